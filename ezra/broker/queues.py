"""The queues the broker knows: each one's state (QueueState), its settings in force, and the
table of them all (Queues), with the events counted since start.

A QueueState holds what the broker remembers about one queue between batches: its last id,
its tasks' counts by state (changed only through `move`), its settings as stored (None: the
server's) and the policy they make with the server's defaults (`lease_seconds()`,
`retention()`...). Only the writer's batches change them; greenlets read them between batches
(the writer never yields inside one), as a claim that finds nothing to do does.
"""

from __future__ import annotations

import bisect

from .. import errors, lifecycle
from ..settings import queue_settings
from ..lifecycle import AVAILABLE, DONE, GONE, IN_FLIGHT
from ..storage import SETTING_COLUMNS
from .flow import PAUSED, flow_of
from .in_flight import QueueLeases

# A queue's name is in every row of its tasks, every INFO line, /metrics series and dashboard row:
# 10 queues with 1 MB names made each scrape 162 MB. A new queue's name is at most this long;
# queues an older EZRA created with longer names keep working (drain, settings, XINFO), and
# /metrics and the dashboard show their names cut (web/).
MAX_QUEUE_NAME = 256  # bytes
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

    __slots__ = ("name", "defaults", "last_id", "counts", "order", "leases", "group", "last_delivered", "next_purge",
                 "trim_floor", "unmarked_done", "mark_from", "done_moved", "available_moved", "journal", "deleted", "max_deleted",
                 "deleted_dirty", "iids_added", "iids_duplicates", "totals", "flow", *SETTING_COLUMNS)

    def __init__(self, name: bytes, defaults: Defaults, last_id=(0, 0), journal: set | None = None,
                 leases: QueueLeases | None = None):
        self.name = name
        self.defaults = defaults
        self.last_id = last_id
        self.counts = dict.fromkeys(lifecycle.STATES, 0)
        self.order = None           # its available tasks' AvailableOrder; None: not built yet
        self.leases = QueueLeases() if leases is None else leases  # its tasks in flight (in_flight.py)
        self.group = None           # the name XGROUP CREATE gave
        self.last_delivered = None  # newest id delivered; None: not known since start
        self.next_purge = 0         # no done task is due for purging before this (ms)
        self.trim_floor = (0, 0)    # no done task has a lower id (trimming scans from here)
        self.unmarked_done = True   # done tasks may lack `retained` (queues.unmarked_done; a new queue's: 1)
        self.mark_from = (0, 0)     # where the marking walk goes on (Reaper._mark_retained)
        # Done and available tasks counted in by the writer's batch under way, and the queues with
        # some (`journal`, Queues.moved): a rollback takes them back out rather than read every row
        # to count them (neither is in an index); the batch's end clears them.
        self.done_moved = 0
        self.available_moved = 0
        self.journal = set() if journal is None else journal
        self.deleted = 0            # tasks removed for good, and the newest of them
        self.max_deleted = (0, 0)
        self.deleted_dirty = False
        self.iids_added = self.iids_duplicates = 0
        self.totals = dict.fromkeys(TALLIES, 0)  # events since start (metrics, dashboard)
        for column in SETTING_COLUMNS:
            setattr(self, column, None)
        self.flow = None  # MAX-IN-FLIGHT and RATE-LIMIT (flow.py); None: neither, as most queues

    def move(self, from_state: str | None, to_state: str | None, n: int = 1) -> None:
        """The one place state counts change: n tasks moved (lifecycle.MOVES; GONE, None, is
        outside the queue: a push comes from it, a delete or purge goes to it)."""
        if (from_state, to_state) not in lifecycle.MOVES:
            raise errors.move_not_drawn(from_state, to_state)
        counts = self.counts
        if from_state is not GONE:
            counts[from_state] -= n
        if to_state is not GONE:
            counts[to_state] += n
        if to_state == DONE:
            self.done_moved += n
            self.journal.add(self)
        elif from_state == DONE:
            self.done_moved -= n
            self.journal.add(self)
        if to_state == AVAILABLE:
            self.available_moved += n
            self.journal.add(self)
        elif from_state == AVAILABLE:
            self.available_moved -= n
            self.journal.add(self)

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

    def is_paused(self) -> bool:
        """XCFGSET PAUSED 1: nothing is handed out from this queue (stored 1; 0 or None: running)."""
        return bool(self.paused)

    def set_flow(self, before=None) -> None:
        """Its settings changed (or were read): the Flow they make, keeping `before`'s hand-outs."""
        self.flow = flow_of(self.max_in_flight, self.rate_limit_count, self.rate_limit_seconds,
                            before if before is not None else self.flow)

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
    and the events counted since start over all of them (`totals`, by TALLIES).

    One table for the broker's life: a reload after a rollback refills it in place, so every
    part that holds it sees the new states."""

    # No instance dict: `queues.get` stays a plain dict's.
    __slots__ = ("defaults", "names", "totals", "moved")

    def __init__(self, defaults: Defaults):
        super().__init__()
        self.defaults = defaults
        self.names: list[bytes] = []
        self.totals = dict.fromkeys(TALLIES, 0)
        self.moved: set[QueueState] = set()  # queues whose done or available count the batch under way moved

    def new(self, name: bytes, last_id=(0, 0), leases: QueueLeases | None = None) -> QueueState:
        return QueueState(name, self.defaults, last_id, self.moved, leases)

    def counts_before_batch(self) -> tuple[dict[bytes, int], dict[bytes, int]]:
        """Each queue's done and available tasks before the batch under way: a rollback's reload
        takes them, and reads no row to count them."""
        return ({name: queue.counts[DONE] - queue.done_moved for name, queue in self.items()},
                {name: queue.counts[AVAILABLE] - queue.available_moved for name, queue in self.items()})

    def batch_ended(self) -> None:
        """The batch committed or was rolled back: its done moves are the file's now, or undone."""
        for queue in self.moved:
            queue.done_moved = queue.available_moved = 0
        self.moved.clear()

    def add(self, queue: QueueState) -> None:
        """A queue made in a batch: in the table, its name in order."""
        self[queue.name] = queue
        bisect.insort(self.names, queue.name)

    def replace(self, queues: dict[bytes, QueueState]) -> None:
        """Every queue as the file has them (start-up, and after a rollback)."""
        self.clear()
        self.update(queues)
        self.names[:] = sorted(queues)

    def tally(self, queue: QueueState, event: str, n: int = 1) -> None:
        """Count an event for the queue and in all."""
        self.totals[event] += n
        queue.totals[event] += n
