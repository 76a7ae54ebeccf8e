"""Rows written by hand (the sqlite3 shell), found at the next start.

A person may INSERT tasks while the server is stopped (docs/usage.md, "Writing tasks by hand"):
SQLite gives such a row the table's largest row id plus one, inside the last queue's range of row
ids (storage/row_ranges.py) whatever its queue, and any id. A start that reads every row anyway
(after a crash, or when the file was written since its clean stop: storage/done_counts.py) makes
one pass over the table (`check`) for rows that are:

- unreadable: fields that are not a JSON array of text names and values, nor a BLOB (EZRA's own
  form, a RESP array); an id that is not two integers; a priority that is not NULL nor an integer
  from 0 to 9, a partition key that is not NULL nor 1 to 256 bytes of text or BLOB. Moved to the
  table `unreadable_tasks`, with why: never served, counted in INFO and on the dashboard. A BLOB's
  bytes are looked at (`*n` with n even and above 0, CRLF at the end: +0.5 s a million tasks) when the file was
  written by another program since the server's clean stop or while it ran, as hand edits are;
  after a crash, which leaves only EZRA's own writes, its type only;
- out of place: in another queue's range, or not above the row before it in its own (out of id
  order, or a second row with an id its queue has). The tasks table is then renumbered in id
  order; of a repeated id, the row with the lowest row id (written first) stays, and the others
  are moved to `unreadable_tasks`: one id, one task.

A row is compared with the row id just below it, a point lookup; the first row after a gap
(deleted tasks) with the row before it in its range, a search: 0.5 s a million tasks, the cost of
the check it replaces. Nothing in a push, a claim or an ack. A row written while the server runs
is survived (a push that meets it takes the next free row id) and put in place by the next start,
as the stop marks the file written by another connection (HandRows).
"""

from __future__ import annotations

import sqlite3
import time

from loguru import logger

from .. import lifecycle
from .schema import decode_fields, roll_back

LOGGED = 20  # rows set aside named one by one in the log; the rest counted
# Columns copied to unreadable_tasks: every column of tasks but the row id.
COLUMNS = ("queue, id_ms, id_seq, state, fields, attempts, worker, created_at, available_at, deadline, "
           "delivered_at, finished_at, ttl_ms, unique_key, failure, retained, reserved, priority, partition_key, "
           "result, progress, name")

# Rows that may be unreadable: fields in text (read in Python, as a reply would) or neither text nor a
# BLOB; ids that are not integers; a priority or partition key XADD would refuse (commands/push.py).
# BLOB_BYTES: also a BLOB that is not `*n` (n even, above 0) ... CRLF. A partition key is TEXT or a BLOB
# (the column's TEXT affinity makes a number text); its bytes are counted (a CAST: a copy) only when it
# has over a quarter of the bound in characters, at most 4 bytes of UTF-8 each: a million keyed rows
# were checked in 0.12 s, 0.32 with a CAST of each (measured).
_SUSPECT = ("typeof(t.fields) != 'blob' OR typeof(t.id_ms) != 'integer' OR typeof(t.id_seq) != 'integer' "
            "OR t.id_ms < 0 OR t.id_seq < 0 OR (t.priority IS NOT NULL AND (typeof(t.priority) != 'integer' "
            f"OR t.priority < {lifecycle.PRIORITIES[0]} OR t.priority > {lifecycle.PRIORITIES[-1]})) "
            f"OR (t.partition_key IS NOT NULL AND length(t.partition_key) NOT BETWEEN 1 AND {lifecycle.MAX_PARTITION_KEY // 4} "
            f"AND length(CAST(t.partition_key AS BLOB)) NOT BETWEEN 1 AND {lifecycle.MAX_PARTITION_KEY})")
_ITEMS = "CAST(CAST(substr(t.fields, 2, instr(t.fields, x'0d0a') - 2) AS TEXT) AS INTEGER)"
_BLOB_BYTES = (f"substr(t.fields, 1, 1) != x'2a' OR {_ITEMS} <= 0 OR {_ITEMS} % 2 OR substr(t.fields, -2) != x'0d0a'")
# Out of place: a row not of the queue of the row just below it (b), or not above its id; a row with no
# row just below it in its range (its first, or the first after deleted tasks) not of the range's
# queue (queues.number = rowid >> 40), or not above the row before it there.
# (A first row has no row before it: the comparison is NULL, which coalesce makes 0.)
_OUT_OF_PLACE = (
    "coalesce(CASE WHEN b.rowid IS NOT NULL THEN t.queue IS NOT b.queue OR (t.id_ms, t.id_seq) <= (b.id_ms, b.id_seq) "
    "ELSE t.queue IS NOT (SELECT name FROM queues WHERE number = t.rowid >> 40) "
    "OR (t.id_ms, t.id_seq) <= (SELECT id_ms, id_seq FROM tasks AS p WHERE p.rowid BETWEEN (t.rowid >> 40) << 40 "
    "AND t.rowid - 1 ORDER BY p.rowid DESC LIMIT 1) END, 0)")
_CHECK = ("SELECT t.rowid, t.queue, t.id_ms, t.id_seq, t.fields, typeof(t.fields) = 'blob', t.priority, "
          "t.partition_key, {suspect}, {out} "
          "FROM tasks AS t LEFT JOIN tasks AS b ON b.rowid = t.rowid - 1 AND b.rowid >> 40 = t.rowid >> 40 "
          "WHERE {suspect} OR {out}")
CHECK_SQL = {blob_bytes: _CHECK.format(out=_OUT_OF_PLACE, suspect=f"({_SUSPECT} OR {_BLOB_BYTES})" if blob_bytes
                                       else f"({_SUSPECT})") for blob_bytes in (False, True)}
# Second rows of an id within a queue (a sort of the table: only when rows are out of place).
_REPEATS = ("SELECT rowid FROM (SELECT rowid, row_number() OVER (PARTITION BY queue, id_ms, id_seq ORDER BY rowid) "
            "AS copy FROM tasks) WHERE copy > 1")
REPEAT_REASON = "a duplicate: a second row with an id its queue has (the row written first stays in the queue)"


def check(conn, path: str, renumber, blob_bytes: bool) -> bool:
    """Set aside rows that cannot be read and repeated ids, and put every task in its queue's place
    (`renumber(conn)`, opening.py's), in one transaction each; log what was found. `blob_bytes`:
    look at BLOBs' bytes too (the file was written by another program). True if it moved any row."""
    unreadable, out_of_place = [], 0
    for rowid, queue, ms, seq, fields, blob, priority, partition, suspect, out in conn.execute(CHECK_SQL[blob_bytes]):
        reason = _unreadable(ms, seq, fields, blob, priority, partition) if suspect else None
        if reason is not None:
            unreadable.append((rowid, (queue, ms, seq), reason))
        out_of_place += out  # an unreadable row too: the rows after it were compared with it
    if unreadable:
        _set_aside(conn, path, unreadable)
    if not out_of_place:
        return bool(unreadable)
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
        roll_back(conn)
        raise
    return True


def _unreadable(id_ms, id_seq, fields, blob: bool, priority=None, partition=None) -> str | None:
    """Why a suspect task row cannot be served, or None: it can."""
    if type(id_ms) is not int or type(id_seq) is not int or id_ms < 0 or id_seq < 0:
        return f"its id ({id_ms!r}, {id_seq!r}) is not two integers"
    if priority is not None and (type(priority) is not int or priority not in lifecycle.PRIORITIES):
        return f"its priority ({priority!r}) is not an integer from 0 to 9 (NULL: the default)"
    if partition is not None and (type(partition) not in (str, bytes) or not 0 < len(
            partition.encode() if type(partition) is str else partition) <= lifecycle.MAX_PARTITION_KEY):
        return (f"its partition key ({partition!r:.60}) is not 1 to {lifecycle.MAX_PARTITION_KEY} bytes of text or "
                "a BLOB (NULL: none)")
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
            roll_back(conn)
        raise
    for rowid, (queue, ms, seq), reason in rows[:LOGGED]:
        logger.warning("{}: task {}-{} of queue {!r} (row {}) moved to the table unreadable_tasks, not served: {}",
                       path, ms, seq, queue, rowid, reason)
    if len(rows) > LOGGED:
        logger.warning("{}: {} more tasks moved to unreadable_tasks", path, len(rows) - LOGGED)


def count(conn) -> int:
    """Tasks set aside in unreadable_tasks (INFO's unreadable_tasks, the dashboard)."""
    return conn.execute("SELECT count(*) FROM unreadable_tasks").fetchone()[0]



class HandRows:
    """The server's side of rows written by hand: how many the start set aside (INFO, the dashboard),
    and writes by other connections (the sqlite3 shell) while the server runs, which the docs say
    not to make and the server survives. SQLite counts others' commits (PRAGMA data_version: not
    this connection's, nor a checkpoint's), compared once, at the stop; a push that meets a row at
    its queue's next row id finds it on its error path only (`make_way`)."""

    def __init__(self, conn, path: str):
        self.conn = conn
        self.path = path
        self.set_aside = count(conn)  # tasks in unreadable_tasks
        self._data_version = conn.execute("PRAGMA data_version").fetchone()[0]
        self._met_a_row = False

    def make_way(self, queue: bytes, rowids: tuple[int, int], exc, next_rows: dict) -> None:
        """A push's INSERT at `rowids` failed with `exc` (sqlite3.IntegrityError): if a row it did not
        write holds one of them (the sqlite3 shell gives a row the largest row id plus one), the
        queue's next row id is forgotten (`next_rows`: Database's), to be read again after that row,
        and the caller pushes again; any other constraint raises `exc`."""
        if "tasks.rowid" not in str(exc):
            raise exc
        row = self.conn.execute("SELECT rowid, queue, id_ms, id_seq FROM tasks WHERE rowid BETWEEN ? AND ? LIMIT 1",
                                rowids).fetchone()
        logger.warning("a push to queue {!r} found row {} taken by a row it did not write ({}; written by hand "
                       "while the server runs?): the push takes the next free row id, and the next start puts "
                       "that row in its own queue", queue, rowids[0] if row is None else row[0],
                       "gone" if row is None else f"task {row[2]}-{row[3]} of queue {row[1]!r}")
        self._met_a_row = True
        next_rows.pop(queue, None)

    def written_meanwhile(self) -> bool:
        """Whether another connection wrote to the file since it was opened (logged: the next start
        must read every row, not take the counts this stop would leave)."""
        try:
            wrote = self._met_a_row or self.conn.execute("PRAGMA data_version").fetchone()[0] != self._data_version
        except sqlite3.Error as exc:
            logger.warning("cannot tell whether {} was written by another connection ({}): the next start "
                           "checks every task's row", self.path, exc)
            return True
        if wrote:
            logger.warning("{} was written by another connection while the server ran (the sqlite3 shell?): the "
                           "next start checks every task's row", self.path)
        return wrote
