"""A pipeline's run of plain XADDs to one queue, worked as one request.

A producer that pipelines its pushes (a redis-py pipeline, a framework's batch, redis-benchmark
-P) sends dozens of `XADD q * field value` in one read. One by one, each is a handler call, a
writer request, an INSERT, a Deferred and a reply of its own. The connection hands a run of them
here instead: each command gets XADD's checks, then the run is one request (Broker.push_run: one
executemany) and one Deferred whose replies are written together (resp.Replies).

Only the plainest form runs so: `*` right after the queue's name (no option), fields in pairs
within the task limit, a live queue (not q::dead), an authenticated session outside MULTI. A
command that is not so ends the run and is dispatched as before; so is a run of one. Each
command's reply is the one XADD would give it: its id, or the error that refused it.
"""

from __future__ import annotations

from ..lifecycle import split_queue
from ..resp import ErrorReply, Replies
from ..task_fields import stored
from .table import Deferred, internal_error

RUN_NAMES = frozenset((b"XADD", b"xadd"))  # as clients send it: other spellings are dispatched


def push_run(session, commands: list[list[bytes]], start: int):
    """(the reply of the run of plain XADDs from commands[start], the index after it), or None:
    commands[start] is to be dispatched alone."""
    first = commands[start]
    if (len(first) < 5 or first[2] != b"*" or session.queued is not None or not session.authenticated
            or split_queue(first[1])[1]):
        return None
    queue, limit = first[1], session.state.settings.max_task_size
    pushes = []
    for args in commands[start:]:  # the length first: `XADD` alone is XADD's arity error, not ours
        if len(args) < 5 or not len(args) & 1 or args[0] not in RUN_NAMES or args[1] != queue or args[2] != b"*":
            break
        fields = args[3:]
        if sum(map(len, fields)) > limit:
            break  # refused by XADD itself, with its message
        pushes.append(stored(fields))
    n = len(pushes)
    if n < 2:
        return None
    session.state.total_commands += n
    try:
        return Deferred(session.state.broker.push_run(queue, pushes), Replies, replies=n), start + n
    except ErrorReply as exc:  # refused whole (shutting down, a full disk): each push's reply
        return Replies((exc.as_reply(),) * n), start + n
    except Exception as exc:
        return Replies((internal_error(session, commands[start], exc),) * n), start + n
