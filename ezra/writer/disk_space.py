"""The full-disk mode, in one object: the DiskGuard of the data directory.

A full disk must not stop the workers: their claims, acks and nacks rewrite
rows that exist, so they need no new space but the WAL's, and the WAL starts
over from its beginning after each checkpoint. The reserve (a ballast file,
ezra.reserve, made at start) is what gives the WAL and the checkpoint that
follows room once the disk fills: when a commit or a checkpoint meets a full
disk, the reserve is released, pushes (which add rows) are refused with
DISK_FULL, and everything else goes on. Pushes resume once the reserve fits
again with room beside it: freed by an operator, or by the upkeep giving a
drained queue's free pages back to the file system (broker/reaper.py).

The writer tells the guard what happened (a commit or a checkpoint failed for
want of space) and asks it (refuse this push? must the WAL start over now?);
the upkeep asks it how much room is missing. The file-system figures come
from `statvfs`, a parameter, so the decisions can be tested without filling a
disk (tests/test_disk_guard.py).
"""

from __future__ import annotations

import errno
import os
import stat

from loguru import logger

from .. import errors
from ..storage import RESERVE_FILENAME, Database

MIN_ROOM = 1024 * 1024  # free bytes needed before pushes resume after the disk was full
WAL_AHEAD_ROOM = 64 * 1024 * 1024  # free bytes (past the reserve) needed to keep zeros past a pinned WAL's end


class DiskGuard:
    """Owns the full-disk mode of one data directory: the reserve, the free-space figures, the decisions."""

    def __init__(self, directory: str, reserve_bytes: int, wal_limit: int, free_inside, wal_size,
                 statvfs=os.statvfs):
        self.directory = directory
        self.reserve_path = os.path.join(directory, RESERVE_FILENAME)
        self.reserve_bytes = reserve_bytes
        self.wal_limit = wal_limit  # the WAL's size at which a checkpoint is due (db.wal_limit)
        self._free_inside = free_inside  # bytes of free pages in the database file: room for new rows
        self._wal_size = wal_size  # bytes in the WAL file
        self._statvfs = statvfs
        self.full = False  # pushes are refused until there is room again

    @classmethod
    def beside(cls, db: Database, statvfs=os.statvfs) -> DiskGuard:
        """The guard of the database's data directory, with its reserve size."""
        return cls(os.path.dirname(db.path), db.reserve_bytes, db.wal_limit, db.file_space.free_bytes_inside, db.wal_size,
                   statvfs)

    def start(self) -> None:
        """Set the reserve aside; on a disk that has not that much free, start with pushes refused."""
        if not self.make_reserve():
            self.full = True
            logger.warning("cannot set {} bytes aside in {}: the disk is nearly full, pushes are refused "
                           "until there is room", self.reserve_bytes, self.reserve_path)

    def close(self) -> None:
        """Made again at the next start: a stopped EZRA leaves only ezra.db."""
        self.release_reserve()

    # -- what the writer tells it

    @staticmethod
    def is_full_error(exc: BaseException) -> bool:
        """SQLITE_FULL or ENOSPC: no room left on the database's file system."""
        return Database.is_disk_full(exc)

    def out_of_space(self, what: str, exc: BaseException) -> bool:
        """`what` failed for want of space: free the reserve so acks and claims go on, refuse pushes.
        True when this starts an episode (logged once; then a checkpoint should come soon, so the
        WAL starts over inside the released reserve)."""
        if self.full:
            logger.debug("{} failed, the disk is still full: {}", what, exc)  # logged once per episode
            return False
        self.full = True
        self.release_reserve()
        logger.error("disk full: {} failed ({}); released the {}-byte reserve, refusing pushes until "
                     "there is room again", what, exc, self.reserve_bytes)
        return True

    # -- what the writer asks

    def check_growth(self) -> None:
        """A push while the disk is full: refused with DISK_FULL, unless the reserve fits again
        (then the episode ends and the push goes on)."""
        if self._room_again():
            self.full = False
            logger.info("disk space available again: {} bytes set aside, pushes accepted", self.reserve_bytes)
            return
        raise errors.DISK_FULL

    def wal_must_start_over(self) -> bool:
        """On a full disk the WAL grows only into the released reserve: once a batch left it above
        its limit, it must be folded in and start over before the next batch. A passive pass every
        20 batches or more let a drain's claims and acks outgrow the reserve (6 MB of WAL on a 4 MB
        reserve) and fail. Even while a snapshot seems held: a passive pass racing the commits can
        look like one, and a RESTART that finds a real reader returns at once (CHECKPOINT_WAIT_MS)."""
        return self.full and self._wal_size() > self.wal_limit

    def keep_free_past_wal(self) -> int:
        """Free bytes the zeros kept past a pinned WAL's end must leave: the disk's last room is
        for commits and the reserve's checkpoint."""
        return self.reserve_bytes + WAL_AHEAD_ROOM

    # -- what the upkeep asks

    def room_missing(self) -> int:
        """Bytes the file system lacks for the reserve and MIN_ROOM beside it (see _room_again)."""
        return self.reserve_bytes + MIN_ROOM - self.free_bytes()

    # -- the figures and the reserve file

    def _room_again(self) -> bool:
        """Room for the reserve and as much again (else the next push fills the disk at once): the
        reserve in the file system, with MIN_ROOM beside it for the WAL; the rest may be free pages
        in the database file, which new rows reuse without the file system giving a byte."""
        if self.room_missing() > 0:
            return False
        if self.free_bytes() + self._free_inside() < max(2 * self.reserve_bytes, MIN_ROOM):
            return False
        return self.make_reserve()

    def free_bytes(self) -> int:
        """Space unprivileged writers may still use on the database's file system."""
        stats = self._statvfs(self.directory)
        return stats.f_bavail * stats.f_frsize

    def make_reserve(self) -> bool:
        """Set `reserve_bytes` aside in the data directory; False if the disk has not that much free."""
        if self.reserve_bytes <= 0:
            return True
        try:
            fd = os.open(self.reserve_path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                logger.error("cannot make the disk reserve: {} is a symbolic link (not followed)",
                             self.reserve_path)
            else:
                logger.warning("cannot make the disk reserve {}: {}", self.reserve_path, exc)
            return False
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:  # a hard link: somebody else's file
                logger.error("not using {} as the disk reserve: not a regular file of its own "
                             "(mode {:o}, {} links)", self.reserve_path, info.st_mode, info.st_nlink)
                return False
            os.posix_fallocate(fd, 0, self.reserve_bytes)  # blocks really allocated, not a sparse file
            return True
        except OSError:
            os.ftruncate(fd, 0)
            return False
        finally:
            os.close(fd)

    def release_reserve(self) -> None:
        """Give the reserve's space back to the file system (for the WAL and checkpoints)."""
        try:
            os.unlink(self.reserve_path)
        except FileNotFoundError:
            pass
