"""BrokerCore: what the broker's parts (core.py and the mixins) share through `self`.

Construction order (Broker.__init__): db, settings, default_backoff, clock, queues,
stats; then Claims, Leases, Upkeep and Observers set their own state (Upkeep reads
`db`); then `_reload()` fills `queues`; `writer` comes last.
The stubs below are implemented by the part named in each docstring; the parts
list earlier in Broker's bases, so their definitions win.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections import OrderedDict

    from ..storage import Database
    from ..writer import Writer
    from .core import QueueState
    from .observers import Observer


class BrokerCore:
    """The attributes and helpers the broker's parts call on each other."""

    # --- set by Broker.__init__ (core.py), in this order
    db: Database                            # the SQLite database; all SQL goes through it
    settings: object                        # the server's settings (queue defaults, durability)
    default_backoff: object                 # the server's backoff policy, for queues without one
    clock: object                           # () -> ms since the epoch; tests replace it
    queues: dict[bytes, QueueState]         # per-queue caches, touched only in writer batches
    queue_names: list[bytes]                # their names in byte order (pages of the queue list)
    stats: dict[str, int]                   # event tallies since start, all queues
    writer: Writer                          # runs the `_tx_*` scripts in batches; set last
    # --- set by Claims.__init__ (claims.py)
    blocked: dict[bytes, OrderedDict]       # blocked XREADGROUP waiters, FIFO per queue
    # --- set by Leases.__init__ (leases.py)
    worker_connections: dict[bytes, int]    # worker name -> open connections that used it
    held_in: dict[bytes, set[bytes]]        # worker name -> queues where tasks were leased to it
    # --- set by Observers.__init__ (observers.py)
    observers: dict[tuple[bytes, bool], dict[int, Observer]]  # blocked XREADs per view

    # ------------------------------------------------------------ core.py
    def _queue(self, name: bytes, now: int, create: bool = True) -> QueueState | None:
        """core.py: the queue's state, created (in the batch) when `create`."""
        raise NotImplementedError

    def _tally(self, queue: QueueState, event: str, n: int = 1) -> None:
        """core.py: count an event (TALLIES) for the queue and in all."""
        raise NotImplementedError

    def _apply_failures(self, queue: QueueState, rows, mode: str, retry_count: int | None, now: int,
                        cause: str, reason=None):
        """core.py: failed deliveries go back (with backoff) or die, as the queue says."""
        raise NotImplementedError

    def _tx_fail(self, name: bytes, ids: list[tuple], mode: str, retry_count: int | None, force: bool,
                 reason: bytes | None = None, cause: str = "nack") -> int:
        """core.py: XNACK's script: failed deliveries of tasks in flight; how many."""
        raise NotImplementedError

    def _note_deleted(self, queue: QueueState, ids: list[tuple]) -> None:
        """core.py: remember tasks removed for good (XINFO's entries-deleted)."""
        raise NotImplementedError

    def _tx_flush_deleted(self) -> None:
        """core.py: store the deleted counts noted since the last flush."""
        raise NotImplementedError

    def _tx_pending_entries(self, name, start, end, count, worker, min_idle_ms):
        """core.py: XPENDING's extended form."""
        raise NotImplementedError

    def _visibility_timeout(self, queue: QueueState) -> float:
        """core.py: the queue's lease length (s), or the server's."""
        raise NotImplementedError

    def _max_attempts(self, queue: QueueState) -> int:
        """core.py: deliveries before a task dies, the queue's or the server's."""
        raise NotImplementedError

    def _retention(self, queue: QueueState) -> float | None:
        """core.py: how long done tasks are kept (s), the queue's or the server's."""
        raise NotImplementedError

    def _backoff(self, queue: QueueState):
        """core.py: the queue's backoff policy, or the server's."""
        raise NotImplementedError

    def _release_grace(self, queue: QueueState) -> float | None:
        """core.py: how long a gone worker's tasks wait before going back (s)."""
        raise NotImplementedError

    @staticmethod
    def _paused(queue: QueueState) -> bool:
        """core.py: the queue is paused (XCFGSET PAUSED 1): claims skip it."""
        raise NotImplementedError

    def _idmp_limits(self, queue: QueueState) -> tuple[int, int]:
        """core.py: the queue's idempotency limits."""
        raise NotImplementedError

    # ------------------------------------------------------------ admin.py
    def _read_apart(self, query, *args):
        """admin.py: storage.reads' `query` on a native thread, after this greenlet's writes committed."""
        raise NotImplementedError

    # ------------------------------------------------------------ claims.py
    def _serve_waiters(self, queue: QueueState, now: int) -> None:
        """claims.py: claim available tasks for the queue's blocked workers, in the batch."""
        raise NotImplementedError

    def blocked_clients(self) -> int:
        """claims.py: blocked XREADGROUPs and XREADs."""
        raise NotImplementedError

    def _after_batch(self, ok: bool) -> None:
        """claims.py: the writer's hook after each batch: wake the waiters it served, then observers."""
        raise NotImplementedError

    # ------------------------------------------------------------ leases.py
    def _claim_idle(self, queue, worker: bytes, count: int, min_idle: int, now: int) -> list:
        """leases.py: claim tasks in flight idle for `min_idle` ms (XREADGROUP CLAIM)."""
        raise NotImplementedError

    def _leased(self, worker: bytes, queue: QueueState) -> None:
        """leases.py: tasks of the queue were leased to the worker (release on disconnect looks there)."""
        raise NotImplementedError

    def stop_release_timers(self) -> None:
        """leases.py: cancel the timers releasing gone workers' tasks."""
        raise NotImplementedError

    # ------------------------------------------------------------ upkeep.py
    def reset_schedule(self) -> None:
        """upkeep.py: forget the reaper's deadlines (after a reload)."""
        raise NotImplementedError

    def lease_until(self, deadline: int) -> None:
        """upkeep.py: a lease expires at `deadline` (ms): the reaper looks then."""
        raise NotImplementedError

    def due_at(self, available_at: int) -> None:
        """upkeep.py: a delayed task comes due at `available_at` (ms)."""
        raise NotImplementedError

    def idmp_expires_at(self, expires_at: int) -> None:
        """upkeep.py: an idempotency record expires at `expires_at` (ms)."""
        raise NotImplementedError

    def deleted_rows(self, n: int) -> None:
        """upkeep.py: `n` rows were deleted (counts toward the next vacuum)."""
        raise NotImplementedError

    def stop_reaper(self) -> None:
        """upkeep.py: stop the reaper greenlet."""
        raise NotImplementedError

    def _trim_done(self, queue, trim) -> int:
        """upkeep.py: remove done tasks as `trim` says; how many went."""
        raise NotImplementedError

    # ------------------------------------------------------------ observers.py
    def observers_blocked(self) -> int:
        """observers.py: how many XREADs are blocked."""
        raise NotImplementedError

    def _view_grew(self, name: bytes, dead: bool) -> None:
        """observers.py: the batch added entries to the view (wake its observers after it)."""
        raise NotImplementedError

    def _wake_observers(self, committed: bool) -> None:
        """observers.py: after a batch, wake the observers of the views that grew."""
        raise NotImplementedError

    def _cancel_observers(self) -> None:
        """observers.py: shutdown: every blocked XREAD gets a null reply."""
        raise NotImplementedError
