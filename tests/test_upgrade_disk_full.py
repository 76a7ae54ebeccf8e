"""A schema upgrade that meets a full disk (issue 45 item 8): the start is refused saying that the
disk is full and that the file is intact, and the upgrade runs once there is room.

Before, it said "not a usable SQLite database: cannot rollback - no transaction is active" (SQLite
had rolled the upgrade back itself; EZRA's ROLLBACK then failed and hid the reason), and an
operator reading "not usable" may restore a backup over a good file.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest

from support_disk import tmpfs
from support_files import schema_13_text, write_old_file
from support_servers import ROOT
from ezra.storage import SCHEMA_VERSION

TASKS = 20_000
PAD = "x" * 400  # ~9 MB of tasks: schema 14's upgrade copies the tasks table


@pytest.fixture
def fs_32m(tmp_path):
    yield from tmpfs(tmp_path / "fs32", "32m")


def write_schema_13_file(data_dir) -> None:
    db = write_old_file(data_dir, schema_13_text(), 13)
    db.execute("INSERT INTO queues (name, last_id_ms, last_id_seq, created_at) VALUES ('jobs', ?, 0, 1000)", (TASKS,))
    db.executemany("INSERT INTO tasks (queue, id_ms, id_seq, state, fields, created_at, available_at) "
                   "VALUES ('jobs', ?, 0, 'available', ?, 1000, 1000)",
                   ((n, json.dumps(["n", str(n), "pad", PAD])) for n in range(1, TASKS + 1)))
    db.commit()
    db.close()


def start_refused(data_dir) -> str:
    """`ezra` on the data directory, which must refuse to start (exit 1): its log."""
    done = subprocess.run([sys.executable, "-m", "ezra", "--port", "0", "--data-dir", str(data_dir)],
                          capture_output=True, text=True, timeout=300, cwd=str(ROOT),
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 1, done.stderr[-3000:]
    return done.stderr


def file_version(path) -> tuple[int, int]:
    """(user_version, tasks) read with sqlite3 (read-only)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute("PRAGMA user_version").fetchone()[0], db.execute("SELECT count(*) FROM tasks").fetchone()[0]
    finally:
        db.close()


def test_an_upgrade_refused_for_a_full_disk_says_so_and_leaves_the_file_intact(fs_32m, ezra_factory):
    data_dir = fs_32m / "data"
    write_schema_13_file(data_dir)
    database = data_dir / "ezra.db"
    size = database.stat().st_size
    filler = fs_32m / "filler"
    stats = os.statvfs(fs_32m)
    filler.write_bytes(b"\0" * (stats.f_bavail * stats.f_frsize - size // 2))  # room for half a copy of it
    log = start_refused(data_dir)
    refusal = [line for line in log.splitlines() if "cannot start" in line]
    assert len(refusal) == 1, log[-3000:]
    assert "not a usable SQLite database" not in refusal[0] and "cannot rollback" not in refusal[0], refusal
    assert "the disk is full" in refusal[0] and "intact" in refusal[0], refusal
    assert file_version(database) == (13, TASKS)  # intact: the old schema, every task
    # the control: with room, the same file is upgraded, every task kept
    filler.unlink()
    server = ezra_factory(data_dir=data_dir)
    assert f"from schema 13 to {SCHEMA_VERSION}" in server.log()
    assert server.client().xlen("jobs") == TASKS
    server.stop()
    assert file_version(database) == (SCHEMA_VERSION, TASKS)
