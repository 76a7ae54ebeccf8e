"""Operators' side of the broker: settings, redrive, XACKDEL, figures, backup.

    configure      XCFGSET and the config file's queue lines: stored in `queues`, applied at once
                   (PAUSED 0 hands the queue's available tasks to its blocked workers in that batch)
    requeue        XREQUEUE: dead tasks back to available, attempts reset, in one statement
    ack_delete     XACKDEL: ack and drop the record
    stream_info    the figures behind XINFO STREAM / GROUPS / CONSUMERS
    figures        one snapshot of the figures across queues (`Figures`): INFO, /metrics and the
                   dashboard each format it their own way
    backup         SQLite's online backup API on a native thread; writers carry on meanwhile.
                   It writes only a new file inside the backup directory (--backup-dir, else
                   the data directory): anyone who can send commands can run it.
"""

from __future__ import annotations

import heapq
import math
import os
from dataclasses import dataclass
from operator import itemgetter

from gevent import get_hub
from loguru import logger

from .. import errors, lifecycle
from ..protocol import stream_ids
from ..lifecycle import AVAILABLE, DEAD, DONE, GONE, IN_FLIGHT
from ..settings.queue_settings import backoff_text, number, optional_seconds
from ..storage import StorageError, backup_database, reads
from ..storage.reads import task_by_id
from ..storage.dependencies import task_dependencies
from ..protocol.task_fields import UNREADABLE
from ..protocol.stream_ids import TOP
from .flow import FLOW_COLUMNS
from ..writer.transactions import transaction
from .in_flight import APART_LEASES, ROWID, pel_of

LIVE_STATES = (AVAILABLE, lifecycle.DELAYED, IN_FLIGHT, DONE, lifecycle.WAITING)  # what XRANGE shows of a queue
STREAM_NODE_ENTRIES = 100  # Redis's stream-node-max-entries: XINFO's radix-tree figures estimate it
ALL_QUEUES = "all"  # figures(ALL_QUEUES): every queue's figures


@dataclass(slots=True)
class StreamInfo:
    """One queue's figures behind XINFO STREAM / GROUPS / CONSUMERS, as plain values: ids as
    (ms, seq), tasks as storage rows, times in ms (commands/ops.py names them as Redis does)."""

    now: int
    length: int                 # tasks not done (XLEN)
    stream_nodes: int           # the radix-tree nodes a Redis stream of these entries would have
    last_id: tuple
    max_deleted: tuple
    entries_added: int
    first: tuple | None         # the oldest task row shown by XRANGE, the newest, or None
    last: tuple | None
    group: bytes                # the one implicit group's name
    pending: int                # tasks in flight
    last_delivered: tuple
    entries_read: int
    lag: int
    consumers: list             # [(worker, tasks held, last seen at ms)]
    idmp: tuple                 # (duration s, max size) of the idempotent producers
    pids_tracked: int
    iids_tracked: int
    iids_added: int
    iids_duplicates: int
    counts: dict                # {state: tasks}
    settings: dict              # {setting: value as XCFGSET takes it}
    entries: list | None = None  # XINFO STREAM FULL: the task rows
    pel: list | None = None      # ...and the pending ones: [(id, worker, delivered at ms, deliveries)]


# Counters, one word per idea:
#   counts   tasks in each state now (QueueState.counts: available, delayed, in_flight, done, dead)
#   totals   how many times each event happened since start: QueueState.totals per queue, and
#            Figures.totals in all (Queues.totals; queues.TALLIES names the events)
#   figures  a snapshot of counts, totals and the writer's numbers (Figures): INFO, /metrics, dashboard
# "stats" is only what users see: INFO's Stats section (Redis's name) and `ezra stats`.
@dataclass(slots=True)
class Figures:
    """A snapshot of the broker's figures (Admin.figures): plain values, safe to format on any thread."""

    now: int                    # ms since the epoch, when it was taken
    queues: dict                # {name: {"counts", "totals", "paused", "head_since"}}: the queues asked for
    rest: dict | None           # with busiest: {"counts", "totals", "paused"} summed over the other queues
    queue_count: int            # queues in all
    totals: dict[str, int]      # events since start (queues.TALLIES), all queues (Queues.totals)
    blocked: int                # blocked XREADGROUPs and XREADs
    database_bytes: int         # ezra.db and its WAL
    batches: int                # the writer's committed batches (transactions)
    committed_requests: int     # requests in them
    fsyncs: int                 # fsyncs of the WAL
    disk_full: bool             # pushes are refused until there is room
    unreadable_tasks: int       # tasks whose rows cannot be read: set aside at start, or left out of replies
    batch_sizes: tuple          # histograms, each (cumulative buckets, sum): requests per batch,
    commit_seconds: tuple       # seconds per COMMIT,
    fsync_seconds: tuple | None  # seconds per fsync (None: --durability normal does not fsync per commit)


class Admin:
    """The operators' transactions and the figures, over the file, the queues and the writer."""

    def __init__(self, db, queues, in_flight, transitions, waiters, observers, writer, settings, clock):
        self.db = db
        self.queues = queues
        self.in_flight = in_flight
        self.transitions = transitions
        self.waiters = waiters
        self.observers = observers
        self.writer = writer
        self.settings = settings
        self.clock = clock

    # ------------------------------------------------------------ greenlet API

    def stream_info(self, queue: bytes, full_count: int | None = None, apart: bool = True):
        """The figures of XINFO STREAM / GROUPS / CONSUMERS (a StreamInfo); ERR no such key if none.

        The idempotent producers are counted row by row (300,000 producer ids: 123 ms), so they
        are read apart (storage.reads, on a native thread) unless `apart` is False (inside EXEC,
        which cannot wait). The workers holding tasks are the leases' (in memory); FULL's pending
        list among more than APART_LEASES is picked on a thread too, from a copy of them."""
        idmp = pel = None
        held = self.queues.get(queue)  # a plain read between batches
        if apart and held is not None:
            idmp = self.read_apart(reads.idmp_tracked, queue, self.clock())
            if full_count is not None and len(held.leases) > APART_LEASES:
                leases, now = self.leases_copy(queue).wait()
                pel = get_hub().threadpool.apply(pel_of, (leases, now, full_count or -1))
        return self._stream_info(queue, full_count, idmp, pel)

    def task(self, queue: bytes, task_id: tuple) -> tuple | None:
        """One task by id (storage.INSPECT_COLUMNS + state), or None: the dashboard's task page.
        Read apart, on a native thread: a page load never waits in the writer's queue nor holds it."""
        return self.read_apart(task_by_id, queue, task_id)

    def task_dependencies(self, queue: bytes, task_id: tuple) -> tuple[list, list]:
        """XADD AFTER's edges of one task, both ways (the dashboard's task page), read apart as `task`."""
        return self.read_apart(task_dependencies, queue, task_id)

    def figures(self, queues=(), head_since: bool = True, busiest: int | None = None) -> Figures:
        """The broker's figures in one snapshot, taken on the event loop in one go (INFO, /metrics,
        the dashboard). Per-queue figures cost per queue, so the caller says which it needs:

            queues=()            none (and no writer round trip: nothing to look up)
            queues=ALL_QUEUES    every queue (INFO)
            queues=[names...]    those of them that exist (a dashboard page)
            busiest=n            the n queues with the most unfinished tasks (ties by name; never
                                 the queue named "", whose label is the rest's), the others summed
                                 in `rest` (/metrics)

        head_since=False skips the one index lookup per queue shown that it costs (INFO)."""
        if not queues and busiest is None:
            return Admin._figures.body(self, queues, head_since, busiest)
        return self._figures(queues, head_since, busiest).wait()

    def backup(self, dest_path: str) -> dict:
        """BACKUP: copy the live database (SQLite online backup) to a new file in the backup
        directory, with every write submitted before it; the copy's counts by state."""
        allowed = self.settings.backup_dir or os.path.dirname(self.db.path)
        dest = backup_path(allowed, dest_path)
        # The copy runs on a thread with its own connection: it sees what has committed, and
        # writes submitted before this BACKUP (pipelined on this connection) may still be queued.
        self.writer.barrier()
        counts, error = get_hub().threadpool.apply(_backup_on_thread, (self.db.path, dest))
        if error is not None:
            raise error
        return counts

    def read_apart(self, query, *args):
        """`query(conn, *args)` (storage.reads) on a native thread with a connection of its own, once
        every write this greenlet submitted has committed: the event loop serves others meanwhile."""
        self.writer.barrier()
        result, error = get_hub().threadpool.apply(_read_on_thread, (self.db.path, query, args))
        if error is not None:
            logger.opt(exception=error).error("reading {} apart failed: {}", query.__name__, error)
            raise errors.storage_failed(str(error))
        return result

    # ------------------------------------------------------------ transactions (writer/transactions.py)

    @transaction(grows=True)
    def configure(self, name: bytes, changes: dict) -> bool:
        """XCFGSET: apply and store settings ({column: value}); creates the queue if needed."""
        now = self.clock()
        queue = self.transitions.queue(name, now)
        idmp_before, paused_before = queue.idmp_limits(), queue.is_paused()
        queue.configured(changes)  # retention may have changed: the reaper looks again
        flow_changed = any(column in FLOW_COLUMNS for column in changes) or "partition_limit" in changes
        if queue.idmp_limits() != idmp_before:
            self.db.producers.forget(name)  # as Redis: other IDMP limits start from an empty map
        self.db.save_settings(name, changes)
        if queue.is_paused() != paused_before:
            logger.info("queue {!r} {}", name.decode("utf-8", "replace"),
                        "paused: pushes land, nothing is handed out" if queue.is_paused() else "resumed")
            self.transitions.serve_waiters(queue, now)  # resumed: blocked workers get its tasks now
        elif flow_changed:
            self.transitions.serve_waiters(queue, now)  # a limit raised or gone: they may get some now
        if flow_changed:
            self.transitions.window_full(queue, now)  # a window full under the new limit: its opening
        return True

    @transaction()
    def requeue(self, name: bytes, ids: list[tuple] | None) -> int:
        """XREQUEUE: dead tasks (these ids, or all with None) back to available; how many moved."""
        queue = self.queues.get(name)
        if queue is None or not queue.counts[DEAD]:
            return 0
        now = self.clock()
        self._release_held_keys(name, ids)
        rows = self.db.requeue(name, ids, now)
        waiting = ()
        if self.transitions.dependencies.any:  # a task that waited (XADD AFTER) waits again, or stays dead
            rows, waiting = self.transitions.dependencies.requeued(rows, now)
            if waiting:
                queue.move(DEAD, lifecycle.WAITING, len(waiting))
        moved = len(rows)
        queue.move(DEAD, AVAILABLE, moved)
        for rowid, priority, partition in rows:
            self.transitions.became_available(queue, rowid, (priority, partition))
        queue.tally("requeued", moved + len(waiting))
        self.transitions.serve_waiters(queue, now)
        return moved + len(waiting)

    def _release_held_keys(self, name: bytes, ids: list[tuple] | None) -> None:
        """XADD UNIQUE: a dead task whose key is held meanwhile (by a task pushed with it since, or by
        an older dead task requeued with it) is requeued without its key rather than refused: the
        requeue asked for the work to run again, and refusing it would leave it dead for good."""
        unique_keys = self.db.unique_keys
        released = unique_keys.release_all_dead(name) if ids is None else unique_keys.release_dead(name, ids)
        if released:
            logger.warning("XREQUEUE {!r}: {} task(s) requeued without their unique key, which another "
                           "unfinished task holds (the first: {})", name.decode("utf-8", "replace"),
                           len(released), stream_ids.format_id(min(released)).decode())

    @transaction(durable=False)
    def tasks(self, name: bytes, state: str, count: int, after: tuple = (0, 0)) -> list[tuple]:
        """Up to `count` tasks of one state (storage.INSPECT_COLUMNS rows): XINFO TASKS, the dashboard, ezra
        export. "unfinished": available, delayed and in-flight ones in id order, each row ending with its state."""
        if name not in self.queues:
            raise errors.NO_SUCH_KEY
        if state == "unfinished":  # ezra export's one pass in id order: rows carry their state
            return self.db.tasks_by_id(name, lifecycle.UNFINISHED, count, after)
        queue = self.queues[name]
        if state == IN_FLIGHT:  # the leases say which, in id order
            held = queue.leases.first(count, [pair for pair in queue.leases.items() if pair[0] > after])
            return self.db.tasks_by_rowid([lease[ROWID] for _, lease in held]) if held else []
        # Done tasks are in no index: their listing also walks down from the oldest available task.
        head = self.transitions.order(queue).head() if state == DONE else None
        return self.db.tasks_in_state(name, state, count, after, head)

    @transaction(durable=False)
    def tasks_and_waits(self, name: bytes, state: str, count: int, after: tuple = (0, 0)) -> tuple[list, dict]:
        """XINFO TASKS waiting or unfinished: `tasks`'s rows, and {task id: [(queue, id)]}: what each waiting
        one among them waits for (XADD AFTER; ezra export carries it)."""
        rows = Admin.tasks.body(self, name, state, count, after)
        if state == lifecycle.WAITING or state == "unfinished" and any(row[-1] == lifecycle.WAITING for row in rows):
            return rows, self.transitions.dependencies.waits_of(name, [row[:2] for row in rows
                                                                    if state != "unfinished" or row[-1] == lifecycle.WAITING])
        return rows, {}

    @transaction(durable=False)
    def leases_copy(self, name: bytes) -> tuple[dict, int]:
        """A copy of the queue's leases and the time now, for a pick among many on a native thread."""
        return self.in_flight.copy(name)

    @transaction(durable=False)
    def _figures(self, queues, head_since: bool, busiest: int | None) -> Figures:
        rest = None
        if busiest is not None:
            queues, rest = self._busiest(busiest)
        writer = self.writer
        return Figures(
            now=self.clock(), queues=self._queue_figures(queues, head_since), rest=rest,
            queue_count=len(self.queues), totals=dict(self.queues.totals), blocked=self.waiters.count() + self.observers.count(),
            database_bytes=self.db.bytes_on_disk(), batches=writer.batches,
            committed_requests=writer.committed_requests, fsyncs=writer.fsyncs, disk_full=writer.disk_full,
            unreadable_tasks=self.db.hand_rows.set_aside + UNREADABLE.count,
            batch_sizes=_copy(writer.batch_sizes), commit_seconds=_copy(writer.commit_seconds),
            fsync_seconds=None if writer.fsync_seconds is None else _copy(writer.fsync_seconds))

    def _queue_figures(self, names, head_since: bool) -> dict:
        queues = self.queues.items() if names == ALL_QUEUES else \
            [(name, self.queues[name]) for name in names if name in self.queues]
        now = self.clock()
        return {name: {"counts": dict(queue.counts), "totals": dict(queue.totals), "paused": queue.is_paused(),
                       "held_back": queue.held_back(now),  # None, or flow.PAUSED, CAP, RATE
                       # when the next task to deliver became available (ms): how long it waits
                       "head_since": self._head_since(queue) if head_since and queue.counts[AVAILABLE] else None,
                       # after _head_since, which builds the order if no claim did
                       "partitions": queue.partitions_with_work()}  # None: no task has a partition or priority
                for name, queue in queues}

    def _head_since(self, queue) -> int | None:
        """When the queue's next task to deliver became available (ms). Its order is built for it
        if no claim built it yet, except on a corrupt file, which the build could meet: the
        figures go on without it there."""
        if queue.order is None and self.db.integrity.corrupt:
            return None
        return self.db.head_available_since(self.transitions.order(queue).head())

    def _busiest(self, count: int) -> tuple[list[bytes], dict | None]:
        """The names of the `count` busiest queues, and the others' figures summed (None: no others)."""
        # Plain reads of what the broker keeps, no query but one index lookup per queue shown:
        # 10,000 queues rank and sum in a few milliseconds.
        def rank(queue):
            counts = queue.counts
            return -(counts[AVAILABLE] + counts[lifecycle.DELAYED] + counts[IN_FLIGHT] + counts[DEAD]
                     + counts[lifecycle.WAITING]), queue.name
        shown = [queue.name for queue in heapq.nsmallest(
            count, (queue for name, queue in self.queues.items() if name), key=rank)]
        shown_set = set(shown)
        rest = [queue for name, queue in self.queues.items() if name not in shown_set]
        counts, totals = [queue.counts for queue in rest], [queue.totals for queue in rest]
        return shown, None if not rest else {
            "counts": {state: sum(map(itemgetter(state), counts)) for state in lifecycle.COUNTED},
            "totals": {tally: sum(map(itemgetter(tally), totals)) for tally in totals[0]},
            "paused": sum(1 for queue in rest if queue.is_paused())}

    @transaction()
    def ack_delete(self, name: bytes, ids: list[tuple]) -> list[bool]:
        """XACKDEL: per id, True (acked and deleted) or False (not in flight nor done)."""
        queue = self.queues.get(name)
        if queue is None:
            return [False] * len(ids)
        replies, deleted = [], []
        for task_id in ids:
            state, rowid, _, _ = self.db.delete_by_id(name, task_id, (IN_FLIGHT, DONE)) or (None, None, None, None)
            if state is None:
                replies.append(False)
                continue
            queue.move(state, GONE)
            if state == IN_FLIGHT:
                self.in_flight.ended(queue, task_id)
                if queue.lanes_on:  # its partition has room again (lanes.py)
                    self.transitions.lease_ended(queue, rowid)
                queue.tally("acked")
                if self.transitions.dependencies.any:  # acked: tasks waiting for it may go (XADD AFTER)
                    self.transitions.dependencies.finished([rowid], self.clock())
            deleted.append(task_id)
            replies.append(True)
        self.transitions.note_deleted(queue, deleted)
        if (queue.flow is not None or queue.lanes_on) and name in self.waiters.blocked:  # a slot freed
            self.transitions.serve_waiters(queue, self.clock())
        return replies

    @transaction(durable=False)
    def _stream_info(self, name: bytes, full_count: int | None, idmp: tuple | None,
                     pel: list | None = None) -> StreamInfo:
        queue = self.queues.get(name)
        if queue is None:
            raise errors.NO_SUCH_KEY
        now = self.clock()
        if idmp is None:  # in the transaction (EXEC)
            idmp = self.db.producers.tracked(name, now)
        consumers = self.in_flight.consumers(queue)
        info = StreamInfo(now=now, **self._stream_figures(queue), **self._group_figures(queue, now, consumers),
                          **self._ezra_figures(queue, idmp))
        if full_count is not None:  # XINFO STREAM FULL: the entries and the pending list too
            limit = full_count or None
            info.entries = self.db.range(name, LIVE_STATES, (0, 0), TOP, limit, False)
            info.pel = pel_of(queue.leases, now, limit or -1) if pel is None else pel
        return info

    def _stream_figures(self, queue) -> dict:
        """What Redis 7's XINFO STREAM fields say, as they read for a queue."""
        counts = queue.counts
        first = self.db.range(queue.name, LIVE_STATES, (0, 0), TOP, 1, False)
        last = self.db.range(queue.name, LIVE_STATES, (0, 0), TOP, 1, True)
        nodes = math.ceil(sum(counts[state] for state in LIVE_STATES) / STREAM_NODE_ENTRIES)
        return {
            "length": sum(counts[state] for state in lifecycle.UNFINISHED), "stream_nodes": nodes,
            "last_id": queue.last_id, "max_deleted": queue.max_deleted,
            "entries_added": sum(counts.values()) + queue.deleted,
            "first": first[0] if first else None, "last": last[0] if last else None,
        }

    def _group_figures(self, queue, now: int, consumers: list[tuple]) -> dict:
        """The one implicit group, and the workers holding its tasks (XINFO GROUPS / CONSUMERS)."""
        if queue.last_delivered is None:  # not known since start: ask the file once
            queue.last_delivered_read(self.db.last_delivered(queue.name) or (0, 0))
        waiting = queue.counts[AVAILABLE] + queue.counts[lifecycle.DELAYED] + queue.counts[lifecycle.WAITING]
        return {
            "group": queue.group or b"default",
            "pending": queue.counts[IN_FLIGHT],
            "last_delivered": queue.last_delivered,
            "entries_read": sum(queue.counts.values()) + queue.deleted - waiting,
            "lag": waiting,
            "consumers": [(worker, n, min(seen or now, now)) for worker, n, seen in consumers],
        }

    def _ezra_figures(self, queue, idmp: tuple[int, int]) -> dict:
        """Redis 8.6's idempotency figures, EZRA's counts by state and the settings in force."""
        pids, iids = idmp
        return {
            "idmp": queue.idmp_limits(), "pids_tracked": pids, "iids_tracked": iids,
            "iids_added": queue.iids_added, "iids_duplicates": queue.iids_duplicates,
            "counts": dict(queue.counts), "settings": self._settings_shown(queue),
        }

    def _settings_shown(self, queue) -> dict:
        """Every setting as it applies now, in the text XCFGSET takes (XINFO STREAM)."""
        return {
            "visibility-timeout": number(queue.lease_seconds()),
            "max-attempts": str(queue.attempts_allowed()),
            "retention": optional_seconds(queue.retention(), "forever"),
            "backoff": backoff_text(queue.backoff_policy()),
            "release-on-disconnect": optional_seconds(queue.release_grace(), "off"),
            "paused": "1" if queue.is_paused() else "0",
            **self._flow_shown(queue),
        }

    def _flow_shown(self, queue) -> dict:
        """MAX-IN-FLIGHT and RATE-LIMIT, shown only where set: other queues' replies stay as they were."""
        shown = {}
        if queue.max_in_flight is not None:
            shown["max-in-flight"] = str(queue.max_in_flight)
        if queue.rate_limit_count is not None:
            shown["rate-limit"] = f"{queue.rate_limit_count} {number(queue.rate_limit_seconds)}"
        if queue.partition_limit is not None:
            shown["partition-limit"] = str(queue.partition_limit)
        if shown:
            shown["held-back"] = queue.held_back(self.clock()) or "no"
        return shown


def _copy(histogram) -> tuple:
    """A histogram.Histogram's figures as they are now: (cumulative buckets, sum)."""
    return histogram.cumulative(), histogram.sum


def _backup_on_thread(source: str, dest: str) -> tuple[dict | None, StorageError | None]:
    """The error is returned, raised on the loop: gevent prints a traceback for one a pool task raises."""
    try:
        return backup_database(source, dest), None
    except StorageError as exc:
        return None, exc


def _read_on_thread(path: str, query, args: tuple) -> tuple:
    """(result, None) or (None, the error): raised on the loop, as _backup_on_thread's."""
    try:
        return reads.read_apart(path, query, *args), None
    except Exception as exc:  # sqlite3's errors, an I/O error: the command answers it, the log has it
        return None, exc


def backup_path(allowed_dir: str, requested: str) -> str:
    """Where BACKUP may write `requested`: a new file's path inside allowed_dir, links resolved.

    A relative path is taken in allowed_dir. The directory that will hold the copy is
    resolved (`..`, symbolic links) and must be allowed_dir or below it; the copy is written
    under a new temporary name (O_EXCL | O_NOFOLLOW) and then linked to the final name, which
    fails if anything is there (storage.backup_database): an existing file or a link there is
    never written through.
    """
    if "\0" in requested:
        raise errors.backup_refused("a path cannot hold a NUL byte")
    base = os.path.realpath(allowed_dir)
    head, name = os.path.split(os.path.join(base, requested))
    if name in ("", ".", ".."):
        raise errors.backup_refused(f"{requested!r} does not name a new file")
    parent = os.path.realpath(head)
    if os.path.commonpath([base, parent]) != base:
        raise errors.backup_refused(f"{requested!r} is outside the backup directory {base} "
                                    "(set by --backup-dir, else the data directory)")
    if not os.path.isdir(parent):
        raise errors.backup_refused(f"no such directory {parent}")
    return os.path.join(parent, name)
