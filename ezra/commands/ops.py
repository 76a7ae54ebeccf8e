"""The operations commands:

    XCFGSET queue SETTING value ...          per-queue settings (queue_settings.py)
    XCLAIM / XAUTOCLAIM                       leases: heartbeats and take-overs (ezra/broker/leases.py)
    XACKDEL queue group [KEEPREF|DELREF|ACKED] IDS n id...   ack and drop the record
    XREQUEUE queue ALL | IDS n id...          dead tasks back to available
    XINFO STREAM|GROUPS|CONSUMERS|HELP        Redis's shapes, plus EZRA's counts and settings
    XINFO TASKS queue state [COUNT n] [AFTER id]   EZRA's: the tasks of one state (ezra ls)
    XINFO QUEUES [AFTER name] [COUNT n]       EZRA's: every queue's counts, a page at a time (ezra stats)
    BACKUP dest-path                          a hot backup of ezra.db, a new file in the backup directory

Same rules as every command (table.py): parse, call the broker, return a reply value.
"""

from __future__ import annotations

from .. import errors, lifecycle
from ..settings import queue_settings
from ..protocol import stream_ids
from ..errors import CommandError
from ..protocol.integers import to_int
from ..lifecycle import DEAD, DELAYED, DONE, IN_FLIGHT, split_queue
from ..settings.options import Flag, Options, Value, parse_options
from ..protocol.resp import OK, SimpleString
from ..storage import StorageError, decode_failure, name_bytes
from ..protocol.task_fields import shown as shown_fields
from ..protocol.stream_ids import format_id, parse_id
from .args import MAX_RETRY_COUNT, RANGE_DEFAULT_COUNT, broker_of, ids_of, live_queue, worker_name
from .replies import entry_or_none, long_entries, taken_over
from .table import Deferred, command

AUTOCLAIM_DEFAULT_COUNT = 100
AUTOCLAIM_MAX_COUNT = 10000
AUTOCLAIM_COUNT_LIMIT = (2 ** 63 - 1) // 16  # above, Redis answers "COUNT must be > 0" (it would overflow)


def ids_block(args: list[bytes], i: int) -> tuple[list[tuple], int]:
    """'IDS numids id ...' at args[i]: the ids and the index after them."""
    if i >= len(args) or args[i].upper() != b"IDS" or i + 1 >= len(args):
        raise errors.SYNTAX
    numids = to_int(args[i + 1])
    if numids <= 0:
        raise errors.NUMIDS_NOT_POSITIVE
    if i + 2 + numids > len(args):
        raise errors.NUMIDS_NOT_MATCHING
    return ids_of(args[i + 2:i + 2 + numids]), i + 2 + numids


# ---------------------------------------------------------------- settings

@command("XCFGSET", -2)
def xcfgset(session, args):
    """XCFGSET queue SETTING value [SETTING value ...]: OK; creates the queue if it does not exist."""
    queue = live_queue(args[1])
    changes = queue_settings.parse(args[2:])
    return Deferred(broker_of(session).admin.configure(queue, changes), lambda _: OK)


# ---------------------------------------------------------------- leases

def xclaim_ms(word: str, most: int | None = None) -> Value:
    """XCLAIM's IDLE, TIME and RETRYCOUNT: integers, below 0 read as 0 (as Redis), at most `most`."""
    def error() -> CommandError:
        return errors.xclaim_option_invalid(word)

    def convert(arg: bytes) -> int:
        value = max(to_int(arg, error), 0)
        return value if most is None else min(value, most)
    return Value(convert)


# LASTID sets the group's last id: EZRA's one group has none to set, the id is only checked.
XCLAIM_OPTIONS = Options(IDLE=xclaim_ms("IDLE"), TIME=xclaim_ms("TIME"),
                         RETRYCOUNT=xclaim_ms("RETRYCOUNT", MAX_RETRY_COUNT), FORCE=Flag(), JUSTID=Flag(),
                         LASTID=Value(parse_id), unknown=errors.unknown_xclaim_option)


@command("XCLAIM", -6)
def xclaim(session, args):
    """XCLAIM queue group worker min-idle-ms id... [IDLE ms] [TIME ms] [RETRYCOUNT n] [FORCE] [JUSTID] [LASTID id]"""
    queue = live_queue(args[1])
    worker = worker_name(args[3])
    min_idle = max(to_int(args[4], errors.XCLAIM_MIN_IDLE_INVALID), 0)
    i, ids = 5, []
    while i < len(args):
        try:
            ids.append(parse_id(args[i]))
        except CommandError:
            break  # as Redis: the ids end where the options start
        i += 1
    (idle_ms, time_ms, retry_count, force, justid, _), _ = parse_options(args, i, XCLAIM_OPTIONS)
    session.use_worker(worker)  # once the arguments checked out: a bad command leaves the name alone
    return Deferred(broker_of(session).leases.take_over(queue, worker, min_idle, ids, idle_ms, time_ms, retry_count,
                                                        force, justid),
                    lambda claimed: taken_over(claimed, justid))


def autoclaim_count(arg: bytes) -> int:
    count = to_int(arg, errors.AUTOCLAIM_COUNT_INVALID)
    if not 1 <= count <= AUTOCLAIM_COUNT_LIMIT:
        raise errors.AUTOCLAIM_COUNT_INVALID
    return min(count, AUTOCLAIM_MAX_COUNT)


XAUTOCLAIM_OPTIONS = Options(COUNT=Value(autoclaim_count, AUTOCLAIM_DEFAULT_COUNT), JUSTID=Flag())


@command("XAUTOCLAIM", -6)
def xautoclaim(session, args):
    """XAUTOCLAIM queue group worker min-idle-ms start [COUNT n] [JUSTID]: [cursor, entries, deleted]"""
    queue = live_queue(args[1])
    worker = worker_name(args[3])
    min_idle = max(to_int(args[4], errors.XAUTOCLAIM_MIN_IDLE_INVALID), 0)
    start = stream_ids.parse_range_bound(args[5], True)
    (count, justid), _ = parse_options(args, 6, XAUTOCLAIM_OPTIONS)
    if start == stream_ids.ABOVE_ALL:  # past every id EZRA can store: nothing to scan
        return [b"0-0", [], []]
    session.use_worker(worker)  # once the arguments checked out: a bad command leaves the name alone
    return Deferred(broker_of(session).leases.autoclaim(queue, worker, min_idle, start, count, justid),
                    lambda scanned: autoclaim_reply(scanned, justid))


def autoclaim_reply(scanned: tuple, justid: bool) -> list:
    """[next cursor, entries or ids, deleted ids]: EZRA deletes no entry under a pending one."""
    cursor, claimed = scanned
    return [stream_ids.format_id(cursor), taken_over(claimed, justid), []]


@command("XACKDEL", -6)
def xackdel(session, args):
    """XACKDEL queue group [KEEPREF | DELREF | ACKED] IDS numids id...: per id 1 (acked, deleted) or -1"""
    queue = live_queue(args[1])
    i = 3
    if args[i].upper() in (b"KEEPREF", b"DELREF", b"ACKED"):
        i += 1  # one implicit group: every policy means the same
    ids, end = ids_block(args, i)
    if end != len(args):
        raise errors.SYNTAX
    return Deferred(broker_of(session).admin.ack_delete(queue, ids), xackdel_reply)


XACKDEL_DELETED = 1
XACKDEL_NOT_FOUND = -1


def xackdel_reply(deleted: list[bool]) -> list[int]:
    return [XACKDEL_DELETED if done else XACKDEL_NOT_FOUND for done in deleted]


# ---------------------------------------------------------------- redrive

@command("XREQUEUE", -3)
def xrequeue(session, args):
    """XREQUEUE queue ALL | IDS numids id...: dead tasks back to available, attempts reset; how many."""
    queue, _ = split_queue(args[1])  # 'q' and 'q::dead' both name q's dead tasks
    if args[2].upper() == b"ALL" and len(args) == 3:
        return Deferred(broker_of(session).admin.requeue(queue, None))
    ids, end = ids_block(args, 2)
    if end != len(args):
        raise errors.SYNTAX
    return Deferred(broker_of(session).admin.requeue(queue, ids))


# ---------------------------------------------------------------- XINFO

@command("XINFO", -2)
def xinfo(session, args):
    """XINFO STREAM queue [FULL [COUNT n]] | GROUPS queue | CONSUMERS queue group | HELP | TASKS ..."""
    sub = args[1].upper()
    if sub == b"HELP" and len(args) == 2:
        return [SimpleString(line) for line in XINFO_HELP]  # Redis's text, byte for byte
    if sub == b"TASKS":
        return xinfo_tasks(session, args)
    if sub == b"QUEUES":
        return xinfo_queues(session, args)
    arity = {b"STREAM": 3, b"GROUPS": 3, b"CONSUMERS": 4}.get(sub)
    if arity is None:
        raise errors.unknown_subcommand(args[1].decode("utf-8", "replace"), "XINFO")
    if len(args) < arity or (sub != b"STREAM" and len(args) != arity):
        raise errors.wrong_subcommand_arity("xinfo", sub)
    queue = live_queue(args[2])
    apart = not session.in_exec  # its counts on a native thread; inside EXEC (it cannot wait) in the transaction
    if sub == b"GROUPS":
        return Deferred(broker_of(session).admin.stream_info(queue, apart=apart), lambda info: [group_reply(info)])
    if sub == b"CONSUMERS":
        return Deferred(broker_of(session).admin.stream_info(queue, apart=apart), consumers_reply)
    full_count = stream_full_count(args[3:])
    return Deferred(broker_of(session).admin.stream_info(queue, full_count, apart),
                    stream_reply if full_count is None else stream_full_reply)


TASKS_DEFAULT_COUNT = 100
UNFINISHED = "unfinished"  # XINFO TASKS' word for available, delayed and in-flight tasks together
TASK_STATES = ({state.encode(): state for state in lifecycle.COUNTED} | {b"in-flight": IN_FLIGHT}
               | {UNFINISHED.encode(): UNFINISHED})


def tasks_count(arg: bytes) -> int:
    count = to_int(arg)
    if not 0 < count <= AUTOCLAIM_MAX_COUNT:
        raise errors.count_out_of_range(AUTOCLAIM_MAX_COUNT)
    return count


TASKS_OPTIONS = Options(COUNT=Value(tasks_count, TASKS_DEFAULT_COUNT), AFTER=Value(parse_id, (0, 0)))


def xinfo_tasks(session, args):
    """XINFO TASKS queue state [COUNT n] [AFTER id]: one map per task, in the state's order
    (available, in_flight, dead: by id, AFTER pages; delayed: next due first; done: newest first;
    waiting (XADD AFTER): by id; unfinished: available, delayed, in-flight and waiting ones by id, each
    with its own state)."""
    if len(args) < 4:
        raise errors.wrong_subcommand_arity("xinfo", b"TASKS")
    queue = live_queue(args[2])
    state = TASK_STATES.get(args[3].lower())
    if state is None:
        raise errors.TASK_STATE_UNKNOWN
    (count, after), _ = parse_options(args, 4, TASKS_OPTIONS)
    if state == lifecycle.WAITING or state == UNFINISHED:  # with what the waiting ones wait for (XADD AFTER)
        return Deferred(broker_of(session).admin.tasks_and_waits(queue, state, count, after),
                        lambda found: [with_waits(task_reply(row, state), row, found[1]) for row in found[0]])
    return Deferred(broker_of(session).admin.tasks(queue, state, count, after),
                    lambda rows: [task_reply(row, state) for row in rows])


def with_waits(reply: dict, row, waits: dict) -> dict:
    """A waiting task's XINFO TASKS map, with `waits-for`: [[queue, id], ...], the tasks it waits for
    that are not done yet (XADD AFTER); other tasks' maps as they are."""
    waited = waits.get(row[:2])
    if waited is not None:
        reply["waits-for"] = [[queue, stream_ids.format_id(task_id)] for queue, task_id in waited]
    return reply


QUEUES_DEFAULT_COUNT = 100
QUEUES_MAX_COUNT = 1000
XINFO_QUEUES_TOTALS = ("pushed", "delivered", "acked", "failed", "expired")  # events since start


def queues_count(arg: bytes) -> int:
    count = to_int(arg)
    if not 0 < count <= QUEUES_MAX_COUNT:
        raise errors.count_out_of_range(QUEUES_MAX_COUNT)
    return count


QUEUES_OPTIONS = Options(COUNT=Value(queues_count, QUEUES_DEFAULT_COUNT), AFTER=Value(bytes))


def xinfo_queues(session, args):
    """XINFO QUEUES [AFTER name] [COUNT n]: one map per queue, in byte order of the names after
    AFTER (default: from the first), at most COUNT (default 100, at most 1000): every queue's
    counts, page by page, where INFO lists the first 100 (`ezra stats` reads these)."""
    (count, after), _ = parse_options(args, 2, QUEUES_OPTIONS)
    broker = broker_of(session)
    figures = broker.admin.figures(broker.names_after(after, count), head_since=False)
    return [queue_reply(name, queue) for name, queue in sorted(figures.queues.items())]


def queue_reply(name: bytes, queue: dict) -> dict:
    counts, totals = queue["counts"], queue["totals"]
    return {"name": name, **{state.replace("_", "-"): counts[state] for state in lifecycle.STATES},
            **{event: totals[event] for event in XINFO_QUEUES_TOTALS}, "paused": int(queue["paused"])}


def task_reply(row, state: str) -> dict:
    if state == UNFINISHED:
        *row, state = row  # those rows carry their own state
    (ms, seq, fields, attempts, worker, created, available, deadline, delivered, finished, unique_key, failure,
     priority, partition, progress, result_size, name) = row
    failure = decode_failure(failure) or {}
    return {"id": stream_ids.format_id((ms, seq)), "state": state, "attempts": attempts,
            "worker": None if worker is None else name_bytes(worker), "created-at": created,
            "available-at": available, "delivered-at": delivered, "deadline": deadline,
            "finished-at": finished, "fields": shown_fields(fields, (ms, seq)),
            "unique-key": None if unique_key is None else name_bytes(unique_key),
            "name": None if name is None else name_bytes(name),  # XADD NAME's (None: none)
            # its last failure (EZRA's XNACK REASON...): all None if it never failed
            "failure-cause": failure.get("cause"), "failure-reason": failure.get("reason"),
            "failure-worker": failure.get("worker"), "failed-at": failure.get("at"),
            # XADD PRIORITY's (the default when pushed without it) and PARTITION's (None: none)
            "priority": lifecycle.DEFAULT_PRIORITY if priority is None else priority,
            "partition": None if partition is None else name_bytes(partition),
            # XPROGRESS's last value, and the size of XACK ... RESULT's value (XRESULT reads it): None if none
            "progress": None if progress is None else bytes(progress), "result-size": result_size}


def stream_full_count(rest: list[bytes]) -> int | None:
    """None without FULL; else how many entries and pending entries to show.

    COUNT 0 means all in Redis; here at most 10000, as XRANGE pages: a queue of
    millions of tasks would otherwise be loaded whole into memory by one command."""
    if not rest:
        return None
    if rest[0].upper() != b"FULL" or len(rest) not in (1, 3):
        raise errors.SYNTAX
    if len(rest) == 3:
        if rest[1].upper() != b"COUNT":
            raise errors.SYNTAX
        count = max(to_int(rest[2]), 0)
        return min(count or RANGE_DEFAULT_COUNT, RANGE_DEFAULT_COUNT)
    return 10


def stream_reply(info) -> dict:
    """Redis 7's ten fields, Redis 8.6's idempotency fields, then EZRA's counts and settings."""
    reply = redis_stream_head(info)
    reply.update(groups=1, **{"first-entry": entry_or_none(info.first), "last-entry": entry_or_none(info.last)})
    return reply | ezra_fields(info)


def stream_full_reply(info) -> dict:
    reply = redis_stream_head(info)
    group = {
        "name": info.group, "last-delivered-id": format_id(info.last_delivered),
        "entries-read": info.entries_read, "lag": info.lag, "pel-count": info.pending,
        "pending": [[format_id(task_id), worker, delivered, n] for task_id, worker, delivered, n in info.pel],
        "consumers": [{"name": worker, "seen-time": seen, "pel-count": n,
                       "pending": [[format_id(task_id), delivered, pn] for task_id, owner, delivered, pn in info.pel
                                   if owner == worker]}
                      for worker, n, seen in info.consumers],
    }
    reply.update(entries=long_entries(info.entries), groups=[group])
    return reply | ezra_fields(info)


def redis_stream_head(info) -> dict:
    """The Redis 7 fields XINFO STREAM starts with (FULL too), in Redis's order."""
    return {"length": info.length, "radix-tree-keys": info.stream_nodes, "radix-tree-nodes": info.stream_nodes + 1,
            "last-generated-id": format_id(info.last_id), "max-deleted-entry-id": format_id(info.max_deleted),
            "entries-added": info.entries_added,
            "recorded-first-entry-id": format_id(info.first[:2]) if info.first else b"0-0"}


def ezra_fields(info) -> dict:
    duration, maxsize = info.idmp
    counts = info.counts
    return {
        "idmp-duration": duration, "idmp-maxsize": maxsize, "pids-tracked": info.pids_tracked,
        "iids-tracked": info.iids_tracked, "iids-added": info.iids_added,
        "iids-duplicates": info.iids_duplicates,
        "available": counts[lifecycle.AVAILABLE], "delayed": counts[DELAYED],
        "in-flight": counts[IN_FLIGHT], "done": counts[DONE], "dead": counts[DEAD],
        # XADD AFTER's waiting tasks, only while there are some: a reply as before otherwise
        **({"waiting": counts[lifecycle.WAITING]} if counts[lifecycle.WAITING] else {}),
        **info.settings,
    }


def group_reply(info) -> dict:
    return {"name": info.group, "consumers": len(info.consumers), "pending": info.pending,
            "last-delivered-id": format_id(info.last_delivered), "entries-read": info.entries_read,
            "lag": info.lag}


def consumers_reply(info) -> list:
    return [{"name": worker, "pending": n, "idle": info.now - seen} for worker, n, seen in info.consumers]


XINFO_HELP = [
    "XINFO <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CONSUMERS <key> <groupname>",
    "    Show consumers of <groupname>.",
    "GROUPS <key>",
    "    Show the stream consumer groups.",
    "STREAM <key> [FULL [COUNT <count>]",
    "    Show information about the stream.",
    "HELP",
    "    Prints this help.",
]


# ---------------------------------------------------------------- backup

@command("BACKUP", 2)
def backup(session, args):
    """BACKUP dest-path: a consistent copy of ezra.db, a new file in the backup directory (SQLite's backup API)."""
    dest = args[1].decode("utf-8", "surrogateescape")
    try:
        broker_of(session).admin.backup(dest)
    except StorageError as exc:
        raise errors.backup_failed(exc) from None
    return OK
