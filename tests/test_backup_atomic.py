"""BACKUP is atomic, and EZRA never starts on an empty ezra.db (issue 21 item 4).

Before: killing the server mid-BACKUP left the final name with a hot journal; opening it
rolled it back to 0 bytes, and EZRA, restored from it, started with no tasks and logged
nothing, since any 0-byte ezra.db was taken for a new one. A failed BACKUP left its
partial file under the final name and the retry was refused ("exists already").
"""

from __future__ import annotations

import glob
import socket
import sqlite3

import pytest
import redis

from ezra.storage import encode_fields

from support_disk import leave_free
from support_files import hand_rowids
from support_servers import EzraProcess, wait_until

BIG_TASKS = 1500
BIG_FIELD = 100_000  # bytes: a database of ~150 MB, so a BACKUP of it takes a while


def fill_offline(data_dir, tasks: int, field_size: int) -> None:
    """`tasks` available tasks in queue 'big', written straight into a stopped server's ezra.db."""
    conn = sqlite3.connect(data_dir / "ezra.db")
    fields = encode_fields([b"blob", b"x" * field_size])
    with conn:
        conn.execute("INSERT INTO queues (name, last_id_ms, last_id_seq, created_at) VALUES ('big', ?, 0, 0)",
                     (tasks,))
        conn.executemany("INSERT INTO tasks (rowid, queue, id_ms, id_seq, state, fields, created_at, available_at) "
                         "VALUES (?, 'big', ?, 0, 'available', ?, 0, 0)",
                         ((rowid, n, fields) for n, rowid in enumerate(hand_rowids(conn, "big", tasks), 1)))
    conn.close()


def stopped_server_with(tmp_path, tasks: int, field_size: int, *args: str) -> EzraProcess:
    server = EzraProcess(tmp_path / "data", *args).start()  # makes ezra.db
    assert server.stop() == 0
    fill_offline(server.data_dir, tasks, field_size)
    return server


def complete_copy_tasks(path) -> int:
    """The number of tasks in a backup file, checked whole (quick_check) first."""
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        return conn.execute("SELECT count(*) FROM tasks").fetchone()[0]
    finally:
        conn.close()


def test_a_kill_mid_backup_leaves_no_partial_file_under_the_final_name(tmp_path, protocol):
    server = stopped_server_with(tmp_path, BIG_TASKS, BIG_FIELD).start()
    dest = server.data_dir / "nightly.db"
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(b"BACKUP nightly.db\r\n")  # the reply is never read: the server dies first
            wait_until(lambda: glob.glob(f"{dest}*"), timeout=30, interval=0.002, message="the backup's file")
            server.kill9()
    finally:
        server.stop()
    leftovers = sorted(glob.glob(f"{dest}*"))
    if dest.exists():  # only if the copy finished before the kill: then it is whole
        assert complete_copy_tasks(dest) == BIG_TASKS, leftovers
    else:
        assert leftovers and all(".partial-" in path for path in leftovers), leftovers
    # A retry, after the restart, writes the same name (no "exists already" for a copy that never was).
    if dest.exists():
        dest.unlink()
    server.start()
    r = server.client(protocol)
    assert r.execute_command("BACKUP", "nightly.db") in (b"OK", "OK", True)
    r.close()
    assert complete_copy_tasks(dest) == BIG_TASKS
    assert server.stop() == 0


def test_a_backup_that_fails_leaves_nothing_and_a_retry_works(tmp_path, small_fs, protocol):
    server = stopped_server_with(tmp_path, 60, BIG_FIELD, "--backup-dir", str(small_fs)).start()
    filler = leave_free(small_fs, 1024 * 1024)  # room for 1 MB of the ~6 MB copy
    r = server.client(protocol)
    try:
        with pytest.raises(redis.ResponseError, match="BACKUP failed: .*full"):
            r.execute_command("BACKUP", "nightly.db")
        assert sorted(p.name for p in small_fs.iterdir()) == ["filler"]  # no partial file, named or not
        filler.unlink()
        assert r.execute_command("BACKUP", "nightly.db") in (b"OK", "OK", True)
        assert complete_copy_tasks(small_fs / "nightly.db") == 60
        assert sorted(p.name for p in small_fs.iterdir()) == ["nightly.db"]
    finally:
        r.close()
        assert server.stop() == 0


def test_an_empty_ezra_db_is_refused(ezra_factory, tmp_path):
    data_dir = tmp_path / "restored"
    data_dir.mkdir()
    (data_dir / "ezra.db").write_bytes(b"")  # what a restore of the old cut-short backup gave
    server = EzraProcess(data_dir)
    with pytest.raises(AssertionError, match="exited with 1"):
        server.start()
    log = server.log()
    assert f"{data_dir / 'ezra.db'} is empty (0 bytes)" in log, log
    assert "if this is a new install, delete it" in log
    assert (data_dir / "ezra.db").stat().st_size == 0  # left as found


def test_a_new_database_appears_whole_under_its_name(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "ezra.db.new").write_bytes(b"a start killed while creating the database")
    server = EzraProcess(data_dir).start()
    try:
        assert not (data_dir / "ezra.db.new").exists()
        r = server.client()
        r.xadd("q", {"n": "1"})
        r.close()
    finally:
        assert server.stop() == 0
    assert server.start().client().xlen("q") == 1
    assert server.stop() == 0
