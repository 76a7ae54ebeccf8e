"""Rows written by hand into ezra.db with the sqlite3 shell (docs/usage.md, "Writing tasks by hand").

While the server is stopped, a hand-written task of any id, anywhere in the table, is taken in at
the next start and put in its queue's id order; a second row with an id its queue has, and a row
whose fields cannot be read, are moved to the table unreadable_tasks, reported (the log, INFO's
unreadable_tasks, the dashboard) and never served. While it runs the file is read-only to people:
a row written then is survived (the next push takes the next free row id) and put in place by
the next start, however cleanly the server stopped.
"""

from __future__ import annotations

import random
import sqlite3
import subprocess
import sys

import pytest

from ezra.storage import open_database
from ezra.storage.row_ranges import span
from support import ROOT, http

HAND_INSERT = ("INSERT INTO tasks (queue, id_ms, id_seq, state, fields, created_at, available_at) "
               "VALUES (?, ?, ?, 'available', ?, 0, 0)")


def write_by_hand(server, rows) -> None:
    """(queue, id_ms, id_seq, fields) rows, inserted as a person would: no row id given."""
    db = sqlite3.connect(server.data_dir / "ezra.db", timeout=30)
    with db:
        db.executemany(HAND_INSERT, rows)
    db.close()


def claim_all(r, queue: str, worker: str = "w") -> list[bytes]:
    reply = r.xreadgroup("g", worker, {queue: ">"}, count=100)
    if not reply:
        return []
    entries = reply[queue.encode()][0] if isinstance(reply, dict) else reply[0][1]
    return [task_id for task_id, _ in entries]


def ten_tasks_then(server, protocol: int, rows: list[tuple]) -> list[bytes]:
    """Ten tasks of "jobs" pushed with ids 1000-0...1009-0 (and its group), then `rows` written by
    hand while the server is stopped; the server started again. The ten ids."""
    r = server.client(protocol)
    ids = [r.xadd("jobs", {"n": str(n)}, id=f"{1000 + n}-0") for n in range(10)]
    r.xgroup_create("jobs", "g", id="0")
    r.close()
    server.stop()
    write_by_hand(server, rows)
    server.start()
    return ids


def info_figure(r, name: str) -> int:
    return int(r.info().get(name, -1))


@pytest.mark.parametrize("protocol", [2, 3])
def test_a_task_written_by_hand_below_its_queues_ids_is_found_in_id_order(ezra_factory, protocol):
    server = ezra_factory()
    ids = ten_tasks_then(server, protocol, [("jobs", 500, 0, '["n", "hand"]')])
    r = server.client(protocol)
    assert [i for i, _ in r.xrange("jobs", "400", "600")] == [b"500-0"]
    assert [i for i, _ in r.xrange("jobs")] == [b"500-0", *ids]
    assert claim_all(r, "jobs", "w1")[:2] == [b"500-0", ids[0]]  # the oldest id first
    taken = r.xclaim("jobs", "g", "w2", 0, ["500-0"])
    assert [i for i, _ in taken] == [b"500-0"]
    assert r.xack("jobs", "g", "500-0") == 1
    r.close()
    assert "out of order" in server.log()


@pytest.mark.parametrize("protocol", [2, 3])
def test_a_second_row_with_an_id_its_queue_has_is_set_aside_not_served(ezra_factory, protocol):
    server = ezra_factory()
    ids = ten_tasks_then(server, protocol, [("jobs", 1005, 0, '["n", "copy"]')])
    r = server.client(protocol)
    listed = r.xrange("jobs")
    assert [i for i, _ in listed] == ids  # each id once: the copy is not listed
    assert dict(listed)[b"1005-0"] == {b"n": b"5"}  # the task first there stays
    claimed = claim_all(r, "jobs")
    assert claimed == ids
    assert r.xack("jobs", "g", *claimed) == 10
    assert r.xpending("jobs", "g")["pending"] == 0  # nothing left that cannot be acked
    assert info_figure(r, "unreadable_tasks") == 1
    r.close()
    log = server.log()
    assert "1005-0" in log and "duplicate" in log
    db = sqlite3.connect(server.data_dir / "ezra.db")
    kept = db.execute("SELECT queue, id_ms, id_seq, reason FROM unreadable_tasks").fetchall()
    db.close()
    assert [row[:3] for row in kept] == [("jobs", 1005, 0)] and "id" in kept[0][3]


@pytest.mark.parametrize("protocol,pushes", [(2, 1), (3, 1), (2, 40), (3, 40)],
                         ids=["resp2-one-push", "resp3-one-push", "resp2-a-run-of-pushes", "resp3-a-run-of-pushes"])
def test_a_row_written_while_the_server_runs_breaks_no_push_and_finds_its_queue_at_the_next_start(
        ezra_factory, protocol, pushes):
    server = ezra_factory()
    r = server.client(protocol)
    first = [r.xadd("first", {"n": str(n)}) for n in range(3)]
    last = [r.xadd("last", {"n": str(n)}) for n in range(3)]  # last's range of row ids is above first's
    write_by_hand(server, [("first", 1, 0, '["n", "hand"]')])  # SQLite gives it last's next row id
    pipe = r.pipeline(transaction=False)  # the pushes that meet the row: they take the next free row ids
    for n in range(pushes):
        pipe.xadd("last", {"n": f"after-{n}"})
    pushed = pipe.execute()
    assert all(isinstance(task_id, bytes) for task_id in pushed), pushed
    assert [i for i, _ in r.xrange("last")] == [*last, *pushed]
    r.close()
    assert server.stop() == 0  # a clean stop
    assert "written by another connection" in server.log()
    server.start()
    r = server.client(protocol)
    assert [i for i, _ in r.xrange("first")] == [b"1-0", *first]
    assert [i for i, _ in r.xrange("last")] == [*last, *pushed]
    r.xgroup_create("last", "g", id="0")
    assert claim_all(r, "last") == [*last, *pushed]
    assert r.xadd("last", {"n": "more"})
    r.close()
    assert "out of place" in server.log()


@pytest.mark.parametrize("protocol", [2, 3])
def test_rows_whose_fields_cannot_be_read_are_set_aside_and_reported(ezra_factory, protocol):
    server = ezra_factory("--http-port", "0")
    r = server.client(protocol)
    ids = [r.xadd("jobs", {"n": str(n)}) for n in range(4)]
    other = r.xadd("other", {"n": "fine"})
    r.xgroup_create("jobs", "g", id="0")
    r.close()
    server.stop()
    newest = int(ids[-1].split(b"-")[0])
    write_by_hand(server, [("jobs", newest + 1, 0, "not json"),
                           ("jobs", newest + 2, 0, sqlite3.Binary(b"*2\r\n$1\r\nn\r\nnot resp")),
                           ("jobs", newest + 3, 0, '["n", "hand"]')])
    server.start()
    r = server.client(protocol)
    listed = r.xrange("jobs")
    hand = f"{newest + 3}-0".encode()
    assert [i for i, _ in listed] == [*ids, hand]
    assert claim_all(r, "jobs") == [*ids, hand]
    assert r.ping() is True  # the replies were whole: the connection reads on
    assert [i for i, _ in r.xrange("other")] == [other]
    assert info_figure(r, "unreadable_tasks") == 2
    r.close()
    status, _, page = http(f"{server.http_url}/queue?name=jobs")
    assert status == 200
    status, _, home = http(f"{server.http_url}/")
    assert status == 200 and b"unreadable" in home
    result = subprocess.run([sys.executable, "-m", "ezra", "ls", "jobs", "--port", str(server.port)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    log = server.log()
    assert f"{newest + 1}-0" in log and f"{newest + 2}-0" in log and "unreadable_tasks" in log


@pytest.mark.parametrize("protocol", [2, 3])
def test_a_row_of_text_that_is_not_json_written_while_running_breaks_no_reply(ezra_factory, protocol):
    server = ezra_factory("--http-port", "0")
    r = server.client(protocol)
    ids = [r.xadd("jobs", {"n": str(n)}) for n in range(3)]
    db = sqlite3.connect(server.data_dir / "ezra.db", timeout=30)
    with db:  # an UPDATE of a task's fields: the row stays in place
        db.execute("UPDATE tasks SET fields = 'not json' WHERE queue = 'jobs' AND id_ms = ? AND id_seq = ?",
                   tuple(int(part) for part in ids[1].split(b"-")))
    db.close()
    assert [i for i, _ in r.xrange("jobs")] == [ids[0], ids[2]]  # the unreadable one left out
    r.xgroup_create("jobs", "g", id="0")
    assert claim_all(r, "jobs") == [ids[0], ids[2]]  # claimed and not sent: its lease runs out
    assert r.ping() is True
    assert info_figure(r, "unreadable_tasks") == 1
    status, _, _ = http(f"{server.http_url}/queue?name=jobs")
    assert status == 200
    r.close()
    result = subprocess.run([sys.executable, "-m", "ezra", "ls", "jobs", "--port", str(server.port)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "unreadable" in result.stdout, result.stderr
    assert "cannot be read" in server.log()


def test_the_start_finds_every_row_out_of_place_wherever_it_was_written(tmp_path):
    """Storage level, against a scan: rows written with and without row ids, in gaps left by deleted
    tasks, in other queues' ranges, below and between ids, as repeats; after the start's check
    each queue's range holds its tasks, once each, in id order, and nothing else is lost."""
    rng = random.Random(5)
    for trial in range(12):
        data = tmp_path / f"data{trial}"
        db = open_database(str(data))
        db.begin()
        for name in (b"a", b"b", b"c"):
            db.insert_queue(name, 1)
            db.insert_available(name, [(1000 + n, 0, b"*2\r\n$1\r\nn\r\n$1\r\nv\r\n") for n in range(30)], 1)
        db.commit()
        db.conn.execute("DELETE FROM tasks WHERE rowid % 7 = 3")  # gaps, as acked-and-deleted tasks leave
        db.close()
        conn = sqlite3.connect(data / "ezra.db")
        with conn:
            for _ in range(rng.randrange(1, 6)):
                queue, ms = rng.choice("abc"), rng.choice([rng.randrange(1, 2000), 1000 + rng.randrange(30)])
                rowid = rng.choice([None, (rng.randrange(1, 4) << 40) + rng.randrange(40)])
                if rowid is not None and conn.execute("SELECT 1 FROM tasks WHERE rowid = ?", (rowid,)).fetchone():
                    rowid = None
                conn.execute("INSERT INTO tasks (rowid, queue, id_ms, id_seq, state, fields, created_at, available_at) "
                             "VALUES (?, ?, ?, 0, 'available', '[\"n\", \"hand\"]', 0, 0)", (rowid, queue, ms))
        expected = {queue: sorted(set(conn.execute("SELECT id_ms, id_seq FROM tasks WHERE queue = ?", (queue,))))
                    for queue in "abc"}
        total = conn.execute("SELECT count(*) FROM tasks").fetchone()[0]
        conn.close()
        db = open_database(str(data))  # no counts left beside the file: the check runs
        try:
            for number, queue in enumerate("abc", 1):
                low, high = span(number)
                rows = db.conn.execute("SELECT queue, id_ms, id_seq FROM tasks WHERE rowid BETWEEN ? AND ? "
                                       "ORDER BY rowid", (low, high)).fetchall()
                assert {row[0] for row in rows} <= {queue}, trial
                assert [row[1:] for row in rows] == expected[queue], trial
            set_aside = db.conn.execute("SELECT count(*) FROM unreadable_tasks").fetchone()[0]
            assert db.conn.execute("SELECT count(*) FROM tasks").fetchone()[0] + set_aside == total
        finally:
            db.close()
