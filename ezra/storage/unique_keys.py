"""The queries of unique tasks (XADD UNIQUE), named; run in the writer's transaction like the rest.

A key is held by the one unfinished (available, delayed, in-flight) task of its queue pushed
with it: the partial unique index `tasks_unique` (schema.sql) holds exactly those tasks, so
it answers `holder` and refuses a second holder even if a caller forgot to ask. Done and dead
tasks keep their key in the row (XINFO TASKS shows it) but hold nothing.
"""

from __future__ import annotations

from .schema import name_value

# The index's own WHERE, repeated word for word: SQLite uses a partial index only for a query
# whose WHERE implies the index's.
UNFINISHED = "state IN ('available', 'delayed', 'in_flight')"


class UniqueKeys:
    """The tasks table seen by its unique keys."""

    def __init__(self, conn):
        self.conn = conn

    def holder(self, queue: bytes, key: bytes) -> tuple | None:
        """The id of the unfinished task of `queue` pushed with `key`, if any."""
        return self._holder(name_value(queue), name_value(key))

    def _holder(self, queue, key) -> tuple | None:
        """holder() with the queue and key as their SQL values."""
        return self.conn.execute(
            f"SELECT id_ms, id_seq FROM tasks INDEXED BY tasks_unique WHERE queue = ? AND unique_key = ? "
            f"AND unique_key IS NOT NULL AND {UNFINISHED}", (queue, key)).fetchone()

    def release_all_dead(self, queue: bytes) -> list[tuple]:
        """Before XREQUEUE ALL: the dead tasks whose key another task would hold once they are all
        available (an unfinished task, or an older dead one with the same key) lose their key.
        Returns the ids of those. The window sorts the queue's keyed dead tasks once."""
        q = name_value(queue)
        return self.conn.execute(
            "UPDATE tasks SET unique_key = NULL WHERE rowid IN (SELECT rowid FROM ("
            "  SELECT rowid, unique_key, row_number() OVER (PARTITION BY unique_key ORDER BY id_ms, id_seq) AS n"
            "  FROM tasks WHERE queue = ? AND state = 'dead' AND unique_key IS NOT NULL) AS dead"
            f" WHERE n > 1 OR EXISTS (SELECT 1 FROM tasks AS held INDEXED BY tasks_unique WHERE held.queue = ? "
            f"AND held.unique_key = dead.unique_key AND held.unique_key IS NOT NULL AND held.{UNFINISHED}))"
            " RETURNING id_ms, id_seq", (q, q)).fetchall()

    def release_dead(self, queue: bytes, ids: list[tuple]) -> list[tuple]:
        """Before XREQUEUE of these ids: as release_all_dead, for the given dead tasks in their order
        (the first of them with a free key keeps it). Returns the ids of those released."""
        q, taken, released = name_value(queue), set(), []
        for ms, seq in dict.fromkeys(ids):
            row = self.conn.execute("SELECT rowid, unique_key FROM tasks WHERE queue = ? AND id_ms = ? "
                                    "AND id_seq = ? AND state = 'dead'", (q, ms, seq)).fetchone()
            if row is None or row[1] is None:
                continue
            rowid, key = row
            if key in taken or self._holder(q, key) is not None:
                self.conn.execute("UPDATE tasks SET unique_key = NULL WHERE rowid = ?", (rowid,))
                released.append((ms, seq))
            else:
                taken.add(key)
        return released
