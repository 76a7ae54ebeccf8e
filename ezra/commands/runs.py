"""A pipeline's run of plain XADDs, or of single-id XACKs, to one queue, worked as one request.

A producer that pipelines its pushes (a redis-py pipeline, a framework's batch, redis-benchmark
-P) sends dozens of `XADD q * field value` in one read. One by one, each is a handler call, a
writer request, an INSERT, a Deferred and a reply of its own. The connection hands a run of them
here instead: each command gets XADD's checks, then the run is one request (Broker.push_run: one
executemany) and one Deferred whose replies are written together (resp.Replies).

Only the plainest form runs so: `*` right after the queue's name (no option), fields in pairs
within the task limit, a live queue (not q::dead), an authenticated session outside MULTI. A
command that is not so ends the run and is dispatched as before; so is a run of one. Each
command's reply is the one XADD would give it: its id, or the error that refused it.

Acks go the same way: a worker that pipelines `XACK q group id`, one id each (an auto-pipelining
client, acks sent as tasks finish), has them worked as one request (Broker.ack_run), each XACK
answering 1 or 0 for its own task as it would alone. An id XACK would refuse ends the run.
"""

from __future__ import annotations

from ..lifecycle import split_queue
from ..protocol.resp import ErrorReply, Replies
from ..protocol.stream_ids import parse_id
from ..protocol.task_fields import stored
from .table import Deferred, internal_error

PUSH_NAMES = frozenset((b"XADD", b"xadd"))  # as clients send them: other spellings are dispatched
ACK_NAMES = frozenset((b"XACK", b"xack"))


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
        if len(args) < 5 or not len(args) & 1 or args[0] not in PUSH_NAMES or args[1] != queue or args[2] != b"*":
            break
        fields = args[3:]
        if sum(map(len, fields)) > limit:
            break  # refused by XADD itself, with its message
        pushes.append(stored(fields))
    if len(pushes) < 2:
        return None
    return _one_request(session, commands, start, session.state.broker.push_run, queue, pushes)


def ack_run(session, commands: list[list[bytes]], start: int):
    """(the reply of the run of single-id XACKs from commands[start], the index after it), or None:
    commands[start] is to be dispatched alone."""
    first = commands[start]
    if len(first) != 4 or session.queued is not None or not session.authenticated or split_queue(first[1])[1]:
        return None
    queue, ids = first[1], []
    for args in commands[start:]:
        if len(args) != 4 or args[0] not in ACK_NAMES or args[1] != queue:
            break
        try:
            ids.append(parse_id(args[3]))
        except ErrorReply:
            break  # refused by XACK itself, with its message
    if len(ids) < 2:
        return None
    return _one_request(session, commands, start, session.state.broker.ack_run, queue, ids)


def _one_request(session, commands: list[list[bytes]], start: int, submit, queue: bytes, items: list):
    """A run's reply and the index after it: its commands from commands[start], one per item, as one
    request (`submit(queue, items)`), each command answered by its own result."""
    n = len(items)
    session.state.total_commands += n
    try:
        return Deferred(submit(queue, items), Replies, replies=n), start + n
    except ErrorReply as exc:  # refused whole (shutting down, a full disk): each command's reply
        return Replies((exc.as_reply(),) * n), start + n
    except Exception as exc:
        return Replies((internal_error(session, commands[start], exc),) * n), start + n


# The runs by their first command's name (the connection looks one up when two commands in a row
# have a name here; each run checks that the next ones are of its kind).
RUNS = dict.fromkeys(PUSH_NAMES, push_run) | dict.fromkeys(ACK_NAMES, ack_run)
