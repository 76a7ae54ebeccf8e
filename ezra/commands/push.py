"""XADD: one place checks a push (its size, id and options), for one XADD and for a pipeline's
run of them alike, and one route stores them (Tasks.push, a list of pushes).

A plain push, `XADD q * field value...` as producers send it, is its fields as stored; a placed
push, `XADD q PRIORITY p PARTITION key * field value...` (either option alone, in either order),
is (fields, priority, partition); a push with other options is a Push (broker/tasks.py).
`read_pushes` checks the XADD it is given and, when it is plain or placed, the XADDs of its kind
to the same queue right after it in the pipeline (a placed run takes plain pushes too: placed at
the default): the connection's run strategy (runs.py) sends them as one request, the handler
sends one XADD as a run of one.
"""

from __future__ import annotations

from operator import itemgetter

from .. import errors, lifecycle
from ..broker.tasks import Push
from ..lifecycle import split_queue
from ..protocol import stream_ids
from ..protocol.integers import to_int
from ..protocol.task_fields import stored
from ..settings import queue_settings
from ..settings.options import STOP, Custom, Flag, Options, Value, parse_options
from ..settings.trimming import REFERENCES, take_trimming
from .args import MAX_RETRY_COUNT, live_queue
from .table import Deferred, command

PUSH_NAMES = frozenset((b"XADD", b"xadd"))  # as clients send them: other spellings end a run
ONLY = itemgetter(0)  # the reply of a run of one: its push's
DEAD_VIEW = lifecycle.DEAD_SUFFIX.encode()  # a name ending so may be a dead view: split_queue decides


# ---------------------------------------------------------------- XADD's options

def take_idmp(args: list[bytes], i: int, producer):
    """IDMP producer iid -> (producer, iid)."""
    return idempotent_producer(producer, "IDMP", args[i + 1], args[i + 2]), i + 3


def take_idmpauto(args: list[bytes], i: int, producer):
    """IDMPAUTO producer -> (producer, None): the iid is the fields' digest."""
    return idempotent_producer(producer, "IDMPAUTO", args[i + 1], None), i + 2


def idempotent_producer(before, kind: str, producer: bytes, iid: bytes | None) -> tuple:
    if before is not None:
        raise errors.IDMP_TWICE
    if not producer:
        raise errors.idmp_producer_empty(kind)
    if kind == "IDMP" and not iid:
        raise errors.IDMP_IID_EMPTY
    return producer, iid


def push_ms(arg: bytes) -> int:
    """DELAY's and TTL's seconds, in milliseconds."""
    return lifecycle.to_ms(queue_settings.seconds(arg))


def push_attempts(arg: bytes) -> int:
    """ATTEMPTS: the deliveries the task had elsewhere (ezra import)."""
    attempts = to_int(arg, errors.ATTEMPTS_OUT_OF_RANGE)
    if not 0 <= attempts <= MAX_RETRY_COUNT:
        raise errors.ATTEMPTS_OUT_OF_RANGE
    return attempts


# A key sits in its task's row and in the tasks_unique index: bounded, as queue names are.
MAX_UNIQUE_KEY = 256  # bytes


def key_option(twice, empty, too_long, most: int):
    """The option parser's take of a key (UNIQUE, PARTITION): given once, 1 to `most` bytes."""
    def take(args: list[bytes], i: int, key):
        if key is not None:
            raise twice
        key = args[i + 1]
        if not key:
            raise empty
        if len(key) > most:
            raise too_long(len(key), most)
        return key, i + 2
    return take


# UNIQUE key: at most one unfinished task per key in the queue (an EZRA extension).
take_unique = key_option(errors.UNIQUE_TWICE, errors.UNIQUE_KEY_EMPTY, errors.unique_key_too_long, MAX_UNIQUE_KEY)


def take_priority(args: list[bytes], i: int, priority):
    """PRIORITY p: one digit, 0 to 9 (lifecycle.PRIORITIES), as Redis reads an integer (no sign, no
    leading zero, no space or '_'); stored on the task (tasks.priority)."""
    if priority is not None:
        raise errors.PRIORITY_TWICE
    digit = args[i + 1]
    if len(digit) != 1 or digit[0] - 48 not in lifecycle.PRIORITIES:  # b"0" to b"9"
        raise errors.PRIORITY_OUT_OF_RANGE
    return digit[0] - 48, i + 2


# NAME name: the task's own name in its queue, for as long as its row exists (tasks.name): a push
# with a name taken answers that task's id (get-or-create). Bounded as a UNIQUE key.
MAX_TASK_NAME = 256  # bytes
take_name = key_option(errors.NAME_TWICE, errors.NAME_EMPTY, errors.task_name_too_long, MAX_TASK_NAME)


# PARTITION key: the task's partition of the queue (tasks.partition_key).
take_partition = key_option(errors.PARTITION_TWICE, errors.PARTITION_KEY_EMPTY, errors.partition_key_too_long,
                            lifecycle.MAX_PARTITION_KEY)


# AFTER n: at most this many tasks named. Each costs the push a look-up and an edge written in the
# writer's one transaction, on the event loop (10,000: tens of ms), and its arguments are read
# whole first; a fan-in wider than this is better a chain of fan-ins.
MAX_AFTER = 10_000


def take_after(args: list[bytes], i: int, after):
    """AFTER n queue1 id1 ... queueN idN -> [(queue, id), ...]: the tasks it waits for (broker/dependencies.py).
    The ids are read as XACK's are; whether the tasks exist is the broker's to say."""
    if after is not None:
        raise errors.AFTER_TWICE
    n = to_int(args[i + 1], lambda: errors.after_count_out_of_range(MAX_AFTER))
    if not 1 <= n <= MAX_AFTER:
        raise errors.after_count_out_of_range(MAX_AFTER)
    end = i + 2 + 2 * n
    if end >= len(args):  # the pairs, then at least the task's id
        raise errors.after_pairs_missing(n)
    return [(args[j], args[j + 1], stream_ids.parse_id(args[j + 1])) for j in range(i + 2, end, 2)], end


def push_failure(arg: bytes) -> dict:
    """FAILURE: the task's last failure where it came from (ezra import), bounded as a REASON is."""
    import json  # here: only imports send it

    try:
        record = json.loads(arg)
    except ValueError:
        raise errors.FAILURE_NOT_A_RECORD from None
    if not isinstance(record, dict) or not isinstance(record.get("cause"), str):
        raise errors.FAILURE_NOT_A_RECORD
    texts = [record.get(key) for key in ("cause", "reason", "worker")]
    at = record.get("at")
    if any(value is not None and not isinstance(value, str) for value in texts) or \
            not (at is None or (type(at) is int and 0 <= at < 2 ** 63)):
        raise errors.FAILURE_NOT_A_RECORD
    cause, reason, worker = (None if value is None else lifecycle.bound_reason(value.encode("utf-8", "replace"))
                             for value in texts)
    return lifecycle.failure_record(cause, reason, worker, at)


def push_progress(arg: bytes) -> bytes:
    """PROGRESS: the task's progress where it came from (ezra import), bounded as XPROGRESS's."""
    if len(arg) > errors.MAX_PROGRESS_BYTES:
        raise errors.progress_too_large(len(arg))
    return arg


TRIMMING = take_trimming("xadd")
IDMP = Custom(take_idmp, need=3)
# XADD's options before the id: Redis's own, then EZRA's per-task DELAY, TTL, ATTEMPTS, UNIQUE, FAILURE,
# PRIORITY, PARTITION, AFTER and NAME (how the others combine with NAME: broker/tasks.py). IDMP,
# IDMPAUTO and EZRA's need one argument more than their values (the id): without it the word is read
# as the id (`XADD q NOMKSTREAM DELAY 5`: an invalid id).
PUSH_OPTIONS = Options(
    NOMKSTREAM=Flag(), MAXLEN=TRIMMING, MINID=TRIMMING, LIMIT=TRIMMING,
    KEEPREF=REFERENCES, DELREF=REFERENCES, ACKED=REFERENCES,
    IDMP=IDMP, IDMPAUTO=Custom(take_idmpauto, need=2, shares=IDMP),
    DELAY=Value(push_ms, 0, need=2), TTL=Value(push_ms, need=2), ATTEMPTS=Value(push_attempts, 0, need=2),
    UNIQUE=Custom(take_unique, need=2), FAILURE=Value(push_failure, need=2),
    PRIORITY=Custom(take_priority, need=2), PARTITION=Custom(take_partition, need=2),
    # ezra import's: a task's progress, and a done task with its result (XACK ... RESULT's, elsewhere)
    PROGRESS=Value(push_progress, need=2), RESULT=Value(bytes, need=2),
    AFTER=Custom(take_after, need=4), NAME=Custom(take_name, need=2), unknown=STOP)


# ---------------------------------------------------------------- XADD

@command("XADD", -5)
def xadd(session, args):
    """XADD queue [NOMKSTREAM] [MAXLEN|MINID ~ threshold [LIMIT n]] [IDMP producer iid | IDMPAUTO producer]
    [DELAY s] [TTL s] [ATTEMPTS n] [UNIQUE key] [FAILURE json] [PRIORITY p] [PARTITION key] [PROGRESS value]
    [RESULT value] [AFTER n queue id ...] [NAME name] <* | id> field value ...
    (on queue::dead: a dead task, as ezra import brings dead letters in)"""
    queue, pushes, _ = read_pushes(session, (args,), 0)
    return Deferred(session.state.broker.tasks.push(queue, pushes), ONLY)  # its id is the reply


def read_pushes(session, commands, start: int) -> tuple[bytes, list, int]:
    """(queue, pushes, the index after them): the XADD at commands[start], checked (its error
    raised), and when it is plain the plain XADDs right after it to the same queue, each checked
    the same way. A command that is not so ends the run: it is dispatched alone."""
    first = commands[start]
    name = first[1]
    limit = session.state.settings.max_task_size
    if first[2] != b"*" or not len(first) & 1 or name.endswith(DEAD_VIEW):
        placed = None if name.endswith(DEAD_VIEW) else placed_push(first, limit)
        if placed is None:
            queue, dead = split_queue(name)
            return queue, [push_with_options(session, first, queue, dead)], start + 1
        pushes = placed_run(commands, start, name, limit, [placed])
        return name, pushes, start + len(pushes)
    # `XADD q * field value...`: no option, so none of their checks
    fields = first[3:]
    size = sum(map(len, fields))
    if size > limit:
        raise errors.task_too_large(size, limit)
    pushes = [stored(fields)]
    if len(commands) > start + 1:
        for args in commands[start + 1:]:  # the length first: `XADD` alone is XADD's arity error, not ours
            if len(args) < 5 or not len(args) & 1 or args[0] not in PUSH_NAMES or args[1] != name or args[2] != b"*":
                break
            fields = args[3:]
            if sum(map(len, fields)) > limit:
                break  # refused by XADD itself, with its message
            pushes.append(stored(fields))
    return name, pushes, start + len(pushes)


# The options a placed push may have: PRIORITY p, PARTITION key (as clients send them).
PLACING = {b"PRIORITY": 0, b"priority": 0, b"PARTITION": 1, b"partition": 1}


def placed_push(args: list[bytes], limit: int) -> tuple | None:
    """`XADD q PRIORITY p PARTITION key * field value...` (either option alone, in either order):
    (its fields as stored, priority or None, partition key or None). None for any other XADD, or
    one XADD refuses: push_with_options reads it then, and says why."""
    placed, i = [None, None], 2
    while (option := PLACING.get(args[i])) is not None and placed[option] is None and len(args) > i + 4:
        placed[option] = args[i + 1]
        i += 2
    fields = args[i + 1:]
    if i == 2 or args[i] != b"*" or len(fields) & 1 or sum(map(len, fields)) > limit:
        return None
    digit, partition = placed
    if digit is not None and (len(digit) != 1 or digit[0] - 48 not in lifecycle.PRIORITIES):
        return None
    if partition is not None and not 0 < len(partition) <= lifecycle.MAX_PARTITION_KEY:
        return None
    return stored(fields), None if digit is None else digit[0] - 48, partition


def placed_run(commands, start: int, name: bytes, limit: int, pushes: list) -> list:
    """The placed push `pushes` holds, and the placed or plain XADDs to the same queue right
    after it, each checked (a plain one is placed at the default: no priority, no partition)."""
    for args in commands[start + 1:]:
        if len(args) < 5 or not len(args) & 1 or args[0] not in PUSH_NAMES or args[1] != name:
            break
        if args[2] == b"*":
            fields = args[3:]
            if sum(map(len, fields)) > limit:
                break
            pushes.append((stored(fields), None, None))
        elif (placed := placed_push(args, limit)) is not None:
            pushes.append(placed)
        else:
            break
    return pushes


def push_with_options(session, args: list[bytes], queue: bytes, dead: bool) -> Push:
    """An XADD with options, or an id, or to q::dead, checked as Redis checks it: its Push."""
    if dead:
        live_queue(queue)  # 'x::dead::dead': 'x::dead' is a view itself, not a queue that has dead tasks
    # '*' where the options begin: none, and a new id, without the parser's loop
    options, i = (PUSH_OPTIONS.defaults, 2) if args[2] == b"*" else parse_options(args, 2, PUSH_OPTIONS)
    (nomkstream, trimming, _, idmp, delay_ms, ttl_ms, attempts, unique, failure, priority, partition, progress,
     result, after, name) = options
    requested_id = stream_ids.push_id(args[i]) if i < len(args) else None  # as Redis: a bad id first
    if trimming is not None:
        trimming.check()
    fields = args[i + 1:]
    if not fields or len(fields) % 2:
        raise errors.wrong_arity("xadd")
    if dead and delay_ms:
        raise errors.DELAY_ON_DEAD_TASK
    if dead and unique is not None:
        raise errors.UNIQUE_ON_DEAD_TASK
    if result is not None and (dead or delay_ms or unique is not None or after is not None):
        raise errors.RESULT_PUSH_CONFLICT
    if after is not None and dead:
        raise errors.AFTER_ON_DEAD_TASK
    if after is not None and unique is not None:
        raise errors.AFTER_WITH_UNIQUE
    # Exact trimming is refused here, before anything is stored.
    trim = None if trimming is None else trimming.trim()
    if dead and trim is not None:
        raise errors.TRIM_ON_DEAD_TASK
    size = sum(map(len, fields))
    limit = session.state.settings.max_task_size
    if size > limit:
        raise errors.task_too_large(size, limit)
    if result is not None and len(result) > limit:
        raise errors.result_too_large(len(result), limit)
    if idmp is not None:
        idmp = idempotency(idmp, requested_id, fields)
    return Push(stored(fields), requested_id, nomkstream, delay_ms, ttl_ms, idmp, attempts, dead, trim, unique, failure,
                priority, partition, progress, result, after, name)


def idempotency(idmp: tuple, requested_id: tuple | None, fields: list[bytes]) -> tuple:
    """(producer, iid) for the broker: IDMPAUTO's iid is the fields' digest."""
    if requested_id is not None:
        raise errors.IDMP_NEEDS_AUTO_ID
    producer, iid = idmp
    return producer, lifecycle.idmp_auto_iid(fields) if iid is None else iid
