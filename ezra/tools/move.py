"""`ezra export` and `ezra import`: move tasks between EZRA and Redis (or Valkey), both ways.

    ezra export --to redis://host:port[/db] [--port N | --data-dir DIR] [--dry-run] [QUEUE ...]
    ezra import --from redis://host:port[/db] [--port N | --data-dir DIR] [--dry-run] QUEUE ...

What maps to what (docs/guides/moving-to-redis.md, docs/usage.md):

    EZRA queue q                        Redis
    available, delayed, in-flight  ->   entries of stream q, same id and fields, new to the group
    dead                           ->   entries of stream q::dead
    attempts > 0                   ->   hash q::ezra-attempts: id -> attempts (entries stay the user's)
    unique key (XADD UNIQUE)       ->   hash q::ezra-unique: id -> key (unfinished tasks: dead ones hold none)
    name (XADD NAME)               ->   hash q::ezra-names: id -> name (any state; done ones with a result too)
    a last failure (XNACK REASON)  ->   hash q::ezra-failures: id -> its JSON {cause, reason, worker, at}
    priority (XADD PRIORITY)       ->   hash q::ezra-priorities: id -> 0-9 (tasks pushed without one: none)
    waiting (XADD AFTER)           ->   an entry of q; hash q::ezra-after: id -> [[queue, id], ...] (carried_dependencies.py)
    partition (XADD PARTITION)     ->   hash q::ezra-partitions: id -> key
    settings (XCFGSET)             ->   hash q::ezra-settings, set again by import (carried_settings.py)
    progress, done tasks' results  ->   hash q::ezra-progress; stream q::ezra-done and hash q::ezra-results
                                        (carried_outcomes.py: import pushes them with PROGRESS, RESULT)
    group name (XGROUP CREATE)     ->   XGROUP CREATE q <group> 0 MKSTREAM

    Redis stream q, group g             EZRA queue q
    after g's last-delivered id    ->   available (attempts from q::ezra-attempts, else 0;
                                        pushed with UNIQUE and its key from q::ezra-unique, if any;
                                        the last failure from q::ezra-failures, sent as XADD FAILURE;
                                        PRIORITY, PARTITION, NAME from q::ezra-priorities, -partitions, -names)
    pending (XPENDING)             ->   available, attempts + its delivery count
    delivered and acked            ->   nothing: done in Redis
    stream q::dead                 ->   dead (XADD q::dead)

Ids are kept (XADD with the explicit id), so a re-run adds nothing: an id at or below the
destination stream's last id is already there. Both tools end by reading the destination
back and counting the source's ids in it. The copy code is one path: sources give pages of
`Task`s in id order, a `CheckedPipeline` sends XADDs in pipelines, `verify` walks the
destination (those pieces are in stream_copy.py). Talks RESP2 with ezra/adapters/client.py on both sides: no Redis
library needed.
"""

from __future__ import annotations

import heapq
import json
import os
import sys
from collections import Counter
from contextlib import contextmanager

import configargparse

from ..adapters.client import Client, ClientError, ReplyError, from_url
from .inspector import REPLY_SHAPE_ERRORS, connect, connection_parser, table, unexpected_reply
from .progress import Progress
from ..storage import StorageError, name_bytes
from ..protocol.task_fields import listed
from .carried_settings import SETTINGS_SUFFIX, keep_settings, restore_settings, settings_line, settings_shown
from .carried_dependencies import AFTER_SUFFIX, after_of, after_options, dependencies_line, keep_after, waits_for
from .carried_outcomes import carried_options, export_outcomes, outcomes_line, with_outcomes
from .stream_copy import (PAGE, ZERO, CheckedPipeline, Ids, MoveError, Task, failure_json, format_id, next_id,
                          own_priority, pairs, parse_id, report_verified, shown, side_hash, stream_entries,
                          stream_facts, verify)

DEAD_SUFFIX = b"::dead"
ATTEMPTS_SUFFIX = b"::ezra-attempts"
UNIQUE_SUFFIX = b"::ezra-unique"
NAMES_SUFFIX = b"::ezra-names"
FAILURES_SUFFIX = b"::ezra-failures"
PRIORITIES_SUFFIX = b"::ezra-priorities"
PARTITIONS_SUFFIX = b"::ezra-partitions"
UNFINISHED = ("available", "delayed", "in_flight", "waiting")
RELOCATED = 1 << 62  # added to the sequence of a dead entry whose id the queue's stream has too


# ---------------------------------------------------------------- export: EZRA -> Redis

class PortSource:
    """A running EZRA through its port: XINFO TASKS pages (with attempts and state), INFO for names."""

    def __init__(self, client: Client):
        self.client = client

    def queue_names(self) -> list[bytes]:
        names = []
        for line in self.client.call("INFO", "queues").splitlines():
            if line.startswith(b"queue_"):
                name = line[len(b"queue_"):].rpartition(b":")[0]
                # INFO writes ? for , CR LF and U+FFFD for bytes that are not UTF-8: such a name is
                # only trusted if it exists as shown.
                if (b"?" in name or "\ufffd".encode() in name) and not self.client.call("EXISTS", name):
                    raise MoveError(f"the queue shown as {shown(name)!r} in INFO has a name INFO cannot show "
                                    f"exactly: name the queues to export on the command line")
                names.append(name)
        return names

    def facts(self, queue: bytes) -> dict | None:
        try:
            info = pairs(self.client.call("XINFO", "STREAM", queue))
            groups = self.client.call("XINFO", "GROUPS", queue)
        except ReplyError as exc:
            if "no such key" in str(exc):
                return None
            raise
        counts = {state: info[key] for state, key in
                  (("available", b"available"), ("delayed", b"delayed"), ("in_flight", b"in-flight"),
                   ("dead", b"dead"))}
        return {"group": pairs(groups[0])[b"name"], "counts": counts, "settings": settings_shown(info)}

    def pages(self, queue: bytes, dead: bool):
        after = b"0-0"
        while True:
            page = self.client.call("XINFO", "TASKS", queue, "dead" if dead else "unfinished",
                                    "COUNT", PAGE, "AFTER", after)
            tasks = [pairs(flat) for flat in page]
            yield [Task(parse_id(t[b"id"]), t[b"state"].decode(), t[b"attempts"], t[b"fields"],
                        t.get(b"unique-key"), failure_json(t), own_priority(t.get(b"priority")), t.get(b"partition"),
                        after=waits_for(t), name=t.get(b"name")) for t in tasks]
            if len(page) < PAGE:
                return
            after = tasks[-1][b"id"]


class FileSource:
    """An ezra.db read in one read-only snapshot (storage.Snapshot): no server needed."""

    def __init__(self, data_dir: str):
        from ..storage import DB_FILENAME, Snapshot
        self.snapshot = Snapshot(os.path.join(data_dir, DB_FILENAME))

    def queue_names(self) -> list[bytes]:
        return self.snapshot.queue_names()

    def facts(self, queue: bytes) -> dict | None:
        facts = self.snapshot.queue_facts(queue)
        if facts is not None:
            facts["group"] = facts["group"] or b"default"  # what XINFO GROUPS shows for it
            facts["settings"] = None  # the file holds them, but not what the server's flags make of them
        return facts

    def close(self) -> None:
        self.snapshot.close()

    def pages(self, queue: bytes, dead: bool):
        states, after = (("dead",) if dead else UNFINISHED), ZERO
        while True:
            rows = self.snapshot.tasks_by_id(queue, states, PAGE, after)
            yield [Task((row[0], row[1]), row[-1], row[3], listed(row[2]),
                        None if row[10] is None else name_bytes(row[10]),
                        None if row[11] is None else row[11].encode(), row[12],
                        None if row[13] is None else name_bytes(row[13]),
                        after=self.snapshot.waits_for(queue, row[:2]) if row[-1] == "waiting" else None,
                        name=None if row[16] is None else name_bytes(row[16])) for row in rows]
            if len(rows) < PAGE:
                return
            after = rows[-1][:2]


def export_queue(source, redis: Client, queue: bytes, options) -> str | list:
    """Copy one queue to Redis; its summary line (a dry run: its table row). MoveError when it
    cannot be copied or does not verify."""
    facts = source.facts(queue)
    if facts is None:
        raise MoveError("no such queue in EZRA")
    dead_key, attempts_key = queue + DEAD_SUFFIX, queue + ATTEMPTS_SUFFIX
    last = {False: stream_facts(redis, queue)[1], True: stream_facts(redis, dead_key)[1]}
    stream_facts(redis, attempts_key, kinds=(b"hash",))
    stream_facts(redis, queue + UNIQUE_SUFFIX, kinds=(b"hash",))
    for suffix in (FAILURES_SUFFIX, PRIORITIES_SUFFIX, PARTITIONS_SUFFIX, SETTINGS_SUFFIX, AFTER_SUFFIX, NAMES_SUFFIX):
        stream_facts(redis, queue + suffix, kinds=(b"hash",))
    group = os.fsencode(options.group) if options.group else facts["group"]
    counts, expected = copy_to_redis(source, CheckedPipeline(None if options.dry_run else redis), queue, last,
                                     Progress(f"export {shown(queue)}", sum(facts["counts"].values())))
    unfinished = sum(counts[state] for state in UNFINISHED)
    if counts["delayed"]:
        warn("export", queue, f"{counts['delayed']} delayed task(s) become available at once "
                              "(Redis Streams have no delayed delivery)")
    if group == b"default" and not options.group and unfinished:
        warn("export", queue, "EZRA knows no group name for it (workers never ran XGROUP CREATE), so "
                              "the group is 'default'; --group NAME gives it your workers' name")
    keep_settings(redis, queue, facts["settings"], options.dry_run)
    outcomes = export_outcomes(source, redis, queue, options.dry_run, queue + NAMES_SUFFIX)
    if options.dry_run:
        return dry_row(queue, counts, group)
    if unfinished:
        create_group(redis, queue, group)
    found, total = verify(redis, [queue, dead_key], [expected[False], expected[True]])
    checked = report_verified(found, total, counts["present"], "Redis")
    return (f"{shown(queue)}: {total - counts['present']} copied, {counts['present']} already there "
            f"({counts['available']} available, {counts['delayed']} delayed, {counts['in_flight']} in flight, "
            f"{counts['dead']} dead to {shown(dead_key)}); group {shown(group)!r}; {checked}"
            + placement_line(queue, counts, "kept in", "Redis serves entries in id order, whatever their "
                                                       "priority or partition; `ezra import` restores both")
            + settings_line(queue, facts["settings"], "kept in", "Redis enforces none of them")
            + outcomes_line(queue, outcomes, "kept in", "q::ezra-done, q::ezra-results, q::ezra-progress")
            + dependencies_line(queue, counts, exported=True))


def placement_line(queue: bytes, counts: Counter, verb: str, note: str) -> str:
    """The summary's line on the tasks with a priority of their own or a partition, if any moved."""
    if not counts["priority"] and not counts["partition"]:
        return ""
    return (f"\n{shown(queue)}: {counts['priority']} with a priority {verb} {shown(queue + PRIORITIES_SUFFIX)}, "
            f"{counts['partition']} with a partition {verb} {shown(queue + PARTITIONS_SUFFIX)}; {note}")


def copy_to_redis(source, pipeline: CheckedPipeline, queue: bytes, last: dict, progress: Progress) -> tuple:
    """Both passes (unfinished tasks to q, dead ones to q::dead); (counts, {dead?: Ids})."""
    attempts_key, unique_key = queue + ATTEMPTS_SUFFIX, queue + UNIQUE_SUFFIX
    failures_key, priorities_key, partitions_key = (queue + FAILURES_SUFFIX, queue + PRIORITIES_SUFFIX,
                                                    queue + PARTITIONS_SUFFIX)
    counts, expected = Counter(), {False: Ids(), True: Ids()}
    # Dead last: on a running EZRA, a task that dies during the copy is not missed (it may then
    # be in both streams); one that is acked meanwhile is done, and may be copied all the same.
    for dead in (False, True):
        key = queue + DEAD_SUFFIX if dead else queue
        for page in source.pages(queue, dead):
            for task in page:
                counts[task.state] += 1
                expected[dead].add(task.id)
                if task.id <= last[dead]:  # explicit ids: Redis has it from an earlier run
                    counts["present"] += 1
                    continue
                if task.attempts:  # before its entry: a run cut short leaves no entry without it
                    pipeline.add([b"HSET", attempts_key, format_id(task.id), b"%d" % task.attempts])
                if task.unique_key is not None and not dead:
                    pipeline.add([b"HSET", unique_key, format_id(task.id), task.unique_key])
                if task.name is not None:
                    pipeline.add([b"HSET", queue + NAMES_SUFFIX, format_id(task.id), task.name])
                if task.failure is not None:
                    pipeline.add([b"HSET", failures_key, format_id(task.id), task.failure])
                if task.priority is not None:
                    counts["priority"] += 1
                    pipeline.add([b"HSET", priorities_key, format_id(task.id), b"%d" % task.priority])
                if task.partition is not None:
                    counts["partition"] += 1
                    pipeline.add([b"HSET", partitions_key, format_id(task.id), task.partition])
                keep_after(pipeline, queue, task, counts)
                pipeline.add([b"XADD", key, format_id(task.id), *task.fields], expected=format_id(task.id))
            pipeline.flush()
            progress.advance(len(page))
    progress.finish()
    return counts, expected


def create_group(redis: Client, queue: bytes, group: bytes) -> None:
    """The group the workers will read with, at 0: every exported entry is new to it."""
    try:
        redis.call("XGROUP", "CREATE", queue, group, "0", "MKSTREAM")
    except ReplyError as exc:
        if not str(exc).startswith("BUSYGROUP"):  # there already (a re-run): kept as it is
            raise


def dry_row(queue: bytes, counts: Counter, group: bytes) -> list:
    moved = sum(counts[state] for state in (*UNFINISHED, "dead"))
    return [shown(queue), counts["available"], counts["delayed"], counts["in_flight"], counts["dead"],
            counts["present"], moved - counts["present"], shown(group)]


def export_main(argv: list[str]) -> int:
    parser = move_parser("ezra export", "Copy EZRA's unfinished and dead tasks into Redis streams, with their "
                         "ids, and create the consumer group.", "--from-port")
    parser.add_argument("--to", required=True, metavar="redis://HOST:PORT[/DB]", help="the Redis server")
    parser.add_argument("--data-dir", default=None, metavar="DIR", help="read DIR/ezra.db (read-only, server "
                        "running or not) instead of asking the server through its port; command line only")
    parser.add_argument("queues", nargs="*", metavar="QUEUE", help="queues to copy (default: all)")
    options = parser.parse_args(argv)
    with both_ends(options, options.to) as (ezra, redis):
        source = FileSource(options.data_dir) if options.data_dir else PortSource(ezra)
        try:
            names = [os.fsencode(name) for name in options.queues] or source.queue_names()
            return run_queues("export", names, lambda queue: export_queue(source, redis, queue, options),
                              options, ["queue", "available", "delayed", "in flight", "dead", "already in Redis",
                                        "to copy", "group"], f"to {redis.address}")
        finally:
            if options.data_dir:
                source.close()


# ---------------------------------------------------------------- import: Redis -> EZRA

def redis_group(redis: Client, queue: bytes, wanted: str | None) -> dict | None:
    """The consumer group whose progress says what is done: the only one, or --group's."""
    groups = [pairs(flat) for flat in redis.call("XINFO", "GROUPS", queue)]
    if wanted is not None:
        for group in groups:
            if group[b"name"] == os.fsencode(wanted):
                return group
        raise MoveError(f"no group {wanted!r} on this stream (it has: "
                        f"{', '.join(shown(g[b'name']) for g in groups) or 'none'})")
    if len(groups) > 1:
        raise MoveError(f"{len(groups)} consumer groups ({', '.join(shown(g[b'name']) for g in groups)}): "
                        "--group names the one whose progress says what is done")
    return groups[0] if groups else None


def pending_counts(redis: Client, queue: bytes, group: bytes) -> dict:
    """{id: delivery count} of the group's pending entries (XPENDING's extended form, paged)."""
    pending, start = {}, b"-"
    while True:
        page = redis.call("XPENDING", queue, group, start, "+", PAGE)
        for raw_id, _consumer, _idle, deliveries in page:
            pending[parse_id(raw_id)] = deliveries
        if len(page) < PAGE:
            return pending
        start = next_id(page[-1][0])


def priority_of(raw: bytes) -> int:
    """A q::ezra-priorities value: what XADD PRIORITY takes, else the queue is not moved."""
    if len(raw) != 1 or not raw.isdigit():
        raise MoveError(f"its {PRIORITIES_SUFFIX.decode()} hash holds {shown(raw)!r}, not a priority (a digit "
                        "from 0 to 9)")
    return int(raw)


def redis_tasks(redis: Client, queue: bytes, group: dict | None, pending: dict, attempts: dict, keys: dict,
                failures: dict | None = None, priorities: dict | None = None, partitions: dict | None = None,
                afters: dict | None = None, names: dict | None = None):
    """Every entry of q and q::dead in id order, as Tasks: available, pending, done or dead;
    live ones with their unique key (`keys`, from q::ezra-unique); each with its last failure
    (`failures`, from q::ezra-failures), priority, partition and name (q::ezra-priorities, -partitions, -names);
    new ones with what they wait for (`afters`, from q::ezra-after)."""
    delivered = parse_id(group[b"last-delivered-id"]) if group else ZERO
    failures, priorities, partitions, afters, names = (given or {} for given in (failures, priorities, partitions,
                                                                                 afters, names))

    def live():
        for stream_id, fields in stream_entries(redis, queue):
            earlier, failure = attempts.get(stream_id, 0), failures.get(stream_id)
            placed = priorities.get(stream_id), partitions.get(stream_id)
            if stream_id > delivered:
                yield Task(stream_id, "available", earlier, fields, keys.get(stream_id), failure, *placed,
                           after=afters.get(stream_id), name=names.get(stream_id))
            elif stream_id in pending:
                yield Task(stream_id, "pending", earlier + pending[stream_id], fields, keys.get(stream_id), failure,
                           *placed, name=names.get(stream_id))
            else:
                yield Task(stream_id, "done", earlier, fields, failure=failure)

    def dead():
        for stream_id, fields in stream_entries(redis, queue + DEAD_SUFFIX):
            yield Task(stream_id, "dead", attempts.get(stream_id, 0), fields, failure=failures.get(stream_id),
                       priority=priorities.get(stream_id), partition=partitions.get(stream_id),
                       name=names.get(stream_id))

    return one_id_space(heapq.merge(live(), dead(), key=lambda task: task.id))


def one_id_space(tasks):
    """Tasks of q and q::dead, merged by id, with ids one EZRA queue can hold.

    A dead-letter stream written with `*` ids has its own ids, which may be ids of the queue's
    stream too (same millisecond). Such a dead entry gets sequence + 2**62: after every id Redis
    makes in that millisecond, before the next one, and the same on every run (a re-run finds it
    already there). It is held back until the merge passes its new id, so ids still only grow.
    """
    held, previous = [], None
    for task in tasks:
        if previous is not None and task.id == previous.id and task.state == "dead":
            heapq.heappush(held, task._replace(id=(task.id[0], task.id[1] + RELOCATED)))
            continue  # the merge is stable: the queue's entry came first and keeps the id
        while held and held[0].id < task.id:
            yield heapq.heappop(held)
        previous = task
        yield task
    while held:
        yield heapq.heappop(held)


def ezra_last_id(ezra: Client, queue: bytes) -> tuple:
    try:
        return parse_id(pairs(ezra.call("XINFO", "STREAM", queue))[b"last-generated-id"])
    except ReplyError as exc:
        if "no such key" in str(exc):
            return ZERO
        raise


def import_queue(redis: Client, ezra: Client, queue: bytes, options) -> str | list:
    """Copy one Redis stream (and its ::dead) into EZRA; its summary line (a dry run: its row)."""
    dead_key = queue + DEAD_SUFFIX
    if stream_facts(redis, queue)[0] == b"none":
        raise MoveError(f"no stream {shown(queue)} at {redis.address}")
    stream_facts(redis, dead_key)
    has_attempts = stream_facts(redis, queue + ATTEMPTS_SUFFIX, kinds=(b"hash",))[0] == b"hash"
    has_keys = stream_facts(redis, queue + UNIQUE_SUFFIX, kinds=(b"hash",))[0] == b"hash"
    group = redis_group(redis, queue, options.group)
    name = group[b"name"] if group else None
    pending = pending_counts(redis, queue, name) if group else {}
    attempts = side_hash(redis, queue + ATTEMPTS_SUFFIX) if has_attempts else {}
    keys = side_hash(redis, queue + UNIQUE_SUFFIX, bytes) if has_keys else {}
    has_failures = stream_facts(redis, queue + FAILURES_SUFFIX, kinds=(b"hash",))[0] == b"hash"
    failures = side_hash(redis, queue + FAILURES_SUFFIX, bytes) if has_failures else {}
    has_priorities = stream_facts(redis, queue + PRIORITIES_SUFFIX, kinds=(b"hash",))[0] == b"hash"
    priorities = side_hash(redis, queue + PRIORITIES_SUFFIX, priority_of) if has_priorities else {}
    has_partitions = stream_facts(redis, queue + PARTITIONS_SUFFIX, kinds=(b"hash",))[0] == b"hash"
    partitions = side_hash(redis, queue + PARTITIONS_SUFFIX, bytes) if has_partitions else {}
    has_after = stream_facts(redis, queue + AFTER_SUFFIX, kinds=(b"hash",))[0] == b"hash"
    afters = side_hash(redis, queue + AFTER_SUFFIX, after_of) if has_after else {}
    names = side_hash(redis, queue + NAMES_SUFFIX, bytes) \
        if stream_facts(redis, queue + NAMES_SUFFIX, kinds=(b"hash",))[0] == b"hash" else {}
    settings = restore_settings(redis, ezra, queue, options.dry_run)
    carried = Counter()  # results and progress values (carried_outcomes.py)
    tasks = with_outcomes(redis, queue, redis_tasks(redis, queue, group, pending, attempts, keys, failures,
                                                    priorities, partitions, afters, names), carried, names)
    progress = Progress(f"import {shown(queue)}", redis.call("XLEN", queue) + redis.call("XLEN", dead_key))
    counts, expected = copy_to_ezra(tasks, CheckedPipeline(None if options.dry_run else ezra), queue,
                                    ezra_last_id(ezra, queue), progress)
    if counts["relocated"]:
        warn("import", queue, f"{counts['relocated']} dead entr{'y' if counts['relocated'] == 1 else 'ies'} of "
                              f"{shown(dead_key)} had an id of {shown(queue)} too: given sequence + 2^62 "
                              "(ms-seq becomes ms-(seq+4611686018427387904))")
    if counts["key shared"]:
        warn("import", queue, f"{counts['key shared']} task(s) had a unique key an earlier task of the stream "
                              "has too: pushed without it (EZRA holds one unfinished task per key)")
    unseen = len(pending) - counts["pending"]
    if unseen:
        warn("import", queue, f"{unseen} pending entr{'y is' if unseen == 1 else 'ies are'} no longer in the "
                              "stream (deleted in Redis): nothing to copy for them")
    if options.dry_run:
        return [shown(queue), counts["available"], counts["pending"], counts["done"], counts["dead"],
                counts["present"], len(expected) - counts["present"], shown(name) if name else ""]
    if name is not None and len(expected):
        ezra.call("XGROUP", "CREATE", queue, name, "0", "MKSTREAM")  # EZRA keeps the group's name
    found, total = verify(ezra, [queue, dead_key], [expected])
    checked = report_verified(found, total, counts["present"], "EZRA")
    return (f"{shown(queue)}: {total - counts['present']} copied, {counts['present']} already there "
            f"({counts['available']} new, {counts['pending']} pending (their delivery counts added to "
            f"attempts), {counts['dead']} dead; {counts['done']} done in Redis, not copied); "
            f"{f'group {shown(name)!r}' if name else 'no group'}; {checked}"
            + placement_line(queue, counts, "from", "pushed with XADD PRIORITY and PARTITION")
            + settings_line(queue, settings, "from", "set with XCFGSET")
            + outcomes_line(queue, carried, "from", "pushed with XADD RESULT (done) and PROGRESS")
            + dependencies_line(queue, counts, exported=False))


def copy_to_ezra(tasks, pipeline: CheckedPipeline, queue: bytes, last: tuple, progress: Progress) -> tuple:
    """Push every task not done in Redis, in id order (EZRA's ids only grow); (counts, Ids)."""
    dead_key = queue + DEAD_SUFFIX
    counts, expected, previous, keys = Counter(), Ids(), None, set()
    for task in tasks:
        if task.id == previous:
            raise MoveError(f"id {format_id(task.id).decode()} is in both {shown(queue)} and {shown(dead_key)}: "
                            "one EZRA queue has one task per id")
        previous = task.id
        counts[task.state] += 1
        counts["relocated"] += task.state == "dead" and task.id[1] >= RELOCATED
        progress.advance()
        if task.state == "done":
            continue
        expected.add(task.id)
        if task.id <= last:  # explicit ids: EZRA has it from an earlier run
            counts["present"] += 1
            continue
        attempts = [b"ATTEMPTS", b"%d" % task.attempts] if task.attempts else []
        unique = []
        if task.unique_key is not None and task.state != "dead":
            if task.unique_key in keys:  # Redis kept two with one key: the first keeps it
                counts["key shared"] += 1
            else:
                keys.add(task.unique_key)
                unique = [b"UNIQUE", task.unique_key]
        if task.failure is not None:
            attempts += [b"FAILURE", task.failure]
        if task.priority is not None:
            counts["priority"] += 1
            attempts += [b"PRIORITY", b"%d" % task.priority]
        if task.partition is not None:
            counts["partition"] += 1
            attempts += [b"PARTITION", task.partition]
        attempts += carried_options(task)
        attempts += [] if task.name is None else [b"NAME", task.name]
        attempts += after_options(pipeline, task, counts)  # XADD AFTER, from q::ezra-after
        pipeline.add([b"XADD", dead_key if task.state == "dead" else queue, *attempts, *unique, format_id(task.id),
                    *task.fields], expected=format_id(task.id))
    pipeline.flush()
    progress.finish()
    return counts, expected


def import_main(argv: list[str]) -> int:
    parser = move_parser("ezra import", "Copy Redis streams used as queues into EZRA: new and pending "
                         "entries become available tasks, q::dead entries dead ones; ids kept.", "--to-port")
    parser.add_argument("--from", dest="source", required=True, metavar="redis://HOST:PORT[/DB]",
                        help="the Redis server")
    parser.add_argument("--data-dir", default=None, metavar="DIR", help="import into this data directory with "
                        "EZRA stopped (EZRA runs inside this program meanwhile) instead of through a running "
                        "server's port; command line only")
    parser.add_argument("queues", nargs="+", metavar="QUEUE", help="streams to copy")
    options = parser.parse_args(argv)
    with both_ends(options, options.source, embedded=bool(options.data_dir)) as (ezra, redis):
        names = [os.fsencode(name) for name in options.queues]
        return run_queues("import", names, lambda queue: import_queue(redis, ezra, queue, options), options,
                          ["queue", "new", "pending", "done in Redis", "dead", "already in EZRA", "to copy",
                           "group"], f"from {redis.address}")


# ---------------------------------------------------------------- the programs around them

class MoveParser(configargparse.ArgParser):
    """The server's config file names the server's data directory: --data-dir, which switches
    the tools away from the port, is taken from the command line only."""

    def get_possible_config_keys(self, action):
        return [] if action.dest == "data_dir" else super().get_possible_config_keys(action)


def move_parser(prog: str, description: str, port_alias: str):
    parser = connection_parser(prog, description, port_flags=("--port", port_alias), parser_class=MoveParser)
    add = parser.add_argument
    add("--group", default=None, help="the consumer group (export: its name in Redis, default the one EZRA "
        "knows; import: required when a stream has several)")
    add("--dry-run", action="store_true", help="count what would be copied, per queue; write nothing")
    # --timeout (from connection_parser) bounds each wait for EZRA and for Redis alike
    return parser


@contextmanager
def both_ends(options, url: str, embedded: bool = False):
    """(EZRA's client or None for export --data-dir, Redis's client); closed on the way out,
    and EZRA started in this program (import --data-dir) stopped."""
    server, clients = None, []
    try:
        if embedded:
            server = start_embedded(options.data_dir)
            clients.append(Client("127.0.0.1", server.port, options.timeout))
        else:
            clients.append(connect(options) if options.data_dir is None else None)
        clients.append(from_url(url, options.timeout))
        yield clients
    finally:
        for client in clients:
            if client is not None:
                client.close()
        if server is not None:
            server.stop()


def start_embedded(data_dir: str):
    """EZRA on `data_dir` inside this program, on a free loopback port; refused while another
    process has the database open (a running server would not see the tasks added under it)."""
    from loguru import logger

    from ..embed import Server
    from ..storage import DB_FILENAME, DataDirLocked, database_in_use
    path = os.path.join(data_dir, DB_FILENAME)
    in_use = "import through its port instead (--port), or stop it first"
    if os.path.exists(path) and database_in_use(path):
        raise MoveError(f"{path} is in use (is EZRA running on it?): {in_use}")
    logger.remove()  # the embedded server's start and stop lines are not this program's news
    logger.add(sys.stderr, level="WARNING", format="{level}: ezra: {message}")
    try:
        return Server(data_dir=data_dir, port=0, bind="127.0.0.1").start()  # it takes the directory's lock
    except DataDirLocked as exc:  # a server holds the directory, its file not open yet (or a reader has it)
        raise MoveError(f"{str(exc).split(';')[0]}: {in_use}") from None


def warn(tool: str, queue: bytes, message: str) -> None:
    print(f"ezra {tool}: warning: {shown(queue)}: {message}", file=sys.stderr)


def run_queues(tool: str, names: list[bytes], move, options, headers: list[str], where: str) -> int:
    """Move each queue; failures are reported and the rest go on. Exit 1 if any failed."""
    failed, rows = 0, []
    for queue in names:
        try:
            result = move(queue)
        except MoveError as exc:
            failed += 1
            print(f"ezra {tool}: {shown(queue)}: {exc}", file=sys.stderr)
            continue
        if options.dry_run:
            rows.append(result)
        else:
            print(result, flush=True)
    if options.dry_run:
        print(f"dry run, nothing written; what ezra {tool} would copy {where}:")
        print(table(headers, rows, right=set(range(1, len(headers) - 1))) if rows else "(no queues)")
    elif not names:
        print("no queues to move")
    return 1 if failed else 0


def run(main, argv: list[str]) -> int:
    """Errors that stop the whole program (unreachable server, unreadable file) become one line."""
    tool = "export" if main is export_main else "import"
    try:
        return main(argv)
    except (ClientError, ReplyError, StorageError, MoveError) as exc:
        print(f"ezra {tool}: {exc}", file=sys.stderr)
        return 1
    except REPLY_SHAPE_ERRORS as exc:
        print(f"ezra {tool}: {unexpected_reply(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"ezra {tool}: interrupted; a re-run carries on where this one stopped", file=sys.stderr)
        return 130


SUBCOMMANDS = {"export": export_main, "import": import_main}
