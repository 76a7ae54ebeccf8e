"""The pipeline strategy: a run of XADDs, or of single-id XACKs, to one queue, sent down the verb's
one route as one request.

A producer that pipelines its pushes (a redis-py pipeline, a framework's batch, redis-benchmark
-P) sends dozens of `XADD q * field value` in one read. Dispatched one by one, each is a handler
call, a writer request, an INSERT, a Deferred and a reply of its own. The connection asks here
first: the run is checked as XADD checks one (push.read_pushes, the one check), stored by the
same route (Tasks.push takes a list, and a single XADD is a run of one), and
its replies written together (resp.Replies), each the one XADD would give it.

Only plain pushes make a run (`*` right after the queue's name, no option; push.read_pushes
says which), in an authenticated session outside MULTI. A command that is not so ends the
run and is dispatched as before (an XADD with options is a run of one, read once).

Acks go the same way: a worker that pipelines `XACK q group id`, one id each (an auto-pipelining
client, acks sent as tasks finish), has them sent as one list of ids down XACK's route
(Tasks.ack answers each id's count), each XACK answering 1 or 0 for its own
task as it would alone. An id XACK would refuse ends the run. So do `XACK q group id RESULT
value`s in a row (EZRA's): one list of ids and one of results, the rows written by one
statement; a value over --max-task-size ends the run (XACK refuses it alone, with its message).
"""

from __future__ import annotations

from ..lifecycle import split_queue
from ..protocol.resp import ErrorReply, Replies
from ..protocol.stream_ids import parse_id
from .push import PUSH_NAMES, read_pushes
from .queue import ack_ids
from .table import Deferred, internal_error

ACK_NAMES = frozenset((b"XACK", b"xack"))  # as clients send them: other spellings are dispatched


def push_run(session, commands: list[list[bytes]], start: int):
    """(the reply of the run of plain XADDs from commands[start], the index after it), or None:
    commands[start] is to be dispatched alone."""
    if len(commands[start]) < 5 or session.queued is not None or not session.authenticated:
        return None  # `XADD q` is XADD's arity error, MULTI queues it
    try:
        queue, pushes, _ = read_pushes(session, commands, start)
    except ErrorReply:
        return None  # refused by XADD itself, with its message
    return _one_request(session, commands, start, session.state.broker.tasks.push, queue, pushes)


def ack_run(session, commands: list[list[bytes]], start: int):
    """(the reply of the run of single-id XACKs from commands[start], the index after it), or None:
    commands[start] is to be dispatched alone."""
    first = commands[start]
    if len(first) != 4:
        return ack_result_run(session, commands, start) if len(first) == 6 else None
    if session.queued is not None or not session.authenticated or split_queue(first[1])[1]:
        return None
    queue, ids = first[1], []
    for args in commands[start:]:
        if len(args) != 4 or args[0] not in ACK_NAMES or args[1] != queue:
            break
        try:
            ids += ack_ids(args)
        except ErrorReply:
            break  # refused by XACK itself, with its message
    if len(ids) < 2:
        return None
    return _one_request(session, commands, start, session.state.broker.tasks.ack, queue, ids)


def ack_result_run(session, commands: list[list[bytes]], start: int):
    """ack_run's for `XACK q group id RESULT value`s in a row: one request with their ids and results."""
    first = commands[start]
    if session.queued is not None or not session.authenticated or split_queue(first[1])[1]:
        return None
    queue, ids, results, limit = first[1], [], [], session.state.settings.max_task_size
    for args in commands[start:]:
        if (len(args) != 6 or args[0] not in ACK_NAMES or args[1] != queue or args[4].upper() != b"RESULT"
                or len(args[5]) > limit):
            break
        try:
            ids.append(parse_id(args[3]))
        except ErrorReply:
            break  # refused by XACK itself, with its message
        results.append(args[5])
    if len(ids) < 2:
        return None
    ack = session.state.broker.tasks.ack
    return _one_request(session, commands, start, lambda name, items: ack(name, items, results), queue, ids)


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
