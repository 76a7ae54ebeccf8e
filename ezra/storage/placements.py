"""The queries of a lanes queue's claim order (broker/lanes.py): each task's place, its priority
(XADD PRIORITY; NULL: the default) and partition (XADD PARTITION; NULL: none), as stored; run in
the writer's transaction like the rest."""

from __future__ import annotations

from .schema import name_value


class Placements:
    """The tasks table seen by priority and partition."""

    def __init__(self, conn, span):
        self.conn = conn
        self.span = span  # Database.span: a queue's range of row ids

    def rows(self, queue: bytes) -> tuple[list, list]:
        """(rowid, priority, partition_key) of the queue's available tasks, and of its tasks in flight,
        each in row id order (push order), a read each: a lanes queue's claim order is built from
        them after a start or a rollback."""
        low, high = self.span(queue)
        args = (low, high, name_value(queue))
        return tuple(self.conn.execute(  # queue = ?: a row written by hand in its range meanwhile is not its task
            "SELECT rowid, priority, partition_key FROM tasks WHERE rowid BETWEEN ? AND ? "
            f"AND state = '{state}' AND queue = ? ORDER BY rowid", args).fetchall() for state in ("available", "in_flight"))

    def of(self, rowid: int) -> tuple:
        """(priority, partition_key) of one task as stored, or (None, None) if it is gone."""
        return self.conn.execute("SELECT priority, partition_key FROM tasks WHERE rowid = ?",
                                 (rowid,)).fetchone() or (None, None)

    def use_lanes(self, name: bytes) -> None:
        """The queue's claims take the order by priority and partition from now on, for good."""
        self.conn.execute("UPDATE queues SET lanes = 1 WHERE name = ?", (name_value(name),))
