"""Issue 22: the available order in memory (broker/available.py), schema 8 without tasks_available.

Claims still take the oldest available task, whichever way it became available (a push, a
nack, a lease expiring, a delayed task coming due, XREQUEUE, a restart), and step over tasks
taken another way (XCLAIM FORCE, XNACK FORCE); a file of schema 7 loses the index and keeps
its order; and an order that lost track of a task is built again rather than leaving it
unclaimable.
"""

from __future__ import annotations

import sqlite3
import pytest

from ezra.broker.available import COMPACT_AFTER, AvailableOrder
from ezra.storage import SCHEMA_VERSION
from ezra.protocol.task_fields import stored

from support_servers import wait_until
from support_broker import push_one, claim_committed


# ---------------------------------------------------------------- the order alone

def test_forget_takes_cancelled_tasks_out_of_the_head_only():
    """XDEL (issue 45 item 6): cancelled tasks at the head go, so the head is a task's (the oldest
    waiting's age); one further in stays, a stale entry a claim steps over."""
    order = AvailableOrder([3, 5, 9])
    order.add(1)
    order.forget({1, 3, 9})
    assert order.head() == 5 and order.take(5) == [5, 9]
    order.forget({42})  # not at the head: nothing changes
    assert order.head() is None and len(order) == 0


def test_pushes_and_returns_come_out_oldest_first():
    order = AvailableOrder([3, 5, 9])
    order.add(12)  # a push: after everything
    order.add(4)   # a nack of an older task: between
    order.add(1)
    assert order.head() == 1 and len(order) == 6
    assert order.take(4) == [1, 3, 4, 5]
    order.add(2)
    assert order.take(10) == [2, 9, 12] and order.take(1) == [] and order.head() is None


def test_the_tail_is_cut_once_most_of_it_was_taken_and_the_order_holds():
    order = AvailableOrder(range(COMPACT_AFTER * 3))
    taken = order.take(COMPACT_AFTER * 2)
    assert taken == list(range(COMPACT_AFTER * 2)) and order._head == 0  # cut, no copy of what was taken
    assert order.take(3) == [COMPACT_AFTER * 2, COMPACT_AFTER * 2 + 1, COMPACT_AFTER * 2 + 2]
    assert len(order) == COMPACT_AFTER - 3


def test_a_claim_finds_its_tasks_by_row_id_not_by_walking_the_queue(tmp_path):
    """Found while building this: with `queue = ?` beside `rowid IN (...)` SQLite chose the primary
    key's range of the queue and tested every row of it against the list."""
    from ezra.storage import open_database

    db = open_database(str(tmp_path / "data"))
    statements = []
    db.conn.set_trace_callback(statements.append)
    db.begin()
    db.insert_queue(b"q", 0)
    rowids = [db.insert_task(b"q", (1, n), stored([b"f", b"v"]), 0, 0) for n in range(3)]
    assert len(db.claim(b"q", rowids[:1], b"w", 1, 2)) == 1 and len(db.claim(b"q", rowids[1:], b"w", 1, 2)) == 2
    claims = [sql for sql in statements if "state = 'available'" in sql and "rowid" in sql]
    assert len(claims) == 4, statements  # each COUNT: its SELECT and its UPDATE
    for sql in claims:  # the trace gives each statement with its values written in: planned as it ran
        plan = " ".join(row[3] for row in db.conn.execute("EXPLAIN QUERY PLAN " + sql))
        assert "INTEGER PRIMARY KEY (rowid=?)" in plan and "autoindex" not in plan, (sql, plan)
    db.close()


def test_taking_one_at_a_time_past_the_cut_gives_every_id_once_in_order():
    """Found by bench.py's backlog drain: take_one read the tail after cutting it (IndexError)."""
    order = AvailableOrder(range(COMPACT_AFTER * 3))
    order.add(COMPACT_AFTER * 3 + 5)
    taken = [order.take_one() for _ in range(COMPACT_AFTER * 3 + 1)]
    assert taken == [*range(COMPACT_AFTER * 3), COMPACT_AFTER * 3 + 5] and order.take_one() is None


def test_an_order_read_in_slices_leaves_later_tasks_to_the_next_slice():
    order = AvailableOrder(complete=False)
    order.add(7)  # nothing read yet: the file will give it
    order.read([(2, 1, 0), (4, 2, 0)], complete=False)
    order.add(3)  # back, below what was read: in the order
    order.add(9)  # past what was read: left for the next slice
    assert order.take(5) == [2, 3, 4] and order.take_one() is None and not order.complete
    order.read([(7, 5, 0), (9, 6, 0)], complete=True)
    order.add(11)
    assert [order.take_one(), order.take_one(), order.take_one(), order.take_one()] == [7, 9, 11, None]


def test_after_a_restart_the_order_is_read_a_slice_at_a_time_and_loses_nothing(tmp_path, monkeypatch):
    """In process, with slices of 3: tasks pushed and nacked while the order is half read are all
    claimed, once each, in id order."""
    from ezra import lifecycle, storage
    from ezra.broker import Broker, transitions
    from ezra.config import Settings

    monkeypatch.setattr(transitions, "ORDER_SLICE", 3)
    data = str(tmp_path / "data")
    settings = Settings(data_dir=data, durability="normal")
    broker = Broker(storage.open_database(data), settings)
    ids = [push_one(broker, b"q", stored([b"n", b"%d" % i])) for i in range(10)]
    broker.stop()
    broker.db.close()
    broker = Broker(storage.open_database(data), settings)  # a restart: the order is not read yet
    try:
        def claim(n):
            found = claim_committed(broker, [b"q"], b"w", n, False)
            return [b"%d-%d" % row[:2] for row in found[b"q"]] if found else []

        got = claim(2)
        assert got == ids[:2] and broker.queues[b"q"].order.read_to is not None
        assert not broker.queues[b"q"].order.complete
        later = push_one(broker, b"q", stored([b"n", b"later"]))  # past the slice read
        back = [tuple(map(int, task_id.split(b"-"))) for task_id in got[:1]]
        assert broker.tasks.fail(b"q", back, lifecycle.SILENT).wait() == 1  # back, older than the rest
        rest = claim(100)
        assert rest == [ids[0], *ids[2:], later]
        assert claim(1) == [] and broker.queues[b"q"].order.complete
    finally:
        broker.stop()
        broker.db.close()


# ---------------------------------------------------------------- the real server

def entries(reply, protocol) -> list[tuple[str, bytes]]:
    if not reply:
        return []
    rows = reply[b"q"][0] if protocol == 3 else reply[0][1]
    return [(task_id.decode(), fields[b"n"]) for task_id, fields in rows]


def started(ezra_factory, protocol):
    """A server, a client of it in `protocol`, and the queue q with its group g made."""
    server = ezra_factory()
    client = server.client(protocol)
    client.xgroup_create("q", "g", id="0", mkstream=True)
    return server, client


def claim_all(client, protocol, worker="w", count=1) -> list[tuple[str, bytes]]:
    got = []
    while True:
        found = entries(client.xreadgroup("g", worker, {"q": ">"}, count=count), protocol)
        if not found:
            return got
        got += found


@pytest.mark.parametrize("count", [1, 4])
def test_tasks_back_from_a_nack_and_a_requeue_are_claimed_in_id_order(ezra_factory, protocol, count):
    server, client = started(ezra_factory, protocol)
    ids = [client.xadd("q", {"n": str(i)}).decode() for i in range(8)]
    assert [task_id for task_id, _ in claim_all(client, protocol, count=count)] == ids
    assert client.execute_command("XNACK", "q", "g", "FATAL", "IDS", 1, ids[2]) == 1  # dead
    assert client.execute_command("XNACK", "q", "g", "SILENT", "IDS", 2, ids[6], ids[5]) == 2  # back
    assert client.execute_command("XREQUEUE", "q", "ALL") == 1  # 2 back from the dead
    late = client.xadd("q", {"n": "late"}).decode()
    assert [task_id for task_id, _ in claim_all(client, protocol, count=count)] == [ids[2], ids[5], ids[6], late]


def test_a_delayed_task_coming_due_is_claimed_before_newer_ones(ezra_factory, protocol):
    server, client = started(ezra_factory, protocol)
    soon = client.execute_command("XADD", "q", "DELAY", "1", "*", "n", "soon").decode()
    newer = [client.xadd("q", {"n": str(i)}).decode() for i in range(3)]
    assert [task_id for task_id, _ in claim_all(client, protocol)] == newer
    newest = client.xadd("q", {"n": "newest"}).decode()
    wait_until(lambda: available(server) == 2, timeout=10, message="the delayed task to come due")
    assert [task_id for task_id, _ in claim_all(client, protocol)] == [soon, newest]


def available(server) -> int:
    conn = sqlite3.connect(f"file:{server.data_dir / 'ezra.db'}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT count(*) FROM tasks WHERE state = 'available'").fetchone()[0]
    finally:
        conn.close()


def test_a_task_taken_by_xclaim_force_is_stepped_over_not_delivered_twice(ezra_factory, protocol):
    server, client = started(ezra_factory, protocol)
    ids = [client.xadd("q", {"n": str(i)}).decode() for i in range(5)]
    taken = client.xclaim("q", "g", "other", 0, [ids[0], ids[3]], force=True, justid=True)
    assert [t.decode() for t in taken] == [ids[0], ids[3]]
    assert [task_id for task_id, _ in claim_all(client, protocol, count=2)] == [ids[1], ids[2], ids[4]]
    # Back to available by a SILENT nack: claimed once more, once.
    assert client.execute_command("XNACK", "q", "g", "SILENT", "IDS", 1, ids[3]) == 1
    assert [task_id for task_id, _ in claim_all(client, protocol)] == [ids[3]]


def test_after_a_restart_the_order_is_read_from_the_file(ezra_factory, protocol):
    server, client = started(ezra_factory, protocol)
    ids = [client.xadd("q", {"n": str(i)}).decode() for i in range(6)]
    assert [task_id for task_id, _ in entries(client.xreadgroup("g", "w", {"q": ">"}, count=2), protocol)] == ids[:2]
    client.close()
    server.restart()  # the two in flight come back (start-up recovery), the order is rebuilt
    client = server.client(protocol)
    assert [task_id for task_id, _ in claim_all(client, protocol, count=4)] == ids


def test_a_schema_7_file_loses_its_available_index_and_keeps_its_order(ezra_factory, tmp_path):
    server = ezra_factory(data_dir=tmp_path / "old")
    client = server.client()
    client.xgroup_create("q", "g", id="0", mkstream=True)
    ids = [client.xadd("q", {"n": str(i)}).decode() for i in range(5)]
    client.close()
    server.stop()
    path = server.data_dir / "ezra.db"
    db = sqlite3.connect(path)
    db.execute("CREATE INDEX tasks_available ON tasks (queue, id_ms, id_seq) WHERE state = 'available'")
    db.execute("PRAGMA user_version = 7")
    db.commit()
    db.close()
    server.start()
    assert f"from schema 7 to {SCHEMA_VERSION}" in server.log()
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        assert db.execute("SELECT name FROM sqlite_master WHERE name = 'tasks_available'").fetchall() == []
    finally:
        db.close()
    assert [task_id for task_id, _ in claim_all(server.client(), 2, count=3)] == ids


# ---------------------------------------------------------------- a lost entry (a bug) is recovered

def test_an_order_that_lost_a_task_is_built_again_and_the_task_is_claimed(tmp_path, caplog):
    from loguru import logger

    from ezra import storage
    from ezra.broker import Broker
    from ezra.config import Settings

    data = str(tmp_path / "data")
    broker = Broker(storage.open_database(data), Settings(data_dir=data, durability="normal"))
    messages = []
    sink = logger.add(lambda message: messages.append(str(message)), level="ERROR")
    try:
        ids = [push_one(broker, b"q", stored([b"n", b"%d" % i])) for i in range(3)]
        assert len(claim_committed(broker, [b"q"], b"w", 1, False)[b"q"]) == 1
        broker.queues[b"q"].order = AvailableOrder()  # as if a way into available forgot to tell it
        claimed = claim_committed(broker, [b"q"], b"w", 5, False)[b"q"]
        assert [b"%d-%d" % row[:2] for row in claimed] == ids[1:]
        assert any("building it again from the file" in message for message in messages), messages
    finally:
        logger.remove(sink)
        broker.stop()
        broker.db.close()
