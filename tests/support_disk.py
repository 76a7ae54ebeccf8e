"""A small file system for the disk-full tests: a tmpfs mounted as the data directory, filled on purpose."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


def mount_small_tmpfs(path: Path, size: str) -> str | None:
    """Mount a tmpfs of `size` at path; None on success, else why not."""
    if os.geteuid() != 0:
        return "needs root to mount a small tmpfs as the data directory"
    path.mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return f"mount is not permitted here: {done.stderr.strip()[:200]}"
    return None


def tmpfs(mount_point: Path, size: str):
    """A fixture's body: a tmpfs of `size` mounted at `mount_point`, unmounted after the test."""
    reason = mount_small_tmpfs(mount_point, size)
    if reason:
        pytest.skip(reason)
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


def leave_free(mount_point: Path, room: int) -> Path:
    """Fill the file system with a file, so that about `room` bytes stay free; the file."""
    stats = os.statvfs(mount_point)
    filler = mount_point / "filler"
    filler.write_bytes(b"\0" * (stats.f_bavail * stats.f_frsize - room))
    return filler
