"""Opening ezra.db: the data directory's own files, the connection, the pragmas, migrations.

`open_database` runs at start-up, before anything else touches the file: it
refuses a file that is not EZRA's (or one of its files reached through a link),
sets the pragmas in one place, migrates an older file in place in one
transaction, and hands the connection to a Database.

A new database is made under another name (ezra.db.new) and renamed into place
once its schema is on disk, so EZRA never leaves an empty ezra.db: an empty one
found at start is somebody's interrupted copy or restore, and is refused rather
than taken for a new install (it would start with no tasks and say nothing).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import sqlite3
import stat
import threading
import time

from loguru import logger

from . import done_counts, hand_rows, placements, row_ranges
from .database import DEFAULT_RESERVE_BYTES, RESERVE_FILENAME, Database
from .dirlock import LOCK_FILENAME
from .schema import APPLICATION_ID, SCHEMA, SCHEMA_STATEMENTS, SCHEMA_VERSION, StorageError, roll_back

DB_FILENAME = "ezra.db"
NEW_DB_FILENAME = DB_FILENAME + ".new"  # a new database until its schema is on disk
BUSY_TIMEOUT_MS = 5000
# EZRA's own files in the data directory: never reached through a symbolic link (a link
# planted there would make a server, often root, write wherever it points).
OWN_FILES = (DB_FILENAME, DB_FILENAME + "-wal", DB_FILENAME + "-shm", RESERVE_FILENAME, LOCK_FILENAME,
             done_counts.COUNTS_FILENAME, done_counts.COUNTS_FILENAME + ".new",
             NEW_DB_FILENAME, NEW_DB_FILENAME + "-journal")

# Version 1's tasks table lacked 'delayed' in its CHECK and the ttl_ms column: it is
# rebuilt (SQLite cannot change a CHECK in place); queues only gains columns.
QUEUE_COLUMNS_V2 = {
    "backoff": "TEXT", "release_on_disconnect": "REAL", "idmp_duration": "INTEGER",
    "idmp_maxsize": "INTEGER", "group_name": "TEXT",
    "deleted_count": "INTEGER NOT NULL DEFAULT 0", "max_deleted_ms": "INTEGER NOT NULL DEFAULT 0",
    "max_deleted_seq": "INTEGER NOT NULL DEFAULT 0",
}
QUEUE_COLUMNS_V3 = {"paused": "INTEGER"}  # version 3 only adds columns
# Version 15, flow control: MAX-IN-FLIGHT and RATE-LIMIT (broker/flow.py); NULL: no limit.
# PARTITION-LIMIT, and `lanes`: 1 once a task of the queue has a priority or partition (broker/lanes.py).
QUEUE_COLUMNS_FLOW = {"max_in_flight": "INTEGER", "rate_limit_count": "INTEGER", "rate_limit_seconds": "REAL",
                      "partition_limit": "INTEGER", "lanes": "INTEGER NOT NULL DEFAULT 0"}
QUEUE_COLUMNS_V10 = {"unmarked_done": "INTEGER NOT NULL DEFAULT 1"}  # every done task is unmarked
TASK_COLUMNS_V1 = ("queue, id_ms, id_seq, state, fields, attempts, worker, created_at, available_at, "
                   "deadline, delivered_at, finished_at")


def open_database(data_dir: str, reserve_bytes: int = DEFAULT_RESERVE_BYTES, read_lanes_ahead: bool = False) -> Database:
    """Open (or create) data_dir/ezra.db, migrate it; refuse a file that is not EZRA's.
    `read_lanes_ahead`: a server's start, which recovers the tasks in flight (see _check_hand_rows)."""
    os.makedirs(data_dir, mode=0o700, exist_ok=True)
    _check_own_files(data_dir)
    path = os.path.join(data_dir, DB_FILENAME)
    if not os.path.lexists(path):
        _create_database(data_dir, path)
    elif os.path.getsize(path) == 0:
        raise StorageError(f"{path} is empty (0 bytes): EZRA never leaves an empty ezra.db, so this is an "
                           "interrupted copy or restore, not a database; put the backup you meant to restore in "
                           "its place, or, if this is a new install, delete it and start EZRA again (it creates "
                           "the database)")
    counts_at_close, written_since = done_counts.take(data_dir, path)  # before anything writes to the file
    lanes_ahead = {}
    conn = connect(path)
    try:
        version = _check_owner(conn, path)
        _set_pragmas(conn)
        migrated = version < SCHEMA_VERSION and _has_table(conn, "tasks")
        if migrated:
            _migrate(conn, version, path)
            counts_at_close = None  # a migration may move tasks between states (schema 12's): count them
        conn.executescript(SCHEMA)
        if counts_at_close is None and version:  # the start reads every row anyway: rows written by hand
            lanes_ahead = _check_hand_rows(conn, path, written_since, read_lanes_ahead)
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # a fresh WAL; the file exists from here on
    except sqlite3.Error as exc:
        conn.close()
        if Database.is_disk_full(exc):  # never "not usable": one may restore a backup over a good file
            raise StorageError(_disk_full_at_start(path, exc)) from exc
        raise StorageError(f"{path} is not a usable SQLite database: {exc}") from exc
    except StorageError:
        conn.close()
        raise
    fsync_directory(data_dir)  # the new files' names are durable too
    db = Database(conn, path, reserve_bytes)
    db.counts_at_close = counts_at_close
    db.lanes_read_ahead = lanes_ahead
    return db


def _check_hand_rows(conn, path: str, blob_bytes: bool, read_lanes: bool) -> dict:
    """The check of rows written by hand (hand_rows.py), and with `read_lanes` the lanes queues' tasks
    read on a thread meanwhile (placements.read_ahead), for their first claims. The check is SQLite's
    work and the read mostly Python's, so they overlap on two cores: after a kill -9 with 1,000,000
    tasks over 10,000 partitions, 1.33-1.41 s one after the other, 0.91-1.01 s together (measured). {}
    if the check moved rows (the read saw them before) or the read failed (logged): the first claim
    reads then, as after a clean stop."""
    if not read_lanes:
        hand_rows.check(conn, path, _renumber_tasks, blob_bytes=blob_bytes)
        return {}
    lanes = {}

    def read() -> None:
        try:
            lanes.update(placements.read_ahead(path))
        except Exception as exc:
            logger.opt(exception=exc).warning("{}: reading the lanes queues' tasks at start failed ({}); "
                                              "each queue's first claim reads them", path, exc)
    reader = threading.Thread(target=read, name="ezra-lanes-read-ahead", daemon=True)
    reader.start()
    try:
        moved = hand_rows.check(conn, path, _renumber_tasks, blob_bytes=blob_bytes)
    finally:
        reader.join()
    return {} if moved else lanes


def _disk_full_at_start(path: str, exc: sqlite3.Error) -> str:
    """What a start that met a full disk says: each step writes in one transaction, so the file
    is as it was before the step (an upgrade rolled back whole), and how much room would do
    (schema 14's copy of 10 MB of tasks failed with 1.6 times the file's size free, passed with 2)."""
    return (f"the disk is full ({exc}): {path} is intact, as it was before this start (a schema upgrade is "
            f"one transaction, rolled back whole; nothing is lost, do not restore a backup over it). "
            f"Free space on its file system ({shutil.disk_usage(os.path.dirname(path)).free:,} bytes free; an "
            f"upgrade that copies the tasks table needs twice the file's size, {2 * os.path.getsize(path):,} bytes) "
            "and start EZRA again")


def _create_database(data_dir: str, path: str) -> None:
    """A new, empty EZRA database at `path`: written whole under NEW_DB_FILENAME, then renamed."""
    new_path = os.path.join(data_dir, NEW_DB_FILENAME)
    for leftover in (new_path, new_path + "-journal"):  # a start killed while creating one
        try:
            os.unlink(leftover)
        except FileNotFoundError:
            pass
    conn = connect(new_path, create=True)
    try:
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # only before the first table (see _set_pragmas)
        conn.executescript(SCHEMA)
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except sqlite3.Error as exc:
        raise StorageError(f"cannot create a database in {new_path}: {exc}") from exc
    finally:
        conn.close()
    fsync_file(new_path)
    os.rename(new_path, path)
    fsync_directory(data_dir)
    logger.info("created a new database {}", path)


def _check_own_files(data_dir: str) -> None:
    """Refuse to start on a data directory where one of EZRA's files is a link or not a file."""
    for name in OWN_FILES:
        path = os.path.join(data_dir, name)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise StorageError(f"cannot inspect {path}: {exc}") from exc
        if stat.S_ISLNK(mode):
            fix = ("remove the link: EZRA makes this file itself"
                   if name in (RESERVE_FILENAME, LOCK_FILENAME, done_counts.COUNTS_FILENAME) else
                   "put the file itself in its place, or point --data-dir at the directory that holds it")
            raise StorageError(f"{path} is a symbolic link (to {os.readlink(path)}); EZRA does not follow "
                               f"links for its own files: {fix}")
        if not stat.S_ISREG(mode):
            raise StorageError(f"{path} is not a regular file; move it out of the data directory")


def connect(path: str, create: bool = False) -> sqlite3.Connection:
    """A connection in autocommit mode to a file of EZRA's own (the server's, a backup's copy)."""
    # The file holds users' data: create it 0600 (SQLite gives its -wal and -shm
    # the same mode). Not through the umask, which is the whole process's.
    # O_NOFOLLOW: never through a link. `create`: a new file only (a backup's copy).
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_EXCL if create else 0)
    try:
        os.close(os.open(path, flags, 0o600))
    except FileExistsError:
        kind = " (a symbolic link, not followed)" if os.path.islink(path) else ""
        raise StorageError(f"{path} exists already{kind}; refusing to overwrite it") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StorageError(f"{path} is a symbolic link; refusing to follow it") from None
        raise StorageError(f"cannot open {path}: {exc}") from exc
    try:
        return sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise StorageError(f"cannot open {path}: {exc}") from exc


def fsync_file(path: str) -> None:
    """Make a file's contents durable (before it is renamed into place)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_directory(path: str) -> None:
    """Make the names of files just created in `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_owner(conn, path: str) -> int:
    """The file's schema version (0: a file with no tables and no mark, which EZRA may fill).
    Never build our schema over somebody else's database."""
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    if app_id == APPLICATION_ID:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StorageError(f"{path} was written by a newer EZRA (schema {version}); upgrade EZRA")
        return version
    if app_id != 0 or tables:
        raise StorageError(f"{path} is not an EZRA database (application_id={app_id:#x}, {tables} objects); "
                           "refusing to touch it")
    return 0


def _has_table(conn, name: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                        (name,)).fetchone() is not None


def _migrate(conn, version: int, path: str) -> None:
    """Upgrade an older ezra.db in place, in one transaction: all of it or none of it."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        if version < 2:
            _migrate_to_v2(conn)
        if version < 3:
            _add_queue_columns(conn, QUEUE_COLUMNS_V3)
        if version < 4:  # a new table only
            conn.execute(SCHEMA_STATEMENTS["schedules"])
            conn.execute(SCHEMA_STATEMENTS["schedules_next"])
        if version < 5:  # tasks.failure: why a task last failed
            _add_task_column(conn, "failure", "TEXT")
        if version < 6:
            _migrate_to_v6(conn)
        if version < 7:  # after 5 and 6 (other tables' changes); the same rows, a new CHECK text
            _state_check_as_comparisons(conn)
        if version < 8:  # the available order is kept in memory: its index goes (broker/available.py)
            conn.execute("DROP INDEX IF EXISTS tasks_available")
        if version < 9:  # pushes store their fields as RESP (task_fields.py): the view reads both forms
            conn.execute(SCHEMA_STATEMENTS["tasks_readable"])
        if version < 10:
            _migrate_to_v10(conn)
        if version < 11:
            _add_task_column(conn, "reserved", "BLOB")
        if version < 12:  # the leases are kept in memory: their index goes (broker/in_flight.py)
            _migrate_to_v12(conn)
        if version < 13:
            _migrate_to_v13(conn)
        if version < 14:
            _migrate_to_v14(conn)
        if version < 15:  # flow control: the tasks' priority and partition, the queues' limits
            _migrate_to_v15_task_priority_and_partition(conn)
            _add_queue_columns(conn, QUEUE_COLUMNS_FLOW)
        if version < 16:  # results and progress: two columns of tasks
            _migrate_to_v16_task_result_and_progress(conn)
        if version < 17:  # XADD AFTER: the waiting state, the dependencies table
            _migrate_to_v17_waiting_tasks(conn)
        if version < 18:  # XADD NAME: a column of tasks and its index; waiting tasks counted from the
            _migrate_to_v18_task_names(conn)  # dependencies table (Dependencies.waiting_counts): no index
            conn.execute("DROP INDEX IF EXISTS tasks_waiting")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        roll_back(conn)
        raise
    logger.info("migrated {} from schema {} to {}", path, version, SCHEMA_VERSION)


def _add_queue_columns(conn, columns: dict) -> None:
    have = {row[1] for row in conn.execute("PRAGMA table_info(queues)")}
    for column, kind in columns.items():
        if column not in have:
            conn.execute(f"ALTER TABLE queues ADD COLUMN {column} {kind}")


def _add_task_column(conn, column: str, kind: str) -> None:
    """A nullable column of tasks, NULL in every existing row (SQLite adds it without rewriting the
    table); a file rebuilt by _migrate_to_v2 has it already (the table comes from schema.sql)."""
    if column not in {row[1] for row in conn.execute("PRAGMA table_info(tasks)")}:
        conn.execute(f"ALTER TABLE tasks ADD COLUMN {column} {kind}")


def _migrate_to_v6(conn) -> None:
    """XADD UNIQUE: tasks gain unique_key (NULL for every task already there: SQLite adds a
    nullable column without rewriting the table) and its partial unique index."""
    _add_task_column(conn, "unique_key", "TEXT")
    conn.execute(SCHEMA_STATEMENTS["tasks_unique"])


def _migrate_to_v10(conn) -> None:
    """Done tasks leave the index every ack wrote (tasks_done); those of a queue with a retention
    limit are marked (tasks.retained, NULL in every existing row: no row is rewritten) and indexed
    in tasks_retained. Every queue starts unmarked: a queue with a limit marks its done tasks in
    the reaper's passes (Reaper._mark_retained), a batch at a time, not here in one transaction."""
    conn.execute("DROP INDEX IF EXISTS tasks_done")
    _add_task_column(conn, "retained", "INTEGER")
    _add_queue_columns(conn, QUEUE_COLUMNS_V10)
    conn.execute(SCHEMA_STATEMENTS["tasks_retained"])


def _migrate_to_v12(conn) -> None:
    """The in-flight index goes. A clean stop of an older EZRA left its tasks in flight, which
    start-up's recovery no longer finds without reading every row when the file was closed
    cleanly (Database.recover): they go back to available here, found by the index, before it goes."""
    conn.execute("UPDATE tasks SET state = 'available', worker = NULL, deadline = NULL WHERE state = 'in_flight'")
    conn.execute("DROP INDEX IF EXISTS tasks_in_flight")


def _migrate_to_v13(conn) -> None:
    """The generated column tasks.id goes (SQLite computed it in every write of a row, schema.sql);
    the view, which read it, gives the same text from id_ms and id_seq. A VIRTUAL column holds
    nothing in the rows: dropping it changes the table's text only, instant with a million tasks.
    A file whose table was rebuilt from schema.sql (_migrate_to_v2) has no such column."""
    conn.execute("DROP VIEW IF EXISTS tasks_readable")
    if "id" in {row[1] for row in conn.execute("PRAGMA table_xinfo(tasks)")}:  # table_info hides it
        conn.execute("ALTER TABLE tasks DROP COLUMN id")
    conn.execute(SCHEMA_STATEMENTS["tasks_readable"])


def _migrate_to_v14(conn) -> None:
    """Each queue takes a range of row ids, and its tasks are renumbered into it in id order
    (storage/row_ranges.py); the primary key on (queue, id_ms, id_seq) and its index go."""
    _add_queue_columns(conn, {"number": "INTEGER"})
    _renumber_tasks(conn)


def _migrate_to_v15_task_priority_and_partition(conn) -> None:
    """XADD PRIORITY and PARTITION: tasks gain priority and partition_key, NULL in every existing row
    (the default priority, no partition: SQLite adds a nullable column without rewriting the table);
    the view shows them. unreadable_tasks, which keeps every column of the rows it holds (a few, set
    aside by hand_rows.py), is made anew with them, its rows copied."""
    _add_task_column(conn, "priority", "INTEGER")
    _add_task_column(conn, "partition_key", "TEXT")
    _unreadable_tasks_anew(conn)
    conn.execute("DROP VIEW IF EXISTS tasks_readable")
    conn.execute(SCHEMA_STATEMENTS["tasks_readable"])


def _migrate_to_v16_task_result_and_progress(conn) -> None:
    """XACK ... RESULT and XPROGRESS: tasks gain result and progress, NULL in every existing row (no
    result, no progress reported: SQLite adds a nullable column without rewriting the table); the view
    shows them; unreadable_tasks is made anew with them, as schema 15's step does."""
    _add_task_column(conn, "result", "BLOB")
    _add_task_column(conn, "progress", "BLOB")
    _unreadable_tasks_anew(conn)
    conn.execute("DROP VIEW IF EXISTS tasks_readable")
    conn.execute(SCHEMA_STATEMENTS["tasks_readable"])


def _unreadable_tasks_anew(conn) -> None:
    """unreadable_tasks keeps every column of the rows it holds (a few, set aside by hand_rows.py): made
    anew as schema.sql has it, its rows copied. A file from before it has none: the schema makes it."""
    if not _has_table(conn, "unreadable_tasks"):
        return
    have = {row[1] for row in conn.execute("PRAGMA table_info(unreadable_tasks)")}
    if "name" in have:  # the newest column: made by this schema already (a file rebuilt from schema.sql)
        return
    conn.execute("ALTER TABLE unreadable_tasks RENAME TO unreadable_tasks_old")
    conn.execute(SCHEMA_STATEMENTS["unreadable_tasks"])
    columns = ", ".join(row[1] for row in conn.execute("PRAGMA table_info(unreadable_tasks_old)"))
    conn.execute(f"INSERT INTO unreadable_tasks ({columns}) SELECT {columns} FROM unreadable_tasks_old")
    conn.execute("DROP TABLE unreadable_tasks_old")


def _migrate_to_v18_task_names(conn) -> None:
    """XADD NAME: tasks gain name, NULL in every existing row (SQLite adds a nullable column without
    rewriting the table), and its partial unique index (empty: a pass over the table, no write per row);
    the view shows it; unreadable_tasks is made anew with it, as schema 16's step does."""
    _add_task_column(conn, "name", "TEXT")
    _unreadable_tasks_anew(conn)
    conn.execute("DROP VIEW IF EXISTS tasks_readable")
    conn.execute(SCHEMA_STATEMENTS["tasks_readable"])
    conn.execute(SCHEMA_STATEMENTS["tasks_named"])


def _migrate_to_v17_waiting_tasks(conn) -> None:
    """XADD AFTER: the state CHECK admits 'waiting' (the table's text rewritten, as schema 7's step:
    no row is copied, since every row stays valid) and the dependencies table (schema 17's index
    tasks_waiting, which schema 18 dropped, is not made)."""
    _rewrite_state_check(conn, STATE_CHECK_V15, 17)
    conn.execute(SCHEMA_STATEMENTS["dependencies"])
    conn.execute(SCHEMA_STATEMENTS["dependencies_dependent"])


def _renumber_tasks(conn) -> None:
    """Every task to the row id its queue's range and its id give (storage/row_ranges.py): queues
    without a number (all of them when migrating; one made by hand) get the next ones, in name
    order, and a task of a queue with no row gets a row. The table is copied once (SQLite's way to
    change a table's key): with a million tasks, seconds."""
    started = time.monotonic()
    conn.execute("INSERT OR IGNORE INTO queues (name, created_at) SELECT DISTINCT queue, ? FROM tasks",
                 (int(time.time() * 1000),))
    # In name order: when every queue is numbered here (the migration), the old key's order, (queue, id),
    # is the new row ids' order and the copy appends.
    numbered = conn.execute("SELECT coalesce(max(number), 0) FROM queues").fetchone()[0]
    conn.execute("UPDATE queues SET number = ordered.n FROM (SELECT rowid AS r, ? + row_number() OVER (ORDER BY name) "
                 "AS n FROM queues WHERE number IS NULL) AS ordered WHERE queues.rowid = ordered.r", (numbered,))
    conn.execute("DROP VIEW IF EXISTS tasks_readable")
    _drop_task_indexes(conn)
    conn.execute("ALTER TABLE tasks RENAME TO tasks_old")
    conn.execute(SCHEMA_STATEMENTS["tasks"])
    # The new table's columns that the old one has: an older file's lacks those later steps add
    # (schema 15's, NULL in every row as their own step would leave them).
    had = {row[1] for row in conn.execute("PRAGMA table_info(tasks_old)")}
    columns = [row[1] for row in conn.execute("PRAGMA table_info(tasks)") if row[1] != "rowid" and row[1] in had]
    # The new row ids first, small rows numbered in (queue, id) order; then the copy, in their order.
    conn.execute("CREATE TEMP TABLE renumbered (new INTEGER PRIMARY KEY, old INTEGER NOT NULL)")
    conn.execute(f"INSERT INTO renumbered (new, old) SELECT (queues.number << {row_ranges.ROW_BITS}) + "
                 "row_number() OVER (PARTITION BY old.queue ORDER BY old.id_ms, old.id_seq) - 1, old.rowid "
                 "FROM tasks_old AS old JOIN queues ON queues.name = old.queue")
    conn.execute(f"INSERT INTO tasks (rowid, {', '.join(columns)}) SELECT renumbered.new, "
                 f"{', '.join('old.' + column for column in columns)} FROM renumbered "
                 "JOIN tasks_old AS old ON old.rowid = renumbered.old ORDER BY renumbered.new")
    if _has_table(conn, "dependencies"):  # XADD AFTER's edges name row ids: renumbered with them
        for column in ("dependency", "dependent"):
            conn.execute(f"UPDATE dependencies SET {column} = (SELECT new FROM renumbered WHERE old = {column}) "
                         f"WHERE {column} IN (SELECT old FROM renumbered)")
    copied = conn.execute("SELECT count(*) FROM renumbered").fetchone()[0]
    had = conn.execute("SELECT count(*) FROM tasks_old").fetchone()[0]
    if copied != had:  # every task has its queue's row by now: never reached, and never a task lost
        raise StorageError(f"renumbering: {had} tasks, but {copied} found their queue; the file is left as it was")
    conn.execute("DROP TABLE renumbered")
    conn.execute("DROP TABLE tasks_old")
    for name, statement in SCHEMA_STATEMENTS.items():  # tasks' indexes and view, queues_number
        if name.startswith("tasks_") or name == "queues_number":
            conn.execute(statement)
    logger.info("{} tasks renumbered into their queues' ranges of row ids in {:.1f} s",
                copied, time.monotonic() - started)


def _drop_task_indexes(conn) -> None:
    """The tasks table's own indexes (not SQLite's automatic ones), before it is copied."""
    for (index,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index' "
                                 "AND tbl_name = 'tasks' AND sql IS NOT NULL").fetchall():
        conn.execute(f'DROP INDEX "{index}"')


def _migrate_to_v2(conn) -> None:
    _add_queue_columns(conn, QUEUE_COLUMNS_V2)
    task_sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'tasks'").fetchone()[0]
    if "'delayed'" in task_sql:
        return
    # SQLite's documented way to change a table's constraints: build the new table, copy, swap.
    _drop_task_indexes(conn)
    conn.execute("ALTER TABLE tasks RENAME TO tasks_v1")
    conn.execute(SCHEMA_STATEMENTS["tasks"])
    conn.execute(f"INSERT INTO tasks ({TASK_COLUMNS_V1}) SELECT {TASK_COLUMNS_V1} FROM tasks_v1")
    conn.execute("DROP TABLE tasks_v1")


# Schema 7: the tasks table's state CHECK as comparisons (schema.sql says why). The rule is the
# same, so only the table's text in sqlite_master changes, as SQLite documents for constraint
# changes that leave every row valid ("Making Other Kinds Of Table Schema Changes"): no copy,
# instant with a million tasks. A file already in that form (rebuilt by _migrate_to_v2) is left.
# Schema 17 (XADD AFTER) admits 'waiting' the same way: a wider rule, every row still valid.
STATE_CHECK_V6 = "CHECK (state IN ('available', 'delayed', 'in_flight', 'done', 'dead'))"
STATE_CHECK_V15 = ("CHECK (state = 'available' OR state = 'delayed' OR state = 'in_flight' OR state = 'done' "
                   "OR state = 'dead')")
STATE_CHECK = re.search(r"CHECK \(state = [^)]*\)", SCHEMA_STATEMENTS["tasks"]).group(0)


def _state_check_as_comparisons(conn) -> None:
    """Schema 7's step. Where the text cannot be changed (a tasks table of another shape, an SQLite
    built to refuse writes to sqlite_master), the old CHECK stays: the same rule, slower to check."""
    _rewrite_state_check(conn, STATE_CHECK_V6, 7)


def _rewrite_state_check(conn, before: str, step: int) -> None:
    """The tasks table's state CHECK `before` becomes STATE_CHECK (a rule every row meets already).
    Schema 17's is required ('waiting' rows would be refused without it): where the text cannot be
    changed, the migration fails, rolled back whole."""
    sql = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'tasks'").fetchone()[0]
    if STATE_CHECK in sql:
        return
    if before not in sql:
        if step >= 17:
            raise StorageError(f"schema {step}: the tasks table's state CHECK is not the expected text, so "
                               f"it cannot admit 'waiting'; the file is left as it was: {sql}")
        logger.warning("schema 7: the tasks table's state CHECK is not the expected text; left as it is "
                       "(pushes and state changes cost ~1.7 µs more): {}", sql)
        return
    schema_version = conn.execute("PRAGMA schema_version").fetchone()[0]
    conn.execute("PRAGMA writable_schema = ON")
    try:
        conn.execute("UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'tasks'",
                     (sql.replace(before, STATE_CHECK),))
        conn.execute(f"PRAGMA schema_version = {schema_version + 1}")  # every connection reads it again
    except sqlite3.Error as exc:  # only this statement is undone; the migration goes on
        if step >= 17:
            raise
        logger.warning("schema 7: cannot rewrite the tasks table's state CHECK, left as it is (pushes and "
                       "state changes cost ~1.7 µs more): {}", exc)
        return
    finally:
        conn.execute("PRAGMA writable_schema = OFF")
    conn.execute("SELECT state FROM tasks LIMIT 0").fetchall()  # the new text parses, or all is rolled back


def _set_pragmas(conn) -> None:
    # Freed pages are reused; incremental vacuum (FileSpace.vacuum_some, storage/file_space.py) gives them back to the
    # file system. Only takes effect on a new file (an existing one keeps its mode until VACUUM).
    conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
    conn.execute("PRAGMA journal_mode = WAL").fetchone()
    # Commits write the WAL without fsync; the writer's fsync thread makes durable
    # batches durable (writer.Syncer), and checkpoints, which EZRA runs itself
    # off the event loop, fsync as NORMAL prescribes.
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("PRAGMA foreign_keys = OFF")
    # Deleted tasks are zeroed only where that costs no extra write (some builds default to
    # ON, which writes every freed page again: as much I/O as the purged tasks themselves).
    conn.execute("PRAGMA secure_delete = FAST")
    conn.execute("PRAGMA temp_store = MEMORY")
    conn.execute("PRAGMA cache_size = -16000")  # 16 MB page cache: bounded memory
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")  # a backup or a browser may hold a read lock

