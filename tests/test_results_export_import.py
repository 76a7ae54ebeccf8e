"""Results and progress across `ezra export` and `ezra import` (issue 49, item 1 and "Must hold"):
a round trip EZRA -> Redis -> EZRA keeps every done task's result and every task's progress, and
the tasks' names (XADD NAME), from the port and from the data directory alike; Redis workers are
not handed the done tasks."""

from __future__ import annotations

import pytest
import redis
from support_move import ezra_cli, ok, raw_client, unique

RESULT = b"\x00binary\r\nresult\xff"


def outcome(client, queue, task_id) -> dict:
    reply = client.execute_command("XRESULT", queue, task_id)
    return {key.decode(): value for key, value in zip(reply[::2], reply[1::2])}


def fill(client, queue) -> dict:
    """t1 done with a result, t2 in flight with progress, t3 done without a result, t4 dead with
    progress, t5 available: their ids. Each but t3 is named `name-<t>` (XADD NAME)."""
    ids = {name: client.execute_command("XADD", queue, *([] if name == "t3" else ["NAME", f"name-{name}"]), "*",
                                        "n", name) for name in ("t1", "t2", "t3", "t4", "t5")}
    client.xreadgroup("g", "w", {queue: ">"}, count=4)
    assert client.execute_command("XACK", queue, "g", ids["t1"], "RESULT", RESULT) == 1
    client.execute_command("XPROGRESS", queue, ids["t2"], "half")
    client.xack(queue, "g", ids["t3"])
    client.execute_command("XPROGRESS", queue, ids["t4"], "stuck at 3")
    client.execute_command("XNACK", queue, "g", "FATAL", "IDS", 1, ids["t4"], "REASON", "poison")
    return ids


def check_redis(red, queue, ids) -> None:
    assert red.hgetall(f"{queue}::ezra-results") == {ids["t1"]: RESULT}
    assert red.hgetall(f"{queue}::ezra-progress") == {ids["t2"]: b"half", ids["t4"]: b"stuck at 3"}
    assert red.xrange(f"{queue}::ezra-done") == [[ids["t1"], [b"n", b"t1"]]]
    assert [entry[0] for entry in red.xrange(queue)] == [ids["t2"], ids["t5"]]  # the done ones are not work
    assert [entry[0] for entry in red.xrange(f"{queue}::dead")] == [ids["t4"]]
    assert red.hgetall(f"{queue}::ezra-names") == {ids[t]: f"name-{t}".encode() for t in ("t1", "t2", "t4", "t5")}


def check_ezra(dst, queue, ids) -> None:
    assert outcome(dst, queue, ids["t1"]) == {"state": b"done", "result": RESULT, "progress": None, "attempts": 0,
                                              "failure-reason": None, "name": b"name-t1"}
    for t in ("t1", "t2", "t4", "t5"):  # each name found again, on its own task
        assert dst.execute_command("XADD", queue, "NAME", f"name-{t}", "*", "n", "again") == ids[t]
    assert outcome(dst, queue, ids["t2"])["progress"] == b"half"
    assert outcome(dst, queue, ids["t2"])["state"] == b"available"
    assert outcome(dst, queue, ids["t4"]) | {"attempts": 0} == {
        "state": b"dead", "result": None, "progress": b"stuck at 3", "attempts": 0, "failure-reason": b"poison",
        "name": b"name-t4"}
    assert outcome(dst, queue, ids["t5"])["progress"] is None  # the control: nothing made up
    claimed = dst.xreadgroup("g", "w2", {queue: ">"}, count=10)
    assert [task_id for task_id, _ in claimed[0][1]] == [ids["t2"], ids["t5"]]  # the done task is not handed out


def test_a_round_trip_through_redis_keeps_results_and_progress(ezra_factory, redis_server_port):
    source, target = ezra_factory(), ezra_factory()
    src, red = raw_client(source.port), raw_client(redis_server_port)
    queue = unique("outcomes")
    ids = fill(src, queue)
    redis_url = f"redis://127.0.0.1:{redis_server_port}"
    exported = ok(ezra_cli("export", "--port", str(source.port), "--to", redis_url, queue))
    assert f"{queue}: 1 done task(s) with a result and 2 progress value(s) kept in" in exported.stdout
    check_redis(red, queue, ids)
    again = ok(ezra_cli("export", "--port", str(source.port), "--to", redis_url, queue))  # a re-run adds nothing
    assert f"{queue}: 0 copied" in again.stdout and red.xlen(f"{queue}::ezra-done") == 1

    into = ok(ezra_cli("import", "--port", str(target.port), "--from", redis_url, queue))
    assert f"{queue}: 4 copied, 0 already there" in into.stdout, into.stdout
    assert "verified 4 of 4 in EZRA" in into.stdout
    assert f"{queue}: 1 done task(s) with a result and 2 progress value(s) from" in into.stdout
    rerun = ok(ezra_cli("import", "--port", str(target.port), "--from", redis_url, queue))
    assert f"{queue}: 0 copied, 4 already there" in rerun.stdout
    check_ezra(raw_client(target.port), queue, ids)


def test_export_from_the_data_dir_carries_them_too(ezra_factory, redis_server_port):
    source = ezra_factory()
    src = raw_client(source.port)
    queue = unique("fromfile")
    ids = fill(src, queue)
    assert source.stop() == 0
    red = raw_client(redis_server_port)
    redis_url = f"redis://127.0.0.1:{redis_server_port}"
    exported = ok(ezra_cli("export", "--data-dir", str(source.data_dir), "--to", redis_url, queue))
    assert f"{queue}: 1 done task(s) with a result and 2 progress value(s) kept in" in exported.stdout
    check_redis(red, queue, ids)


def test_xadd_result_and_progress_are_checked(ezra_factory):
    r = ezra_factory("--max-task-size", "100").client()
    with pytest.raises(redis.ResponseError, match="RESULT too large: 101 bytes"):
        r.execute_command("XADD", "q", "RESULT", b"x" * 101, "*", "n", "1")
    with pytest.raises(redis.ResponseError, match="DELAY, UNIQUE, AFTER and a ::dead queue do not apply"):
        r.execute_command("XADD", "q::dead", "RESULT", b"x", "*", "n", "1")
    with pytest.raises(redis.ResponseError, match="progress too large"):
        r.execute_command("XADD", "q", "PROGRESS", b"x" * 8193, "*", "n", "1")
    assert r.xlen("q") == 0 and r.exists("q") == 0  # refused: nothing stored
    task_id = r.execute_command("XADD", "q", "RESULT", b"x" * 100, "PROGRESS", "all", "*", "n", "1")
    assert outcome(r, "q", task_id) | {} == {"state": b"done", "result": b"x" * 100, "progress": b"all",
                                             "attempts": 0, "failure-reason": None}
    assert r.xlen("q") == 0  # done: not work
