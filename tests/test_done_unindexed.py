"""Done tasks in no index (schema 10): what replaced tasks_done keeps every count and purge right.

An ack used to write tasks_done (every done task by finish time): a B-tree write and a page per
commit on every ack, for retention's purge, the start-up count and the dashboard. Now:
- only a queue with a retention limit marks its done tasks (`retained`, in tasks_retained), and
  a limit set later marks those done before it (the reaper's walk), even across a restart;
- start-up takes each queue's done count from ezra.counts, left by a clean stop, if ezra.db is
  still that file; otherwise (a crash, a hand edit) it reads the rows;
- a rolled-back batch takes its done moves back out of the counts instead of reading the rows.

In process with a clock the test moves (the walk and purge), and on real servers (restarts).
"""

from __future__ import annotations

import json
import sqlite3

import pytest

from ezra.protocol import stream_ids
from ezra.broker import reaper
from ezra.lifecycle import AVAILABLE, DONE, IN_FLIGHT
from ezra.storage import SCHEMA_VERSION, reads
from ezra.protocol.task_fields import stored
from support_queue import submit_broken_request
from support_servers import wait_until
from support_broker import acked, claim_committed, push_one


@pytest.fixture
def broker(clocked_broker):
    return clocked_broker


def push(broker, n: int) -> list[tuple]:
    return [stream_ids.parse_id(push_one(broker, b"q", stored([b"n", str(i).encode()]))) for i in range(n)]


def claim_all(broker) -> None:
    claim_committed(broker, [b"q"], b"w", 1000, False)


def ack(broker, ids: list[tuple]) -> int:
    return acked(broker, b"q", ids)


def in_file(broker, sql: str):
    return broker.db.conn.execute(sql).fetchone()[0]


def retained_in_index(broker) -> int:
    return in_file(broker, "SELECT count(*) FROM tasks INDEXED BY tasks_retained WHERE retained IS NOT NULL")


def done_in_file(broker) -> int:
    return in_file(broker, "SELECT count(*) FROM tasks WHERE state = 'done'")


def set_retention(broker, seconds: float | None) -> None:
    broker.admin.configure(b"q", {"retention_seconds": -1.0 if seconds is None else seconds}).wait()


def reaper_passes_until(broker, condition, most: int = 100) -> None:
    for _ in range(most):
        if condition():
            return
        broker.reaper.maintain()
    assert condition(), "the reaper's passes never got there"


# ---------------------------------------------------------------- what an ack writes

def test_an_ack_of_a_queue_that_keeps_done_tasks_writes_no_index(broker):
    ids = push(broker, 3)
    claim_all(broker)
    assert ack(broker, ids) == 3
    indexes = {row[0] for row in broker.db.conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'tasks' AND sql IS NOT NULL")}
    assert "tasks_done" not in indexes  # every done task by finish time, written by every ack (schema 9)
    assert retained_in_index(broker) == 0 and done_in_file(broker) == 3
    assert broker.queues[b"q"].counts[DONE] == 3


def test_a_task_finished_under_a_retention_limit_goes_into_the_purges_index(broker):
    set_retention(broker, 3600)
    ids = push(broker, 2)
    claim_all(broker)
    ack(broker, ids)
    assert retained_in_index(broker) == 2
    push(broker, 1)
    assert claim_committed(broker, [b"q"], b"w", 10, True)  # NOACK: done at once, marked as an ack's
    assert retained_in_index(broker) == 3 == done_in_file(broker)


# ---------------------------------------------------------------- a limit set later

def test_a_limit_set_later_marks_and_purges_the_tasks_done_before_it(broker, monkeypatch):
    monkeypatch.setattr(reaper, "MARK_BATCH", 2)  # the walk takes several passes
    ids = push(broker, 7)
    claim_all(broker)
    ack(broker, ids[:5])  # kept for ever: unmarked
    assert broker.db.conn.execute("SELECT unmarked_done FROM queues").fetchone()[0] == 1
    set_retention(broker, 1)
    broker.clock_.now += 1500
    reaper_passes_until(broker, lambda: broker.queues[b"q"].counts[DONE] == 0)
    assert done_in_file(broker) == 0
    assert broker.queues[b"q"].counts[IN_FLIGHT] == 2  # the two still held are untouched
    assert broker.db.conn.execute("SELECT unmarked_done FROM queues").fetchone()[0] == 0  # walked to the end


def test_a_task_done_for_ever_behind_the_walk_starts_it_over(broker, monkeypatch):
    monkeypatch.setattr(reaper, "MARK_BATCH", 1)
    ids = push(broker, 4)
    claim_all(broker)
    ack(broker, ids[2:])
    set_retention(broker, 3600)
    broker.reaper.maintain()
    broker.reaper.maintain()  # the walk is past the first two tasks (in flight, nothing to mark)
    assert broker.queues[b"q"].mark_from > ids[0]
    set_retention(broker, None)
    ack(broker, ids[:1])  # done for ever, behind the walk
    set_retention(broker, 1)
    reaper_passes_until(broker, lambda: not broker.queues[b"q"].unmarked_done)
    broker.clock_.now += 3_600_000
    reaper_passes_until(broker, lambda: broker.queues[b"q"].counts[DONE] == 0)
    assert in_file(broker, "SELECT count(*) FROM tasks WHERE id_ms = %d AND id_seq = %d" % ids[0]) == 0


# ---------------------------------------------------------------- a rollback

def test_a_rolled_back_ack_leaves_the_done_count_as_the_file_has_it(broker):
    ids = push(broker, 5)
    claim_committed(broker, [b"q"], b"w", 3, False)
    ack(broker, ids[:1])  # committed: 1 done
    rolled_back = broker.tasks.ack(b"q", ids[1:3])  # runs now, commits at the turn's end...
    submit_broken_request(broker)  # ...but a broken request in the same turn rolls the batch back
    with pytest.raises(Exception, match="storage error"):
        rolled_back.wait()
    counts = broker.queues[b"q"].counts
    # The reload counts the rest from the file, the done ones from before the batch (no index):
    # its 2 done moves taken back, not kept (3 done would leave 0 of the 2 available)
    assert (counts[DONE], counts[IN_FLIGHT], counts[AVAILABLE]) == (1, 2, 2)
    assert done_in_file(broker) == 1
    assert ack(broker, ids[1:3]) == 2 and broker.queues[b"q"].counts[DONE] == 3


# ---------------------------------------------------------------- restarts, on real servers

def counts_of(r, queue: str = "q") -> dict:
    info = r.xinfo_stream(queue)
    return {state: int(info[state]) for state in ("available", "in-flight", "done", "dead")}


def three_done_two_held(server) -> None:
    r = server.client()
    ids = [r.xadd("q", {"n": str(n)}) for n in range(5)]
    r.xgroup_create("q", "g", id="0")
    r.xreadgroup("g", "w", {"q": ">"}, count=5)
    assert r.xack("q", "g", *ids[:3]) == 3
    r.close()


def test_a_clean_restart_takes_the_done_counts_left_beside_the_file(ezra_factory):
    server = ezra_factory()
    three_done_two_held(server)
    assert server.stop() == 0
    counts_file = server.data_dir / "ezra.counts"
    assert json.loads(counts_file.read_text())["queues"] == {b"q".hex(): [3, 2]}  # done, available (held: back)
    server.start()
    r = server.client()
    assert counts_of(r) == {"available": 2, "in-flight": 0, "done": 3, "dead": 0}  # the held went back
    assert not counts_file.exists()  # taken: a crash from here on reads the rows
    r.close()
    # The start believes the file, not the rows (the identity check is what guards it):
    assert server.stop() == 0
    record = json.loads(counts_file.read_text())
    record["queues"] = {b"q".hex(): [1, 4]}
    counts_file.write_text(json.dumps(record))
    server.start()
    r = server.client()
    assert counts_of(r) == {"available": 4, "in-flight": 0, "done": 1, "dead": 0}
    r.close()


def test_a_file_written_after_the_clean_stop_is_counted_row_by_row(ezra_factory):
    server = ezra_factory()
    three_done_two_held(server)
    assert server.stop() == 0
    with sqlite3.connect(server.data_dir / "ezra.db") as db:  # a hand edit while the server is down
        db.execute("UPDATE tasks SET state = 'done', finished_at = 1 WHERE state = 'available'")
    db.close()
    server.start()
    r = server.client()
    assert counts_of(r) == {"available": 0, "in-flight": 0, "done": 5, "dead": 0}
    r.close()
    assert "changed after the last clean stop: counting the tasks" in server.log()


def test_a_crash_leaves_no_counts_and_the_start_reads_the_rows(ezra_factory):
    server = ezra_factory()
    three_done_two_held(server)
    server.kill9()
    assert not (server.data_dir / "ezra.counts").exists()
    server.start()
    r = server.client()
    assert counts_of(r) == {"available": 2, "in-flight": 0, "done": 3, "dead": 0}
    r.close()


def test_a_limit_given_at_a_restart_purges_the_tasks_done_for_ever_before_it(ezra_factory, tmp_path):
    server = ezra_factory(data_dir=tmp_path / "data")
    three_done_two_held(server)
    assert server.stop() == 0
    server = ezra_factory("--retention", "0.001", data_dir=tmp_path / "data")
    r = server.client()
    wait_until(lambda: counts_of(r)["done"] == 0, timeout=30, message="the done tasks purged")
    assert counts_of(r)["available"] == 2
    r.close()


def test_the_done_listing_finds_the_tasks_done_last_below_a_backlog(broker, monkeypatch):
    monkeypatch.setattr(reads, "DONE_LOOK_BACK", 2)  # each walk looks at 2 tasks
    ids = push(broker, 6)
    claim_committed(broker, [b"q"], b"w", 3, False)
    ack(broker, ids[:3])
    listed = [row[:2] for row in broker.admin.tasks(b"q", DONE, 10).wait()]
    # the newest 2 are available (the backlog): the walk goes on below the oldest available task
    assert listed == [ids[2], ids[1]]


def test_done_tasks_are_listed_newest_id_first(ezra_factory):
    server = ezra_factory()
    r = server.client()
    ids = [r.xadd("q", {"n": str(n)}) for n in range(4)]
    r.xgroup_create("q", "g", id="0")
    r.xreadgroup("g", "w", {"q": ">"}, count=4)
    for task_id in (ids[1], ids[3], ids[0]):  # finished in another order than pushed
        r.xack("q", "g", task_id)
    listed = r.execute_command("XINFO", "TASKS", "q", "done")
    listed_ids = [dict(zip(entry[::2], entry[1::2]))[b"id"] if isinstance(entry, list) else entry[b"id"]
                  for entry in listed]
    assert listed_ids == [ids[3], ids[1], ids[0]]
    r.close()


def test_a_schema_9_file_loses_tasks_done_and_keeps_its_counts(ezra_factory, tmp_path):
    server = ezra_factory(data_dir=tmp_path / "data")
    three_done_two_held(server)
    assert server.stop() == 0
    (server.data_dir / "ezra.counts").unlink()
    with sqlite3.connect(server.data_dir / "ezra.db") as db:  # back to schema 9's shape
        db.execute("DROP INDEX tasks_retained")
        db.execute("ALTER TABLE tasks DROP COLUMN retained")
        db.execute("ALTER TABLE queues DROP COLUMN unmarked_done")
        db.execute("CREATE INDEX tasks_done ON tasks (queue, finished_at) WHERE state = 'done'")
        db.execute("PRAGMA user_version = 9")
    db.close()
    server = ezra_factory("--retention", "0.001", data_dir=tmp_path / "data")
    assert f"from schema 9 to {SCHEMA_VERSION}" in server.log()
    r = server.client()
    wait_until(lambda: counts_of(r)["done"] == 0, timeout=30, message="the done tasks marked and purged")
    assert counts_of(r)["available"] == 2
    r.close()
    assert server.stop() == 0
    with sqlite3.connect(server.data_dir / "ezra.db") as db:
        names = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    db.close()
    assert "tasks_done" not in names and "tasks_retained" in names
