"""The queries of named tasks (XADD NAME, XRESULT NAME), named; run in the writer's transaction like the rest.

A name belongs to the one task of its queue pushed with it, in whatever state, for as long as the
task's row exists: the partial unique index `tasks_named` (schema.sql) holds every named row, so it
answers `task` and refuses a second row with the name even if a caller forgot to ask (or the
sqlite3 shell writes one). When the row goes (TTL, retention, XTRIM, XDEL, XACKDEL, a purge), so
does the name, with no write of its own.
"""

from __future__ import annotations

from .schema import name_value

_TASK_SQL = ("SELECT id_ms, id_seq FROM tasks INDEXED BY tasks_named WHERE queue = ? AND name = ? "
             "AND name IS NOT NULL")  # the index's own WHERE, so that SQLite may use it


class TaskNames:
    """The tasks table seen by its tasks' names."""

    def __init__(self, conn):
        self.conn = conn

    def task(self, queue: bytes, name: bytes) -> tuple | None:
        """The id of the task of `queue` named `name`, if its row exists."""
        return self.conn.execute(_TASK_SQL, (name_value(queue), name_value(name))).fetchone()
