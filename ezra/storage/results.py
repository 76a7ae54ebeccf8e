"""The queries of a task's outcome as its producer sees it (XRESULT) and of its progress
(XPROGRESS): the columns tasks.result and tasks.progress (schema 16), run in the writer's
transaction like the rest. The result itself is written by the ack that finishes the task
(acks.ack_with_results), in the same statement."""

from __future__ import annotations

from . import row_ranges

# XPROGRESS: the value, and the lease renewed as an owner's XCLAIM renews it (a heartbeat).
_PROGRESS_SQL = ("UPDATE tasks SET progress = ?, delivered_at = ?, deadline = ? "
                 "WHERE rowid = ? AND state = 'in_flight'")
_OUTCOME_SQL = "SELECT state, attempts, failure, result, progress, name FROM tasks WHERE rowid = ?"


class Results:
    """The tasks table seen by outcome: state, attempts, last failure, result, progress."""

    def __init__(self, conn, span):
        self.conn = conn
        self.span = span  # Database.span: a queue's range of row ids

    def outcome(self, queue: bytes, task_id: tuple) -> tuple | None:
        """(state, attempts, failure JSON, result, progress, name) of one task, or None: no such task (never
        pushed, or removed: retention, TTL, XDEL...). A search of the queue's row ids."""
        rowid = row_ranges.row_of(self.conn, self.span(queue), task_id)
        return None if rowid is None else self.conn.execute(_OUTCOME_SQL, (rowid,)).fetchone()

    def state_of(self, queue: bytes, task_id: tuple) -> str | None:
        """One task's state, or None: no such task (XPROGRESS on a task not in flight says which)."""
        outcome = self.outcome(queue, task_id)
        return None if outcome is None else outcome[0]

    def carry(self, rowid: int, result: bytes | None, progress: bytes | None, finished_at: int | None,
              retained: int | None) -> None:
        """A task pushed with its result (done: `finished_at`, `retained` as an ack writes them) or its
        progress, brought in from elsewhere (ezra import): written after its row's insert."""
        self.conn.execute("UPDATE tasks SET result = ?, progress = ?, finished_at = coalesce(?, finished_at), "
                          "retained = coalesce(?, retained) WHERE rowid = ?",
                          (result, progress, finished_at, retained, rowid))

    def report_progress(self, rowid: int, progress: bytes, now: int, deadline: int) -> int:
        """A task in flight reports progress: kept, and its lease runs from now (delivered_at, deadline,
        as a renewal writes them); 1 if the row was in flight."""
        return self.conn.execute(_PROGRESS_SQL, (progress, now, deadline, rowid)).rowcount
