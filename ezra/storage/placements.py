"""The queries of a lanes queue's claim order (broker/lanes.py): each task's place, its priority
(XADD PRIORITY; NULL: the default) and partition (XADD PARTITION; NULL: none), as stored; run in
the writer's transaction like the rest."""

from __future__ import annotations

from .schema import name_value, row_list


class Placements:
    """The tasks table seen by priority and partition."""

    def __init__(self, conn, span):
        self.conn = conn
        self.span = span  # Database.span: a queue's range of row ids

    def rows(self, queue: bytes, in_flight: list[int]) -> tuple:
        """(rowid, priority, partition_key) of the queue's tasks in flight, `in_flight` their row ids
        (the broker's leases: a second pass over the range cost 0.1 s a million tasks), as a list;
        and of its available tasks, in row id order (push order), one read of its range, as the
        cursor to read them from (a list of a million rows held 130 MB more at once, measured). A lanes
        queue's claim order is built from them after a start or a rollback."""
        held = self.conn.execute(
            "SELECT rowid, priority, partition_key FROM tasks WHERE rowid IN (SELECT value FROM json_each(?)) "
            "AND state = 'in_flight' ORDER BY rowid", (row_list(in_flight),)).fetchall() if in_flight else []
        low, high = self.span(queue)
        available = self.conn.execute(  # queue = ?: a row written by hand in its range meanwhile is not its task
            "SELECT rowid, priority, partition_key FROM tasks WHERE rowid BETWEEN ? AND ? "
            "AND state = 'available' AND queue = ? ORDER BY rowid", (low, high, name_value(queue)))
        return available, held

    def of(self, rowid: int) -> tuple:
        """(priority, partition_key) of one task as stored, or (None, None) if it is gone."""
        return self.conn.execute("SELECT priority, partition_key FROM tasks WHERE rowid = ?",
                                 (rowid,)).fetchone() or (None, None)

    def use_lanes(self, name: bytes) -> None:
        """The queue's claims take the order by priority and partition from now on, for good."""
        self.conn.execute("UPDATE queues SET lanes = 1 WHERE name = ?", (name_value(name),))
