"""All of EZRA's SQL: the schema, pragmas, named queries, recovery, backup.

Only this module imports sqlite3. The methods here run on the writer's
thread (see writer.py), except `open_database` and `recover`, which run at
start-up before anything else touches the file. Every query is parameterised.

Names (queues, workers) are stored as TEXT when they are valid UTF-8, so a
person reading the file in a SQLite browser sees them; other names are stored
as BLOBs. Fields are a JSON array `[name, value, ...]`, readable too; bytes that
are not UTF-8 survive through Python's surrogateescape (JSON escapes them as
\\udcXX), so fields stay binary-safe.
"""

from __future__ import annotations

import json
import os
import sqlite3

from . import lifecycle

APPLICATION_ID = 0x455A5241  # "EZRA": marks the file as ours
SCHEMA_VERSION = 1
DB_FILENAME = "ezra.db"

SCHEMA = """
CREATE TABLE IF NOT EXISTS queues (
    name                TEXT PRIMARY KEY,  -- queue name (BLOB if not UTF-8)
    last_id_ms          INTEGER NOT NULL DEFAULT 0,  -- the last id handed out, saved before
    last_id_seq         INTEGER NOT NULL DEFAULT 0,  -- tasks are deleted: ids never repeat
    visibility_timeout  REAL,     -- seconds; NULL = the server's --visibility-timeout
    max_attempts        INTEGER,  -- NULL = the server's --max-attempts
    retention_seconds   REAL,     -- NULL = the server's --retention-seconds
    created_at          INTEGER NOT NULL  -- ms since the epoch
);

CREATE TABLE IF NOT EXISTS tasks (
    queue         TEXT    NOT NULL,
    id_ms         INTEGER NOT NULL,  -- the Redis stream id is id_ms-id_seq
    id_seq        INTEGER NOT NULL,
    id            TEXT    GENERATED ALWAYS AS (id_ms || '-' || id_seq) VIRTUAL,
    state         TEXT    NOT NULL CHECK (state IN ('available', 'in_flight', 'done', 'dead')),
    fields        TEXT    NOT NULL,  -- JSON array: [name, value, name, value, ...]
    attempts      INTEGER NOT NULL DEFAULT 0,  -- deliveries so far
    worker        TEXT,              -- the consumer holding it while in_flight
    created_at    INTEGER NOT NULL,  -- ms since the epoch
    available_at  INTEGER NOT NULL,  -- not delivered before this (delay, backoff)
    deadline      INTEGER,           -- in_flight: redelivered after this
    delivered_at  INTEGER,           -- last delivery (XPENDING idle time)
    finished_at   INTEGER,           -- when it became done or dead
    PRIMARY KEY (queue, id_ms, id_seq)
);

-- Few indexes on purpose: every index costs a page write per state change.
-- Claims take the oldest available task of a queue: FIFO.
CREATE INDEX IF NOT EXISTS tasks_available ON tasks (queue, id_ms, id_seq) WHERE state = 'available';
-- XREADGROUP 0, XPENDING and the reaper look at in-flight tasks (few: leased ones).
CREATE INDEX IF NOT EXISTS tasks_in_flight ON tasks (queue, worker, id_ms, id_seq) WHERE state = 'in_flight';
-- Retention purges a queue's done tasks, oldest first.
CREATE INDEX IF NOT EXISTS tasks_done ON tasks (queue, finished_at) WHERE state = 'done';
"""

TASK_COLUMNS = "id_ms, id_seq, fields"


class StorageError(Exception):
    """The database could not be opened or used; the message names the file."""


def name_value(name: bytes):
    """The SQL value of a queue or worker name (TEXT when it is UTF-8)."""
    try:
        return name.decode()
    except UnicodeDecodeError:
        return name


def name_bytes(value) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def encode_fields(fields: list[bytes]) -> str:
    return json.dumps([f.decode("utf-8", "surrogateescape") for f in fields])


def decode_fields(text: str) -> list[bytes]:
    return [f.encode("utf-8", "surrogateescape") for f in json.loads(text)]


def entry(row) -> list:
    """A task row (id_ms, id_seq, fields) as a Redis stream entry [id, [f, v, ...]]."""
    return [b"%d-%d" % (row[0], row[1]), decode_fields(row[2])]


# ---------------------------------------------------------------- opening

def open_database(data_dir: str) -> "Database":
    """Open (or create) data_dir/ezra.db; refuse a file that is not EZRA's."""
    os.makedirs(data_dir, mode=0o700, exist_ok=True)
    path = os.path.join(data_dir, DB_FILENAME)
    existed = os.path.exists(path) and os.path.getsize(path) > 0
    old_umask = os.umask(0o077)  # the file holds users' data: 0600
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise StorageError(f"cannot open {path}: {exc}") from exc
    finally:
        os.umask(old_umask)
    try:
        _check_owner(conn, path, existed)
        _set_pragmas(conn)
        conn.executescript(SCHEMA)
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # a fresh WAL; the file exists from here on
    except sqlite3.Error as exc:
        conn.close()
        raise StorageError(f"{path} is not a usable SQLite database: {exc}") from exc
    except StorageError:
        conn.close()
        raise
    _fsync_directory(data_dir)  # the new files' names are durable too
    return Database(conn, path)


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_owner(conn, path: str, existed: bool) -> None:
    # Never build our schema over somebody else's database (or garbage).
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    if app_id == APPLICATION_ID:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StorageError(f"{path} was written by a newer EZRA (schema {version}); upgrade EZRA")
        return
    if existed and (app_id != 0 or tables):
        raise StorageError(f"{path} is not an EZRA database (application_id={app_id:#x}, {tables} objects); "
                           "refusing to touch it")


def _set_pragmas(conn) -> None:
    conn.execute("PRAGMA journal_mode = WAL").fetchone()
    # Commits write the WAL without fsync; the writer's fsync thread makes durable
    # batches durable (writer.Syncer), and checkpoints, which EZRA runs itself
    # off the event loop, fsync as NORMAL prescribes.
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute("PRAGMA temp_store = MEMORY")
    conn.execute("PRAGMA cache_size = -16000")  # 16 MB page cache: bounded memory
    conn.execute("PRAGMA busy_timeout = 5000")  # a backup or a browser may hold a read lock


class Database:
    """The connection and every query EZRA runs, named."""

    def __init__(self, conn: sqlite3.Connection, path: str):
        self.conn = conn
        self.path = path
        self.wal_path = path + "-wal"

    # -- transactions (driven by writer.py)

    def begin(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        self.conn.execute("COMMIT")

    def rollback(self) -> None:
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    def close(self) -> None:
        self.conn.close()

    def wal_size(self) -> int:
        try:
            return os.path.getsize(self.wal_path)
        except OSError:
            return 0

    def checkpoint(self) -> None:
        """Copy the WAL into the database file (fsyncing both) and empty the WAL."""
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()

    # -- start-up

    def recover(self) -> int:
        """Every in_flight task back to available (start-up, before the port opens)."""
        cur = self.conn.execute(
            "UPDATE tasks SET state = 'available', worker = NULL, deadline = NULL "
            "WHERE state = 'in_flight'")
        return cur.rowcount

    def load_queues(self) -> list[tuple]:
        """(name, saved last id, newest task id or None, visibility_timeout, max_attempts, retention)."""
        newest = ("(SELECT {} FROM tasks WHERE tasks.queue = queues.name "
                  "ORDER BY id_ms DESC, id_seq DESC LIMIT 1)")
        rows = self.conn.execute(
            f"SELECT name, last_id_ms, last_id_seq, {newest.format('id_ms')}, {newest.format('id_seq')}, "
            "visibility_timeout, max_attempts, retention_seconds FROM queues").fetchall()
        return [(name, (ms, seq), None if top_ms is None else (top_ms, top_seq), *settings)
                for name, ms, seq, top_ms, top_seq, *settings in rows]

    def count_states(self) -> list[tuple]:
        """(queue, state, count) for every queue; start-up builds the counters from it."""
        return self.conn.execute(
            "SELECT queue, state, count(*) FROM tasks GROUP BY queue, state").fetchall()

    # -- queues

    def insert_queue(self, name: bytes, now: int) -> None:
        self.conn.execute("INSERT OR IGNORE INTO queues (name, created_at) VALUES (?, ?)",
                          (name_value(name), now))

    def save_last_id(self, name: bytes, last_id: tuple) -> None:
        self.conn.execute("UPDATE queues SET last_id_ms = ?, last_id_seq = ? WHERE name = ?",
                          (last_id[0], last_id[1], name_value(name)))

    # -- tasks

    def insert_task(self, queue: bytes, task_id: tuple, fields: list[bytes], now: int,
                    available_at: int) -> None:
        self.conn.execute(
            "INSERT INTO tasks (queue, id_ms, id_seq, state, fields, created_at, available_at) "
            "VALUES (?, ?, ?, 'available', ?, ?, ?)",
            (name_value(queue), task_id[0], task_id[1], encode_fields(fields), now, available_at))

    def insert_done_task(self, queue: bytes, task_id: tuple, fields: list[bytes], now: int,
                         worker: bytes) -> None:
        """A task delivered with NOACK: done at once, as Redis's NOACK means."""
        self.conn.execute(
            "INSERT INTO tasks (queue, id_ms, id_seq, state, fields, attempts, worker, created_at, "
            "available_at, delivered_at, finished_at) VALUES (?, ?, ?, 'done', ?, 1, ?, ?, ?, ?, ?)",
            (name_value(queue), task_id[0], task_id[1], encode_fields(fields), name_value(worker),
             now, now, now, now))

    def claim(self, queue: bytes, worker: bytes, count: int, now: int, deadline: int,
              state: str = lifecycle.IN_FLIGHT) -> list[tuple]:
        """Take up to `count` available tasks, oldest first (one guarded statement)."""
        rows = self.conn.execute(
            "UPDATE tasks SET state = ?, worker = ?, deadline = ?, delivered_at = ?, "
            "attempts = attempts + 1, finished_at = CASE WHEN ? = 'done' THEN ? END "
            "WHERE rowid IN (SELECT rowid FROM tasks WHERE queue = ? AND state = 'available' "
            "AND available_at <= ? ORDER BY id_ms, id_seq LIMIT ?) "
            f"RETURNING {TASK_COLUMNS}",
            (state, name_value(worker), deadline, now, state, now, name_value(queue), now, count),
        ).fetchall()
        rows.sort()
        return rows

    def reread(self, queue: bytes, worker: bytes, after: tuple, count: int | None, now: int,
               deadline: int) -> list[tuple]:
        """A worker's own in-flight tasks after `after`; each counts a delivery, lease renewed."""
        rows = self.conn.execute(
            "UPDATE tasks SET deadline = ?, delivered_at = ?, attempts = attempts + 1 "
            "WHERE rowid IN (SELECT rowid FROM tasks WHERE queue = ? AND worker = ? "
            "AND state = 'in_flight' AND (id_ms, id_seq) > (?, ?) ORDER BY id_ms, id_seq LIMIT ?) "
            f"RETURNING {TASK_COLUMNS}",
            (deadline, now, name_value(queue), name_value(worker), after[0], after[1],
             -1 if count is None else count),
        ).fetchall()
        rows.sort()
        return rows

    def ack(self, queue: bytes, ids: list[tuple], now: int) -> int:
        """in_flight -> done for each id; a stale id counts 0."""
        q = name_value(queue)
        cur = self.conn.executemany(
            "UPDATE tasks SET state = 'done', deadline = NULL, finished_at = ? "
            "WHERE queue = ? AND id_ms = ? AND id_seq = ? AND state = 'in_flight'",
            [(now, q, ms, seq) for ms, seq in ids])
        return cur.rowcount

    def in_flight_attempts(self, queue: bytes, ids: list[tuple], states=(lifecycle.IN_FLIGHT,)) -> list[tuple]:
        """(rowid, attempts, state) of the given tasks that are in one of `states`."""
        q = name_value(queue)
        found = []
        marks = ",".join("?" * len(states))
        for ms, seq in dict.fromkeys(ids):
            row = self.conn.execute(
                f"SELECT rowid, attempts, state FROM tasks WHERE queue = ? AND id_ms = ? "
                f"AND id_seq = ? AND state IN ({marks})", (q, ms, seq, *states)).fetchone()
            if row:
                found.append(row)
        return found

    def expired(self, now: int, limit: int) -> list[tuple]:
        """(rowid, attempts, state, queue) of in-flight tasks whose lease ran out."""
        return self.conn.execute(
            "SELECT rowid, attempts, state, queue FROM tasks WHERE state = 'in_flight' "
            "AND deadline <= ? ORDER BY deadline LIMIT ?", (now, limit)).fetchall()

    def next_deadline(self) -> int | None:
        return self.conn.execute(
            "SELECT min(deadline) FROM tasks WHERE state = 'in_flight'").fetchone()[0]

    def set_outcome(self, rowid: int, state: str, attempts: int, now: int, available_at: int) -> None:
        """Apply the result of a failure (lifecycle.after_failure) to one task."""
        self.conn.execute(
            "UPDATE tasks SET state = ?, attempts = ?, worker = NULL, deadline = NULL, "
            "available_at = ?, finished_at = CASE WHEN ? = 'dead' THEN ? END WHERE rowid = ?",
            (state, attempts, available_at, state, now, rowid))

    def delete_dead(self, queue: bytes, ids: list[tuple]) -> int:
        q = name_value(queue)
        cur = self.conn.executemany(
            "DELETE FROM tasks WHERE queue = ? AND id_ms = ? AND id_seq = ? AND state = 'dead'",
            [(q, ms, seq) for ms, seq in dict.fromkeys(ids)])
        return cur.rowcount

    def purge_done(self, queue: bytes, finished_before: int, limit: int) -> int:
        """Delete up to `limit` done tasks of a queue finished before the cut-off."""
        cur = self.conn.execute(
            "DELETE FROM tasks WHERE rowid IN (SELECT rowid FROM tasks WHERE state = 'done' "
            "AND finished_at < ? AND queue = ? ORDER BY finished_at LIMIT ?)",
            (finished_before, name_value(queue), limit))
        return cur.rowcount

    # -- reads

    def range(self, queue: bytes, states: tuple, start: tuple, end: tuple, count: int | None,
              reverse: bool) -> list[tuple]:
        marks = ",".join("?" * len(states))
        order = "DESC" if reverse else "ASC"
        return self.conn.execute(
            f"SELECT {TASK_COLUMNS} FROM tasks WHERE queue = ? AND state IN ({marks}) "
            f"AND (id_ms, id_seq) >= (?, ?) AND (id_ms, id_seq) <= (?, ?) "
            f"ORDER BY id_ms {order}, id_seq {order} LIMIT ?",
            (name_value(queue), *states, start[0], start[1], end[0], end[1],
             -1 if count is None else count)).fetchall()

    def pending_summary(self, queue: bytes) -> tuple:
        """(first id, last id, [(worker, count)]) of a queue's in-flight tasks."""
        q = name_value(queue)
        first = self.conn.execute(
            "SELECT id_ms, id_seq FROM tasks WHERE queue = ? AND state = 'in_flight' "
            "ORDER BY id_ms, id_seq LIMIT 1", (q,)).fetchone()
        last = self.conn.execute(
            "SELECT id_ms, id_seq FROM tasks WHERE queue = ? AND state = 'in_flight' "
            "ORDER BY id_ms DESC, id_seq DESC LIMIT 1", (q,)).fetchone()
        workers = self.conn.execute(
            "SELECT worker, count(*) FROM tasks WHERE queue = ? AND state = 'in_flight' "
            "GROUP BY worker ORDER BY worker", (q,)).fetchall()
        return first, last, workers

    def pending_entries(self, queue: bytes, start: tuple, end: tuple, count: int,
                        worker: bytes | None, min_delivered_before: int | None) -> list[tuple]:
        """(id_ms, id_seq, worker, delivered_at, attempts) of in-flight tasks in a range."""
        sql = ("SELECT id_ms, id_seq, worker, delivered_at, attempts FROM tasks "
               "WHERE queue = ? AND state = 'in_flight' AND (id_ms, id_seq) >= (?, ?) "
               "AND (id_ms, id_seq) <= (?, ?)")
        params: list = [name_value(queue), start[0], start[1], end[0], end[1]]
        if worker is not None:
            sql += " AND worker = ?"
            params.append(name_value(worker))
        if min_delivered_before is not None:
            sql += " AND delivered_at <= ?"
            params.append(min_delivered_before)
        sql += " ORDER BY id_ms, id_seq LIMIT ?"
        params.append(count)
        return self.conn.execute(sql, params).fetchall()

    # -- backup

    def backup_to(self, dest_path: str) -> None:
        """A consistent copy through SQLite's online backup API."""
        dest = sqlite3.connect(dest_path)
        try:
            self.conn.backup(dest)
        finally:
            dest.close()
