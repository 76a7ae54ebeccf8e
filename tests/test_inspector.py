"""`ezra stats`, `ezra ls`, `ezra requeue` (run as a user would, against a real server),
and the XINFO TASKS command they read, in RESP2 and RESP3."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import redis

from support_servers import ROOT


def ezra(server, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ezra", *args, "--port", str(server.port)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env=env)


def lines_of(output: str) -> list[list[str]]:
    return [line.split() for line in output.strip().splitlines()]


def make_dead(client, queue: str, fields: dict) -> str:
    task_id = client.xadd(queue, fields).decode()
    client.xreadgroup("g", "w", {queue: ">"}, count=1)
    client.execute_command("XNACK", queue, "g", "FATAL", "IDS", 1, task_id)
    return task_id


@pytest.fixture
def server(ezra_factory):
    return ezra_factory()


def test_stats_shows_every_queue(server):
    client = server.client()
    make_dead(client, "emails", {"to": "a"})
    for n in range(3):
        client.xadd("emails", {"n": str(n)})
    client.xreadgroup("g", "w", {"emails": ">"}, count=1)
    client.xadd("pdfs", {"n": "1"})
    result = ezra(server, "stats")
    assert result.returncode == 0, result.stderr
    rows = {row[0]: row[1:] for row in lines_of(result.stdout)[2:]}
    #                 available delayed in-flight done dead pushed acked failed timed-out
    assert rows["emails"] == ["2", "0", "1", "0", "1", "4", "0", "1", "0"]
    assert rows["pdfs"] == ["1", "0", "0", "0", "0", "1", "0", "0", "0"]
    assert "pushed" in result.stdout.splitlines()[2]


def test_stats_watch_shows_rates_until_stopped(server):
    server.client().xadd("watched", {"n": "1"})
    proc = subprocess.Popen([sys.executable, "-m", "ezra", "stats", "--watch", "0.2", "--port", str(server.port)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        screens = 0
        for line in proc.stdout:
            if line.startswith("queue"):
                assert "pushes/s" in line and "acks/s" in line
            screens += line.startswith("EZRA")
            if screens == 3:
                break
    finally:
        proc.terminate()
        proc.wait(10)
    assert screens == 3


def test_ls_lists_tasks_by_state_with_control_characters_escaped(server):
    client = server.client()
    dead_id = make_dead(client, "jobs", {"payload": "\x1b[31mred\nline"})
    held = client.xadd("jobs", {"n": "held"}).decode()
    client.xreadgroup("g", "worker-7", {"jobs": ">"}, count=1)
    waiting = client.xadd("jobs", {"n": "waiting"}).decode()

    result = ezra(server, "ls", "jobs")
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and "\\x1b[31mred\\nline" in result.stdout
    rows = {row[0]: row for row in lines_of(result.stdout)[1:]}
    assert rows[held][1:4] == ["in_flight", "1", "worker-7"]
    assert rows[waiting][1:3] == ["available", "0"]
    assert rows[dead_id][1:3] == ["dead", "1"]

    only_dead = ezra(server, "ls", "jobs", "--state", "dead")
    assert [row[0] for row in lines_of(only_dead.stdout)[1:]] == [dead_id]
    assert "no done tasks in jobs" in ezra(server, "ls", "jobs", "--state", "done").stdout
    missing = ezra(server, "ls", "nope")
    assert missing.returncode == 1 and "no queue named 'nope'" in missing.stderr


def test_ls_says_when_there_are_more(server):
    client = server.client()
    for n in range(5):
        client.xadd("many", {"n": str(n)})
    result = ezra(server, "ls", "many", "--count", "2")
    assert [row[1] for row in lines_of(result.stdout)[1:] if row and row[0][0].isdigit()] == ["available"] * 2
    assert "first 2 available; --count shows more" in result.stdout


def test_requeue_all_or_some(server):
    client = server.client()
    ids = [make_dead(client, "redo", {"n": str(n)}) for n in range(3)]
    result = ezra(server, "requeue", "redo", "--id", ids[0])
    assert (result.returncode, result.stdout.strip()) == (0, "requeued 1 dead task of redo")
    assert client.xlen("redo::dead") == 2
    result = ezra(server, "requeue", "redo", "--all")
    assert result.stdout.strip() == "requeued 2 dead tasks of redo"
    assert client.xlen("redo::dead") == 0
    assert ezra(server, "requeue", "redo").returncode == 2  # --all or --id is required


def test_password_from_the_environment_and_clear_errors(ezra_factory):
    server = ezra_factory("--password", "s3cret")
    refused = ezra(server, "stats")
    assert refused.returncode == 1 and "NOAUTH" in refused.stderr and "Traceback" not in refused.stderr
    allowed = ezra(server, "stats", env=dict(os.environ, EZRA_PASSWORD="s3cret"))
    assert allowed.returncode == 0, allowed.stderr
    server.stop()
    gone = ezra(server, "stats")
    assert gone.returncode == 1 and "cannot reach" in gone.stderr


def test_xinfo_tasks(shared_server, protocol, queue):
    r = shared_server.client(protocol)
    first, second, third = (r.xadd(queue, {"n": str(n)}).decode() for n in range(3))
    r.xreadgroup("g", "w1", {queue: ">"}, count=1)
    tasks = r.execute_command("XINFO", "TASKS", queue, "available")
    if protocol == 2:
        tasks = [dict(zip(flat[::2], flat[1::2])) for flat in tasks]
    assert [t[b"id"].decode() for t in tasks] == [second, third]
    assert tasks[0][b"state"] == b"available" and tasks[0][b"attempts"] == 0 and tasks[0][b"worker"] is None
    assert tasks[0][b"fields"] == [b"n", b"1"]
    [held] = r.execute_command("XINFO", "TASKS", queue, "IN-FLIGHT")
    held = held if protocol == 3 else dict(zip(held[::2], held[1::2]))
    assert (held[b"id"].decode(), held[b"worker"], held[b"attempts"]) == (first, b"w1", 1)
    assert held[b"deadline"] > held[b"delivered-at"] >= held[b"created-at"]
    paged = r.execute_command("XINFO", "TASKS", queue, "available", "COUNT", 1, "AFTER", second)
    assert len(paged) == 1
    assert r.execute_command("XINFO", "TASKS", queue, "dead") == []
    for bad, message in ((["XINFO", "TASKS", queue, "sleeping"], "state must be one of"),
                         (["XINFO", "TASKS", queue, "dead", "COUNT", 0], "COUNT must be"),
                         (["XINFO", "TASKS", queue, "dead", "COUNT"], "syntax error"),
                         (["XINFO", "TASKS", queue], "wrong number of arguments"),
                         (["XINFO", "TASKS", f"{queue}-missing", "dead"], "no such key")):
        with pytest.raises(redis.ResponseError, match=message):
            r.execute_command(*bad)
