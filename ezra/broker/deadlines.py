"""The reaper's deadlines: the earliest time each kind of upkeep can be due.

Idle cost is near zero: for each kind of work the reaper keeps a lower bound of when anything
can be due, lowered by whoever creates the work (a lease, a delayed task, an idempotent id, a
deletion), and runs no query before it. A pass moves a bound up to what the file says next.
"""

from __future__ import annotations

INF = float("inf")


class ReaperSchedule:
    """Times (ms) before which the reaper need not look, and the deletions since the last vacuum."""

    def __init__(self, clock, journal=None):
        self.clock = clock
        self.rows_since_vacuum = 0
        self.last_delete_at = 0
        self.reset()
        if journal is not None:  # a rolled-back batch may have moved any bound: all looked at again
            journal.on_rollback(self.reset)

    def reset(self) -> None:
        """Look at everything on the next pass (start-up, and after a rollback)."""
        self.earliest_deadline = 0    # no lease expires before this
        self.earliest_due = 0         # no delayed task is due before this
        self.next_ttl_purge = 0
        self.next_idmp_purge = 0
        self.next_flush = 0
        self.next_window = 0          # no RATE-LIMIT window opens before this (flow.py)

    # -- lowered by whoever creates work

    def lease_until(self, deadline: int) -> None:
        """A lease expires at `deadline` (ms)."""
        if deadline < self.earliest_deadline:
            self.earliest_deadline = deadline

    def due_at(self, available_at: int) -> None:
        """A delayed task comes due at `available_at` (ms)."""
        if available_at < self.earliest_due:
            self.earliest_due = available_at

    def window_opens_at(self, at: int) -> None:
        """A queue's full RATE-LIMIT window lets the next task out at `at` (ms)."""
        if at < self.next_window:
            self.next_window = at

    def idmp_expires_at(self, expires_at: int) -> None:
        """An idempotency record expires at `expires_at` (ms)."""
        if expires_at < self.next_idmp_purge:
            self.next_idmp_purge = expires_at

    def deleted_rows(self, n: int) -> None:
        """`n` rows were deleted (counts toward the next vacuum)."""
        self.rows_since_vacuum += n
        self.last_delete_at = self.clock()
