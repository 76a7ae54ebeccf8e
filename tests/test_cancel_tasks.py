"""Cancelling a task nobody holds (issue 45 items 6 and 13): XDEL of an available or delayed task
deletes it for good, as Redis's XDEL removes an entry, and frees its UNIQUE key; XDEL of a task
in flight stays EZRA's failure report. Through the real server, redis-py in RESP2 and RESP3, and
the dashboard's delete button."""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest

from support_http import form_token, http

TEN_YEARS = 315360000  # seconds


def push(client, queue, *options, fields=("n", "1")) -> bytes:
    return client.execute_command("XADD", queue, *options, "*", *fields)


def unfinished(client, queue) -> list[bytes]:
    reply = client.execute_command("XINFO", "TASKS", queue, "unfinished", "COUNT", 1000)
    rows = [t if isinstance(t, dict) else dict(zip(t[::2], t[1::2])) for t in reply]
    return [row[b"id"] for row in rows]


def claim(client, queue, worker="w", count=10) -> list[bytes]:
    reply = client.xreadgroup("g", worker, {queue: ">"}, count=count)
    if not reply:
        return []
    entries = reply[queue.encode()][0] if isinstance(reply, dict) else reply[0][1]
    return [task_id for task_id, _ in entries]


def test_xdel_deletes_a_delayed_task_and_frees_its_unique_key(r, queue):
    held = push(r, queue, "DELAY", TEN_YEARS, "UNIQUE", "report-7")
    assert push(r, queue, "UNIQUE", "report-7") == held  # positive control: the key is held
    assert r.xdel(queue, held) == 1
    assert r.xlen(queue) == 0 and unfinished(r, queue) == []
    fresh = push(r, queue, "UNIQUE", "report-7")
    assert fresh != held and unfinished(r, queue) == [fresh]
    assert claim(r, queue) == [fresh]
    assert r.xdel(queue, held) == 0  # gone: a second XDEL finds nothing


def test_xdel_deletes_an_available_task_never_delivered(r, queue):
    first, second, third = (push(r, queue, fields=("n", str(i))) for i in range(3))
    assert r.xdel(queue, second) == 1
    assert r.xlen(queue) == 2
    assert [entry[0] for entry in r.xrange(queue)] == [first, third]
    assert claim(r, queue) == [first, third]  # the others still run, in order
    assert r.xack(queue, "g", first, third) == 2


def test_xdel_of_the_newest_task_then_a_push_keeps_ids_and_order(r, queue):
    first = push(r, queue)
    newest = push(r, queue)
    assert r.xdel(queue, newest) == 1
    later = push(r, queue)
    assert later > newest  # ids never repeat, though its row went
    assert claim(r, queue) == [first, later]
    assert claim(r, queue) == []  # nothing stale is handed out twice
    assert r.xack(queue, "g", first, later) == 2


def test_xdel_of_a_task_given_back_for_a_retry_deletes_it(r, queue):
    task = push(r, queue)
    assert claim(r, queue) == [task]
    assert r.execute_command("XNACK", queue, "g", "FAIL", "IDS", 1, task) == 1  # available again, 1 attempt
    assert r.xdel(queue, task) == 1
    assert r.xlen(queue) == 0 and claim(r, queue) == []
    assert r.xlen(f"{queue}::dead") == 0  # deleted, not dead


def test_xdel_in_flight_is_still_a_failure_report_beside_deletes(r, queue):
    held, waiting = push(r, queue), push(r, queue)
    delayed = push(r, queue, "DELAY", 3600)
    assert claim(r, queue, count=1) == [held]
    assert r.xdel(queue, held, waiting, delayed, "9-9") == 3
    # the in-flight one was failed (kept for a retry), the other two deleted, 9-9 was never there
    assert unfinished(r, queue) == [held]
    assert claim(r, queue, worker="w2") == [held]
    assert r.xack(queue, "g", held) == 1


def test_a_paused_queue_task_can_be_deleted(r, queue):
    task = push(r, queue, "UNIQUE", "k")
    assert r.execute_command("XCFGSET", queue, "PAUSED", 1) == b"OK"
    assert r.xdel(queue, task) == 1
    assert unfinished(r, queue) == []
    again = push(r, queue, "UNIQUE", "k")
    assert again != task
    assert r.execute_command("XCFGSET", queue, "PAUSED", 0) == b"OK"
    assert claim(r, queue) == [again]


def test_xdel_of_a_done_task_keeps_its_record(r, queue):
    task = push(r, queue)
    assert claim(r, queue) == [task]
    assert r.xack(queue, "g", task) == 1
    assert r.xdel(queue, task) == 0  # done: nothing to cancel; trimming, retention or XACKDEL remove it
    assert [entry[0] for entry in r.xrange(queue)] == [task]


def test_xnack_force_reaches_a_delayed_task(r, queue):
    """The other documented ways to a task nobody holds: XNACK ... FORCE runs a delayed task now
    (SILENT) or sends it to the dead queue (FATAL), freeing its key; without FORCE, 0."""
    later = push(r, queue, "DELAY", TEN_YEARS, "UNIQUE", "later")
    doomed = push(r, queue, "DELAY", TEN_YEARS, "UNIQUE", "doomed")
    assert r.execute_command("XNACK", queue, "g", "FATAL", "IDS", 1, doomed) == 0  # nobody holds it
    assert r.execute_command("XACK", queue, "g", later) == 0
    assert claim(r, queue) == []  # positive control: both still wait for their time
    assert r.execute_command("XNACK", queue, "g", "SILENT", "IDS", 1, later, "FORCE") == 1
    assert claim(r, queue) == [later]  # due now
    assert r.execute_command("XNACK", queue, "g", "FATAL", "IDS", 1, doomed, "FORCE") == 1
    assert [entry[0] for entry in r.xrange(f"{queue}::dead")] == [doomed]
    assert push(r, queue, "UNIQUE", "doomed") != doomed  # a dead task holds no key


def test_the_deletes_survive_a_restart(ezra_factory, tmp_path):
    server = ezra_factory(data_dir=tmp_path / "data")
    client = server.client()
    kept = push(client, "jobs")
    gone = push(client, "jobs", "DELAY", TEN_YEARS, "UNIQUE", "k")
    assert client.xdel("jobs", gone) == 1
    client.close()
    assert server.stop() == 0
    server = ezra_factory(data_dir=tmp_path / "data")
    client = server.client()
    assert unfinished(client, "jobs") == [kept] and client.xlen("jobs") == 1
    assert push(client, "jobs", "UNIQUE", "k") != gone
    assert client.xadd("jobs", {"n": "x"}) > gone


@pytest.fixture
def web(ezra_factory):
    return ezra_factory("--http-port", "0", "--visibility-timeout", "60")


def test_the_dashboard_deletes_a_delayed_or_available_task(web):
    client = web.client()
    delayed = push(client, "jobs", "DELAY", TEN_YEARS, "UNIQUE", "report-7").decode()
    available = push(client, "jobs").decode()
    held = push(client, "jobs").decode()
    page = http(f"{web.http_url}/queue?name=jobs")[2].decode()
    for task in (delayed, available):  # each waiting row has its delete button
        assert re.search(rf'name="id" value="{task}"><button type="submit" class="delete"', page), task
    token = form_token(web, "jobs")
    for task in (delayed, available):
        status, headers, _ = http(f"{web.http_url}/queue/delete?name=jobs", f"csrf={token}&id={task}".encode())
        assert status == 303, headers
    assert claim(client, "jobs") == [held.encode()]
    # an in-flight task is not deleted by the dashboard: its worker holds it
    status, headers, _ = http(f"{web.http_url}/queue/delete?name=jobs", f"csrf={token}&id={held}".encode())
    assert status == 303
    status, _, body = http(web.http_url + headers["Location"])
    assert status == 200 and b"deleted 0 tasks" in body
    assert unfinished(client, "jobs") == [held.encode()]
    assert push(client, "jobs", "UNIQUE", "report-7").decode() != delayed  # the key is free
    status, _, body = http(f"{web.http_url}/task?queue=jobs&id={quote(held)}")
    assert b'class="delete"' not in body  # no delete button for a task in flight
