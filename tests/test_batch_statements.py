"""Issue 22: a pipeline's run of pushes goes in as INSERTs of many rows each (database.INSERT_ROWS),
and the row ids the broker's available order keeps must be the ones SQLite gave. An ack names its
rows by row id (the broker's leases say which, broker/in_flight.py), many of them in one UPDATE,
the row ids passed as one JSON text: it must count and change each row in flight once, whatever
the duplicates, rows done or available, or row ids of no task."""

from __future__ import annotations

import pytest
from support_queue import claim

from ezra.lifecycle import AVAILABLE, DONE, IN_FLIGHT
from ezra.storage import open_database
from ezra.storage.database import INSERT_ROWS
from ezra.protocol.stream_ids import MAX_ID_PART
from ezra.protocol.task_fields import stored

NOW = 1_000_000
TOP = (MAX_ID_PART, MAX_ID_PART)


@pytest.fixture
def db(tmp_path):
    """Queues q and other with the same ids 1-0..60-0 and TOP; q's 1..50 and TOP in flight,
    51..60 available; other's all in flight."""
    db = open_database(str(tmp_path / "data"))
    db.begin()
    for name in (b"q", b"other"):
        db.insert_queue(name, NOW)
        ids = [(ms, 0) for ms in range(1, 61)] + [TOP]
        rowids = [db.insert_task(name, task_id, stored([b"n", b"%d" % task_id[0]]), NOW, NOW) for task_id in ids]
        held = rowids if name == b"other" else rowids[:50] + rowids[-1:]
        assert len(db.claim(name, held, b"w", NOW, NOW + 1000)) == len(held)
    yield db
    db.rollback()
    db.close()


def states(db, queue: str) -> dict[tuple, str]:
    return {(ms, seq): state for ms, seq, state in db.conn.execute(
        "SELECT id_ms, id_seq, state FROM tasks WHERE queue = ?", (queue,))}


def rowids_of(db, queue: str) -> dict[tuple, int]:
    return {(ms, seq): rowid for rowid, ms, seq in db.conn.execute(
        "SELECT rowid, id_ms, id_seq FROM tasks WHERE queue = ?", (queue,))}


@pytest.mark.parametrize("size", [1, 2, 50])
def test_an_ack_counts_and_finishes_each_in_flight_row_once(db, size):
    rowid = rowids_of(db, "q")
    assert db.ack([rowid[(5, 0)]], NOW) == 1  # done before: a stale row from here on
    wanted = [rowid[(ms, 0)] for ms in range(1, 61)][:size - 1] + [rowid[TOP]]
    listed = wanted + [rowid[(5, 0)], rowid[(55, 0)], 10 ** 9, rowid[TOP], wanted[0]]  # done, available, none, twice
    in_flight = {r for r in wanted if r != rowid[(5, 0)] and r not in [rowid[(ms, 0)] for ms in range(51, 61)]}
    assert db.ack(listed, NOW + 1) == len(in_flight)
    after = states(db, "q")
    for task_id, state in after.items():
        if rowid[task_id] in in_flight or task_id == (5, 0):
            assert state == DONE, task_id
        else:
            assert state == (AVAILABLE if 50 < task_id[0] <= 60 else IN_FLIGHT), task_id
    assert set(states(db, "other").values()) == {IN_FLIGHT}  # another queue's rows: untouched
    finished = db.conn.execute("SELECT count(*) FROM tasks WHERE queue = 'q' AND state = 'done' "
                               "AND finished_at = ? AND deadline IS NULL", (NOW + 1,)).fetchone()[0]
    assert finished == len(in_flight)


def test_an_ack_of_many_rows_is_one_statement_that_finds_each_row_by_its_id(db):
    rowid = rowids_of(db, "q")
    statements = []
    db.conn.set_trace_callback(statements.append)
    assert db.ack([rowid[(ms, 0)] for ms in range(1, 51)], NOW) == 50
    db.conn.set_trace_callback(None)
    assert len(statements) == 1, statements[:3]
    plan = " ".join(row[3] for row in db.conn.execute("EXPLAIN QUERY PLAN " + statements[0]))
    assert "SCAN tasks" not in plan and "INTEGER PRIMARY KEY" in plan, plan


def test_xack_of_many_ids_through_the_server(r, queue):
    ids = [r.xadd(queue, {"n": i}) for i in range(60)]
    r.xgroup_create(queue, "g", id="0")
    assert len(claim(r, queue, count=40)) == 40
    # 40 delivered, 20 never delivered, one of them twice: only the delivered ones count.
    assert r.xack(queue, "g", *ids, ids[0]) == 40
    assert r.xpending(queue, "g")["pending"] == 0
    assert r.xack(queue, "g", *ids[:40]) == 0  # all done now
    rest = claim(r, queue, count=100)
    assert len(rest) == 20 and r.xack(queue, "g", *[entry[0] for entry in rest]) == 20


@pytest.mark.parametrize("size", [1, 2, 3, 7, 50, INSERT_ROWS, INSERT_ROWS + 1, 3 * INSERT_ROWS - 1])
def test_a_push_run_gets_the_row_ids_it_reports_in_its_order(db, size):
    tasks = [(2000 + n, n % 3, stored([b"n", b"%d" % n])) for n in range(size)]
    rowids = db.insert_available(b"q", tasks, NOW)
    assert len(rowids) == size
    rows = {rowid: (ms, seq, fields, state) for rowid, ms, seq, fields, state in db.conn.execute(
        "SELECT rowid, id_ms, id_seq, fields, state FROM tasks WHERE queue = 'q' AND id_ms >= 2000")}
    assert [rows[rowid] for rowid in rowids] == [(ms, seq, fields, AVAILABLE) for ms, seq, fields in tasks]
    assert len(db.claim(b"q", list(rowids), b"w", NOW, NOW + 1000)) == size  # claimable by those ids


def test_a_push_run_of_50_is_three_inserts(db):
    statements = []
    db.conn.set_trace_callback(statements.append)
    db.insert_available(b"q", [(3000, n, stored([b"n", b"v"])) for n in range(50)], NOW)
    db.conn.set_trace_callback(None)
    assert sum(sql.startswith("INSERT") for sql in statements) == 3, statements  # 32 + 16 + 2 rows
