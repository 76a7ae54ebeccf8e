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
from support_servers import ROOT

OK_REPLIES = (True, b"OK", "OK")


def task_ids_in(path) -> set[bytes]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {row[0].encode() for row in conn.execute("SELECT id FROM tasks_readable")}
    finally:
        conn.close()


def backup(r, dest):
    return r.execute_command("BACKUP", str(dest))


# ---------------------------------------------------------------- 2. where BACKUP writes

@pytest.mark.parametrize("protocol", [2, 3])
def test_backup_goes_only_inside_the_data_directory(ezra_factory, tmp_path, protocol):
    server = ezra_factory()
    r = server.client(protocol=protocol)
    r.xadd("q", {"a": "1"})
    outside = tmp_path / "outside"
    outside.mkdir()
    refused = {
        "absolute, elsewhere": outside / "b.db",
        "escapes with ..": "../outside/c.db",
        "absolute with ..": server.data_dir / ".." / "outside" / "d.db",
    }
    for why, dest in refused.items():
        with pytest.raises(redis.ResponseError, match="outside the backup directory") as caught:
            backup(r, dest)
        assert str(caught.value).startswith("BACKUP"), (why, caught.value)
    assert list(outside.iterdir()) == [], "nothing written outside the data directory"

    name = f"rel-{uuid.uuid4().hex[:8]}.db"
    try:
        assert backup(r, name) in OK_REPLIES
        assert (server.data_dir / name).is_file(), "a relative path is taken in the data directory"
        assert not (ROOT / name).exists()
    finally:
        if (ROOT / name).exists():  # the old code wrote it in the server's working directory
            (ROOT / name).unlink()
    (server.data_dir / "sub").mkdir()
    assert backup(r, server.data_dir / "sub" / "abs.db") in OK_REPLIES
    assert len(task_ids_in(server.data_dir / "sub" / "abs.db")) == 1
    r.close()


def test_backup_refuses_existing_files_symlinks_and_symlinked_parents(ezra_factory, tmp_path):
    server = ezra_factory()
    r = server.client()
    outside = tmp_path / "outside"
    outside.mkdir()
    data = server.data_dir
    (data / "old.db").write_bytes(b"keep me")
    (data / "dangling.db").symlink_to(outside / "made-through-link.db")
    (data / "link-to-file.db").symlink_to(outside / "victim")
    (outside / "victim").write_bytes(b"victim")
    (data / "linked-dir").symlink_to(outside, target_is_directory=True)

    with pytest.raises(redis.ResponseError, match="exists already"):
        backup(r, "old.db")
    assert (data / "old.db").read_bytes() == b"keep me"
    for name in ("dangling.db", "link-to-file.db"):
        with pytest.raises(redis.ResponseError, match="exists already"):
            backup(r, data / name)
    with pytest.raises(redis.ResponseError, match="outside the backup directory"):
        backup(r, "linked-dir/through.db")
    with pytest.raises(redis.ResponseError, match="no such directory"):
        backup(r, "missing-dir/x.db")
    for bad in (".", "..", "", "sub/.."):
        with pytest.raises(redis.ResponseError):
            backup(r, bad)
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert (outside / "victim").read_bytes() == b"victim"
    assert r.ping()
    assert "Traceback" not in server.log(), "a refusal is an answer, not a crash"
    r.close()


def test_backup_dir_option_sets_where_backups_go(ezra_factory, tmp_path):
    backups = tmp_path / "backups"
    backups.mkdir()
    server = ezra_factory(env={"EZRA_BACKUP_DIR": str(backups)})
    r = server.client()
    r.xadd("q", {"a": "1"})
    assert backup(r, "one.db") in OK_REPLIES
    assert backup(r, backups / "two.db") in OK_REPLIES
    assert {p.name for p in backups.iterdir()} == {"one.db", "two.db"}
    with pytest.raises(redis.ResponseError, match="outside the backup directory"):
        backup(r, server.data_dir / "three.db")
    r.close()
    flagged = ezra_factory("--backup-dir", str(tmp_path))
    r = flagged.client()
    assert backup(r, tmp_path / "by-flag.db") in OK_REPLIES
    r.close()


def test_ezra_backup_program_does_not_follow_a_dangling_symlink(ezra_factory, tmp_path):
    server = ezra_factory()
    server.client().xadd("q", {"a": "1"})
    link = tmp_path / "link.db"
    link.symlink_to(tmp_path / "target.db")
    cli = subprocess.run([sys.executable, "-m", "ezra", "backup", "--data-dir", str(server.data_dir), str(link)],
                         check=False, cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert cli.returncode == 1 and "exists already" in cli.stderr, cli
    assert not (tmp_path / "target.db").exists(), "the link's target was created"
    anywhere = tmp_path / "elsewhere" / "copy.db"  # the operator's program may write anywhere
    anywhere.parent.mkdir()
    cli = subprocess.run([sys.executable, "-m", "ezra", "backup", "--data-dir", str(server.data_dir), str(anywhere)],
                         check=False, cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert len(task_ids_in(anywhere)) == 1


# ---------------------------------------------------------------- 7. pipelined writes before BACKUP

TRIES = 20


@pytest.mark.parametrize("protocol", [2, 3])
def test_backup_holds_every_write_pipelined_before_it(ezra_factory, protocol):
    server = ezra_factory()
    r = server.client(protocol=protocol)
    missing = []
    for attempt in range(TRIES):
        dest = server.data_dir / f"pipe-{attempt}.db"
        pipe = r.pipeline(transaction=False)
        pipe.xadd("q", {"try": str(attempt)})
        pipe.execute_command("BACKUP", str(dest))
        task_id, reply = pipe.execute()
        assert reply in OK_REPLIES
        task_id = task_id if isinstance(task_id, bytes) else task_id.encode()
        if task_id not in task_ids_in(dest):
            missing.append(attempt)
    assert not missing, f"the pipelined XADD was missing from {len(missing)} of {TRIES} backups"
    r.close()


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
