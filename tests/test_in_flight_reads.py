"""Reads of in-flight tasks in id order stay bounded by the in-flight tasks, whatever the done ones.

Done tasks are kept for ever by default. XPENDING (both forms), XAUTOCLAIM's scan and XINFO
STREAM FULL read a queue's in-flight tasks in id order, and SQLite, knowing no counts, walked the
queue's primary key for them, past every done task: with 300,000 done tasks each call held the
event loop 63-90 ms (measured), and it grows with the file. They now read the in-flight index
when the queue has fewer tasks in flight than in other states (storage.reads.in_flight_source).
"""

from __future__ import annotations

import pytest

from ezra.broker.queues import Defaults, QueueState
from ezra.config import Settings
from ezra.lifecycle import AVAILABLE, DONE, IN_FLIGHT
from ezra.storage import open_database
from ezra.storage import reads
from ezra.task_fields import stored

NOW = 1_000_000
DONE_TASKS = 300


def plans(db, statements: list[str]) -> list[str]:
    """The query plan of each traced statement (the trace writes the values in: planned as it ran)."""
    return [" ".join(row[3] for row in db.conn.execute("EXPLAIN QUERY PLAN " + sql)) for sql in statements]


@pytest.fixture
def db_with_done_tasks(tmp_path):
    """A queue with DONE_TASKS done tasks, then three in flight: held by w2, w1, w2 (in id order)."""
    db = open_database(str(tmp_path / "data"))
    db.begin()
    db.insert_queue(b"q", NOW)
    rowids = [db.insert_task(b"q", (ms, 0), stored([b"n", b"%d" % ms]), NOW, NOW) for ms in range(1, DONE_TASKS + 4)]
    assert len(db.claim(b"q", rowids[:DONE_TASKS], b"w0", NOW, NOW + 1000)) == DONE_TASKS
    assert db.ack(b"q", [(ms, 0) for ms in range(1, DONE_TASKS + 1)], NOW) == DONE_TASKS
    for rowid, worker in zip(rowids[DONE_TASKS:], (b"w2", b"w1", b"w2")):
        assert len(db.claim(b"q", [rowid], worker, NOW, NOW + 1000)) == 1
    yield db
    db.rollback()
    db.close()


IN_FLIGHT_IDS = [(DONE_TASKS + 1, 0), (DONE_TASKS + 2, 0), (DONE_TASKS + 3, 0)]


def test_the_reads_of_in_flight_tasks_use_the_in_flight_index_not_the_queues_primary_key(db_with_done_tasks):
    db = db_with_done_tasks
    statements = []
    db.conn.set_trace_callback(statements.append)
    first, last, workers = reads.pending_summary(db.conn, b"q", True)
    scanned = db.in_flight_from(b"q", (0, 0), 10, True)
    pending = db.pending_entries(b"q", (0, 0), (2 ** 62, 0), 10, None, None, True)
    db.conn.set_trace_callback(None)
    assert (first, last) == (IN_FLIGHT_IDS[0], IN_FLIGHT_IDS[-1]) and workers == [("w1", 1), ("w2", 2)]
    # In id order across workers, though the index holds them by worker: sorted.
    assert [row[1:3] for row in scanned] == IN_FLIGHT_IDS
    assert [(ms, seq, worker) for ms, seq, worker, *_ in pending] == [
        (*IN_FLIGHT_IDS[0], "w2"), (*IN_FLIGHT_IDS[1], "w1"), (*IN_FLIGHT_IDS[2], "w2")]
    for sql, plan in zip(statements, plans(db, statements)):
        assert "tasks_in_flight" in plan and "autoindex" not in plan, (sql, plan)


def test_the_same_reads_by_the_primary_key_give_the_same_rows(db_with_done_tasks):
    """The other source, which the broker picks when most of a queue's tasks are in flight."""
    db = db_with_done_tasks
    assert [row[1:3] for row in db.in_flight_from(b"q", (0, 0), 10, False)] == IN_FLIGHT_IDS
    assert [row[1:3] for row in db.in_flight_from(b"q", IN_FLIGHT_IDS[1], 1, True)] == IN_FLIGHT_IDS[1:2]
    assert db.pending_entries(b"q", (0, 0), (2 ** 62, 0), 10, b"w2", None, False) == \
        db.pending_entries(b"q", (0, 0), (2 ** 62, 0), 10, b"w2", None, True)


def test_the_broker_reads_the_index_while_fewer_tasks_are_in_flight_than_in_other_states():
    queue = QueueState(b"q", Defaults(Settings()))
    assert queue.in_flight_are_fewer()  # empty: either source costs nothing
    queue.move(None, AVAILABLE, 10)
    queue.move(AVAILABLE, IN_FLIGHT, 4)
    assert queue.in_flight_are_fewer()
    queue.move(AVAILABLE, IN_FLIGHT, 2)  # 6 in flight, 4 available: the primary key passes fewer rows
    assert not queue.in_flight_are_fewer()
    queue.move(IN_FLIGHT, DONE, 3)
    assert queue.in_flight_are_fewer()


@pytest.mark.parametrize("protocol", [2, 3], ids=["resp2", "resp3"])
def test_xpending_and_xautoclaim_answer_in_id_order_with_many_done_tasks(ezra_factory, protocol):
    """Black box: the index's rows come sorted back into id order for every reader."""
    server = ezra_factory()
    r = server.client(protocol)
    r.xgroup_create("q", "g", id="0", mkstream=True)
    pipe = r.pipeline(transaction=False)
    for i in range(DONE_TASKS + 3):
        pipe.xadd("q", {"n": str(i)})
    ids = pipe.execute()
    claimed = r.xreadgroup("g", "w0", {"q": ">"}, count=DONE_TASKS)
    entries = claimed[0][1] if protocol == 2 else claimed[b"q"][0]
    assert r.xack("q", "g", *[task_id for task_id, _ in entries]) == DONE_TASKS
    for worker in ("w2", "w1", "w2"):
        assert r.xreadgroup("g", worker, {"q": ">"}, count=1)
    in_flight = ids[DONE_TASKS:]
    summary = r.xpending("q", "g")
    assert summary["pending"] == 3 and (summary["min"], summary["max"]) == (in_flight[0], in_flight[-1])
    detail = r.xpending_range("q", "g", "-", "+", 10)
    assert [(p["message_id"], p["consumer"]) for p in detail] == list(zip(in_flight, [b"w2", b"w1", b"w2"]))
    assert r.xautoclaim("q", "g", "w3", 0, "0-0", count=10, justid=True) == in_flight  # redis-py: the ids
    r.close()
