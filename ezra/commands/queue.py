"""The queue commands (XADD's are in push.py): XREADGROUP, XREAD, XACK, XNACK, XDEL, XLEN, XRANGE,
XREVRANGE, XTRIM, XPENDING, XGROUP. Each parses its arguments, calls a broker verb
(ezra/broker/) and returns a reply value or a Deferred (table.py).
"""

from __future__ import annotations

from .. import errors, lifecycle
from ..settings import queue_settings
from ..protocol import stream_ids
from ..errors import CommandError
from ..broker.core import DEFAULT_READ_COUNT, MAX_READ_COUNT
from ..broker.waiters import Claim, Waiter
from ..protocol.integers import to_int
from ..lifecycle import split_queue
from ..settings.options import STOP, Custom, Flag, Options, Refuse, Stop, Value, parse_options
from ..protocol.resp import NULL_ARRAY, OK, Mapped, PairsMap, SimpleString
from ..protocol.stream_ids import NEW_TASKS, format_id, xread_id, xreadgroup_id
from ..protocol.task_fields import stored
from ..settings.trimming import REFERENCES, take_trimming
from .args import MAX_RETRY_COUNT, RANGE_DEFAULT_COUNT, block_timeout, broker_of, ids_of, live_queue, worker_name
from .replies import LONG, claim_reply, claimed_reply, claimed_size, entries, long_entries, read_reply
from .table import Block, Deferred, command


# ---------------------------------------------------------------- queue commands

XTRIM_TRIMMING = take_trimming("xtrim")
XTRIM_OPTIONS = Options(MAXLEN=XTRIM_TRIMMING, MINID=XTRIM_TRIMMING, LIMIT=XTRIM_TRIMMING,
                        KEEPREF=REFERENCES, DELREF=REFERENCES, ACKED=REFERENCES)


@command("XTRIM", -4)
def xtrim(session, args):
    """XTRIM queue MAXLEN|MINID ~ threshold [LIMIT n] [KEEPREF | DELREF | ACKED]: how many done
    tasks went (trimming.py; the reference policies as XADD's)."""
    queue = live_queue(args[1])
    (trimming, _), _ = parse_options(args, 2, XTRIM_OPTIONS)  # arity: one option at least, or a syntax error
    if trimming is None:  # a reference policy alone
        raise errors.XTRIM_WITHOUT_STRATEGY
    trimming.check()
    return Deferred(broker_of(session).tasks.trim(queue, trimming.trim()))


def claim_min_idle(arg: bytes) -> int:
    """XREADGROUP's CLAIM: in-flight tasks idle this long (ms) are claimed too."""
    return max(to_int(arg, errors.MIN_IDLE_NOT_INTEGER), 0)


READ_OPTIONS = Options(COUNT=Value(to_int), BLOCK=Value(block_timeout), CLAIM=Value(claim_min_idle),
                       NOACK=Flag(), STREAMS=Stop())
XREAD_OPTIONS = Options(COUNT=Value(to_int), BLOCK=Value(block_timeout), STREAMS=Stop(need=1),
                        GROUP=Refuse(errors.GROUP_IN_XREAD, need=2), NOACK=Refuse(errors.NOACK_IN_XREAD))


@command("XREADGROUP", -7, blocks=True)
def xreadgroup(session, args):
    """XREADGROUP GROUP group worker [COUNT n] [BLOCK ms] [CLAIM min-idle-ms] [NOACK] STREAMS q... id..."""
    last = session.last_claim
    if last is not None and last[0] == args:  # this worker's claim as last time: read as it was then
        claim, block_ms = last[1]
        session.use_worker(claim.worker)
        return claim_new(session, claim, block_ms)
    if args[1].upper() != b"GROUP":
        raise errors.SYNTAX
    worker = worker_name(args[3])  # registered (session.use_worker) once every argument checked out
    if len(args) > 8 and args[4] == b"COUNT" and args[6] == b"BLOCK" and args[8] == b"STREAMS":
        # The shape workers send on every claim (redis-py and the libraries on it): the same
        # reading as READ_OPTIONS', without the generic parser's ~0.3 µs (measured, issue 16).
        count, block_ms, claim_idle, noack, i = to_int(args[5]), block_timeout(args[7]), None, False, 8
    else:
        (count, block_ms, claim_idle, noack), i = parse_options(args, 4, READ_OPTIONS)
    streams = args[i + 1:]
    if i >= len(args) or not streams:
        raise errors.wrong_arity("xreadgroup")
    if len(streams) == 2:  # one queue, as workers read: nothing to merge (the loop below cost 0.5 µs)
        queues, ids = [live_queue(streams[0])], [xreadgroup_id(streams[1])]
    else:
        if len(streams) % 2:
            raise errors.UNBALANCED_STREAMS
        half = len(streams) // 2
        # The reply is keyed by queue: a queue named twice is read once (with its first id), else the
        # tasks claimed for its first mention would be dropped from the reply, leased and never shown.
        reads = {}
        for queue, stream_id in zip(map(live_queue, streams[:half]), map(xreadgroup_id, streams[half:])):
            reads.setdefault(queue, stream_id)
        queues, ids = list(reads), list(reads.values())
    count = read_count(count)
    session.use_worker(worker)  # not before: a malformed command must not touch the name's release timer
    if ids[0] is NEW_TASKS if len(ids) == 1 else all(stream_id is NEW_TASKS for stream_id in ids):
        claim = Claim(queues, worker, count, noack, claim_idle)
        if i == 8 and len(ids) == 1 and not noack and claim_idle is None:  # the shape workers repeat
            session.last_claim = (args, (claim, block_ms))
        return claim_new(session, claim, block_ms)
    return read_mixed(session, queues, ids, Claim(queues, worker, count, noack, claim_idle))


def claim_new(session, claim: Claim, block_ms):
    """XREADGROUP '>': what it claims now, or a wait for it (BLOCK), or null."""
    broker = session.state.broker
    claimed = broker.claim(claim)
    if claimed is not None:
        # answered with the read's other replies: one commit for them all (its size: see Connection)
        return Deferred(claimed, claimed_reply if claim.claim_idle is None else idle_claim_reply, claimed_size)
    if block_ms is None:
        return NULL_ARRAY
    return ClaimWait(broker, claim, block_ms)


class ClaimWait(Block):
    """XREADGROUP BLOCK that found nothing: in line (a Waiter) until a task is claimed for it."""

    __slots__ = ("broker", "claim", "waiter", "event")

    def __init__(self, broker, claim: Claim, block_ms):
        super().__init__(block_ms)
        self.broker, self.claim = broker, claim
        self.waiter = None

    def without_waiting(self):
        return NULL_ARRAY  # the handler's claim found nothing

    def start(self):
        found = self.broker.claim(self.claim, wait=True)
        if type(found) is not Waiter:
            return self.reply(found)
        self.waiter, self.event = found, found.event
        return None

    def woken(self, outcome):
        waiter = self.waiter
        if outcome:
            if waiter.error is not None:
                raise waiter.error
            result = waiter.result  # None: the server is stopping
        else:  # timed out or hung up: a batch that committed just now may have served it
            result = self.broker.unblock(waiter, hung_up=outcome is None)
        return self.reply(result) if result else NULL_ARRAY

    def reply(self, found: dict):
        claim_idle = self.claim.claim_idle
        return claimed_reply(found) if claim_idle is None else claim_reply(found, claim_idle)


@command("XREAD", -4, blocks=True)
def xread(session, args):
    """XREAD [COUNT n] [BLOCK ms] STREAMS q... id...: entries after each id, nothing claimed (an observer)."""
    (count, block_ms), i = parse_options(args, 1, XREAD_OPTIONS)
    streams = args[i + 1:]
    if i >= len(args):
        raise errors.SYNTAX
    if len(streams) % 2:
        raise errors.UNBALANCED_STREAMS
    half = len(streams) // 2
    # Keyed by stream: a queue named twice is read once, with its first id (Redis repeats it).
    reads = {}
    for stream, after in zip(streams[:half], map(xread_id, streams[half:])):
        reads.setdefault(stream, (stream, split_queue(stream), after))
    count = read_count(count)
    if block_ms is None:
        return Deferred(broker_of(session).views.look(list(reads.values()), count), found_or_null)
    return ObserveWait(broker_of(session), list(reads.values()), count, block_ms)


class ObserveWait(Block):
    """XREAD BLOCK: an observer of the views, reading again whenever a batch adds entries to one."""

    __slots__ = ("broker", "reads", "count", "observer", "event")

    def __init__(self, broker, reads, count, block_ms):
        super().__init__(block_ms)
        self.broker, self.reads, self.count = broker, reads, count
        self.observer = None

    def without_waiting(self):
        return Deferred(self.broker.views.look(self.reads, self.count), found_or_null)

    def start(self):
        # Later looks read after the same ids: '$' means the time of the call.
        self.observer, self.reads, found = self.broker.watch(self.reads, self.count)
        self.event = self.observer.event
        return read_reply(found) if found else None

    def woken(self, outcome):
        if not outcome or self.observer.cancelled:
            return NULL_ARRAY  # timed out, hung up, or the server is stopping
        self.event.clear()  # before the look: a commit after this sets it again
        found = self.broker.views.look(self.reads, self.count).wait()
        return read_reply(found) if found else None

    def end(self):
        if self.observer is not None:
            self.broker.observers.unwatch(self.observer)


def found_or_null(found: dict | None):
    return read_reply(found) if found else NULL_ARRAY


def idle_claim_reply(found: dict):
    return claim_reply(found, True)


def read_count(count: int | None) -> int:
    if count is None or count <= 0:
        return DEFAULT_READ_COUNT
    return min(count, MAX_READ_COUNT)


def read_mixed(session, queues, ids, claim: Claim):
    """XREADGROUP with explicit ids: pending tasks come back even when empty (as Redis)."""
    result = PairsMap()
    for queue, after in zip(queues, ids):
        if after is NEW_TASKS:
            request = broker_of(session).claim(Claim([queue], claim.worker, claim.count, claim.noack, claim.claim_idle))
            claimed = None if request is None else request.wait()
            if claimed:
                result.update(claim_reply(claimed, claim.claim_idle))
        else:
            result[queue] = entries(broker_of(session).claims.claim_own(queue, claim.worker, after, claim.count).wait())
    return result or NULL_ARRAY


@command("XACK", -4)
def xack(session, args):
    """XACK queue group id [id ...] | XACK queue group id RESULT value: integer, how many were in
    flight and are now done."""
    try:  # no test on the plain path: RESULT is not an id, so only an XACK with it gets here
        ids = ack_ids(args)
    except CommandError:
        if any(arg.upper() == b"RESULT" for arg in args[3:]):
            return xack_result(session, args)
        raise
    queue, dead = split_queue(args[1])
    if dead:
        return 0
    return Deferred(session.state.broker.tasks.ack(queue, ids), sum)  # each id's count (Tasks.ack)


def xack_result(session, args):
    """XACK queue group id RESULT value (EZRA's): acks one task and keeps `value` (bytes, at most
    --max-task-size) with it, in the ack's transaction: 1, or 0 for an id not in flight (nothing kept)."""
    if len(args) != 6 or args[4].upper() != b"RESULT":
        raise errors.RESULT_SYNTAX
    task_id = stream_ids.parse_id(args[3])
    result, limit = args[5], session.state.settings.max_task_size
    if len(result) > limit:
        raise errors.result_too_large(len(result), limit)
    queue, dead = split_queue(args[1])
    if dead:
        return 0
    return Deferred(session.state.broker.tasks.ack(queue, [task_id], [result]), sum)


def ack_ids(args: list[bytes]) -> list[tuple]:
    """XACK's ids, checked: the one reading of them, for one XACK and a pipeline's run alike."""
    return [stream_ids.parse_id(args[3])] if len(args) == 4 else ids_of(args[3:])  # one id, as workers ack


def nack_retry_count(arg: bytes) -> int:
    retry_count = to_int(arg)
    if retry_count < 0:
        raise errors.RETRYCOUNT_NEGATIVE
    return min(retry_count, MAX_RETRY_COUNT)


# REASON (EZRA's, after Redis 8.8's words): why it failed, kept on the task (bound_reason cuts it).
NACK_OPTIONS = Options(RETRYCOUNT=Value(nack_retry_count), FORCE=Flag(), REASON=Value(bytes))


@command("XNACK", -4)
def xnack(session, args):
    """XNACK queue group <SILENT|FAIL|FATAL> IDS numids id... [RETRYCOUNT n] [FORCE] [REASON text]
    | XNACK queue group id..."""
    queue = live_queue(args[1])
    mode = args[3].upper().decode("latin-1")
    if mode not in lifecycle.NACK_MODES:
        if any(arg.upper() == b"REASON" for arg in args[3:]):
            raise errors.REASON_NEEDS_LONG_FORM
        return Deferred(broker_of(session).tasks.fail(queue, ids_of(args[3:])))
    if len(args) < 7 or args[4].upper() != b"IDS":
        raise errors.SYNTAX
    numids = to_int(args[5])
    if numids <= 0 or 6 + numids > len(args):
        raise errors.NACK_NUMIDS_INVALID
    ids = ids_of(args[6:6 + numids])
    (retry_count, force, reason), _ = parse_options(args, 6 + numids, NACK_OPTIONS)
    return Deferred(broker_of(session).tasks.fail(queue, ids, mode, retry_count, force, reason))


@command("XDEL", -3)
def xdel(session, args):
    """XDEL queue id...: deletes a task nobody holds (available, delayed); of one in flight, a
    failure report (kept for retry); on queue::dead, deletes dead tasks. How many of each."""
    ids = ids_of(args[2:])
    queue, dead = split_queue(args[1])
    if dead:
        return Deferred(broker_of(session).tasks.delete_dead(queue, ids))
    return Deferred(broker_of(session).tasks.delete(queue, ids))


@command("XLEN", 2)
def xlen(session, args):
    """XLEN queue: tasks not done (available + in flight); on queue::dead, dead tasks."""
    queue, dead = split_queue(args[1])
    return Deferred(broker_of(session).tasks.length(queue, dead))


def range_command(session, args, reverse: bool):
    queue, dead = split_queue(args[1])
    low, high = (args[3], args[2]) if reverse else (args[2], args[3])
    start = stream_ids.parse_range_bound(low, True)
    end = stream_ids.parse_range_bound(high, False)
    count = RANGE_DEFAULT_COUNT
    if len(args) == 6 and args[4].upper() == b"COUNT":
        count = min(max(to_int(args[5]), 0), RANGE_DEFAULT_COUNT)
        if count == 0:  # Redis: a null array when the stream exists, an empty one when not
            return Deferred(broker_of(session).tasks.range(queue, dead, start, end, 0, reverse), entries_or_null_array)
    elif len(args) != 4:
        raise errors.SYNTAX
    if start > end:
        return []
    return Deferred(broker_of(session).tasks.range(queue, dead, start, end, count, reverse), long_entries)


def entries_or_null_array(rows):
    return NULL_ARRAY if rows is None else entries(rows)


@command("XRANGE", -4)
def xrange(session, args):
    """XRANGE queue start end [COUNT n]: available, in-flight and retained done tasks."""
    return range_command(session, args, reverse=False)


@command("XREVRANGE", -4)
def xrevrange(session, args):
    """XREVRANGE queue end start [COUNT n]"""
    return range_command(session, args, reverse=True)


def pending_min_idle(arg: bytes) -> int:
    return max(to_int(arg), 0)  # below 0: any idle time, as in Redis


PENDING_OPTIONS = Options(IDLE=Value(pending_min_idle), unknown=STOP)


@command("XPENDING", -3)
def xpending(session, args):
    """XPENDING queue group [[IDLE min-idle] start end count [worker]]"""
    queue = live_queue(args[1])
    if len(args) == 3:
        return Deferred(broker_of(session).tasks.pending_summary(queue), pending_summary_reply)
    # IDLE comes once, first (as Redis reads it): only args[3:5] may hold it.
    (min_idle,), i = parse_options(args[:5], 3, PENDING_OPTIONS)
    rest = args[i:]
    if len(rest) not in (3, 4):
        raise errors.SYNTAX
    start = stream_ids.parse_range_bound(rest[0], True)
    end = stream_ids.parse_range_bound(rest[1], False)
    count = min(to_int(rest[2]), RANGE_DEFAULT_COUNT)
    worker = rest[3] if len(rest) == 4 else None
    if count <= 0 or start > end:
        return []
    pending = broker_of(session).pending_entries(queue, start, end, count, worker, min_idle, not session.in_exec)
    return pending_reply(pending) if type(pending) is list else Deferred(pending, pending_reply)


def pending_reply(pending: list):
    if len(pending) > LONG:  # made while it is written (resp.Mapped)
        return Mapped(pending, pending_item)
    return [[format_id(task_id), worker, idle, n] for task_id, worker, idle, n in pending]


def pending_item(pending: tuple) -> list:
    task_id, worker, idle, n = pending
    return [format_id(task_id), worker, idle, n]


def pending_summary_reply(summary) -> list:
    first, last, workers = summary
    if not workers:
        return [0, None, None, NULL_ARRAY]
    return [sum(n for _, n in workers), format_id(first), format_id(last),
            [[worker, str(n).encode()] for worker, n in workers]]


@command("XGROUP", -2)
def xgroup(session, args):
    """XGROUP CREATE|DESTROY|SETID|CREATECONSUMER|DELCONSUMER|HELP: one implicit group per queue."""
    sub = args[1].upper()
    if sub in (b"CREATE", b"SETID") and len(args) >= 5:
        return xgroup_create_or_setid(session, sub, args)
    if sub == b"CREATECONSUMER" and len(args) == 5:
        return 1
    if sub == b"DESTROY" and len(args) == 4:
        # 1 for the group XGROUP CREATE named (forgotten), else 0; the tasks stay as they are
        return Deferred(broker_of(session).tasks.destroy_group(live_queue(args[2]), args[3]))
    if sub == b"DELCONSUMER" and len(args) == 5:
        # As Redis, how many tasks the worker held; EZRA gives them back instead of dropping them
        return Deferred(broker_of(session).tasks.delete_worker(live_queue(args[2]), args[4]))
    if sub == b"HELP":
        return [SimpleString(line) for line in XGROUP_HELP]
    if sub in (b"CREATE", b"SETID", b"CREATECONSUMER", b"DELCONSUMER", b"DESTROY"):
        raise errors.wrong_subcommand_arity("xgroup", sub)
    raise errors.unknown_subcommand(args[1].decode("utf-8", "replace"), "XGROUP")


def xgroup_create_or_setid(session, sub: bytes, args: list[bytes]):
    """XGROUP CREATE q g <id|$> [MKSTREAM] [ENTRIESREAD n] | SETID q g <id|$> [ENTRIESREAD n]:
    checked in Redis's order (the options, the key, the id) before anything is created; the id
    and ENTRIESREAD mean nothing to EZRA's one implicit group, so SETID changes nothing."""
    mkstream = group_options(sub, args)
    queue = live_queue(args[2])
    try:
        stream_ids.group_start_id(args[4])
    except CommandError:
        if not mkstream and queue not in broker_of(session).tasks.existing([queue]).wait():
            raise errors.XGROUP_NEEDS_KEY from None
        raise
    if sub == b"CREATE":
        return Deferred(broker_of(session).tasks.create_queue(queue, not mkstream, args[3]), lambda _: OK)
    if queue not in broker_of(session).tasks.existing([queue]).wait():
        raise errors.XGROUP_NEEDS_KEY
    return OK


def group_options(sub: bytes, args: list[bytes]) -> bool:
    """XGROUP CREATE's MKSTREAM and ENTRIESREAD (SETID's ENTRIESREAD): whether MKSTREAM was given."""
    if len(args) > 8 or (sub == b"SETID" and len(args) not in (5, 7)):
        raise errors.subcommand_syntax(args[1], "XGROUP")
    mkstream, i = False, 5
    while i < len(args):
        word = args[i].upper()
        if word == b"MKSTREAM" and sub == b"CREATE":
            mkstream, i = True, i + 1
        elif word == b"ENTRIESREAD" and i + 1 < len(args):
            if to_int(args[i + 1]) < -1:
                raise errors.ENTRIESREAD_INVALID
            i += 2
        else:
            raise errors.subcommand_syntax(args[1], "XGROUP")
    return mkstream


XGROUP_HELP = [
    "XGROUP <subcommand> [<arg> [value] [opt] ...]. EZRA has one implicit group per queue:",
    "CREATE <key> <groupname> <id|$> [MKSTREAM]",
    "    Accepted; with MKSTREAM the queue is created.",
    "DESTROY <key> <groupname>",
    "    1 if CREATE named that group (the name is forgotten), else 0; no task is dropped.",
    "DELCONSUMER <key> <groupname> <consumername>",
    "    The consumer's in-flight tasks in that queue go back (an attempt, as a lost lease): their count.",
    "SETID, CREATECONSUMER",
    "    Accepted and ignored: no task is ever dropped.",
]

