"""One server per data directory: an exclusive lock on `ezra.lock`, held while EZRA runs.

A second server on the same directory would turn the first one's leased tasks
back to available at its start and interleave its writes with the first's. The
lock is flock(2) on a file of its own: SQLite's locks on ezra.db are POSIX locks,
which any close of another descriptor of that file would drop for the whole
process, so ezra.db is never opened for this. flock conflicts between two opens
in one process too (two embedded servers), and the kernel lets go when the
process ends, however it ends: a stale lock file cannot block anyone. The file
names its holder (host, pid, since when) for the error a second server shows.
It assumes a local disk: on a network file system flock may be emulated, or
not shared between hosts.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
import time

from loguru import logger

from .schema import StorageError

LOCK_FILENAME = "ezra.lock"
POLL_SECONDS = 0.1  # how often a waiting server tries the lock again


class DataDirLocked(StorageError):
    """Another process holds the data directory."""


class DataDirLock:
    """The exclusive hold on a data directory; `release` (or the process's end) lets it go."""

    def __init__(self, data_dir: str, fd: int):
        self.data_dir = data_dir
        self.path = os.path.join(data_dir, LOCK_FILENAME)
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, data_dir: str, timeout: float = 0.0, sleep=time.sleep) -> "DataDirLock":
        """Hold `data_dir` (made 0700 if missing); wait up to `timeout` seconds for another holder
        to let go, then raise DataDirLocked naming it."""
        os.makedirs(data_dir, mode=0o700, exist_ok=True)
        fd = _open_lock_file(os.path.join(data_dir, LOCK_FILENAME))
        deadline = time.monotonic() + timeout
        waiting_logged = False
        try:
            while not _try_lock(fd):
                holder = _holder(fd)
                if time.monotonic() >= deadline:
                    raise DataDirLocked(
                        f"the data directory {data_dir} is in use by another EZRA ({holder}); "
                        "one server per data directory: stop the other one first, or give "
                        "--lock-timeout SECONDS to wait for it to exit (a rolling update)")
                if not waiting_logged:
                    logger.info("the data directory {} is in use by another EZRA ({}): waiting up to {:g}s "
                                "for it to exit (--lock-timeout)", data_dir, holder, timeout)
                    waiting_logged = True
                sleep(min(POLL_SECONDS, max(deadline - time.monotonic(), 0)))
        except BaseException:
            os.close(fd)
            raise
        _write_holder(fd)
        return cls(data_dir, fd)

    def release(self) -> None:
        """Let the directory go (the holder's line is cleared first: nobody holds it now)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
        except OSError as exc:
            logger.warning("cannot clear {}: {}", self.path, exc)
        os.close(fd)  # closing the only descriptor of it releases the flock


def _open_lock_file(path: str) -> int:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StorageError(f"{path} is a symbolic link; EZRA does not follow links for its own files: "
                               "remove the link (EZRA makes this file itself)") from None
        raise StorageError(f"cannot open the lock file {path}: {exc}") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StorageError(f"{path} is not a regular file; move it out of the data directory")
    return fd


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _holder(fd: int) -> str:
    """Who holds the lock, as its holder wrote it (empty while it is being written)."""
    try:
        text = os.pread(fd, 512, 0).decode("utf-8", "replace").strip()
    except OSError as exc:
        return f"holder unknown: {exc}"
    return text or "holder unknown"


def _write_holder(fd: int) -> None:
    line = (f"host {socket.gethostname()} pid {os.getpid()} since "
            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n").encode()
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, line, 0)
    except OSError as exc:  # the lock holds anyway; only the name in a second server's error is lost
        logger.warning("cannot write the lock holder's name into {}: {}", LOCK_FILENAME, exc)
