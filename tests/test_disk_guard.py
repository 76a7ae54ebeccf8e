"""The DiskGuard alone (ezra/writer/disk_space.py): the full-disk mode's reserve file, figures and decisions.

The file-system figures come from a fake `statvfs` where a test needs a nearly full disk without
filling one; the reserve file is real (a temp dir, or a small tmpfs where it must not fit). The
server-level behaviour (pushes refused, claims going on, the drain) is in tests/test_faults.py.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from types import SimpleNamespace

import pytest
from loguru import logger

from ezra import errors
from ezra.writer.disk_space import MIN_ROOM, WAL_AHEAD_ROOM, DiskGuard
from ezra.storage import RESERVE_FILENAME, open_database
from support import tmpfs

RESERVE = 2 * 1024 * 1024
WAL_LIMIT = 1024 * 1024


class FakeDisk:
    """A file system whose free bytes the test sets: a stand-in for os.statvfs."""

    def __init__(self, free: int):
        self.free = free
        self.asked: list[str] = []

    def __call__(self, path):
        self.asked.append(path)
        return SimpleNamespace(f_bavail=self.free // 4096, f_frsize=4096)


@pytest.fixture
def logged():
    """The messages loguru logs during the test, with their levels."""
    lines: list[tuple[str, str]] = []
    sink = logger.add(lambda message: lines.append((message.record["level"].name, message.record["message"])),
                      level="DEBUG")
    yield lines
    logger.remove(sink)


def a_guard(directory, free: int | None = None, free_inside: int = 0, wal: int = 0, reserve: int = RESERVE):
    """A guard of `directory`; with `free`, its file system has that many bytes free (FakeDisk)."""
    figures = SimpleNamespace(free_inside=free_inside, wal=wal)
    statvfs = os.statvfs if free is None else FakeDisk(free)
    guard = DiskGuard(str(directory), reserve, WAL_LIMIT, lambda: figures.free_inside, lambda: figures.wal, statvfs)
    return guard, figures


def a_full_episode(guard) -> None:
    assert guard.out_of_space("commit of 3 requests", OSError(errno.ENOSPC, "No space left on device"))


# ---------------------------------------------------------------- the reserve file

def test_start_sets_the_reserve_aside_and_close_gives_it_back(tmp_path):
    guard, _ = a_guard(tmp_path)
    guard.start()
    reserve = tmp_path / RESERVE_FILENAME
    assert not guard.full
    assert reserve.stat().st_size == RESERVE
    assert reserve.stat().st_blocks * 512 >= RESERVE  # allocated, not a sparse file
    assert reserve.stat().st_mode & 0o777 == 0o600
    guard.close()
    assert not reserve.exists()
    guard.close()  # twice: nothing to give back, no error


def test_no_reserve_asked_for_is_no_file_and_never_full(tmp_path):
    guard, _ = a_guard(tmp_path, reserve=0)
    guard.start()
    assert not guard.full and not (tmp_path / RESERVE_FILENAME).exists()


@pytest.fixture
def fs_1m(tmp_path):
    """A 1 MB tmpfs: no room for a 2 MB reserve (root only; skips elsewhere)."""
    yield from tmpfs(tmp_path / "fs1", "1m")


def test_a_disk_without_room_for_the_reserve_starts_with_pushes_refused(fs_1m, logged):
    guard, _ = a_guard(fs_1m)
    guard.start()
    assert guard.full
    assert (fs_1m / RESERVE_FILENAME).stat().st_size == 0  # cut back: the space stays free
    assert ("WARNING", f"cannot set {RESERVE} bytes aside in {fs_1m / RESERVE_FILENAME}: the disk is nearly "
            "full, pushes are refused until there is room") in logged
    with pytest.raises(errors.CommandError, match="disk full"):
        guard.check_growth()


def test_a_symlinked_reserve_is_not_followed(tmp_path, logged):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (tmp_path / RESERVE_FILENAME).symlink_to(victim)
    guard, _ = a_guard(tmp_path)
    assert not guard.make_reserve()
    assert victim.read_bytes() == b"keep"
    assert ("ERROR", f"cannot make the disk reserve: {tmp_path / RESERVE_FILENAME} is a symbolic link "
            "(not followed)") in logged


def test_a_hard_linked_reserve_is_somebody_elses_file(tmp_path, logged):
    other = tmp_path / "other"
    other.write_bytes(b"keep")
    os.link(other, tmp_path / RESERVE_FILENAME)
    guard, _ = a_guard(tmp_path)
    assert not guard.make_reserve()
    assert other.read_bytes() == b"keep"
    assert any(level == "ERROR" and "not a regular file of its own" in message for level, message in logged)


# ---------------------------------------------------------------- what the writer tells it

def test_running_out_of_space_releases_the_reserve_and_is_logged_once_per_episode(tmp_path, logged):
    guard, _ = a_guard(tmp_path)
    guard.start()
    exc = OSError(errno.ENOSPC, "No space left on device")
    assert guard.out_of_space("commit of 3 requests", exc) is True  # a new episode: checkpoint soon
    assert guard.full and not (tmp_path / RESERVE_FILENAME).exists()
    assert guard.out_of_space("PASSIVE checkpoint", exc) is False
    errors_logged = [message for level, message in logged if level == "ERROR"]
    assert errors_logged == [f"disk full: commit of 3 requests failed ({exc}); released the {RESERVE}-byte "
                             "reserve, refusing pushes until there is room again"]
    assert ("DEBUG", f"PASSIVE checkpoint failed, the disk is still full: {exc}") in logged


def test_what_counts_as_a_full_disk(tmp_path):
    db = sqlite3.connect(tmp_path / "tiny.db")
    db.execute("PRAGMA max_page_count = 2")
    with pytest.raises(sqlite3.Error) as full:
        db.execute("CREATE TABLE t (x)")
        db.execute("INSERT INTO t VALUES (zeroblob(100000))")
    db.close()
    assert DiskGuard.is_full_error(full.value)  # SQLITE_FULL: 'database or disk is full'
    assert DiskGuard.is_full_error(OSError(errno.ENOSPC, "No space left on device"))
    assert not DiskGuard.is_full_error(OSError(errno.EIO, "Input/output error"))
    assert not DiskGuard.is_full_error(sqlite3.OperationalError("database is locked"))


# ---------------------------------------------------------------- what the writer asks

def test_pushes_stay_refused_while_the_reserve_and_min_room_do_not_fit(tmp_path):
    guard, _ = a_guard(tmp_path, free=RESERVE + MIN_ROOM - 4096)
    guard.start()
    a_full_episode(guard)
    assert guard.room_missing() == 4096
    with pytest.raises(errors.CommandError) as refused:
        guard.check_growth()
    assert str(refused.value) == str(errors.DISK_FULL())
    assert guard.full and not (tmp_path / RESERVE_FILENAME).exists()


def test_pushes_resume_once_the_reserve_fits_with_as_much_again(tmp_path, logged):
    guard, figures = a_guard(tmp_path, free=RESERVE + MIN_ROOM)
    guard.start()
    a_full_episode(guard)
    assert guard.room_missing() == 0
    with pytest.raises(errors.CommandError):
        guard.check_growth()  # the reserve fits, but not twice over: the next push would fill the disk
    figures.free_inside = RESERVE  # a drained queue's free pages in the database file count
    guard.check_growth()
    assert not guard.full and (tmp_path / RESERVE_FILENAME).stat().st_size == RESERVE
    assert ("INFO", f"disk space available again: {RESERVE} bytes set aside, pushes accepted") in logged
    guard.check_growth()  # while not full the writer does not ask; asking again is harmless


def test_the_free_space_is_that_of_the_data_directory(tmp_path):
    guard, _ = a_guard(tmp_path, free=10 * RESERVE)
    assert guard.free_bytes() == 10 * RESERVE
    assert guard._statvfs.asked == [str(tmp_path)]
    db = open_database(str(tmp_path / "data"), RESERVE)
    try:
        real = DiskGuard.beside(db)
        stats = os.statvfs(tmp_path / "data")
        assert abs(real.free_bytes() - stats.f_bavail * stats.f_frsize) < 64 * 1024 * 1024  # others write too
        assert real.reserve_path == str(tmp_path / "data" / RESERVE_FILENAME) and real.reserve_bytes == RESERVE
        assert real.wal_limit == db.wal_limit and not real.wal_must_start_over()
    finally:
        db.close()


def test_the_wal_starts_over_at_once_only_on_a_full_disk(tmp_path):
    guard, figures = a_guard(tmp_path)
    figures.wal = 3 * WAL_LIMIT
    assert not guard.wal_must_start_over()  # a disk with room: the periodic checkpoints see to it
    a_full_episode(guard)
    assert guard.wal_must_start_over()
    figures.wal = WAL_LIMIT
    assert not guard.wal_must_start_over()


def test_the_wal_is_not_measured_while_the_disk_has_room(tmp_path):
    """The writer asks after every batch: with room, no fstat of the WAL."""
    def no_fstat():
        raise AssertionError("the WAL was measured")

    guard = DiskGuard(str(tmp_path), RESERVE, WAL_LIMIT, lambda: 0, no_fstat)
    assert not guard.wal_must_start_over()


def test_zeros_ahead_of_a_pinned_wal_leave_the_reserve_and_more(tmp_path):
    guard, _ = a_guard(tmp_path)
    assert guard.keep_free_past_wal() == RESERVE + WAL_AHEAD_ROOM


# ---------------------------------------------------------------- in the server

def test_the_server_holds_the_reserve_while_it_runs_and_leaves_none_after_a_clean_stop(ezra_factory):
    server = ezra_factory("--disk-reserve", str(RESERVE))
    assert server.client().xadd("q", {"n": "1"})
    assert (server.data_dir / RESERVE_FILENAME).stat().st_size == RESERVE
    assert server.stop() == 0, server.log()
    assert not (server.data_dir / RESERVE_FILENAME).exists()
    assert (server.data_dir / "ezra.db").exists()
