"""The queues the broker knows: each one's state (QueueState), its settings in force, and the
table of them all (Queues), with the events counted since start.

A QueueState holds what the broker remembers about one queue between batches: its last id,
its tasks' counts by state, its settings as stored (None: the server's) and the policy they
make with the server's defaults (`lease_seconds()`, `retention()`...). It changes its own fields,
through verbs named for what happened (`pushed`, `delivered`, `finished`, `removed`, `tally`...);
the other parts call them (tests/test_layout.py holds the rule). Only the writer's batches change
them; greenlets read them between batches (the writer never yields inside one), as a claim that
finds nothing to do does. A count moved is undone with a rolled-back batch (journal.py).
"""

from __future__ import annotations

import bisect

from .. import errors, lifecycle
from ..settings import queue_settings
from ..lifecycle import AVAILABLE, DEAD, DONE, GONE, IN_FLIGHT, MOVES
from ..storage import SETTING_COLUMNS, name_bytes
from .available import AvailableOrder
from .flow import FLOW_COLUMNS, PAUSED, flow_of
from .in_flight import QueueLeases
from .journal import BatchJournal
from .observers import VIEW_GROWS, Observers

# A queue's name is in every row of its tasks, every INFO line, /metrics series and dashboard row:
# 10 queues with 1 MB names made each scrape 162 MB. A new queue's name is at most this long;
# queues an older EZRA created with longer names keep working (drain, settings, XINFO), and
# /metrics and the dashboard show their names cut (web/).
MAX_QUEUE_NAME = 256  # bytes
NO_MARK = (0, 0)  # QueueState.mark_from when no marking walk is under way (from the first id)
# Events counted since start, per queue and in all (INFO stats, /metrics, the dashboard):
# pushed, delivered (of which redelivered: a task delivered before), acked, failed (XNACK,
# XDEL), expired (lease ran out), released (worker gone), dead, requeued (from dead), purged.
TALLIES = ("pushed", "delivered", "redelivered", "acked", "failed", "expired", "released", "dead",
           "requeued", "purged")


class Defaults:
    """The server's settings a queue falls back on where its own are None (read once: the
    server's flags do not change while it runs; XCFGSET changes a queue's own)."""

    __slots__ = ("visibility_timeout", "max_attempts", "retention_seconds", "backoff", "release_on_disconnect")

    def __init__(self, settings):
        self.visibility_timeout = settings.visibility_timeout
        self.max_attempts = settings.max_attempts
        self.retention_seconds = settings.retention_seconds
        self.backoff = queue_settings.backoff_policy(settings.backoff)
        self.release_on_disconnect = settings.release_on_disconnect


class QueueState:
    """What the broker remembers about one queue (settings as stored: None = the server's)."""

    __slots__ = ("name", "defaults", "journal", "all_totals", "observers", "last_id", "counts", "order", "leases",
                 "group", "last_delivered", "next_purge", "trim_floor", "unmarked_done", "mark_from", "deleted",
                 "max_deleted", "deleted_dirty", "iids_added", "iids_duplicates", "totals", "flow", "lanes_on",
                 *SETTING_COLUMNS)

    def __init__(self, name: bytes, table: Queues, last_id=(0, 0), leases: QueueLeases | None = None):
        self.name = name
        self.defaults = table.defaults
        self.journal = table.journal        # the batch's undo steps (journal.py): its count moves
        self.all_totals = table.totals      # the events in all queues (Queues.totals)
        self.observers = table.observers    # XREAD's and XRESULT's blocked readers: a view grew, a task ended
        self.last_id = last_id
        self.counts = dict.fromkeys(lifecycle.COUNTED, 0)  # the five states, and waiting (XADD AFTER)
        self.order = None           # its available tasks' AvailableOrder; None: not built yet
        self.leases = QueueLeases() if leases is None else leases  # its tasks in flight (in_flight.py)
        self.group = None           # the name XGROUP CREATE gave
        self.last_delivered = None  # newest id delivered; None: not known since start
        self.next_purge = 0         # no done task is due for purging before this (ms)
        self.trim_floor = (0, 0)    # no done task has a lower id (trimming scans from here)
        self.unmarked_done = True   # done tasks may lack `retained` (queues.unmarked_done; a new queue's: 1)
        self.mark_from = NO_MARK    # where the marking walk goes on (Reaper._mark_retained)
        self.deleted = 0            # tasks removed for good, and the newest of them
        self.max_deleted = (0, 0)
        self.deleted_dirty = False
        self.iids_added = self.iids_duplicates = 0
        self.totals = dict.fromkeys(TALLIES, 0)  # events since start (metrics, dashboard)
        for column in SETTING_COLUMNS:
            setattr(self, column, None)
        self.flow = None  # MAX-IN-FLIGHT and RATE-LIMIT (flow.py); None: neither, as most queues
        # A task of it has a priority or partition: `order` is its Lanes (lanes.py), not an AvailableOrder.
        self.lanes_on = False

    def read(self, row, before: QueueState | None = None) -> None:
        """Its state as the file's queue row says (start-up, a rollback's reload); the counters
        since start of `before`, the state it replaces, go on (they never go down)."""
        newest = None if row["newest_ms"] is None else (row["newest_ms"], row["newest_seq"])
        # Pushes do not save the last id (a page write saved per push): the newest task holds it.
        self.last_id = max((row["last_id_ms"], row["last_id_seq"]), newest or (0, 0))
        if before is not None:
            self.totals, self.iids_added, self.iids_duplicates = before.totals, before.iids_added, before.iids_duplicates
        for column in SETTING_COLUMNS:
            setattr(self, column, row[column])
        self.group = None if row["group_name"] is None else name_bytes(row["group_name"])
        self.deleted = row["deleted_count"]
        self.unmarked_done = bool(row["unmarked_done"])
        self.max_deleted = (row["max_deleted_ms"], row["max_deleted_seq"])
        self.lanes_on = bool(row["lanes"])
        self.set_flow(None if before is None else before.flow)  # a rollback keeps the hand-outs made

    def counted(self, state: str, n: int) -> None:
        """The file holds n tasks of the queue in `state` (a reload's count)."""
        self.counts[state] = n

    # ------------------------------------------------------------ what happens to its tasks

    def move(self, from_state: str | None, to_state: str | None, n: int = 1) -> None:
        """The one place state counts change: n tasks moved (lifecycle.MOVES; GONE, None, is
        outside the queue: a push comes from it, a delete or purge goes to it); undone with a
        rolled-back batch (`unmove`)."""
        if (from_state, to_state) not in MOVES:
            raise errors.move_not_drawn(from_state, to_state)
        counts = self.counts
        if from_state is not GONE:
            counts[from_state] -= n
        if to_state is not GONE:
            counts[to_state] += n
        self.journal.append((self.unmove, from_state, to_state, n))

    def unmove(self, from_state: str | None, to_state: str | None, n: int) -> None:
        """A rolled-back batch's `move`, taken back."""
        counts = self.counts
        if to_state is not GONE:
            counts[to_state] -= n
        if from_state is not GONE:
            counts[from_state] += n

    def tally(self, event: str, n: int = 1) -> None:
        """The one way to count an event (TALLIES): for the queue and in all; XREAD's observers
        look again where it added entries to a view (VIEW_GROWS)."""
        self.totals[event] += n
        self.all_totals[event] += n
        if self.observers.watching and n and event in VIEW_GROWS:  # blocked XREADs: seldom any
            self.observers.grew(self.name, VIEW_GROWS[event])

    def pushed(self, last_id: tuple, state: str = AVAILABLE, n: int = 1) -> None:
        """n tasks pushed into `state` (available, delayed, waiting, or dead: an import), the last of them
        `last_id`."""
        self.last_id = last_id
        self.move(GONE, state, n)
        self.tally("pushed", n)
        if state == DEAD and self.observers.watching:  # XREAD's observers of q::dead look again too
            self.observers.grew(self.name, True)

    def idmp_recorded(self) -> None:
        """A push recorded its producer's idempotent id (XINFO's iids-added)."""
        self.iids_added += 1

    def idmp_repeated(self) -> None:
        """A push repeated an idempotent id: answered with the first push's id (iids-duplicates)."""
        self.iids_duplicates += 1

    def delivered(self, rows: list, state: str = IN_FLIGHT) -> None:
        """Available tasks handed out, claim rows (id_ms, id_seq, fields, attempts, ...) in id
        order, now `state` (in flight; done with NOACK)."""
        n = len(rows)
        if state == DONE:  # NOACK: done tasks below the trimming floor now
            self.trim_floor = min(self.trim_floor, rows[0][:2])
            if self.observers.watching:
                self.settled([row[:2] for row in rows])
        self.last_delivered = max(self.last_delivered or (0, 0), rows[-1][:2])
        self.move(AVAILABLE, state, n)
        self.tally("delivered", n)
        redelivered = 0
        for row in rows:  # a loop, not sum() of a generator: a frame less on every claim
            if row[3] > 1:  # attempts, this one included
                redelivered += 1
        if redelivered:
            self.tally("redelivered", redelivered)

    def last_delivered_read(self, task_id: tuple) -> None:
        """The newest id delivered, as the file says (not known since start)."""
        self.last_delivered = task_id

    def finished(self, held: list[tuple]) -> None:
        """These tasks in flight, (task id, lease) pairs, are done (an ack): counted, and the
        trimming floor moved back below the first of them."""
        if self.trim_floor > (0, 0):  # trimming moved it up: a task done below it moves it back down
            first = held[0][0] if len(held) == 1 else min(held)[0]
            if first < self.trim_floor:
                self.trim_floor = first
        self.move(IN_FLIGHT, DONE, len(held))
        if self.observers.watching:  # a blocked XREAD or XRESULT: seldom any
            self.settled([task_id for task_id, _ in held])

    def settled(self, ids) -> None:
        """These tasks ended (done, dead, removed): XRESULT BLOCK's watchers of them look again
        after the commit (observers.py)."""
        if self.observers.watching:
            self.observers.ended(self.name, ids)

    def removed(self, n: int, newest: tuple) -> None:
        """n tasks were removed for good, the newest of them `newest`: counted (XINFO); the
        counters are saved by the next flush (`deletions_saved`)."""
        self.deleted += n
        self.max_deleted = max(self.max_deleted, newest)
        self.deleted_dirty = True

    def deletions_saved(self) -> None:
        """The removed-task counters are in the file."""
        self.deleted_dirty = False

    def trimmed_to(self, floor: tuple) -> None:
        """No done task below `floor` is left (trimming scans from it)."""
        self.trim_floor = floor

    def done_unmarked(self) -> bool:
        """A task finishes without the `retained` mark (the queue keeps done tasks for ever). True
        if it is the first since they were all marked: the file must say so. A marking walk under
        way starts over (it may have passed this task)."""
        first = not self.unmarked_done
        self.unmarked_done = True
        self.mark_from = NO_MARK
        return first

    def marked_to(self, task_id: tuple | None) -> None:
        """The marking walk reached `task_id`; None: it is over, every done task is marked, and
        the purge may find some due at once."""
        if task_id is None:
            self.unmarked_done, self.mark_from, self.next_purge = False, (0, 0), 0
        else:
            self.mark_from = task_id

    def purge_due_at(self, ms: float) -> None:
        """No done task is due for purging before `ms` (INF: kept for ever)."""
        self.next_purge = ms

    def configured(self, changes: dict) -> None:
        """XCFGSET: its own settings ({column: value}); the reaper looks again at its retention."""
        for column, value in changes.items():
            setattr(self, column, value)
        self.next_purge = 0
        if any(column in FLOW_COLUMNS for column in changes):
            self.set_flow()
        if "partition_limit" in changes and self.lanes_on and self.order is not None:
            self.order.set_partition_limit(self.partition_cap())

    def named_group(self, group: bytes | None) -> None:
        """XGROUP CREATE named its group (None: XGROUP DESTROY forgot it)."""
        self.group = group

    def reading_order(self) -> AvailableOrder:
        """Its available order; begun empty, to be read from the file a slice at a time, if none
        is built (Transitions.order)."""
        if self.order is None:
            self.order = AvailableOrder(complete=False)
        return self.order

    def turned_to_lanes(self, lanes) -> None:
        """Its first task with a priority or partition: its claim order is `lanes` from now on
        (None: read from the file by the next claim, Transitions.order)."""
        self.lanes_on = True
        self.order = lanes

    def forget_order(self) -> None:
        """Its available order is dropped: the next claim reads it again from the file."""
        self.order = None

    # ------------------------------------------------------------ the settings in force

    def lease_seconds(self) -> float:
        vt = self.visibility_timeout
        return self.defaults.visibility_timeout if vt is None else vt

    def attempts_allowed(self) -> int:
        """Deliveries before a task dies."""
        attempts = self.max_attempts
        return self.defaults.max_attempts if attempts is None else attempts

    def retention(self) -> float | None:
        """Seconds done tasks are kept; None: forever."""
        retention = self.retention_seconds
        if retention is None:
            return self.defaults.retention_seconds
        return None if retention < 0 else retention

    def backoff_policy(self):
        text = self.backoff
        return self.defaults.backoff if text is None else queue_settings.backoff_policy(text)

    def release_grace(self) -> float | None:
        """Seconds before a gone worker's tasks go back; None: never (off)."""
        grace = self.release_on_disconnect
        if grace is None:
            return self.defaults.release_on_disconnect
        return None if grace < 0 else grace

    def partition_cap(self) -> int:
        """PARTITION-LIMIT: tasks of one partition in flight at once (NULL: 1)."""
        limit = self.partition_limit
        return 1 if limit is None else limit

    def is_paused(self) -> bool:
        """XCFGSET PAUSED 1: nothing is handed out from this queue (stored 1; 0 or None: running)."""
        return bool(self.paused)

    def set_flow(self, before=None) -> None:
        """Its settings changed (or were read): the Flow they make, keeping `before`'s hand-outs."""
        self.flow = flow_of(self.max_in_flight, self.rate_limit_count, self.rate_limit_seconds,
                            before if before is not None else self.flow)

    def partitions_with_work(self) -> int | None:
        """How many partitions have available tasks; None for a queue without lanes (no task of it
        has a priority or partition), or whose order is not read yet."""
        return self.order.partitions_with_work() if self.lanes_on and self.order is not None else None

    def held_back(self, now: int) -> str | None:
        """What keeps the queue from handing out a task now: flow.PAUSED, CAP, RATE, or None."""
        if self.is_paused():
            return PAUSED
        return None if self.flow is None else self.flow.held_back(self.counts[IN_FLIGHT], now)

    def idmp_limits(self) -> tuple[int, int]:
        """(IDMP-DURATION seconds, IDMP-MAXSIZE)."""
        return (self.idmp_duration or queue_settings.IDMP_DURATION_DEFAULT,
                self.idmp_maxsize or queue_settings.IDMP_MAXSIZE_DEFAULT)


class Queues(dict):
    """Every queue's QueueState by name, their names in byte order (pages of the queue list),
    the events counted since start over all of them (`totals`, by TALLIES), and the journal of
    the batch under way (journal.py).

    One table for the broker's life: a reload after a rollback refills it in place, so every
    part that holds it sees the new states."""

    # No instance dict: `queues.get` stays a plain dict's.
    __slots__ = ("defaults", "names", "totals", "journal", "observers")

    def __init__(self, defaults: Defaults, observers: Observers | None = None):
        super().__init__()
        self.defaults = defaults
        self.names: list[bytes] = []
        self.totals = dict.fromkeys(TALLIES, 0)
        self.journal = BatchJournal()  # the writer's batch under way, to take back on a rollback
        self.observers = Observers() if observers is None else observers

    def new(self, name: bytes, last_id=(0, 0), leases: QueueLeases | None = None) -> QueueState:
        return QueueState(name, self, last_id, leases)

    def done_and_available(self) -> tuple[dict[bytes, int], dict[bytes, int]]:
        """Each queue's done and available tasks (after a rollback's undo: the file's), for a
        reload, which then reads no row to count them (neither is in an index)."""
        return ({name: queue.counts[DONE] for name, queue in self.items()},
                {name: queue.counts[AVAILABLE] for name, queue in self.items()})

    def add(self, queue: QueueState) -> None:
        """A queue made in a batch: in the table, its name in order."""
        self[queue.name] = queue
        bisect.insort(self.names, queue.name)

    def replace(self, queues: dict[bytes, QueueState]) -> None:
        """Every queue as the file has them (start-up, and after a rollback)."""
        self.clear()
        self.update(queues)
        self.names[:] = sorted(queues)
