"""Results and progress (issue 49, items 1-3): XACK ... RESULT keeps a value with the done task,
XRESULT reads a task's state, result, progress, attempts and last failure (BLOCK: until it ends,
woken by the commit that ends it), XPROGRESS records progress of a task in flight and renews its
lease. Real servers, redis-py in RESP2 and RESP3; the kill -9 and the purges on servers of their own."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import threading

import pytest
import redis
from support_queue import blocked, claim, configure, pending
from support_http import http
from support_servers import ROOT, wait_until

ALL_BYTES = bytes(range(256)) * 3  # binary-safe: every byte value, NUL and CR LF included


def outcome(r, queue, task_id, *block) -> dict:
    """XRESULT as a dict keyed by text, in RESP2 (flat pairs) and RESP3 (a map) alike."""
    reply = r.execute_command("XRESULT", queue, task_id, *block)
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    return {key.decode(): value for key, value in pairs}


def ack_result(r, queue, task_id, value):
    return r.execute_command("XACK", queue, "g", task_id, "RESULT", value)


def xinfo_task(r, queue, state, task_id) -> dict:
    reply = r.execute_command("XINFO", "TASKS", queue, state)
    tasks = [t if isinstance(t, dict) else dict(zip(t[::2], t[1::2])) for t in reply]
    [task] = [t for t in tasks if t[b"id"] == task_id]
    return task


def test_a_result_is_kept_with_its_done_task_and_read_back_binary_safe(r, queue):
    first, second = r.xadd(queue, {"n": "1"}), r.xadd(queue, {"n": "2"})
    claim(r, queue, count=2)
    assert ack_result(r, queue, first, ALL_BYTES) == 1
    assert r.xack(queue, "g", second) == 1  # a plain XACK beside it: no result
    assert outcome(r, queue, first) == {"state": b"done", "result": ALL_BYTES, "progress": None, "attempts": 1,
                                        "failure-reason": None}
    assert outcome(r, queue, second)["result"] is None
    assert outcome(r, queue, second)["state"] == b"done"
    assert xinfo_task(r, queue, "done", first)[b"result-size"] == len(ALL_BYTES)
    assert xinfo_task(r, queue, "done", second)[b"result-size"] is None
    empty = r.xadd(queue, {"n": "3"})  # an empty result is a result (not nil)
    claim(r, queue)
    assert ack_result(r, queue, empty, b"") == 1
    assert outcome(r, queue, empty)["result"] == b""


def test_xack_result_on_a_task_not_in_flight_answers_0_and_keeps_nothing(r, queue):
    task_id = r.xadd(queue, {"n": "1"})
    assert ack_result(r, queue, task_id, "too early") == 0  # available: not acked, nothing kept
    assert outcome(r, queue, task_id) | {"attempts": 0} == {"state": b"available", "result": None, "progress": None,
                                                             "attempts": 0, "failure-reason": None}
    claim(r, queue)
    assert ack_result(r, queue, task_id, "first") == 1
    assert ack_result(r, queue, task_id, "second") == 0  # done already: the first result stays
    assert outcome(r, queue, task_id)["result"] == b"first"
    assert ack_result(r, queue, "1-1", "unknown") == 0  # as a plain XACK answers an unknown id
    assert ack_result(r, f"{queue}-none", "1-1", "x") == 0
    with pytest.raises(redis.ResponseError, match="XACK with RESULT takes one id and one value"):
        r.execute_command("XACK", queue, "g", task_id, "RESULT")
    with pytest.raises(redis.ResponseError, match="XACK with RESULT takes one id and one value"):
        r.execute_command("XACK", queue, "g", task_id, task_id, "RESULT", "v")


def test_a_result_over_max_task_size_is_refused_and_nothing_is_acked(ezra_factory, protocol):
    server = ezra_factory("--max-task-size", "1000")
    r = server.client(protocol)
    task_id = r.xadd("big", {"n": "1"})
    claim(r, "big")
    with pytest.raises(redis.ResponseError, match=r"RESULT too large: 1001 bytes, the limit is 1000 "
                                                  r"\(--max-task-size\); nothing was acked"):
        ack_result(r, "big", task_id, b"x" * 1001)
    assert outcome(r, "big", task_id)["state"] == b"in-flight"
    assert r.xpending("big", "g")["pending"] == 1
    assert ack_result(r, "big", task_id, b"x" * 1000) == 1  # the limit itself is allowed
    assert outcome(r, "big", task_id)["result"] == b"x" * 1000


def test_xresult_answers_each_state(r, queue):
    delayed = r.execute_command("XADD", queue, "DELAY", "3600", "*", "n", "delayed")
    assert outcome(r, queue, delayed)["state"] == b"delayed"
    task_id = r.xadd(queue, {"n": "1"})
    assert outcome(r, queue, task_id)["state"] == b"available"
    claim(r, queue)
    assert outcome(r, queue, task_id) | {} == {"state": b"in-flight", "result": None, "progress": None, "attempts": 1,
                                               "failure-reason": None}
    assert r.execute_command("XNACK", queue, "g", "FAIL", "IDS", 1, task_id, "REASON", "timeout upstream") == 1
    assert outcome(r, queue, task_id)["failure-reason"] == b"timeout upstream"
    claim(r, queue)
    assert r.execute_command("XNACK", queue, "g", "FATAL", "IDS", 1, task_id, "REASON", "poison") == 1
    assert outcome(r, queue, task_id) == {"state": b"dead", "result": None, "progress": None, "attempts": 2,
                                          "failure-reason": b"poison"}
    done = r.xadd(queue, {"n": "2"})
    claim(r, queue)
    r.xack(queue, "g", done)
    assert outcome(r, queue, done)["state"] == b"done"


def test_xresult_of_an_unknown_task_or_queue_is_an_error_that_says_so(r, queue):
    r.xadd(queue, {"n": "1"})
    with pytest.raises(redis.ResponseError, match=re.escape(f"no such task 1-1 in queue '{queue}'")):
        r.execute_command("XRESULT", queue, "1-1")
    with pytest.raises(redis.ResponseError, match=re.escape(f"no such queue '{queue}-none'")):
        r.execute_command("XRESULT", f"{queue}-none", "1-1")
    with pytest.raises(redis.ResponseError, match=re.escape(f"no such task 1-1 in queue '{queue}'")):
        r.execute_command("XRESULT", queue, "1-1", "BLOCK", "0")  # BLOCK never waits for a task that is not there
    with pytest.raises(redis.ResponseError, match="syntax error"):
        r.execute_command("XRESULT", queue, "1-1", "WAIT", "10")
    with pytest.raises(redis.ResponseError, match="Invalid stream ID"):
        r.execute_command("XRESULT", queue, "not-an-id")


class BlockedResult:
    """XRESULT ... BLOCK in a thread, on a connection of its own; `reply` once it returns."""

    def __init__(self, server, protocol, queue, task_id, block_ms):
        self.client = server.client(protocol)  # socket_timeout 30 s: longer than any wait here
        self.reply, self.error = None, None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._wait, args=(queue, task_id, block_ms), daemon=True)
        self.thread.start()

    def _wait(self, queue, task_id, block_ms):
        try:
            self.reply = outcome(self.client, queue, task_id, "BLOCK", block_ms)
        except Exception as exc:  # noqa: BLE001 - the test reads it
            self.error = exc
        self.done.set()


@pytest.mark.parametrize("block_ms", [0, 60_000])
def test_xresult_block_is_woken_by_the_commit_that_acks_the_task(shared_server, protocol, queue, block_ms):
    r = shared_server.client(protocol)
    task_id = r.xadd(queue, {"n": "1"})
    claim(r, queue)
    before = blocked(r)
    waiting = BlockedResult(shared_server, protocol, queue, task_id, block_ms)
    wait_until(lambda: blocked(r) >= before + 1, message="XRESULT BLOCK to wait")
    assert not waiting.done.is_set()  # the control: it waits while the task is in flight
    r.execute_command("XPROGRESS", queue, task_id, "half")  # no end: it goes on waiting
    assert ack_result(r, queue, task_id, b"42") == 1
    assert waiting.done.wait(30), "XRESULT BLOCK was not woken by the ack"
    assert waiting.error is None, waiting.error
    assert waiting.reply == {"state": b"done", "result": b"42", "progress": b"half", "attempts": 1,
                             "failure-reason": None}
    wait_until(lambda: blocked(r) == before, message="the blocked XRESULT to be gone")


def test_xresult_block_is_woken_when_the_task_dies(shared_server, protocol, queue):
    r = shared_server.client(protocol)
    task_id = r.xadd(queue, {"n": "1"})
    claim(r, queue)
    before = blocked(r)
    waiting = BlockedResult(shared_server, protocol, queue, task_id, 0)
    wait_until(lambda: blocked(r) >= before + 1, message="XRESULT BLOCK to wait")
    r.execute_command("XNACK", queue, "g", "FATAL", "IDS", 1, task_id, "REASON", "bad input")
    assert waiting.done.wait(30)
    assert waiting.reply["state"] == b"dead" and waiting.reply["failure-reason"] == b"bad input"


def test_xresult_shows_a_waiting_task_and_block_is_woken_when_its_dependency_dies(shared_server, protocol, queue):
    """A task pushed AFTER another is `waiting`; it dies with its dependency (not through a failure of
    its own), and an XRESULT BLOCK on it is woken by that commit, with the reason."""
    r = shared_server.client(protocol)
    first = r.xadd(queue + "-a", {"n": "1"})
    task_id = r.execute_command("XADD", queue, "AFTER", 1, queue + "-a", first, "*", "n", "2")
    assert outcome(r, queue, task_id) == {"state": b"waiting", "result": None, "progress": None, "attempts": 0,
                                          "failure-reason": None}
    r.xgroup_create(queue + "-a", "g", "0")
    reply = r.xreadgroup("g", "w", {queue + "-a": ">"}, count=1)
    entries = list(reply.values())[0][0] if isinstance(reply, dict) else reply[0][1]
    assert [entry[0] for entry in entries] == [first]
    before = blocked(r)
    waiting = BlockedResult(shared_server, protocol, queue, task_id, 0)
    wait_until(lambda: blocked(r) >= before + 1, message="XRESULT BLOCK to wait")
    assert not waiting.done.is_set()  # the control: it waits while its dependency runs
    r.execute_command("XNACK", queue + "-a", "g", "FATAL", "IDS", 1, first)
    assert waiting.done.wait(30), "XRESULT BLOCK was not woken when the task died with its dependency"
    assert waiting.reply["state"] == b"dead"
    assert waiting.reply["failure-reason"] == f"dependency {queue}-a {first.decode()} is dead".encode()


def test_xresult_block_answers_at_once_for_a_task_that_has_ended(r, queue):
    task_id = r.xadd(queue, {"n": "1"})
    claim(r, queue)
    ack_result(r, queue, task_id, "r")
    assert outcome(r, queue, task_id, "BLOCK", 0)["result"] == b"r"  # BLOCK 0 (for ever), answered at once


def test_xresult_block_timing_out_answers_the_current_state(r, queue):
    task_id = r.xadd(queue, {"n": "1"})
    assert outcome(r, queue, task_id, "BLOCK", 50)["state"] == b"available"
    claim(r, queue)
    r.execute_command("XPROGRESS", queue, task_id, "3/10")
    assert outcome(r, queue, task_id, "BLOCK", 50) == {"state": b"in-flight", "result": None, "progress": b"3/10",
                                                       "attempts": 1, "failure-reason": None}


def test_xresult_block_inside_multi_answers_at_once(r, queue):
    task_id = r.xadd(queue, {"n": "1"})
    pipe = r.pipeline(transaction=True)
    pipe.execute_command("XRESULT", queue, task_id, "BLOCK", 0)
    [reply] = pipe.execute()
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    assert dict(pairs)[b"state"] == b"available"


def test_xprogress_records_progress_and_renews_the_lease(r, queue):
    task_id = r.xadd(queue, {"n": "1"})
    claim(r, queue)
    deadline = xinfo_task(r, queue, "in_flight", task_id)[b"deadline"]
    idle = wait_until(lambda: pending(r, queue)[0]["time_since_delivered"] >= 200 and
                      pending(r, queue)[0]["time_since_delivered"], message="the task to be idle 200 ms")
    assert r.execute_command("XPROGRESS", queue, task_id, b"\x00 50%") in (b"OK", "OK")
    assert pending(r, queue)[0]["time_since_delivered"] < idle  # the heartbeat: idle from now again
    assert xinfo_task(r, queue, "in_flight", task_id)[b"deadline"] > deadline  # the lease runs from now
    assert pending(r, queue)[0]["times_delivered"] == 1  # a heartbeat is not a delivery
    assert outcome(r, queue, task_id)["progress"] == b"\x00 50%"
    assert xinfo_task(r, queue, "in_flight", task_id)[b"progress"] == b"\x00 50%"
    r.execute_command("XPROGRESS", queue, task_id, "60%")  # the last value is kept
    assert outcome(r, queue, task_id)["progress"] == b"60%"


def test_xprogress_on_a_task_not_in_flight_is_an_error(r, queue):
    task_id = r.xadd(queue, {"n": "1"})
    with pytest.raises(redis.ResponseError, match=f"task {task_id.decode()} is available, not in flight"):
        r.execute_command("XPROGRESS", queue, task_id, "1%")
    claim(r, queue)
    with pytest.raises(redis.ResponseError, match=r"progress too large: 8193 bytes, the limit is 8192"):
        r.execute_command("XPROGRESS", queue, task_id, b"p" * 8193)
    assert outcome(r, queue, task_id)["progress"] is None  # refused: nothing recorded
    r.execute_command("XPROGRESS", queue, task_id, b"p" * 8192)  # the control: 8 KB is allowed
    r.xack(queue, "g", task_id)
    with pytest.raises(redis.ResponseError, match=f"task {task_id.decode()} is done, not in flight"):
        r.execute_command("XPROGRESS", queue, task_id, "100%")
    with pytest.raises(redis.ResponseError, match=re.escape(f"no such task 1-1 in queue '{queue}'")):
        r.execute_command("XPROGRESS", queue, "1-1", "1%")
    with pytest.raises(redis.ResponseError, match=re.escape(f"no such queue '{queue}-none'")):
        r.execute_command("XPROGRESS", f"{queue}-none", "1-1", "1%")
    assert outcome(r, queue, task_id)["progress"] == b"p" * 8192  # kept with the done task


def test_progress_stays_across_a_redelivery(r, queue):
    task_id = r.xadd(queue, {"n": "1"})
    claim(r, queue)
    r.execute_command("XPROGRESS", queue, task_id, "step 2")
    r.execute_command("XNACK", queue, "g", "FAIL", "IDS", 1, task_id)
    assert outcome(r, queue, task_id) | {} == {"state": b"available", "result": None, "progress": b"step 2",
                                               "attempts": 1, "failure-reason": None}


def test_a_result_survives_kill_9_after_the_xack_reply(ezra_factory, protocol):
    server = ezra_factory()
    r = server.client(protocol)
    ids = [r.xadd("durable", {"n": str(i)}) for i in range(20)]
    claim(r, "durable", count=20)
    for i, task_id in enumerate(ids):
        assert ack_result(r, "durable", task_id, b"result-%d\x00" % i) == 1  # each answered: committed
    server.kill9()
    server.start()
    r = server.client(protocol)
    for i, task_id in enumerate(ids):
        assert outcome(r, "durable", task_id) | {"attempts": 1} == {
            "state": b"done", "result": b"result-%d\x00" % i, "progress": None, "attempts": 1, "failure-reason": None}


def test_progress_survives_kill_9_after_the_xprogress_reply(ezra_factory, protocol):
    server = ezra_factory()
    r = server.client(protocol)
    task_id = r.xadd("durable", {"n": "1"})
    claim(r, "durable")
    r.execute_command("XPROGRESS", "durable", task_id, "70%")
    server.kill9()
    server.start()
    r = server.client(protocol)
    # the restart gave the task back (never to dead); its progress is what was reported
    assert outcome(r, "durable", task_id) | {} == {"state": b"available", "result": None, "progress": b"70%",
                                                   "attempts": 1, "failure-reason": None}


def test_a_result_goes_with_its_task_under_retention_and_ttl(ezra_factory, protocol):
    server = ezra_factory()
    r = server.client(protocol)
    kept = r.xadd("kept", {"n": "1"})
    claim(r, "kept")
    ack_result(r, "kept", kept, "stays")
    configure(r, "gone", "RETENTION", "1")
    by_retention = r.xadd("gone", {"n": "1"})
    by_ttl = r.execute_command("XADD", "kept", "TTL", "1", "*", "n", "2")
    claim(r, "gone")
    claim(r, "kept")
    assert ack_result(r, "gone", by_retention, "r1") == 1 and ack_result(r, "kept", by_ttl, "r2") == 1
    assert outcome(r, "gone", by_retention)["result"] == b"r1"  # the control: kept until purged
    assert outcome(r, "kept", by_ttl)["result"] == b"r2"

    def purged(queue, task_id):
        try:
            outcome(r, queue, task_id)
        except redis.ResponseError as exc:
            return "no such task" in str(exc)
        return False

    wait_until(lambda: purged("gone", by_retention) and purged("kept", by_ttl), timeout=30,
               message="retention and TTL to purge the done tasks")
    assert outcome(r, "kept", kept)["result"] == b"stays"  # the queue's own retention: kept for ever
    db = sqlite3.connect(server.data_dir / "ezra.db")
    results = db.execute("SELECT result FROM tasks WHERE result IS NOT NULL").fetchall()
    db.close()
    assert results == [(b"stays",)]  # the purged results are gone with their rows


def test_under_retention_0_an_acked_result_goes_with_the_task(r, queue):
    configure(r, queue, "RETENTION", "0")
    task_id = r.xadd(queue, {"n": "1"})
    claim(r, queue)
    assert ack_result(r, queue, task_id, "dropped") == 1
    with pytest.raises(redis.ResponseError, match="no such task"):
        outcome(r, queue, task_id)


def test_progress_and_result_are_shown_by_ezra_ls_and_the_dashboards_task_page(ezra_factory):
    server = ezra_factory("--http-port", "0")
    r = server.client()
    working, finished, plain = r.xadd("shown", {"n": "1"}), r.xadd("shown", {"n": "2"}), r.xadd("shown", {"n": "3"})
    claim(r, "shown", count=3)
    r.execute_command("XPROGRESS", "shown", working, "step 3 of 7")
    ack_result(r, "shown", finished, b"<b>" + b"r" * 2997)  # 3000 bytes, HTML in it
    r.xack("shown", "g", plain)
    listing = subprocess.run([sys.executable, "-m", "ezra", "ls", "shown", "--port", str(server.port)], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0, listing.stderr
    assert "progress" in listing.stdout.splitlines()[0] and "step 3 of 7" in listing.stdout

    def page(task_id) -> bytes:
        status, _, body = http(f"{server.http_url}/task?queue=shown&id={task_id.decode()}")
        assert status == 200
        return body

    body = page(working)
    assert b'<span class="progress">step 3 of 7</span>' in body
    assert b'<tr data-fact="result"><th>result</th><td><span class="muted">none</span>' in body
    body = page(finished)
    assert b"&lt;b&gt;" + b"r" * 1997 + b"</pre>" in body  # the first 2000 bytes, escaped
    assert b"(first 2000 of 3000 bytes: XRESULT reads it whole)" in body
    assert b"<b>r" not in body
    assert b"none reported" in body  # no progress was reported for it
    body = page(plain)  # the control: a plain ack shows no result
    assert b'<tr data-fact="result"><th>result</th><td><span class="muted">none</span>' in body


def test_xresult_block_on_a_task_deleted_meanwhile_answers_that_it_is_gone(shared_server, protocol, queue):
    r = shared_server.client(protocol)
    task_id = r.xadd(queue, {"n": "1"})
    before = blocked(r)
    waiting = BlockedResult(shared_server, protocol, queue, task_id, 0)
    wait_until(lambda: blocked(r) >= before + 1, message="XRESULT BLOCK to wait")
    assert not waiting.done.is_set()  # the control: an available task is waited for
    assert r.xdel(queue, task_id) == 1  # cancelled: nobody held it
    assert waiting.done.wait(30), "XRESULT BLOCK was not woken by the deletion"
    assert isinstance(waiting.error, redis.ResponseError) and "no such task" in str(waiting.error)


def test_pipelined_xack_results_each_answer_their_own_and_keep_their_own(ezra_factory, protocol):
    server = ezra_factory("--max-task-size", "1000")
    r = server.client(protocol)
    ids = [r.xadd("piped", {"n": str(i)}) for i in range(6)]
    claim(r, "piped", count=5)  # ids[5] stays available
    pipe = r.pipeline(transaction=False)
    for i in range(3):
        pipe.execute_command("XACK", "piped", "g", ids[i], "RESULT", b"r%d" % i)
    pipe.execute_command("XACK", "piped", "g", ids[0], "RESULT", b"again")  # named twice: 0, the first stays
    pipe.execute_command("XACK", "piped", "g", ids[5], "RESULT", b"early")  # not in flight: 0, nothing kept
    pipe.execute_command("XACK", "piped", "g", ids[3], "RESULT", b"x" * 1001)  # too large: refused, ends the run
    pipe.execute_command("XACK", "piped", "g", ids[4], "RESULT", b"r4")
    pipe.execute_command("XACK", "piped", "g", ids[3], "RESULT", b"r3")
    replies = pipe.execute(raise_on_error=False)
    assert replies[:5] == [1, 1, 1, 0, 0]
    assert isinstance(replies[5], redis.ResponseError) and "RESULT too large" in str(replies[5])
    assert replies[6:] == [1, 1]
    assert [outcome(r, "piped", task_id)["result"] for task_id in ids] == [b"r0", b"r1", b"r2", b"r3", b"r4", None]
    assert outcome(r, "piped", ids[5])["state"] == b"available"
