"""A corrupt ezra.db: found, reported, and no longer written.

Two ways to find it: `QuickCheck`, which App runs on a native thread with a
read-only connection of its own just after the port opens (a full check of a
large file takes seconds: the first task after a restart must not wait for
it), and the first "database disk image is malformed" (SQLITE_CORRUPT) a
query meets at run time (the writer asks `is_corruption`). Either way
`Integrity.mark_corrupt` turns the server's connection read-only (PRAGMA
query_only): writes would spread the damage (a page's garbage copied into new
rows, freed pages reused), while reads of the pages still whole let an
operator look and export. The state shows in INFO, /healthz and /metrics.
"""

from __future__ import annotations

import sqlite3

from .schema import StorageError

UNCHECKED, CHECKING, OK, CORRUPT = "unchecked", "checking", "ok", "corrupt"
MAX_PROBLEMS = 10  # quick_check stops after this many: enough to say where, cheap to report


class Integrity:
    """Whether the server's database is whole, as far as anyone has looked; read-only once it is not."""

    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn
        self.state = UNCHECKED
        self.corrupt = False  # state == CORRUPT, kept as a plain value: every write request reads it
        self.reason: str | None = None  # what was found, for the log, INFO and /healthz
        self.begin_sql = "BEGIN IMMEDIATE"  # a read-only connection may not take the write lock

    def mark_checking(self) -> None:
        if self.state != CORRUPT:
            self.state = CHECKING

    def mark_checked(self, whole: bool | None) -> None:
        """The check's outcome: True whole, None not known (it could not run, or was cut short)."""
        if self.state != CORRUPT:
            self.state = OK if whole else UNCHECKED

    def mark_corrupt(self, reason: str) -> bool:
        """Stop writing; True the first time (the caller logs it once)."""
        if self.state == CORRUPT:
            return False
        self.state, self.reason = CORRUPT, " ".join(reason.split())  # one line: INFO's format
        self.corrupt = True
        self._conn.execute("PRAGMA query_only = ON")
        self.begin_sql = "BEGIN"
        return True

    @staticmethod
    def is_corruption(exc: BaseException) -> bool:
        """SQLITE_CORRUPT or SQLITE_NOTADB: pages that are not what SQLite wrote."""
        return isinstance(exc, sqlite3.DatabaseError) and (
            getattr(exc, "sqlite_errorcode", None) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)
            or "malformed" in str(exc))

    @staticmethod
    def is_refused_write(exc: BaseException) -> bool:
        """A write the read-only connection refused (SQLITE_READONLY)."""
        return isinstance(exc, sqlite3.Error) and getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_READONLY


class QuickCheck:
    """PRAGMA quick_check of the file on a read-only connection of its own, run on a native thread
    (seconds for a large file); `interrupt` (from any thread) cuts it short at a stop."""

    def __init__(self, path: str):
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._interrupted = False

    def run(self) -> list[str] | None:
        """[] when the file is whole, else up to MAX_PROBLEMS of what was found; None: interrupted."""
        try:
            self._conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, isolation_level=None,
                                         check_same_thread=False)
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open {self.path} to check it: {exc}") from exc
        try:
            if self._interrupted:
                return None
            self._conn.execute("PRAGMA busy_timeout = 5000")
            rows = [row[0] for row in self._conn.execute(f"PRAGMA quick_check({MAX_PROBLEMS})")]
        except sqlite3.Error as exc:
            if self._interrupted:
                return None
            if Integrity.is_corruption(exc):  # so broken that the check itself cannot run
                return [str(exc)]
            raise StorageError(f"cannot check {self.path}: {exc}") from exc
        finally:
            self._conn.close()
        return [] if rows == ["ok"] else rows

    def interrupt(self) -> None:
        self._interrupted = True
        conn = self._conn
        if conn is not None:
            try:
                conn.interrupt()
            except sqlite3.ProgrammingError:  # closed meanwhile: the check is over
                pass
