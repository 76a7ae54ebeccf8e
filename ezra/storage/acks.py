"""The ack's statements: in_flight -> done (or deleted, under retention 0), each task's row by
its row id.

The broker knows which tasks are in flight and their rows (broker/in_flight.py): it asks for
exactly those, and each statement must finish every row it names. The state guard stays in
the statement, so that a row the broker was wrong about is counted out, never finished twice:
the caller checks the count.
"""

from __future__ import annotations

from .schema import row_list

_DONE = "UPDATE tasks SET state = 'done', deadline = NULL, finished_at = ?, retained = ? WHERE "
_ONE_SQL = _DONE + "rowid = ? AND state = 'in_flight'"
_MANY_SQL = _DONE + "rowid IN (SELECT value FROM json_each(?)) AND state = 'in_flight'"
_RESULT_SQL = ("UPDATE tasks SET state = 'done', deadline = NULL, finished_at = ?, retained = ?, result = ? "
               "WHERE rowid = ? AND state = 'in_flight'")
_DELETE_SQL = "DELETE FROM tasks WHERE rowid = ? AND state = 'in_flight' AND ttl_ms IS NULL"


def ack(conn, rowids: list[int], now: int, retained: int | None = None) -> int:
    """in_flight -> done for each row; how many it finished. `retained`: 1 under a retention
    limit (the task goes into tasks_retained, for the purge), None while done tasks are kept for
    ever (no index written)."""
    if len(rowids) == 1:  # a worker's ack of one task
        return conn.execute(_ONE_SQL, (now, retained, rowids[0])).rowcount
    # One statement for many (50 ids: no bind, step and reset a row, as executemany's)
    return conn.execute(_MANY_SQL, (now, retained, row_list(rowids))).rowcount


def delete_acked(conn, rowid: int) -> bool:
    """Retention 0: an acked task without its own TTL goes at once; False if it has a TTL (then
    `ack` it: it is kept that long)."""
    return conn.execute(_DELETE_SQL, (rowid,)).rowcount == 1


def ack_with_results(conn, rows: list[tuple]) -> int:
    """XACK ... RESULT: in_flight -> done for each (now, retained, result, rowid), its result written in
    the same statement (each row is written once, as a plain ack writes it); how many it finished."""
    if len(rows) == 1:
        return conn.execute(_RESULT_SQL, rows[0]).rowcount
    return conn.executemany(_RESULT_SQL, rows).rowcount
