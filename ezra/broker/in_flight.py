"""The tasks in flight, kept in memory: each one's row, who holds it, until when, since when and
its deliveries so far.

The file keeps no index of tasks in flight (schema 12 dropped `tasks_in_flight`: a B-tree, and a
WAL page a commit, written by every claim and every ack). What that index served is read here
instead: an ack finds its task here (then its row by row id), and so do XNACK, XPENDING, XINFO
CONSUMERS, XREADGROUP with an id, XAUTOCLAIM, XREADGROUP CLAIM, the reaper's expiry and a gone
worker's release. The rows still say the same (state, worker, deadline, delivered_at,
attempts): the file stays the record, for people and for the next start.

    QueueLeases   one queue's leases (QueueState.leases): task id (ms, seq) -> a lease, the
                  plain tuple (rowid, worker, deadline, delivered_at, attempts). A lease is
                  never changed in place: a renewal or a take-over puts a new one.
    InFlight      every change to them, journaled while a writer's batch is under way so that
                  a rollback undoes it (the batch journal, journal.py); the deadlines, soonest
                  first; the reads.

Start-up: recovery has made every task in flight available again, so there is nothing to
read; a file opened without recovery (tests, tools) is read once (`load`). A lease costs about
330 bytes of memory (tracemalloc; Redis keeps its pending entries in memory too).

Expiry: a heap of (deadline, entry number, queue name, task ids), soonest first. Every
HORIZON_MS, when the reaper looks, it is built anew from all the leases; a lease given
between two builds goes into it only if it runs out before the next build (a short
visibility timeout): a worker's usual claim costs the heap nothing. An entry whose lease has
since ended or been renewed is passed over when it comes up (a lease is an entry's while its
queue maps the id to a lease with the entry's deadline), and dropped by the next build.
"""

from __future__ import annotations

import heapq
from collections import Counter
from itertools import count
from operator import itemgetter

from ..lifecycle import IN_FLIGHT
from ..protocol.stream_ids import TOP
from ..storage import name_bytes

# A lease's fields (the tuple's positions)
ROWID, WORKER, DEADLINE, DELIVERED_AT, ATTEMPTS = range(5)
# XPENDING's and XINFO STREAM FULL's pick among more leases runs on a thread, from a copy (`copy`)
APART_LEASES = 10_000
HORIZON_MS = 5000  # the deadline heap is built from every lease this often (while any is held)
COMPACT_MIN = 1024  # ...or when it holds this many entries, twice as many as at its last build and queues


class QueueLeases(dict):
    """One queue's tasks in flight: task id (ms, seq) -> (rowid, worker, deadline, delivered_at,
    attempts). `figures` is what the reads worked out from them, kept until they change (None)."""

    __slots__ = ("figures",)

    def __init__(self):
        super().__init__()
        self.figures = None

    def summed(self) -> tuple:
        """(first task id, last task id, {worker: tasks held}), worked out once per change of the
        leases, in C (200,000 leases: ~15 ms): 256 pipelined XPENDINGs count them once."""
        figures = self.figures
        if figures is None:
            figures = self.figures = {}
        summary = figures.get("summary")
        if summary is None:
            summary = figures["summary"] = (min(self, default=None), max(self, default=None),
                                            Counter(map(itemgetter(WORKER), self.values())))
        return summary

    def last_deliveries(self) -> dict:
        """{worker: its last delivery (ms)} of the workers holding tasks (XINFO CONSUMERS), worked
        out once per change of the leases."""
        figures = self.figures
        if figures is None:
            figures = self.figures = {}
        last = figures.get("last deliveries")
        if last is None:
            last = figures["last deliveries"] = {}
            for lease in self.values():
                if lease[DELIVERED_AT] > last.get(lease[WORKER], -1):
                    last[lease[WORKER]] = lease[DELIVERED_AT]
        return last

    def first(self, limit: int, pairs=None, key=itemgetter(0)) -> list[tuple]:
        """The first `limit` (task id, lease) pairs (all if it is negative) of `pairs` (None: every
        one), in task id order or by `key`: one pass over them, no sort of them all."""
        if pairs is None:
            pairs = self.items()
        return sorted(pairs, key=key) if limit < 0 else heapq.nsmallest(limit, pairs, key=key)


class InFlight:
    """Every queue's leases: their changes (journaled per batch), their deadlines, their reads."""

    def __init__(self, queues, clock):
        self.queues = queues  # the Queues table: a heap entry names its queue, which a reload replaces
        self.clock = clock
        self._deadlines: list[tuple] = []
        self._entry_numbers = count()  # ties in the heap break on these, never on what follows them
        self._compact_at = COMPACT_MIN
        self._built_until = 0  # every lease running out before this is in the heap
        # Each change in the writer's batch under way is journaled, (restore, leases, the ids it
        # added, the (id, lease) pairs it took out), for a rollback to undo (journal.py); the heap
        # is built anew after it, since the batch may have taken entries of leases it ended.
        self.journal = queues.journal
        self.journal.on_rollback(self._build)

    # ------------------------------------------------------------ changes, in a writer's batch

    def claimed(self, queue, rows: list, worker: bytes, deadline: int, now: int) -> None:
        """Available tasks were leased to `worker`: storage claim rows (id_ms, id_seq, fields,
        attempts, rowid), each an available task until now (so in no lease)."""
        leases = queue.leases
        if len(rows) == 1:  # a worker's COUNT 1: no loop, no list
            row = rows[0]
            task_id = (row[0], row[1])
            leases[task_id] = (row[4], worker, deadline, now, row[3])
            ids = (task_id,)
        else:
            ids = [(row[0], row[1]) for row in rows]
            for task_id, row in zip(ids, rows):
                leases[task_id] = (row[4], worker, deadline, now, row[3])
        leases.figures = None
        self.journal.append((restore, leases, ids, ()))
        if deadline < self._built_until:  # runs out before the heap's next build: in it now
            self._push(deadline, queue.name, ids)

    def leased(self, queue, task_id: tuple, lease: tuple) -> None:
        """A task's lease is now `lease` (renewed, taken over, or a task leased by XCLAIM FORCE)."""
        leases = queue.leases
        before = leases.get(task_id)
        self.journal.append((restore, leases, (task_id,), () if before is None else ((task_id, before),)))
        leases[task_id] = lease
        leases.figures = None
        if lease[DEADLINE] < self._built_until:
            self._push(lease[DEADLINE], queue.name, (task_id,))

    def ended(self, queue, task_id: tuple) -> None:
        """The task is no longer in flight (failed, deleted): its lease, out."""
        leases = queue.leases
        self.journal.append((restore, leases, (), ((task_id, leases.pop(task_id)),)))
        leases.figures = None

    def take(self, queue, ids: list[tuple]) -> list[tuple]:
        """The acks' way out: (task id, lease) of those of the ids in flight in the queue, in the
        order given, their leases ended here, each once (a repeated id finds none the second time:
        one dict step an id, where a lookup, a set for repeats and a removal after were three)."""
        if len(ids) == 1:  # a worker's ack of one task: no comprehension (a frame, in 3.11)
            lease = queue.leases.pop(ids[0], None)
            held = [] if lease is None else [(ids[0], lease)]
        else:
            pop = queue.leases.pop
            held = [(task_id, lease) for task_id in ids if (lease := pop(task_id, None)) is not None]
        if held:
            queue.leases.figures = None
            self.journal.append((restore, queue.leases, (), held))
        return held

    @staticmethod
    def put_back(queue, held: list[tuple]) -> None:
        """Leases `take` took, as they were: the write they were taken for was refused."""
        queue.leases.update(held)
        queue.leases.figures = None

    def all_ended(self, queue, held: list[tuple]) -> None:
        """These (task id, lease) pairs are no longer in flight (given back at a clean stop; an ack
        takes its leases with `take`)."""
        leases = queue.leases
        for task_id, _ in held:
            del leases[task_id]
        leases.figures = None
        self.journal.append((restore, leases, (), held))

    def load(self, rows) -> None:
        """The tasks a file holds in flight, read once (a start without recovery): (queue name,
        id_ms, id_seq, rowid, worker, deadline, delivered_at, attempts) each, the queues loaded."""
        for name, ms, seq, rowid, worker, deadline, delivered_at, attempts in rows:
            queue = self.queues.get(name_bytes(name))
            if queue is not None:
                queue.leases[(ms, seq)] = (rowid, name_bytes(worker or b""), deadline or 0, delivered_at or 0,
                                           attempts)
        self._build()

    # ------------------------------------------------------------ deadlines

    def _push(self, deadline: int, name: bytes, ids) -> None:
        deadlines = self._deadlines
        heapq.heappush(deadlines, (deadline, next(self._entry_numbers), name, ids))
        if len(deadlines) >= self._compact_at:  # mostly entries of leases ended since
            self._build()

    def _build(self) -> None:
        """The heap anew, from every lease: one entry per queue and deadline."""
        grouped: dict[tuple, list] = {}
        for queue in self.queues.values():
            for task_id, lease in queue.leases.items():
                grouped.setdefault((lease[DEADLINE], queue.name), []).append(task_id)
        self._deadlines = [(deadline, next(self._entry_numbers), name, ids)
                           for (deadline, name), ids in grouped.items()]
        heapq.heapify(self._deadlines)
        # The next build from _push comes after at least as many pushes as it will look at queues
        # and entries: with 50,000 queues and short leases, not a walk of them all per 1,024 claims.
        self._compact_at = max(COMPACT_MIN, 2 * len(self._deadlines), 2 * len(self.queues))
        self._built_until = self.clock() + HORIZON_MS

    def _current(self, entry: tuple) -> list[tuple]:
        """The entry's tasks whose lease is still the entry's: [(queue, task id, lease)]."""
        deadline, _, name, ids = entry
        queue = self.queues.get(name)
        if queue is None:
            return []
        leases = queue.leases
        return [(queue, task_id, lease) for task_id in ids
                if (lease := leases.get(task_id)) is not None and lease[DEADLINE] == deadline]

    def expired(self, now: int, limit: int) -> list[tuple]:
        """Up to about `limit` (queue, task id, lease) whose deadline is `now` or before, soonest
        first; their entries leave the heap (the caller ends each lease)."""
        if now >= self._built_until:  # leases given since the last build may be due: all in it now
            self._build()
        deadlines, found, seen = self._deadlines, [], set()
        while deadlines and deadlines[0][0] <= now and len(found) < limit:
            current = self._current(heapq.heappop(deadlines))
            for task in current:
                key = (task[0].name, task[1])
                if key not in seen:  # a lease renewed to the same deadline has two entries
                    seen.add(key)
                    found.append(task)
        return found

    def next_deadline(self) -> int | None:
        """When the reaper must look next: the soonest deadline in the heap (entries of ended
        leases dropped on the way), or the heap's next build if a lease may be outside it; None
        while no task is in flight."""
        deadlines = self._deadlines
        while deadlines and not self._current(deadlines[0]):
            heapq.heappop(deadlines)
        if deadlines:
            return min(deadlines[0][0], self._built_until)
        return self._built_until if any(queue.leases for queue in self.queues.values()) else None

    # ------------------------------------------------------------ reads

    @staticmethod
    def held(queue, ids: list[tuple]) -> list[tuple]:
        """(task id, lease) of those of the ids in flight in the queue, each once, in the order given."""
        leases = queue.leases
        return [(task_id, lease) for task_id in dict.fromkeys(ids) if (lease := leases.get(task_id)) is not None]

    @staticmethod
    def held_by(queue, worker: bytes, after: tuple = (-1, -1), limit: int = -1) -> list[tuple]:
        """(task id, lease) of the worker's tasks in flight in the queue after `after`, in id
        order, up to `limit` (-1: all)."""
        return queue.leases.first(limit, [(task_id, lease) for task_id, lease in queue.leases.items()
                                          if lease[WORKER] == worker and task_id > after])

    @staticmethod
    def entries(queue, start: tuple, end: tuple, limit: int, worker: bytes | None = None,
                delivered_before: int | None = None) -> list[tuple]:
        """XPENDING's extended form: (task id, lease) of tasks in flight from `start` to `end`, in id
        order, up to `limit` (-1: all); of one worker, delivered at or before a time, if given."""
        return entries_of(queue.leases, start, end, limit, worker, delivered_before)

    def copy(self, name: bytes) -> tuple[dict, int]:
        """In a writer's batch: a copy of the queue's leases, and the time it was taken (a pick among
        them then runs on a thread: pending_of, pel_of)."""
        queue = self.queues.get(name)
        return ({} if queue is None else dict(queue.leases)), self.clock()

    @staticmethod
    def summary(queue) -> tuple:
        """XPENDING's summary: (first id, last id, [(worker, tasks held)] by worker name)."""
        first, last, held = queue.leases.summed()
        return first, last, sorted(held.items())

    @staticmethod
    def consumers(queue) -> list[tuple]:
        """XINFO CONSUMERS: (worker, tasks held, last delivery) of each worker holding some."""
        held, last = queue.leases.summed()[2], queue.leases.last_deliveries()
        return [(worker, n, last[worker]) for worker, n in sorted(held.items())]


def restore(leases: QueueLeases, added, removed) -> None:
    """A rolled-back change of a queue's leases, taken back (InFlight's journal entries)."""
    for task_id in added:
        leases.pop(task_id, None)
    leases.update(removed)
    leases.figures = None


def entries_of(leases: dict, start: tuple, end: tuple, limit: int, worker: bytes | None = None,
               delivered_before: int | None = None) -> list[tuple]:
    """InFlight.entries of a queue's leases, or of a copy of them (on a thread: Broker.pending_entries)."""
    pairs = [(task_id, lease) for task_id, lease in leases.items() if start <= task_id <= end
             and (worker is None or lease[WORKER] == worker)
             and (delivered_before is None or lease[DELIVERED_AT] <= delivered_before)]
    return QueueLeases.first(leases, limit, pairs)  # (of the pairs given: a plain dict serves as well)


def pending_of(leases: dict, now: int, start: tuple, end: tuple, count: int, worker: bytes | None,
               min_idle_ms: int | None) -> list[tuple]:
    """XPENDING's extended form: [(task id, worker, idle ms, deliveries)] of the leases at `now`."""
    before = None if min_idle_ms is None else now - min_idle_ms
    return [(task_id, lease[WORKER], max(now - lease[DELIVERED_AT], 0), lease[ATTEMPTS])
            for task_id, lease in entries_of(leases, start, end, count, worker, before)]


def pel_of(leases: dict, now: int, limit: int) -> list[tuple]:
    """XINFO STREAM FULL's pending list: [(task id, worker, delivered at, deliveries)], the first
    `limit` by id (-1: all)."""
    return [(task_id, lease[WORKER], min(lease[DELIVERED_AT], now), lease[ATTEMPTS])
            for task_id, lease in entries_of(leases, (0, 0), TOP, limit)]


def failure_rows(pairs) -> list[tuple]:
    """(task id, lease) pairs as Transitions.apply_failures takes them: (rowid, attempts, state,
    worker, task id)."""
    return [(lease[ROWID], lease[ATTEMPTS], IN_FLIGHT, lease[WORKER], task_id) for task_id, lease in pairs]
