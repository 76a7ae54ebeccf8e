"""The queries of XADD AFTER (broker/dependencies.py), named; run in the writer's transaction.

An edge (dependency, dependent) of the dependencies table says: the dependent, a task's row id,
waits for the dependency, another's, to be done. The broker asks for them only while some edge
exists (Dependencies.any), so a plain ack runs none of these.
"""

from __future__ import annotations

from . import row_ranges
from .schema import ROOM_SQL, encode_failure, name_value, row_list

_DONE_ONE_SQL = "DELETE FROM dependencies WHERE dependency = ? RETURNING dependent"
_DONE_MANY_SQL = "DELETE FROM dependencies WHERE dependency IN (SELECT value FROM json_each(?)) RETURNING dependent"
# Released, those of the rows given that wait for nothing more: available, or delayed while their own
# DELAY runs (available_at, set by the push). One statement for many (an ack that releases 100,000:
# 10 times faster than a look-up and an update each).
_RELEASE_SQL = ("UPDATE tasks SET state = CASE WHEN available_at > ? THEN 'delayed' ELSE 'available' END, "
                f"reserved = {ROOM_SQL} WHERE rowid IN (SELECT value FROM json_each(?)) AND state = 'waiting' "
                "AND NOT EXISTS (SELECT 1 FROM dependencies WHERE dependent = tasks.rowid) "
                "RETURNING rowid, queue, state, available_at, priority, partition_key")
RELEASE_ROWS = 10_000  # row ids per statement: a bounded JSON text
_ORPHAN_SQL = ("UPDATE tasks SET state = 'dead', finished_at = ?, failure = ?, reserved = NULL "
               "WHERE rowid = ? AND state = ? RETURNING queue, id_ms, id_seq")


def task_dependencies(conn, queue: bytes, task_id: tuple) -> tuple[list, list]:
    """(what the task waits for, what waits for it): (queue, id_ms, id_seq, state) each, queue None for a
    task deleted since (the dashboard's task page, read apart on its own connection). An edge goes when
    its dependency is done, so these are the ones not done yet."""
    span = row_ranges.queue_span(conn, queue)
    rowid = None if span is None else row_ranges.row_of(conn, span, task_id)
    if rowid is None:
        return [], []
    edges = Dependencies(conn, None)
    return [row[1:] for row in edges.waited_for(rowid)], edges.waiting_on(rowid, SHOWN)


SHOWN = 100  # tasks the task page lists each way


class Dependencies:
    """The dependencies table and the waiting tasks' rows."""

    def __init__(self, conn, span):
        self.conn = conn
        self.span = span  # Database.span: a queue's range of row ids

    def any(self) -> bool:
        """Some edge exists (start-up, a rollback's reload)."""
        return self.conn.execute("SELECT EXISTS (SELECT 1 FROM dependencies)").fetchone()[0] == 1

    def find(self, queue: bytes, task_id: tuple) -> tuple[int, str] | None:
        """(row id, state) of a task named by AFTER, or None: no such task."""
        rowid = row_ranges.row_of(self.conn, self.span(queue), task_id)
        if rowid is None:
            return None
        row = self.conn.execute("SELECT state FROM tasks WHERE rowid = ? AND queue = ?",
                                (rowid, name_value(queue))).fetchone()
        return None if row is None else (rowid, row[0])

    def add(self, dependent: int, dependencies: list[int]) -> None:
        """The dependent waits for each of these (a task named twice is one edge)."""
        self.conn.executemany("INSERT OR IGNORE INTO dependencies (dependency, dependent) VALUES (?, ?)",
                              [(dependency, dependent) for dependency in dependencies])

    def done(self, rowids: list[int]):
        """These tasks are done: their edges go. Yields the dependents that waited for them (one may come
        twice), RELEASE_ROWS at a time, in row id order for one task: SQLite holds the rest, so that a task
        a million wait for costs no list of a million here."""
        cursor = (self.conn.execute(_DONE_ONE_SQL, (rowids[0],)) if len(rowids) == 1 else
                  self.conn.execute(_DONE_MANY_SQL, (row_list(rowids),)))
        while True:
            rows = cursor.fetchmany(RELEASE_ROWS)
            if rows:
                yield [row[0] for row in rows]
            if len(rows) < RELEASE_ROWS:
                return

    def release(self, dependents: list[int], now: int) -> list[tuple]:
        """The waiting tasks among these (up to RELEASE_ROWS) with no edge left become available (or
        delayed): (rowid, queue, state, available_at, priority, partition_key) of each, in row id order."""
        rows = self.conn.execute(_RELEASE_SQL, (now, row_list(dependents))).fetchall()
        rows.sort()
        return rows

    def wait_again(self, rowid: int) -> None:
        """A requeued task (available) waits again: some task it names is not done."""
        self.conn.execute("UPDATE tasks SET state = 'waiting', reserved = NULL WHERE rowid = ? AND state = 'available'",
                          (rowid,))

    def dependents(self, rowids: list[int]) -> list[int]:
        """The tasks waiting for any of these (their edges stay)."""
        return [row[0] for row in self.conn.execute(
            "SELECT dependent FROM dependencies WHERE dependency IN (SELECT value FROM json_each(?))",
            (row_list(rowids),))]

    def orphan(self, rowid: int, failure: dict, now: int, state: str = "waiting") -> tuple | None:
        """A task in `state` (waiting; dead: a requeue undone) dies, why in `failure`: (queue, id_ms, id_seq),
        or None if it was not in that state."""
        return self.conn.execute(_ORPHAN_SQL, (now, encode_failure(failure), rowid, state)).fetchone()

    def forget(self, rowids: list[int]) -> None:
        """These tasks are gone (deleted, purged): the edges where they wait go."""
        self.conn.execute("DELETE FROM dependencies WHERE dependent IN (SELECT value FROM json_each(?))",
                          (row_list(rowids),))

    def waited_for(self, dependent: int) -> list[tuple]:
        """(row id, queue, id_ms, id_seq, state) of each task the dependent waits for; queue etc. None: gone."""
        return self.conn.execute(
            "SELECT d.dependency, t.queue, t.id_ms, t.id_seq, t.state FROM dependencies AS d "
            "LEFT JOIN tasks AS t ON t.rowid = d.dependency WHERE d.dependent = ? ORDER BY d.dependency",
            (dependent,)).fetchall()

    def waiting_on(self, dependency: int, limit: int = 1000) -> list[tuple]:
        """(queue, id_ms, id_seq, state) of the tasks that wait for this one (up to `limit`)."""
        return self.conn.execute(
            "SELECT t.queue, t.id_ms, t.id_seq, t.state FROM dependencies AS d JOIN tasks AS t "
            "ON t.rowid = d.dependent WHERE d.dependency = ? ORDER BY d.dependent LIMIT ?",
            (dependency, limit)).fetchall()

    def waiting_counts(self) -> list[tuple]:
        """(queue, count) of the waiting tasks of each queue that has some (start-up's counts). A task
        with an edge left is waiting, or dead (it died with its dependency and keeps its edges), and a
        waiting one has an edge: so the tasks of a queue's range among the dependents, less its dead ones
        among them. No index of waiting tasks: its predicate on the state cost every push, claim and
        ack 0.35 µs (schema 18 dropped tasks_waiting)."""
        dependents, start = [], 0
        while True:  # queue by queue, each its range of row ids (one GROUP BY would sort every edge)
            row = self.conn.execute("SELECT dependent FROM dependencies INDEXED BY dependencies_dependent "
                                    "WHERE dependent >= ? ORDER BY dependent LIMIT 1", (start,)).fetchone()
            if row is None:
                break
            first, last = row_ranges.span(row[0] >> row_ranges.ROW_BITS)
            dependents.append(self.conn.execute(
                "SELECT (SELECT name FROM queues WHERE number = ?), count(DISTINCT dependent) FROM dependencies "
                "INDEXED BY dependencies_dependent WHERE dependent BETWEEN ? AND ?",
                (row[0] >> row_ranges.ROW_BITS, first, last)).fetchone())
            start = last + 1
        if not dependents:
            return []
        dead = dict(self.conn.execute(self._dead_dependents_sql(sum(n for _, n in dependents))))
        return [(queue, n - dead.get(queue, 0)) for queue, n in dependents
                if queue is not None and n > dead.get(queue, 0)]

    def _dead_dependents_sql(self, dependents: int) -> str:
        """(queue, count) of the dead tasks with an edge: from the side with fewer rows to look at (a
        look-up each: 0.13 s a million), the dependents or the dead tasks (their index counted first)."""
        dead = self.conn.execute("SELECT count(*) FROM tasks INDEXED BY tasks_dead WHERE state = 'dead'").fetchone()[0]
        if dependents <= dead:
            return ("SELECT tasks.queue, count(*) FROM (SELECT DISTINCT dependent FROM dependencies INDEXED BY "
                    "dependencies_dependent) AS edges JOIN tasks ON tasks.rowid = edges.dependent "
                    "WHERE tasks.state = 'dead' GROUP BY tasks.queue")
        return ("SELECT queue, count(*) FROM tasks INDEXED BY tasks_dead WHERE state = 'dead' AND EXISTS "
                "(SELECT 1 FROM dependencies INDEXED BY dependencies_dependent WHERE dependent = tasks.rowid) "
                "GROUP BY queue")

    def row_of(self, queue: bytes, task_id: tuple) -> int | None:
        """A task's row id (the dashboard's and export's look-ups), or None."""
        return row_ranges.row_of(self.conn, self.span(queue), task_id)
