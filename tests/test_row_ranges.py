"""A queue's tasks are one range of row ids, in id order (ezra/storage/row_ranges.py): the binary
search that finds a task id's place in it, against a scan of the rows, with rows missing
anywhere (deleted tasks) and another queue's range beside it; and a queue whose range is used up
refuses a push with a clear error, losing nothing."""

from __future__ import annotations

import random
import sqlite3

import pytest
import redis

from ezra.storage import open_database
from ezra.storage.row_ranges import QUEUE_ROWS, lowest_row, row_of, rows_between, span
from ezra.storage.schema import SCHEMA
from ezra.protocol.stream_ids import TOP


def table_of(ids_by_queue: dict[int, list[tuple]]) -> sqlite3.Connection:
    """A tasks table holding these ids, each queue's in its range of row ids with gaps between them."""
    conn = sqlite3.connect(":memory:")
    conn.executescript(SCHEMA)
    rng = random.Random(7)
    for number, ids in ids_by_queue.items():
        rowid = span(number)[0] + rng.randrange(3)
        for ms, seq in ids:
            conn.execute("INSERT INTO tasks (rowid, queue, id_ms, id_seq, state, fields, created_at, available_at) "
                         "VALUES (?, ?, ?, ?, 'available', x'', 0, 0)", (rowid, f"q{number}", ms, seq))
            rowid += 1 + rng.choice((0, 0, 0, 1, 5, 1000))  # deleted rows between, some long runs
    return conn


def scanned(conn, rows, task_id, above=False) -> int:
    """lowest_row's answer by reading every row of the range."""
    for rowid, ms, seq in conn.execute("SELECT rowid, id_ms, id_seq FROM tasks WHERE rowid BETWEEN ? AND ? "
                                       "ORDER BY rowid", rows):
        if ((ms, seq) > task_id) if above else ((ms, seq) >= task_id):
            return rowid
    return None


def test_the_search_finds_what_a_scan_finds_at_every_id_in_and_around_the_range():
    rng = random.Random(1)
    ids = sorted({(rng.randrange(1000, 1200), rng.randrange(4)) for _ in range(400)})
    other = [(ms, 0) for ms in range(1, 50)]  # queue 3, above queue 2: never part of its answers
    conn = table_of({2: ids, 3: other, 1: other})
    rows = span(2)
    probes = ids + [(ms, seq) for ms in range(990, 1210) for seq in (0, 2, 5)] + [(0, 0), (0, 1), TOP]
    for task_id in probes:
        for above in (False, True):
            split = lowest_row(conn, rows, task_id, above)
            expected = scanned(conn, rows, task_id, above)
            if expected is None:  # no task at or above it: the split is past the range's last task
                assert conn.execute("SELECT count(*) FROM tasks WHERE rowid BETWEEN ? AND ?",
                                    (split, rows[1])).fetchone()[0] == 0, task_id
                assert split <= rows[1] + 1
            else:  # no task between the split and the first task at or above the id
                assert split <= expected and conn.execute(
                    "SELECT count(*) FROM tasks WHERE rowid >= ? AND rowid < ?", (split, expected)).fetchone()[0] == 0
        found = row_of(conn, rows, task_id)
        assert (found is not None) == (task_id in set(ids)), task_id
        if found is not None:
            assert conn.execute("SELECT id_ms, id_seq FROM tasks WHERE rowid = ?", (found,)).fetchone() == task_id


def test_a_range_between_two_ids_holds_exactly_the_tasks_between_them():
    rng = random.Random(2)
    ids = sorted({(rng.randrange(100), rng.randrange(3)) for _ in range(120)})
    conn = table_of({5: ids})
    for _ in range(300):
        start, end = sorted([(rng.randrange(-1, 102), rng.randrange(3)) for _ in range(2)])
        start = max(start, (0, 0))
        low, high = rows_between(conn, span(5), start, end)
        got = [tuple(row) for row in conn.execute(
            "SELECT id_ms, id_seq FROM tasks WHERE rowid BETWEEN ? AND ? ORDER BY rowid", (low, high))]
        assert got == [i for i in ids if start <= i <= end], (start, end)
    assert rows_between(conn, span(5), (0, 0), TOP) == span(5)  # `-` and `+`: no search at all


def test_an_empty_queue_and_a_queue_of_one_task():
    conn = table_of({1: [], 2: [(7, 0)]})
    assert lowest_row(conn, span(1), (5, 0)) == span(1)[0] and row_of(conn, span(1), (5, 0)) is None
    assert row_of(conn, span(2), (7, 0)) == span(2)[0] + conn.execute(
        "SELECT rowid FROM tasks").fetchone()[0] - span(2)[0]
    assert lowest_row(conn, span(2), (7, 0), above=True) == conn.execute("SELECT rowid + 1 FROM tasks").fetchone()[0]


def test_a_queue_whose_row_ids_are_used_up_refuses_the_push_and_keeps_its_tasks(tmp_path, ezra_factory):
    server = ezra_factory()
    r = server.client()
    first = r.xadd("q", {"n": "1"})
    r.close()
    server.stop()
    with sqlite3.connect(server.data_dir / "ezra.db") as db:  # a task at the range's last row id
        number = db.execute("SELECT number FROM queues WHERE name = 'q'").fetchone()[0]
        db.execute("INSERT INTO tasks (rowid, queue, id_ms, id_seq, state, fields, created_at, available_at) "
                   "VALUES (?, 'q', 9999999999999, 0, 'available', '[\"n\", \"last\"]', 0, 0)",
                   (span(number)[1],))
        db.execute("UPDATE queues SET last_id_ms = 9999999999999")
    db.close()
    server.start()
    r = server.client()
    with pytest.raises(redis.ResponseError, match=f"this queue has used all of its {QUEUE_ROWS:,} row ids"):
        r.xadd("q", {"n": "2"})
    with pytest.raises(redis.ResponseError, match="used all of its"):
        r.pipeline(transaction=False).xadd("q", {"n": "3"}).xadd("q", {"n": "4"}).execute()
    assert [i for i, _ in r.xrange("q")] == [first, b"9999999999999-0"]
    assert r.xadd("other", {"n": "1"})  # other queues push on
    r.close()


def test_queues_made_in_a_rolled_back_batch_leave_no_number_taken(tmp_path):
    db = open_database(str(tmp_path / "data"))
    try:
        db.begin()
        db.insert_queue(b"a", 1)
        assert db.span(b"a") == span(1)
        db.rollback()
        assert db.span(b"a") == (1, 0)  # forgotten with the batch: no range, no row id
        db.begin()
        db.insert_queue(b"b", 1)
        db.insert_task(b"b", (1, 0), b"*0\r\n", 1, 1)
        db.commit()
        assert db.span(b"b") == span(1)
        assert db.conn.execute("SELECT rowid FROM tasks").fetchone()[0] == span(1)[0]
    finally:
        db.close()


def test_tasks_written_by_hand_outside_their_queues_range_are_put_in_place_at_the_next_start(ezra_factory):
    """SQLite gives a row inserted without its row id the largest plus one: inside the last queue's
    range, whatever its queue. A start that reads every row (here: the file changed after its clean
    stop) finds such rows and renumbers the table, so each task is served by its own queue."""
    server = ezra_factory()
    r = server.client()
    a = [r.xadd("a", {"n": str(n)}) for n in range(3)]
    b = [r.xadd("b", {"n": str(n)}) for n in range(3)]  # b's range is above a's
    r.close()
    server.stop()
    with sqlite3.connect(server.data_dir / "ezra.db") as db:
        for queue, ms in (("a", 1), ("new", 7)):  # an older id of a, and a queue with no row
            db.execute("INSERT INTO tasks (queue, id_ms, id_seq, state, fields, created_at, available_at) "
                       "VALUES (?, ?, 0, 'available', ?, 0, 0)", (queue, ms, f'["n", "{queue}-hand"]'))
    db.close()
    server.start()
    r = server.client()
    assert [i for i, _ in r.xrange("a")] == [b"1-0", *a]
    assert [i for i, _ in r.xrange("b")] == b
    r.xgroup_create("a", "g", id="0")
    r.xgroup_create("b", "g", id="0")
    assert [i for i, _ in r.xreadgroup("g", "w", {"b": ">"}, count=10)[0][1]] == b
    assert [i for i, _ in r.xreadgroup("g", "w", {"a": ">"}, count=10)[0][1]] == [b"1-0", *a]
    assert r.xrange("new") == [(b"7-0", {b"n": b"new-hand"})]
    r.close()
    assert "tasks are out of place" in server.log()


def probes_to_find(conn, rows, task_id, search=lowest_row) -> int:
    """How many reads of the table lowest_row (or row_of) makes to place task_id."""
    statements = []
    conn.set_trace_callback(statements.append)
    try:
        search(conn, rows, task_id)
    finally:
        conn.set_trace_callback(None)
    return len(statements)


def test_ids_pushed_at_a_steady_rate_are_found_in_a_few_probes_and_uneven_ones_in_at_most_twice_halvings():
    steady = [(1_000_000 + n // 10, n % 10) for n in range(100_000)]  # 10 pushes a millisecond
    conn = sqlite3.connect(":memory:")
    conn.executescript(SCHEMA)
    conn.executemany("INSERT INTO tasks (rowid, queue, id_ms, id_seq, state, fields, created_at, available_at) "
                     "VALUES (?, 'q1', ?, ?, 'available', x'', 0, 0)",
                     ((span(1)[0] + 5_000 + n, ms, seq) for n, (ms, seq) in enumerate(steady)))  # the first 5,000 purged
    rng = random.Random(3)
    # an XRESULT names a task just pushed, or any task; halving took 19 reads among these 100,000
    for task_id in steady[-50:] + rng.sample(steady, 200):
        assert probes_to_find(conn, span(1), task_id) <= 4, task_id
        assert probes_to_find(conn, span(1), task_id, row_of) <= 3, task_id  # no read after the search
    uneven = sorted({(int(1.0002 ** n) + n, 0) for n in range(60_000)})  # gaps growing without bound
    conn = table_of({1: uneven})  # and deleted rows anywhere, some runs of 1,000
    halving = (len(uneven) - 1).bit_length()
    for task_id in rng.sample(uneven, 200):
        assert probes_to_find(conn, span(1), task_id) <= 2 * halving + 2, task_id
