"""Trust, round two: where BACKUP may write, backups that hold every write sent before
them, and EZRA's own files in the data directory (symlinks, permissions).

Through the front door: the real server, redis-py, a temp dir; `ezra backup` as the
operator runs it. Every test here failed on the code before its fix.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import uuid

import pytest
import redis
from conftest import ROOT

OK_REPLIES = (True, b"OK", "OK")


def task_ids_in(path) -> set[bytes]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {row[0].encode() for row in conn.execute("SELECT id FROM tasks")}
    finally:
        conn.close()


def backup(r, dest):
    return r.execute_command("BACKUP", str(dest))


# ---------------------------------------------------------------- 10. EZRA's own files

def test_a_symlinked_reserve_file_is_refused_and_its_target_untouched(ezra_factory, tmp_path):
    data = tmp_path / "data-reserve"
    data.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (data / "ezra.reserve").symlink_to(victim)
    with pytest.raises(AssertionError, match="exited with 1") as caught:
        ezra_factory(data_dir=data)
    assert "ezra.reserve is a symbolic link" in str(caught.value)
    assert victim.read_bytes() == b"precious", "the server wrote through the link"


@pytest.mark.parametrize("name", ["ezra.db", "ezra.db-wal"])
def test_a_symlinked_database_file_is_refused_at_start(ezra_factory, tmp_path, name):
    data = tmp_path / "data-link"
    data.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (data / name).symlink_to(elsewhere / name)
    with pytest.raises(AssertionError, match="exited with 1") as caught:
        ezra_factory(data_dir=data)
    assert f"{name} is a symbolic link" in str(caught.value)
    assert list(elsewhere.iterdir()) == [], "the server created the link's target"


def test_a_world_writable_data_directory_is_logged_at_start(ezra_factory, tmp_path):
    data = tmp_path / "data-open"
    data.mkdir()
    data.chmod(0o777)
    server = ezra_factory(data_dir=data)
    assert "world-writable" in server.log()
    private = ezra_factory()
    assert "world-writable" not in private.log()
