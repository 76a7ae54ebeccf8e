"""Looks at ezra.db from beside the writer, each on a connection of its own: a hot
backup (`backup_database`: BGSAVE on a native thread, or the `ezra backup` program),
a read-only snapshot (`Snapshot`: `ezra export --data-dir`) and whether a server
has the file open (`database_in_use`: `ezra import --data-dir`).
"""

from __future__ import annotations

import errno
import os
import sqlite3

from loguru import logger

from .. import lifecycle
from .opening import BUSY_TIMEOUT_MS, connect, fsync_directory, fsync_file
from .dependencies import task_dependencies
from .reads import outcomes_after, tasks_by_id
from .row_ranges import NO_ROWS, queue_span
from .schema import APPLICATION_ID, SCHEMA_VERSION, StorageError, name_bytes, name_value


PARTIAL_MARK = ".partial-"  # dest.db.partial-<random>: a backup being written (or one a kill cut short)


def backup_database(source_path: str, dest_path: str) -> dict[str, int]:
    """Copy a live ezra.db through SQLite's online backup API; returns the copy's task counts.

    Reads a consistent snapshot (one read transaction; writers carry on in WAL mode),
    writes a self-contained file (rollback journal, no -wal beside it) under a temporary
    name beside `dest_path`, checks that the copy opens, fsyncs it, then gives it its
    name and fsyncs the directory (as Redis's BGSAVE does): `dest_path` holds the whole
    copy or does not exist, whether the backup fails, the disk fills or the process is
    killed. A failed backup removes its temporary file; a retry uses a new one. Safe
    from another process or a thread: it uses its own connections.
    """
    if os.path.lexists(dest_path):
        raise StorageError(f"{dest_path} exists already; refusing to overwrite it")
    temp_path = f"{dest_path}{PARTIAL_MARK}{os.urandom(4).hex()}"  # not secrets: it loads OpenSSL
    try:
        counts = _copy(source_path, temp_path)
        fsync_file(temp_path)
        _publish(temp_path, dest_path)
        fsync_directory(os.path.dirname(os.path.abspath(dest_path)))
    except OSError as exc:  # a full disk at the fsync, a directory gone
        _remove_partial(temp_path)
        raise StorageError(f"backup of {source_path} to {dest_path} failed: {exc}") from exc
    except BaseException:
        _remove_partial(temp_path)
        raise
    return counts


def _copy(source_path: str, temp_path: str) -> dict[str, int]:
    dest = connect(temp_path, create=True)  # O_EXCL | O_NOFOLLOW: a new file, never through a link
    source = sqlite3.connect(f"file:{source_path}?mode=ro", uri=True)
    try:
        source.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        source.backup(dest)  # pages=-1: the whole file in one step, one snapshot
        dest.execute("PRAGMA journal_mode = DELETE").fetchone()
        check = dest.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise StorageError(f"the copy in {temp_path} does not check out: {check}")
        return dict(dest.execute("SELECT state, count(*) FROM tasks GROUP BY state").fetchall())
    except sqlite3.Error as exc:
        reason = unreadable_because(source_path)
        if reason:
            raise StorageError(f"cannot read {source_path} ({exc}): {reason}") from exc
        raise StorageError(f"backup of {source_path} to {temp_path} failed: {exc}") from exc
    finally:
        source.close()
        dest.close()


def _publish(temp_path: str, dest_path: str) -> None:
    """Give the finished copy its name, never over a file that appeared there meanwhile."""
    try:
        os.link(temp_path, dest_path)  # fails if dest_path exists, where rename would replace it
    except FileExistsError:
        raise StorageError(f"{dest_path} exists already; refusing to overwrite it") from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV):
            raise StorageError(f"cannot name the backup {dest_path}: {exc}") from exc
        os.rename(temp_path, dest_path)  # a file system without hard links: checked absent above
        return
    os.unlink(temp_path)


def _remove_partial(temp_path: str) -> None:
    for path in (temp_path, temp_path + "-journal"):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("cannot remove the unfinished backup {}: {}", path, exc)


def database_in_use(path: str) -> bool:
    """Whether another connection (a running EZRA, a reader) has the file open.

    In WAL mode every open connection holds a shared lock on the file, so an exclusive
    lock is granted only to a connection that is alone with it; taken and let go at once.
    """
    conn = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=0, isolation_level=None)  # never creates
    try:
        conn.execute("PRAGMA locking_mode = EXCLUSIVE")
        conn.execute("BEGIN EXCLUSIVE")
        conn.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            return True
        raise StorageError(f"cannot open {path}: {exc}") from exc
    finally:
        conn.close()


class Snapshot:
    """A read-only look at an ezra.db, whether a server runs on it or not (ezra export --data-dir).

    Every query runs in one read transaction: a single moment of the file, however long the
    export takes (WAL mode lets a running server write meanwhile; its WAL grows until the
    snapshot ends). Nothing is written: the file is opened read-only, no recovery runs.
    """

    def __init__(self, path: str):
        if not os.path.isfile(path):
            raise StorageError(f"no database at {path}")
        try:
            self.conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
            self.conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            app_id = self.conn.execute("PRAGMA application_id").fetchone()[0]
            version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.Error as exc:
            reason = unreadable_because(path)
            if reason:
                raise StorageError(f"cannot read {path} ({exc}): {reason}") from exc
            raise StorageError(f"{path} is not a usable SQLite database: {exc}") from exc
        if app_id != APPLICATION_ID:
            self.conn.close()
            raise StorageError(f"{path} is not an EZRA database (application_id={app_id:#x})")
        if version != SCHEMA_VERSION:
            self.conn.close()
            raise StorageError(f"{path} has schema {version}, this EZRA reads {SCHEMA_VERSION}: "
                               "start this EZRA on it once (it migrates the file), or use the matching EZRA")
        self.path = path
        self.conn.execute("BEGIN")  # deferred: the first read below fixes the snapshot

    def queue_names(self) -> list[bytes]:
        return sorted(name_bytes(row[0]) for row in self.conn.execute("SELECT name FROM queues"))

    def queue_facts(self, queue: bytes) -> dict | None:
        """{"group": name or None, "last_id": (ms, seq), "counts": {state: n}}; None: no such queue."""
        q = name_value(queue)
        row = self.conn.execute("SELECT group_name, last_id_ms, last_id_seq FROM queues WHERE name = ?",
                                (q,)).fetchone()
        if row is None:
            return None
        group, last_ms, last_seq = row
        rows = queue_span(self.conn, queue) or NO_ROWS
        newest = self.conn.execute("SELECT id_ms, id_seq FROM tasks WHERE rowid BETWEEN ? AND ? "
                                   "ORDER BY rowid DESC LIMIT 1", rows).fetchone() or (0, 0)
        counts = dict.fromkeys(lifecycle.STATES, 0)
        counts.update(self.conn.execute("SELECT state, count(*) FROM tasks WHERE rowid BETWEEN ? AND ? "
                                        "GROUP BY state", rows).fetchall())
        return {"group": None if group is None else name_bytes(group),
                "last_id": max((last_ms, last_seq), newest), "counts": counts}

    def tasks_by_id(self, queue: bytes, states: tuple, count: int, after: tuple) -> list[tuple]:
        return tasks_by_id(self.conn, queue, states, count, after)

    def outcomes_after(self, queue: bytes, count: int, after: tuple) -> list[tuple]:
        """Tasks with a result or a progress (reads.outcomes_after), for the export."""
        return outcomes_after(self.conn, queue, count, after)
    def waits_for(self, queue: bytes, task_id: tuple) -> list[tuple]:
        """[(queue, id)]: what a waiting task waits for (XADD AFTER; the tasks not done yet)."""
        return [(name_bytes(name), (ms, seq)) for name, ms, seq, _ in task_dependencies(self.conn, queue, task_id)[0]
                if name is not None]

    def close(self) -> None:
        self.conn.close()  # ends the read transaction: nothing was written


def unreadable_because(path: str) -> str | None:
    """Why a read-only connection to a WAL database failed when the file itself is fine: SQLite
    must create (or write) its -shm file beside it, even to read. None: not that."""
    directory = os.path.dirname(os.path.abspath(path))
    shm = path + "-shm"
    try:
        read_only_fs = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return None
    needs = (f"to read a database in WAL mode, SQLite must create or open {os.path.basename(shm)} beside it "
             "(the database is not damaged)")
    if read_only_fs:
        return (f"{directory} is on a read-only file system, and {needs}. Copy the data directory to a "
                "writable place (with its server stopped) and give that as --data-dir, or remount it read-write")
    if not os.access(directory, os.W_OK) or (os.path.exists(shm) and not os.access(shm, os.W_OK)):
        owner = os.stat(directory).st_uid
        return (f"this user (uid {os.geteuid()}) may not write in {directory} (owner uid {owner}), and {needs}. "
                "Run this command as the data directory's owner, the server's user (e.g. sudo -u <that user>)")
    return None
