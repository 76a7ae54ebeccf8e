"""The queries of what goes for good, named: retention's purge of done tasks (and the marking
that lets it see those done while their queue kept them for ever), trimming (MAXLEN, MINID) and
TTL. Run in the writer's transaction like the rest (Reaper, broker/reaper.py, drives them).

Done tasks are in no index of their own (schema 10): a queue that keeps them for ever, the
default, writes none on its acks. Those finished under a retention limit carry `retained` and
sit in tasks_retained by finish time, which the purge reads oldest first.
"""

from __future__ import annotations

from ..protocol.stream_ids import TOP
from .row_ranges import lowest_row
from .schema import name_value


class Retention:
    """The tasks table seen by when tasks leave it."""

    def __init__(self, conn, span):
        self.conn = conn
        self.span = span  # a queue's range of row ids (Database.span)

    def purge_done(self, queue: bytes, finished_before: int, limit: int) -> list[tuple]:
        """Delete up to `limit` retained done tasks (without their own TTL) finished before the
        cut-off, oldest first (tasks_retained's order); their ids."""
        return self.conn.execute(
            "DELETE FROM tasks WHERE rowid IN (SELECT rowid FROM tasks INDEXED BY tasks_retained "
            "WHERE queue = ? AND retained IS NOT NULL AND finished_at < ? AND state = 'done' "
            "AND ttl_ms IS NULL ORDER BY finished_at LIMIT ?) "
            "RETURNING id_ms, id_seq", (name_value(queue), finished_before, limit)).fetchall()

    def mark_retained(self, queue: bytes, start: tuple, rows: int) -> tuple | None:
        """Mark the done tasks among the queue's next `rows` tasks from id `start` (in id order) as
        retained: a retention limit applies to those done while the queue kept them for ever. The
        id to go on from, or None when the walk reached the queue's end."""
        span = self.span(queue)
        low = lowest_row(self.conn, span, start)
        end = self.conn.execute(
            "SELECT rowid, id_ms, id_seq FROM tasks WHERE rowid BETWEEN ? AND ? ORDER BY rowid LIMIT 1 OFFSET ?",
            (low, span[1], rows)).fetchone()
        self.conn.execute(
            "UPDATE tasks SET retained = 1 WHERE rowid BETWEEN ? AND ? AND state = 'done' AND retained IS NULL",
            (low, span[1] if end is None else end[0] - 1))
        return None if end is None else (end[1], end[2])

    def save_unmarked_done(self, name: bytes, unmarked: bool) -> None:
        self.conn.execute("UPDATE queues SET unmarked_done = ? WHERE name = ?", (int(unmarked), name_value(name)))

    def trim_done(self, queue: bytes, start: tuple, below: tuple, limit: int) -> list[tuple]:
        """Trimming: delete up to `limit` done tasks with ids from `start` to below `below`, lowest
        first (in the order of the queue's row ids: the scan starts at `start`); their ids, in order."""
        span = self.span(queue)
        low = lowest_row(self.conn, span, start)
        high = span[1] if below >= TOP else lowest_row(self.conn, span, below) - 1
        return sorted(self.conn.execute(
            "DELETE FROM tasks WHERE rowid IN (SELECT rowid FROM tasks WHERE rowid BETWEEN ? AND ? "
            "AND state = 'done' ORDER BY rowid LIMIT ?) RETURNING id_ms, id_seq", (low, high, limit)).fetchall())

    def oldest_done(self, queue: bytes) -> int | None:
        """When the oldest retained done task (without its own TTL) of a queue finished."""
        return self.conn.execute(
            "SELECT min(finished_at) FROM tasks INDEXED BY tasks_retained WHERE queue = ? "
            "AND retained IS NOT NULL AND state = 'done' AND ttl_ms IS NULL",
            (name_value(queue),)).fetchone()[0]

    def purge_expired_ttl(self, now: int, limit: int) -> list[tuple]:
        """Delete finished tasks whose TTL ran out; (queue, state, id_ms, id_seq, rowid) of each."""
        return self.conn.execute(
            "DELETE FROM tasks WHERE rowid IN (SELECT rowid FROM tasks WHERE ttl_ms IS NOT NULL "
            "AND state IN ('done', 'dead') AND finished_at + ttl_ms <= ? LIMIT ?) "
            "RETURNING queue, state, id_ms, id_seq, rowid", (now, limit)).fetchall()

    def next_ttl_expiry(self) -> int | None:
        return self.conn.execute(
            "SELECT min(finished_at + ttl_ms) FROM tasks WHERE ttl_ms IS NOT NULL "
            "AND state IN ('done', 'dead')").fetchone()[0]
