"""Pause and resume (issue 15) through the front door: `XCFGSET q PAUSED 1|0`.

A paused queue accepts pushes and hands out nothing: `>` reads answer as for an empty
queue, blocked readers stay blocked, take-overs take nothing (the owner's heartbeat still
renews its lease), leases still run out and delayed tasks still come due, without being
handed out. Resuming serves the blocked readers at once. redis-py in RESP2 and RESP3.

No sleeps: a reader "did not get the task" is checked right after the command that would
have served it returns, since a task is handed to a blocked reader in the same batch that
makes it available (push, expiry, coming due), and that batch commits before the reply.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time

import pytest
import redis
from support_http import basic, form_token, http, scrape, value
from support_queue import claim, configure, entries_of, pending, text
from support_resp import RespConnection
from support_servers import ROOT, wait_until
from ezra.storage import SCHEMA_VERSION  # 4 since schedules (test_schedules.py)


def pause(r, queue, paused=1):
    configure(r, queue, "PAUSED", str(paused))


def counts(r, queue) -> tuple:
    shown = r.xinfo_stream(queue)
    return shown["available"], shown["delayed"], shown["in-flight"], shown["dead"]


def blocked(r) -> int:
    return int(r.info("clients")["blocked_clients"])


class BlockedReader:
    """An XREADGROUP ... BLOCK in a thread; `reply` once it returns."""

    def __init__(self, server, protocol, streams: dict, worker="blocked", block=20_000):
        self.client = server.client(protocol)
        self.thread = threading.Thread(target=self._read, args=(streams, worker, block), daemon=True)
        self.done = threading.Event()
        self.reply = None

    def _read(self, streams, worker, block):
        self.reply = self.client.xreadgroup("g", worker, streams, count=10, block=block)
        self.done.set()

    def start(self, watcher) -> "BlockedReader":
        before = blocked(watcher)
        self.thread.start()
        wait_until(lambda: blocked(watcher) > before, message="the reader to block")
        return self

    def result(self, queue) -> list:
        assert self.done.wait(10), "the reader was not woken"
        self.client.close()
        return entries_of(self.reply, queue)


def raw_reply(port: int, protocol: int, *command: str) -> bytes:
    """The exact bytes the server answers to one command (after HELLO 3 for RESP3)."""
    conn = RespConnection(port)
    try:
        if protocol == 3:
            conn.call(["HELLO", "3"])
        return conn.call(list(command))
    finally:
        conn.close()


# ---------------------------------------------------------------- reads

def test_a_paused_queue_takes_pushes_and_reads_answer_as_for_an_empty_queue(r, queue, shared_server, protocol):
    empty = queue + "-empty"
    r.xgroup_create(empty, "g", mkstream=True)
    pause(r, queue)
    task_id = r.xadd(queue, {"job": "kept"})
    assert r.xlen(queue) == 1 and counts(r, queue) == (1, 0, 0, 0)
    assert [i for i, _ in r.xrange(queue)] == [task_id]  # looking is not claiming
    for options in ({}, {"noack": True}, {"claim_min_idle_time": 0}, {"block": 50}):
        assert r.xreadgroup("g", "w1", {queue: ">"}, **options) == \
            r.xreadgroup("g", "w1", {empty: ">"}, **options), options
    for extra in ([], ["BLOCK", "20"]):
        command = ["XREADGROUP", "GROUP", "g", "w1", *extra, "STREAMS"]
        assert raw_reply(shared_server.port, protocol, *command, queue, ">") == \
            raw_reply(shared_server.port, protocol, *command, empty, ">")
    assert counts(r, queue) == (1, 0, 0, 0) and pending(r, queue) == []

    pause(r, queue, 0)
    assert [i for i, _ in claim(r, queue)] == [task_id]
    assert r.xack(queue, "g", task_id) == 1


def test_a_blocked_reader_stays_blocked_until_the_queue_is_resumed(shared_server, protocol, queue):
    r = shared_server.client(protocol)
    pause(r, queue)
    reader = BlockedReader(shared_server, protocol, {queue: ">"}).start(r)
    pushed = [r.xadd(queue, {"n": n}) for n in range(2)]
    # Each push would have handed its task to the reader before its reply: it did not.
    assert counts(r, queue) == (2, 0, 0, 0)
    assert not reader.done.is_set() and blocked(r) >= 1

    pause(r, queue, 0)  # resuming hands the waiting tasks over in its own batch
    assert [i for i, _ in reader.result(queue)] == pushed
    assert [(p["message_id"], p["consumer"]) for p in pending(r, queue)] == [(i, b"blocked") for i in pushed]
    r.close()


def test_a_read_of_several_queues_skips_the_paused_one(shared_server, protocol, queue):
    r = shared_server.client(protocol)
    held, served = queue + "-held", queue + "-served"
    pause(r, held)
    r.xadd(held, {"n": "held"})
    served_id = r.xadd(served, {"n": "served"})
    reply = r.xreadgroup("g", "w1", {held: ">", served: ">"}, count=10)
    assert [i for i, _ in entries_of(reply, served)] == [served_id] and entries_of(reply, held) == []

    reader = BlockedReader(shared_server, protocol, {held: ">", served: ">"}).start(r)
    r.xadd(held, {"n": "held again"})
    assert not reader.done.is_set() and counts(r, held) == (2, 0, 0, 0)
    late_id = r.xadd(served, {"n": "late"})
    assert [i for i, _ in reader.result(served)] == [late_id] and entries_of(reader.reply, held) == []
    assert counts(r, held) == (2, 0, 0, 0)
    r.close()


# ---------------------------------------------------------------- what goes on while paused

def test_leases_run_out_while_paused_and_the_tasks_wait_for_the_resume(shared_server, protocol, queue):
    r = shared_server.client(protocol)
    configure(r, queue, "VISIBILITY-TIMEOUT", "1", "MAX-ATTEMPTS", "2")
    first, doomed = r.xadd(queue, {"n": "first"}), r.xadd(queue, {"n": "doomed"})
    assert [i for i, _ in claim(r, queue, "w1", count=2)] == [first, doomed]
    # Its last attempt: it dies when its lease runs out (the owner may renew while paused).
    pause(r, queue)
    assert r.xclaim(queue, "g", "w1", 0, [doomed], retrycount=2, justid=True) == [doomed]
    reader = BlockedReader(shared_server, protocol, {queue: ">"}).start(r)
    # The reaper's pass that expires a lease also serves blocked readers: here it does not.
    wait_until(lambda: counts(r, queue) == (1, 0, 0, 1), message="both leases to run out")
    assert not reader.done.is_set() and pending(r, queue) == []
    assert [i for i, _ in r.xrange(queue + "::dead")] == [doomed]

    pause(r, queue, 0)
    assert [i for i, _ in reader.result(queue)] == [first]
    assert pending(r, queue)[0]["times_delivered"] == 2
    r.close()


def test_acks_nacks_and_delayed_tasks_go_on_while_paused(shared_server, protocol, queue):
    r = shared_server.client(protocol)
    acked, nacked = r.xadd(queue, {"n": 1}), r.xadd(queue, {"n": 2})
    claim(r, queue, "w1", count=2)
    pause(r, queue)
    reader = BlockedReader(shared_server, protocol, {queue: ">"}).start(r)
    assert r.xack(queue, "g", acked) == 1
    assert r.execute_command("XNACK", queue, "g", nacked) == 1  # back to available, not handed out
    delayed = r.execute_command("XADD", queue, "DELAY", "0.2", "*", "n", "3")
    wait_until(lambda: counts(r, queue) == (2, 0, 0, 0), message="the delayed task to come due")
    assert not reader.done.is_set() and pending(r, queue) == []
    poison = r.xadd(queue, {"n": "poison"})  # docs/usage.md's recipe: straight to the dead queue
    assert r.execute_command("XNACK", queue, "g", "FATAL", "IDS", 1, poison, "FORCE") == 1
    assert counts(r, queue) == (2, 0, 0, 1) and not reader.done.is_set()

    pause(r, queue, 0)
    assert [i for i, _ in reader.result(queue)] == [nacked, delayed]
    r.close()


def test_takeovers_take_nothing_but_the_owner_heartbeat_renews(r, queue):
    held, waiting = r.xadd(queue, {"n": "held"}), r.xadd(queue, {"n": "waiting"})
    claim(r, queue, "w1", count=1)
    pause(r, queue)
    assert r.xclaim(queue, "g", "w2", 0, [held]) == []                    # take-over
    assert r.xclaim(queue, "g", "w2", 0, [waiting], force=True) == []    # FORCE of an available task
    assert r.xautoclaim(queue, "g", "w2", 0, "0-0")[:2] in ([b"0-0", []], ["0-0", []])
    assert claim(r, queue, "w2", claim_min_idle_time=0) == []            # XREADGROUP CLAIM
    assert [(p["consumer"], p["times_delivered"]) for p in pending(r, queue)] == [(b"w1", 1)]

    wait_until(lambda: pending(r, queue)[0]["time_since_delivered"] >= 100, message="idle 100 ms")
    sent = time.monotonic()
    assert r.xclaim(queue, "g", "w1", 0, [held], justid=True) == [held]  # the owner's heartbeat
    # Renewed: idle at most the time since the heartbeat was sent (not renewed: 100 ms more).
    assert pending(r, queue)[0]["time_since_delivered"] <= (time.monotonic() - sent) * 1000 + 1
    cursor, renewed, _ = r.xautoclaim(queue, "g", "w1", 0, "0-0")
    assert [i for i, _ in renewed] == [held]
    mine = r.xreadgroup("g", "w1", {queue: "0"})  # its own pending entries: still readable
    assert [i for i, _ in entries_of(mine, queue)] == [held]
    assert counts(r, queue) == (1, 0, 1, 0)

    pause(r, queue, 0)
    assert r.xclaim(queue, "g", "w2", 0, [held], justid=True) == [held]
    assert [i for i, _ in claim(r, queue, "w2")] == [waiting]


# ---------------------------------------------------------------- settings, shown and kept

@pytest.mark.parametrize("settings, message", [
    (("PAUSED", "2"), "PAUSED must be 1 \\(pause\\) or 0 \\(resume\\), got 2"),
    (("PAUSED", "yes"), "PAUSED must be 1 \\(pause\\) or 0 \\(resume\\), got yes"),
    (("PAUSED",), "syntax error"),
    (("PAUSED", "1", "MAX-ATTEMPTS", "0"), "MAX-ATTEMPTS must be between"),
])
def test_bad_paused_values_are_refused_and_change_nothing(r, queue, settings, message):
    r.xadd(queue, {"n": 1})
    with pytest.raises(redis.ResponseError, match=message):
        r.execute_command("XCFGSET", queue, *settings)
    assert text(r.xinfo_stream(queue)["paused"]) == "0"
    assert len(claim(r, queue)) == 1


def test_paused_shows_in_xinfo_info_and_ezra_stats_and_default_resumes(ezra_factory, protocol):
    # A server of its own: INFO lists the first 100 queues by name, and a shared server holds more
    server = ezra_factory()
    r, queue = server.client(protocol), "paused-one"
    r.xadd(queue, {"n": 1})
    assert text(r.xinfo_stream(queue)["paused"]) == "0"
    assert r.info("queues")[f"queue_{queue}"]["paused"] == 0
    pause(r, queue)
    assert text(r.xinfo_stream(queue)["paused"]) == "1"
    assert text(r.xinfo_stream(queue, full=True)["paused"]) == "1"
    assert r.info("queues")[f"queue_{queue}"]["paused"] == 1
    stats = subprocess.run([sys.executable, "-m", "ezra", "stats", "--port", str(server.port)],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert stats.returncode == 0, stats.stderr
    assert any(line.startswith(f"{queue} (paused) ") for line in stats.stdout.splitlines()), stats.stdout
    configure(r, queue, "PAUSED", "DEFAULT")  # no server-wide pause: DEFAULT is running
    assert text(r.xinfo_stream(queue)["paused"]) == "0"
    assert len(claim(r, queue)) == 1


def test_pause_survives_a_restart_and_config_lines_can_pause(ezra_factory, tmp_path, protocol):
    config = tmp_path / "ezra.conf"
    config.write_text("queue = [frozen PAUSED 1]\n")
    server = ezra_factory("--config", str(config))
    r = server.client(protocol)
    pause(r, "jobs")
    task_id = r.xadd("jobs", {"n": 1})
    r.xadd("frozen", {"n": 1})
    r.close()
    server.restart()
    r = server.client(protocol)
    for name in ("jobs", "frozen"):
        assert text(r.xinfo_stream(name)["paused"]) == "1"
        assert claim(r, name) == []
    pause(r, "jobs", 0)
    assert [i for i, _ in claim(r, "jobs")] == [task_id]
    r.close()


def test_a_schema_2_file_is_migrated_and_keeps_its_tasks(ezra_factory, tmp_path):
    server = ezra_factory()
    r = server.client()
    task_id = r.xadd("jobs", {"n": 1})
    configure(r, "jobs", "MAX-ATTEMPTS", "7")
    r.close()
    server.stop()
    with sqlite3.connect(server.data_dir / "ezra.db") as db:  # as EZRA's schema 2 left the file
        db.execute("ALTER TABLE queues DROP COLUMN paused")
        db.execute("PRAGMA user_version = 2")
    db.close()
    server.start()
    assert "migrated" in server.log() and f"from schema 2 to {SCHEMA_VERSION}" in server.log()
    r = server.client()
    assert text(r.xinfo_stream("jobs")["max-attempts"]) == "7"
    pause(r, "jobs")
    assert claim(r, "jobs") == []
    r.close()
    server.restart()
    r = server.client()
    assert text(r.xinfo_stream("jobs")["paused"]) == "1"
    pause(r, "jobs", 0)
    assert [i for i, _ in claim(r, "jobs")] == [task_id]
    r.close()
    with sqlite3.connect(server.data_dir / "ezra.db") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()


# ---------------------------------------------------------------- /metrics and the dashboard

@pytest.fixture
def web(ezra_factory):
    return ezra_factory("--http-port", "0", "--metrics-queues", "2")


def test_metrics_show_paused_queues_and_count_the_rest(web):
    client = web.client()
    for name, backlog in (("busy", 3), ("busier", 4), ("quiet-a", 1), ("quiet-b", 1)):
        for n in range(backlog):
            client.xadd(name, {"n": n})
    pause(client, "busy")
    pause(client, "quiet-a")
    samples = scrape(web)
    assert value(samples, "ezra_queue_paused", queue="busy") == 1
    assert value(samples, "ezra_queue_paused", queue="busier") == 0
    assert value(samples, "ezra_queue_paused", queue="") == 1  # the rest, beyond --metrics-queues 2
    assert {dict(labels)["queue"] for name, labels in samples if name == "ezra_queue_paused"} == \
        {"busy", "busier", ""}
    pause(client, "busy", 0)
    assert value(scrape(web), "ezra_queue_paused", queue="busy") == 0


def test_the_dashboard_pauses_and_resumes_with_a_guarded_form(web, protocol):
    client = web.client(protocol)
    task_id = client.xadd("mails", {"to": "a@example.com"})
    page = http(f"{web.http_url}/queue?name=mails")[2]
    assert b'action="/queue/pause?name=mails"' in page and b'class="pause"' in page
    url, token = f"{web.http_url}/queue/pause?name=mails", form_token(web, "mails")
    assert http(url, b"paused=1")[0] == 403                                   # no token
    assert http(url, f"csrf={'0' * 64}&paused=1".encode())[0] == 403          # a forged token
    assert http(url, f"csrf={token}&paused=1".encode(), {"Origin": "http://evil.example"})[0] == 403
    assert http(url, f"csrf={token}&paused=1".encode(), {"Sec-Fetch-Site": "cross-site"})[0] == 403
    assert http(url)[0] == 405                                                # GET changes nothing
    assert http(url, f"csrf={token}&paused=yes".encode())[0] == 400
    assert text(client.xinfo_stream("mails")["paused"]) == "0"
    assert http(f"{web.http_url}/queue/pause?name=nope", f"csrf={token}&paused=1".encode())[0] == 404
    assert client.exists("nope") == 0  # the dashboard creates no queue

    status, headers, _ = http(url, f"csrf={token}&paused=1".encode(), {"Origin": web.http_url})
    assert status == 303 and headers["Location"].startswith("/queue?name=mails&done=paused")
    assert text(client.xinfo_stream("mails")["paused"]) == "1"
    assert claim(client, "mails") == []
    page = http(f"{web.http_url}/queue?name=mails")[2]
    assert b'class="badge paused"' in page and b'class="resume"' in page and b'class="pause"' not in page
    index = http(web.http_url + "/")[2]
    assert b'<tr data-queue="mails"><td><a href="/queue?name=mails">mails</a> <span class="badge paused"' in index

    reader = BlockedReader(web, protocol, {"mails": ">"}).start(client)
    status, headers, _ = http(url, f"csrf={token}&paused=0".encode())
    assert status == 303 and headers["Location"].endswith("&done=resumed")
    assert [i for i, _ in reader.result("mails")] == [task_id]
    assert b'class="badge paused"' not in http(web.http_url + "/")[2]


def test_the_pause_button_needs_the_password(ezra_factory):
    server = ezra_factory("--http-port", "0", "--password", "s3cret")
    client = server.client(password="s3cret")
    client.xadd("mails", {"n": 1})
    url = f"{server.http_url}/queue/pause?name=mails"
    page = http(f"{server.http_url}/queue?name=mails", headers=basic("s3cret"))[2]
    token = page.split(b'name="csrf" value="')[1].split(b'"')[0].decode()
    assert http(url, f"csrf={token}&paused=1".encode())[0] == 401
    assert http(url, f"csrf={token}&paused=1".encode(), basic("wrong"))[0] == 401
    assert text(client.xinfo_stream("mails")["paused"]) == "0"
    assert http(url, f"csrf={token}&paused=1".encode(), basic("s3cret"))[0] == 303
    assert text(client.xinfo_stream("mails")["paused"]) == "1"
