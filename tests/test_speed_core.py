"""The core's hot statements (issue 22, round three): each shape of a claim and an ack stores
the same row as every other shape, read back from the file with sqlite3 as an operator would.

Speed itself is measured by scripts/stages.py and scripts/bench.py, never here.
"""

from __future__ import annotations

import re
import sqlite3

import pytest

from ezra.storage import SCHEMA_VERSION, open_database

ROW = "state, worker, deadline IS NOT NULL, delivered_at IS NOT NULL, attempts, finished_at IS NOT NULL"


def stored(server, queue: str) -> list[tuple]:
    """Every task row of `queue`, in id order, from the file (a read-only connection)."""
    conn = sqlite3.connect(f"file:{server.data_dir / 'ezra.db'}?mode=ro", uri=True)
    try:
        return conn.execute(f"SELECT id_ms || '-' || id_seq, {ROW} FROM tasks WHERE queue = ? "
                            "ORDER BY id_ms, id_seq", (queue,)).fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize("protocol", [2, 3], ids=["resp2", "resp3"])
@pytest.mark.parametrize("count", [1, 3])
def test_a_claim_stores_its_lease_whatever_its_count(ezra_factory, protocol, count):
    """COUNT 1 (a read of the head, then an update of its row) and COUNT 3 (one UPDATE ...
    RETURNING) take the oldest tasks in order and write the same lease, and a redelivery
    counts its attempt either way."""
    server = ezra_factory("--max-attempts", "5")
    client = server.client(protocol)
    ids = [client.xadd("q", {"n": str(i)}).decode() for i in range(6)]
    client.xgroup_create("q", "g", id="0")
    got = []
    while len(got) < 6:
        reply = client.xreadgroup("g", "w1", {"q": ">"}, count=count)
        entries = reply[b"q"][0] if protocol == 3 else reply[0][1]
        assert 1 <= len(entries) <= count
        got += [(task_id.decode(), fields[b"n"]) for task_id, fields in entries]
    assert got == [(task_id, str(i).encode()) for i, task_id in enumerate(ids)]  # oldest first
    assert stored(server, "q") == [(task_id, "in_flight", "w1", 1, 1, 1, 0) for task_id in ids]
    assert client.execute_command("XNACK", "q", "g", "FAIL", "IDS", 1, ids[1]) == 1  # back, as "fixed 0"
    reply = client.xreadgroup("g", "w2", {"q": ">"}, count=count)
    entries = reply[b"q"][0] if protocol == 3 else reply[0][1]
    assert entries[0][0].decode() == ids[1]
    row = stored(server, "q")[1]
    assert row == (ids[1], "in_flight", "w2", 1, 1, 2, 0)  # delivered twice: attempts 2
    pending = client.xpending_range("q", "g", min=ids[1], max=ids[1], count=1)
    assert pending[0]["times_delivered"] == 2


@pytest.mark.parametrize("count", [1, 3])
def test_a_noack_claim_finishes_the_task_whatever_its_count(ezra_factory, count):
    """NOACK: the claimed task is done at once (finished_at set, no lease), in either shape."""
    server = ezra_factory()
    client = server.client()
    task_id = client.xadd("q", {"f": "v"}).decode()
    client.xgroup_create("q", "g", id="0")
    reply = client.xreadgroup("g", "w1", {"q": ">"}, count=count, noack=True)
    assert reply[0][1][0][0].decode() == task_id
    assert stored(server, "q") == [(task_id, "done", "w1", 0, 1, 1, 1)]
    assert client.xpending("q", "g")["pending"] == 0


# --------------------------------------------------------------------------- schema 7: the state CHECK

OLD_CHECK = "CHECK (state IN ('available', 'delayed', 'in_flight', 'done', 'dead'))"


def tasks_sql(path) -> str:
    with sqlite3.connect(path) as db:
        sql = db.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'tasks'").fetchone()[0]
    db.close()
    return sql


def refuses_a_bad_state(path) -> bool:
    """The file's CHECK, as any writer (the sqlite3 shell) meets it."""
    db = sqlite3.connect(path)
    try:
        db.execute("INSERT INTO tasks (queue, id_ms, id_seq, state, fields, created_at, available_at) "
                   "VALUES ('q', 9, 9, 'lost', '[]', 0, 0)")
    except sqlite3.IntegrityError as exc:
        return "CHECK constraint failed" in str(exc)
    finally:
        db.rollback()
        db.close()
    return False


def test_a_schema_4_file_gets_the_state_check_as_comparisons_with_its_tasks(ezra_factory, tmp_path):
    """Schema 7 rewrites the CHECK's text in place (no copy of the rows): afterwards the file's
    tasks table reads as a new file's, the rule still holds for every writer, and the tasks
    and their states are all there."""
    fresh = ezra_factory()
    fresh.stop()
    server = ezra_factory(data_dir=tmp_path / "old")
    client = server.client()
    ids = [client.xadd("q", {"n": str(i)}) for i in range(3)]
    client.xgroup_create("q", "g", id="0")
    client.xreadgroup("g", "w1", {"q": ">"}, count=2)
    client.xack("q", "g", ids[0])
    client.close()
    server.stop()
    # The clean stop gave the task in flight back (schema 12); an EZRA of schema 4 left it in flight.
    assert [row[1] for row in stored(server, "q")] == ["done", "available", "available"]
    path = server.data_dir / "ezra.db"
    db = sqlite3.connect(path, isolation_level=None)  # make it the file an EZRA of schema 4 wrote
    ms, seq = map(int, ids[1].split(b"-"))
    db.execute("UPDATE tasks SET state = 'in_flight', worker = 'w1', deadline = 1 WHERE id_ms = ? AND id_seq = ?",
               (ms, seq))
    before = stored(server, "q")  # done, in flight, available
    assert [row[1] for row in before] == ["done", "in_flight", "available"]
    version = db.execute("PRAGMA schema_version").fetchone()[0]
    db.execute("PRAGMA writable_schema = ON")
    new_check = re.search(r"CHECK \(state = [^)]*\)", tasks_sql(path)).group(0)
    db.execute("UPDATE sqlite_master SET sql = replace(sql, ?, ?) WHERE name = 'tasks'", (new_check, OLD_CHECK))
    db.execute(f"PRAGMA schema_version = {version + 1}")
    db.execute("PRAGMA writable_schema = OFF")
    db.execute("PRAGMA user_version = 4")
    db.close()
    assert OLD_CHECK in tasks_sql(path)

    server.start()
    assert f"from schema 4 to {SCHEMA_VERSION}" in server.log()
    assert tasks_sql(path) == tasks_sql(fresh.data_dir / "ezra.db")
    assert refuses_a_bad_state(path)
    client = server.client()
    assert [entry[0] for entry in client.xrange("q")] == ids
    reply = client.xreadgroup("g", "w2", {"q": ">"}, count=5)  # the one in flight came back at the start
    assert [entry[0] for entry in reply[0][1]] == ids[1:]
    client.close()
    server.stop()
    assert [row[1] for row in stored(server, "q")] == ["done", "available", "available"]  # given back
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()


def test_a_new_file_refuses_a_state_outside_the_lifecycle(ezra_factory):
    server = ezra_factory()
    server.stop()
    assert OLD_CHECK not in tasks_sql(server.data_dir / "ezra.db")
    assert refuses_a_bad_state(server.data_dir / "ezra.db")


def test_a_state_check_of_another_text_is_left_and_the_file_still_opens(tmp_path):
    """Step 7 changes only the text it knows; another (a hand-made table) stays as it is, with
    a warning, and the file opens all the same: the rule is the same either way. Step 14 then
    copies the table into schema.sql's, which has the comparisons."""
    data = tmp_path / "data"
    open_database(str(data)).close()
    path = data / "ezra.db"
    other = "CHECK (state IN ('available','delayed','in_flight','done','dead'))"
    db = sqlite3.connect(path, isolation_level=None)
    version = db.execute("PRAGMA schema_version").fetchone()[0]
    db.execute("PRAGMA writable_schema = ON")
    new_check = re.search(r"CHECK \(state = [^)]*\)", tasks_sql(path)).group(0)
    db.execute("UPDATE sqlite_master SET sql = replace(sql, ?, ?) WHERE name = 'tasks'", (new_check, other))
    db.execute(f"PRAGMA schema_version = {version + 1}")
    db.execute("PRAGMA writable_schema = OFF")
    db.execute("PRAGMA user_version = 4")
    db.close()
    open_database(str(data)).close()
    assert other not in tasks_sql(path) and new_check in tasks_sql(path)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 7
    db.close()
    assert refuses_a_bad_state(path)
