"""Rows written by hand (the sqlite3 shell) since the server last stopped cleanly, found at start.

A person may INSERT tasks while the server is stopped (docs/usage.md, "Writing tasks by hand"):
SQLite gives such a row the table's largest row id plus one, inside the last queue's range of row
ids (storage/row_ranges.py) whatever its queue, and any id. A start that reads every row anyway
(after a crash, or when the file changed since its clean stop: storage/done_counts.py) checks:

- every task's fields can be read: a JSON array of text names and values, or a BLOB holding a
  RESP array (its header and last bytes are looked at, as a BLOB is EZRA's own form: `*n` with n
  even and above 0, CRLF at the end), and its id is two integers. A row that cannot be read is moved to the table `unreadable_tasks`, with why:
  never served, and counted in INFO and on the dashboard;
- every task is in its queue's range, after the one before it: a row out of place (another
  queue's range, or out of id order in its own) makes the tasks table renumbered in id order. A
  second row with an id its queue has is moved to `unreadable_tasks` first (the row with the lower
  row id, the one written first, stays): one id, one task.

The checks cost a pass over the table (one query each, the fields' first and last bytes read);
nothing in a push, a claim or an ack. A row written while the server runs is the writer's to
survive (Database._row_taken) and this start's to put in place (Database.close).
"""

from __future__ import annotations

import time

from loguru import logger

from .schema import decode_fields

LOGGED = 20  # rows set aside named one by one in the log; the rest counted
# Columns copied to unreadable_tasks: every column of tasks but the row id.
COLUMNS = ("queue, id_ms, id_seq, state, fields, attempts, worker, created_at, available_at, deadline, "
           "delivered_at, finished_at, ttl_ms, unique_key, failure, retained, reserved")

# Rows whose fields may not be readable: text (read below, as a reply would), anything but text or
# a BLOB, a BLOB that is not `*n` (n even, above 0) to CRLF ... CRLF; ids that are not integers.
_ITEMS = "CAST(CAST(substr(fields, 2, instr(fields, x'0d0a') - 2) AS TEXT) AS INTEGER)"
_SUSPECT = ("SELECT rowid, queue, id_ms, id_seq, fields, typeof(fields) = 'blob' FROM tasks "
            f"WHERE typeof(fields) != 'blob' OR substr(fields, 1, 1) != x'2a' OR {_ITEMS} <= 0 OR {_ITEMS} % 2 "
            "OR substr(fields, -2) != x'0d0a' "
            "OR typeof(id_ms) != 'integer' OR typeof(id_seq) != 'integer' OR id_ms < 0 OR id_seq < 0")
# Rows out of place: not in their queue's range (the range's owner, queues.number = rowid >> 40, is
# another queue or none), or not above the row before them in the range (out of order, or a repeat).
_OUT_OF_PLACE = (
    "SELECT count(*) FROM tasks AS t WHERE t.queue IS NOT (SELECT name FROM queues WHERE number = t.rowid >> 40) "
    "OR (t.id_ms, t.id_seq) <= (SELECT id_ms, id_seq FROM tasks AS b WHERE b.rowid BETWEEN (t.rowid >> 40) << 40 "
    "AND t.rowid - 1 ORDER BY b.rowid DESC LIMIT 1)")
# Second rows of an id within a queue (a sort of the table: only when rows are out of place).
_REPEATS = ("SELECT rowid FROM (SELECT rowid, row_number() OVER (PARTITION BY queue, id_ms, id_seq ORDER BY rowid) "
            "AS copy FROM tasks) WHERE copy > 1")
REPEAT_REASON = "a duplicate: a second row with an id its queue has (the row written first stays in the queue)"


def check(conn, path: str, renumber) -> None:
    """Set aside rows that cannot be read and repeated ids, and put every task in its queue's place
    (`renumber(conn)`, opening.py's), in one transaction; log what was found."""
    unreadable = [(row[0], (row[1], row[2], row[3]), reason) for row in conn.execute(_SUSPECT)
                  if (reason := _unreadable(row[2], row[3], row[4], row[5])) is not None]
    if unreadable:
        _set_aside(conn, path, unreadable)
    out_of_place = conn.execute(_OUT_OF_PLACE).fetchone()[0]
    if not out_of_place:
        return
    logger.warning("{}: {} tasks are out of place (another queue's range of row ids, or out of order in their "
                   "own: written by hand?); renumbering the tasks table", path, out_of_place)
    conn.execute("BEGIN IMMEDIATE")
    try:
        repeats = [row[0] for row in conn.execute(_REPEATS)]
        if repeats:
            rows = conn.execute("SELECT rowid, queue, id_ms, id_seq FROM tasks WHERE rowid IN "
                                f"({','.join('?' * len(repeats))})", repeats).fetchall()
            _set_aside(conn, path, [(row[0], row[1:], REPEAT_REASON) for row in rows], transaction=False)
        renumber(conn)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _unreadable(id_ms, id_seq, fields, blob: bool) -> str | None:
    """Why a suspect task row cannot be served, or None: it can."""
    if type(id_ms) is not int or type(id_seq) is not int or id_ms < 0 or id_seq < 0:
        return f"its id ({id_ms!r}, {id_seq!r}) is not two integers"
    if blob:
        return "its fields are a BLOB that is not a RESP array of names and values (write them as JSON text)"
    if type(fields) is not str:
        return f"its fields are a value of type {type(fields).__name__}, not a JSON array of text"
    try:
        items = decode_fields(fields)
    except ValueError as exc:
        return f"its fields are not a JSON array of text: {exc}"
    if not items or len(items) % 2:
        return f"its fields are {len(items)} items, not names and values"
    return None


def _set_aside(conn, path: str, rows: list[tuple], transaction: bool = True) -> None:
    """Move these rows, (rowid, (queue, id_ms, id_seq), reason), to unreadable_tasks."""
    now = int(time.time() * 1000)
    if transaction:
        conn.execute("BEGIN IMMEDIATE")
    try:
        for rowid, _, reason in rows:
            conn.execute(f"INSERT INTO unreadable_tasks (row, {COLUMNS}, reason, found_at) "
                         f"SELECT rowid, {COLUMNS}, ?, ? FROM tasks WHERE rowid = ?", (reason, now, rowid))
            conn.execute("DELETE FROM tasks WHERE rowid = ?", (rowid,))
        if transaction:
            conn.execute("COMMIT")
    except BaseException:
        if transaction:
            conn.execute("ROLLBACK")
        raise
    for rowid, (queue, ms, seq), reason in rows[:LOGGED]:
        logger.warning("{}: task {}-{} of queue {!r} (row {}) moved to the table unreadable_tasks, not served: {}",
                       path, ms, seq, queue, rowid, reason)
    if len(rows) > LOGGED:
        logger.warning("{}: {} more tasks moved to unreadable_tasks", path, len(rows) - LOGGED)


def count(conn) -> int:
    """Tasks set aside in unreadable_tasks (INFO's unreadable_tasks, the dashboard)."""
    return conn.execute("SELECT count(*) FROM unreadable_tasks").fetchone()[0]
