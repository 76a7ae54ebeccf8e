"""Issue 22: a task waiting for its first claim keeps room in its row (tasks.reserved, schema.py
RESERVED_BYTES) for the columns the claim fills, so the claim rewrites the row where it is. A
row that grows splits its page, and pushes leave their pages full: every claim of a page's tasks
used to add pages to the file and to each commit. The claims and acks of a whole backlog must
leave the file as many pages as the pushes made, and the room must be gone once a task is
claimed or finished. A schema 10 file gains the column, its rows without room."""

from __future__ import annotations

import sqlite3

import pytest

from ezra.lifecycle import AVAILABLE, DEAD, DELAYED, DONE, IN_FLIGHT
from ezra.storage import SCHEMA_VERSION, open_database
from ezra.storage.schema import RESERVED_BYTES
from ezra.protocol.task_fields import stored

NOW = 1_764_000_000_000  # ms since the epoch: deadline and delivered_at take 6 bytes each, as in use
WORKER = b"worker-%014d" % 7  # 21 bytes: one more than RESERVED_BYTES leaves room for (32 - 12 = 20)


def push(db, queue: bytes, count: int, first_ms: int = 1) -> list[int]:
    """`count` available tasks of 150-byte fields, in runs of 50 as a pipeline pushes them."""
    rowids = []
    for start in range(0, count, 50):
        tasks = [(ms, 0, stored([b"body", b"x" * 140])) for ms in range(first_ms + start, first_ms + min(count, start + 50))]
        rowids += list(db.insert_available(queue, tasks, NOW))
    return rowids


def pages_in_use(db) -> int:
    """The file's pages but those on the free list."""
    return db.conn.execute("PRAGMA page_count").fetchone()[0] - db.conn.execute("PRAGMA freelist_count").fetchone()[0]


@pytest.fixture
def db(tmp_path):
    db = open_database(str(tmp_path / "data"))
    db.begin()
    db.insert_queue(b"q", NOW)
    db.commit()
    yield db
    db.rollback()
    db.close()


@pytest.mark.parametrize("count", [50, 1])  # a worker's COUNT 50 (one statement), and COUNT 1
def test_claiming_and_acking_a_backlog_adds_no_page(db, count):
    db.begin()
    rowids = push(db, b"q", 1000)
    db.commit()
    pushed = pages_in_use(db)
    for start in range(0, len(rowids), count):
        db.begin()
        claimed = db.claim(b"q", rowids[start:start + count], WORKER[:20], NOW, NOW + 30_000)
        assert len(claimed) == len(rowids[start:start + count])
        db.commit()
    db.begin()
    assert db.ack(rowids, NOW + 1) == 1000
    db.commit()
    # Each row was rewritten in its place (without the room, claims split pages: 90 in use against 77).
    assert pages_in_use(db) == pushed
    assert db.conn.execute("SELECT count(*) FROM tasks WHERE reserved IS NOT NULL").fetchone()[0] == 0


def test_only_tasks_that_wait_for_a_claim_keep_room(db):
    db.begin()
    push(db, b"q", 3)
    db.insert_task(b"q", (10, 0), stored([b"n", b"v"]), NOW, NOW + 60_000, state=DELAYED)
    db.insert_task(b"q", (11, 0), stored([b"n", b"v"]), NOW, NOW, ttl_ms=5_000)
    db.insert_task(b"q", (12, 0), stored([b"n", b"v"]), NOW, NOW, state=DEAD, attempts=3)
    db.insert_task(b"q", (13, 0), stored([b"n", b"v"]), NOW, NOW, failure={"cause": "nack", "reason": "r"})
    rows = dict(db.conn.execute("SELECT id_ms, reserved FROM tasks").fetchall())
    room = bytes(RESERVED_BYTES)
    assert rows == {1: room, 2: room, 3: room, 10: room, 11: room, 12: None, 13: room}
    rowid = db.conn.execute("SELECT rowid FROM tasks WHERE id_ms = 1").fetchone()[0]
    db.claim(b"q", [rowid], WORKER, NOW, NOW + 30_000)  # a longer name than the room: grows, still right
    claimed = db.conn.execute("SELECT state, worker, reserved FROM tasks WHERE id_ms = 1").fetchone()
    assert claimed == (IN_FLIGHT, WORKER.decode(), None)
    db.commit()


def test_a_schema_10_file_gains_the_column_and_its_tasks_are_claimed(tmp_path):
    data = tmp_path / "data"
    db = open_database(str(data))
    db.begin()
    db.insert_queue(b"q", NOW)
    push(db, b"q", 60)
    db.commit()
    db.close()
    with sqlite3.connect(data / "ezra.db") as conn:  # the file as schema 10 wrote it
        conn.execute("ALTER TABLE tasks DROP COLUMN reserved")
        conn.execute("PRAGMA user_version = 10")
    conn.close()
    db = open_database(str(data))
    try:
        assert db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.conn.execute("SELECT count(*) FROM tasks WHERE reserved IS NULL").fetchone()[0] == 60
        db.begin()
        rowids = [row[0] for row in db.conn.execute("SELECT rowid FROM tasks ORDER BY rowid")]
        assert [row[0] for row in db.claim(b"q", rowids[:50], WORKER, NOW, NOW + 30_000)] == list(range(1, 51))
        assert db.ack(rowids[:50], NOW + 1) == 50
        push(db, b"q", 1, first_ms=61)  # a new push has the room
        db.commit()
        states = dict(db.conn.execute("SELECT state, count(*) FROM tasks GROUP BY state").fetchall())
        assert states == {DONE: 50, AVAILABLE: 11}
        assert db.conn.execute("SELECT reserved FROM tasks WHERE id_ms = 61").fetchone()[0] == bytes(RESERVED_BYTES)
    finally:
        db.close()
