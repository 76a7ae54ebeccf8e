"""The queries of a lanes queue's claim order (broker/lanes.py): each task's place, its priority
(XADD PRIORITY; NULL: the default) and partition (XADD PARTITION; NULL: none), as stored; run in
the writer's transaction like the rest."""

from __future__ import annotations

import sqlite3
from array import array
from collections import defaultdict
from functools import partial

from .row_ranges import span
from .schema import name_bytes, name_value, row_list


def grouped(rows) -> dict[tuple, array]:
    """(rowid, priority, partition_key) rows, in row id order, by (priority, partition_key) as stored:
    each group's row ids in order, 8 bytes each (an int object each held 36: a million tasks)."""
    groups: dict[tuple, array] = defaultdict(partial(array, "q"))
    for rowid, priority, partition in rows:
        groups[priority, partition].append(rowid)
    return groups


def read_ahead(path: str) -> dict[bytes, dict]:
    """Each lanes queue's tasks available or in flight, grouped, read on a connection of its own (the
    start runs it on a thread while the check of rows written by hand runs on the file's: opening.py).
    For a start that recovers: its tasks in flight become available. {queue name: grouped rows}."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False)
    try:
        return {name_bytes(name): grouped(conn.execute(
            "SELECT rowid, priority, partition_key FROM tasks WHERE rowid BETWEEN ? AND ? AND queue = ? "
            "AND (state = 'available' OR state = 'in_flight') ORDER BY rowid",
            (*span(number), name)))
            for name, number in conn.execute("SELECT name, number FROM queues WHERE lanes = 1 AND number IS NOT NULL")}
    finally:
        conn.close()


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
