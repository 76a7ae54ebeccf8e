"""Issue 4 through the front door: settings, leases, delays, backoff, redrive, release on
disconnect, idempotent producers, XACKDEL, XINFO, retention and hot backup.

redis-py in RESP2 and RESP3 against the real server. Timeouts are short and set per
queue with XCFGSET; tests poll with deadlines (wait_until), never sleep to synchronise.
Where a test proves that something does *not* happen too early, it looks at once and
then polls until it does happen, measuring the time in between.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
import redis
from support_queue import OK_REPLIES, claim, configure, entries_of, pending, text
from support_servers import ROOT, wait_until

# ---------------------------------------------------------------- helpers

def info(r, queue) -> dict:
    return r.xinfo_stream(queue)


# ---------------------------------------------------------------- 1. per-queue settings

def test_xcfgset_settings_show_in_xinfo_stream(r, queue):
    configure(r, queue, "VISIBILITY-TIMEOUT", "2.5", "MAX-ATTEMPTS", "7", "RETENTION", "60",
              "BACKOFF", "EXPONENTIAL", "1", "30", "RELEASE-ON-DISCONNECT", "3",
              "IDMP-DURATION", "50", "IDMP-MAXSIZE", "20")
    shown = info(r, queue)
    assert [text(shown[k]) for k in ("visibility-timeout", "max-attempts", "retention", "backoff",
                                     "release-on-disconnect")] == ["2.5", "7", "60", "exponential 1 30", "3"]
    assert (shown["idmp-duration"], shown["idmp-maxsize"]) == (50, 20)
    configure(r, queue, "RETENTION", "FOREVER", "BACKOFF", "FIXED", "0.5", "RELEASE-ON-DISCONNECT", "OFF",
              "MAX-ATTEMPTS", "DEFAULT")
    shown = info(r, queue)
    assert [text(shown[k]) for k in ("retention", "backoff", "release-on-disconnect", "max-attempts")] == \
        ["forever", "fixed 0.5", "off", "3"]  # DEFAULT: the server's --max-attempts 3


@pytest.mark.parametrize("settings, message", [
    ((), "At least one setting"),
    (("VISIBILITY-TIMEOUT",), "syntax error"),
    (("NOPE", "1"), "syntax error"),
    (("VISIBILITY-TIMEOUT", "0"), "seconds must be above 0"),
    (("VISIBILITY-TIMEOUT", "abc"), "not a valid number"),
    (("VISIBILITY-TIMEOUT", "1e-300"), r"VISIBILITY-TIMEOUT must be at least 0.001 seconds \(1 ms\)"),
    (("VISIBILITY-TIMEOUT", "0.0009"), r"at least 0.001 seconds \(1 ms\), got 0.0009"),
    (("VISIBILITY-TIMEOUT", "nan"), "seconds must be above 0 and at most"),
    (("VISIBILITY-TIMEOUT", "inf"), "seconds must be above 0 and at most"),
    (("MAX-ATTEMPTS", "0"), "MAX-ATTEMPTS must be between 1 and 2147483647, got 0"),
    (("MAX-ATTEMPTS", "99999999999"), "MAX-ATTEMPTS must be between 1 and 2147483647, got 99999999999"),
    (("MAX-ATTEMPTS", "x"), "not an integer"),
    (("BACKOFF", "LINEAR", "1"), "BACKOFF takes FIXED"),
    (("BACKOFF", "EXPONENTIAL", "5", "1"), "base <= max"),
    (("IDMP-DURATION", "0"), "IDMP-DURATION must be between 1 and 86400 seconds"),
    (("IDMP-MAXSIZE", "10001"), "IDMP-MAXSIZE must be between 1 and 10000 entries"),
])
def test_xcfgset_refuses_bad_settings(r, queue, settings, message):
    with pytest.raises(redis.ResponseError, match=message):
        r.execute_command("XCFGSET", queue, *settings)


def test_settings_survive_a_restart(ezra_factory):
    server = ezra_factory()
    r = server.client()
    configure(r, "jobs", "VISIBILITY-TIMEOUT", "0.3", "MAX-ATTEMPTS", "9", "BACKOFF", "FIXED", "0.2")
    r.close()
    server.restart()
    r = server.client(3)
    shown = info(r, "jobs")
    assert [text(shown[k]) for k in ("visibility-timeout", "max-attempts", "backoff")] == ["0.3", "9", "fixed 0.2"]
    # ... and they apply: a lease of 0.3 s runs out, the task comes back after its 0.2 s backoff.
    task_id = r.xadd("jobs", {"n": 1})
    assert [i for i, _ in claim(r, "jobs")] == [task_id]
    assert wait_until(lambda: claim(r, "jobs", "w2"), timeout=10, message="redelivery")[0][0] == task_id
    r.close()


def test_config_file_queue_lines_are_applied_at_start(ezra_factory, tmp_path):
    config = tmp_path / "ezra.conf"
    config.write_text("queue = [emails VISIBILITY-TIMEOUT 12 MAX-ATTEMPTS 4, reports RETENTION 0]\n")
    server = ezra_factory("--config", str(config))
    r = server.client()
    assert [text(info(r, "emails")[k]) for k in ("visibility-timeout", "max-attempts")] == ["12", "4"]
    assert text(info(r, "reports")["retention"]) == "0"
    r.close()


# ---------------------------------------------------------------- 2. leases

def test_heartbeat_keeps_a_task_past_its_original_deadline(r, queue):
    # A 2 s lease, heartbeats every 0.1 s: only a 2 s stall of this client between two of them
    # could let it expire (a 0.6 s lease did, once, on a loaded machine).
    configure(r, queue, "VISIBILITY-TIMEOUT", "2")
    task_id = r.xadd(queue, {"job": "long"})
    assert [i for i, _ in claim(r, queue)] == [task_id]
    original_deadline = time.monotonic() + 2
    while time.monotonic() < original_deadline + 1.0:  # a task that runs 1.5 leases long
        assert r.xclaim(queue, "g", "w1", 0, [task_id], justid=True) == [task_id]  # heartbeat
        assert claim(r, queue, "w2") == []  # nobody else gets it meanwhile
        time.sleep(0.1)  # the worker's work between heartbeats
    [held] = pending(r, queue)
    assert (held["consumer"], held["times_delivered"]) == (b"w1", 1), "heartbeats count no attempt"
    assert r.xack(queue, "g", task_id) == 1


def test_heartbeat_by_the_owner_without_justid_counts_no_attempt(r, queue):
    task_id = r.xadd(queue, {"a": 1})
    claim(r, queue)
    [(got_id, fields)] = r.xclaim(queue, "g", "w1", 0, [task_id])
    assert got_id == task_id and fields == {b"a": b"1"}
    assert pending(r, queue)[0]["times_delivered"] == 1


def test_xclaim_takes_over_an_idle_task(r, queue):
    task_id = r.xadd(queue, {"a": 1})
    claim(r, queue, "w1")
    assert r.xclaim(queue, "g", "w2", 3_600_000, [task_id]) == []  # not idle for an hour
    wait_until(lambda: pending(r, queue)[0]["time_since_delivered"] >= 50, message="idle 50 ms")
    [(got_id, _)] = r.xclaim(queue, "g", "w2", 50, [task_id])
    assert got_id == task_id
    [held] = pending(r, queue)
    assert (held["consumer"], held["times_delivered"]) == (b"w2", 2)
    assert r.xack(queue, "g", task_id) == 1  # any connection may ack


def test_xclaim_force_and_retrycount(r, queue):
    waiting = r.xadd(queue, {"a": 1})
    assert r.xclaim(queue, "g", "w1", 0, [waiting]) == []  # not in flight: needs FORCE
    assert r.xclaim(queue, "g", "w1", 0, [waiting], force=True, retrycount=5, justid=True) == [waiting]
    [held] = pending(r, queue)
    assert (held["consumer"], held["times_delivered"]) == (b"w1", 5)
    with pytest.raises(redis.ResponseError, match="Unrecognized XCLAIM option 'NOPE'"):
        r.execute_command("XCLAIM", queue, "g", "w1", 0, waiting, "NOPE")


def test_xautoclaim_pages_with_a_cursor(r, queue):
    ids = [r.xadd(queue, {"n": n}) for n in range(3)]
    claim(r, queue, "w1", count=3)
    cursor, first, deleted = r.xautoclaim(queue, "g", "w2", 0, "0-0", count=2)
    assert ([i for i, _ in first], cursor, deleted) == (ids[:2], ids[2], [])
    cursor, rest, _ = r.xautoclaim(queue, "g", "w2", 0, cursor, count=2)
    assert ([i for i, _ in rest], cursor) == (ids[2:], b"0-0")
    assert {p["consumer"] for p in pending(r, queue)} == {b"w2"}
    assert r.xautoclaim(queue, "g", "w3", 3_600_000, "0-0", justid=True) == []  # redis-py: the ids


def test_xreadgroup_claim_takes_idle_tasks_before_new_ones(r, queue):
    old, new = r.xadd(queue, {"n": "old"}), r.xadd(queue, {"n": "new"})
    claim(r, queue, "w1", count=1)
    wait_until(lambda: pending(r, queue)[0]["time_since_delivered"] >= 50, message="idle 50 ms")
    got = claim(r, queue, "w2", count=10, claim_min_idle_time=50)
    assert [e[0] for e in got] == [old, new]
    (_, fields, idle, delivered), (_, _, new_idle, new_delivered) = got
    assert fields == {b"n": b"old"} and idle >= 50 and delivered == 1  # as Redis 8.4: before this claim
    assert (new_idle, new_delivered) == (0, 0)
    assert [(p["consumer"], p["times_delivered"]) for p in pending(r, queue)] == [(b"w2", 2), (b"w2", 1)]


# ---------------------------------------------------------------- 3. delayed tasks and TTL

def test_delayed_task_is_not_delivered_before_its_time(r, queue):
    pushed_at = time.monotonic()
    task_id = r.execute_command("XADD", queue, "DELAY", "0.8", "*", "job", "later")
    assert claim(r, queue) == [], "a delayed task is not deliverable at once"
    assert (r.xlen(queue), info(r, queue)["delayed"]) == (1, 1)
    [(got_id, _)] = wait_until(lambda: claim(r, queue), message="the delayed task")
    assert got_id == task_id and time.monotonic() - pushed_at >= 0.8


def test_a_blocked_reader_gets_a_delayed_task_when_it_comes_due(shared_server, protocol, queue):
    worker, producer = shared_server.client(protocol), shared_server.client(protocol)
    result = {}
    reader = threading.Thread(target=lambda: result.update(
        reply=worker.xreadgroup("g", "w1", {queue: ">"}, block=10_000), at=time.monotonic()))
    reader.start()
    wait_until(lambda: producer.info("clients")["blocked_clients"] >= 1, message="the reader to block")
    pushed_at = time.monotonic()
    task_id = producer.execute_command("XADD", queue, "DELAY", "0.4", "*", "a", "1")
    reader.join(15)
    assert [i for i, _ in entries_of(result["reply"], queue)] == [task_id]
    assert 0.4 <= result["at"] - pushed_at < 5
    worker.close()
    producer.close()


def test_ttl_overrides_the_queues_retention(r, queue):
    configure(r, queue, "RETENTION", "FOREVER")
    kept = r.xadd(queue, {"keep": 1})
    short = r.execute_command("XADD", queue, "TTL", "0.3", "*", "short", "1")
    claim(r, queue, count=2)
    assert r.xack(queue, "g", kept, short) == 2
    wait_until(lambda: [i for i, _ in r.xrange(queue)] == [kept], message="the TTL task's record to go")
    assert info(r, queue)["done"] == 1


def test_xadd_options_are_checked(r, queue):
    with pytest.raises(redis.ResponseError, match="not a valid number"):
        r.execute_command("XADD", queue, "DELAY", "soon", "*", "a", "1")
    with pytest.raises(redis.ResponseError, match="only with auto-generated IDs"):
        r.execute_command("XADD", queue, "IDMP", "p", "i", "5-1", "a", "1")
    with pytest.raises(redis.ResponseError, match="specified multiple times"):
        r.execute_command("XADD", queue, "IDMP", "p", "i", "IDMPAUTO", "p", "*", "a", "1")
    with pytest.raises(redis.ResponseError, match="non-empty producer ID"):
        r.execute_command("XADD", queue, "IDMPAUTO", "", "*", "a", "1")


# ---------------------------------------------------------------- 4. retry backoff

def test_backoff_spaces_the_retries(r, queue):
    configure(r, queue, "BACKOFF", "EXPONENTIAL", "0.25", "0.6", "MAX-ATTEMPTS", "5")
    task_id = r.xadd(queue, {"job": "flaky"})
    [(got_id, _)] = claim(r, queue)
    for backoff in (0.25, 0.5, 0.6):  # 0.25, 0.5, then capped at 0.6
        nacked = time.monotonic()  # the server's nack comes after this, its backoff ends after nacked + backoff
        assert r.execute_command("XNACK", queue, "g", "FAIL", "IDS", 1, task_id) == 1
        early, delayed = claim(r, queue), info(r, queue)["delayed"]
        if time.monotonic() - nacked < backoff:  # else a loaded machine took longer than the backoff
            assert early == [] and delayed == 1, "not offered again before its backoff"
        [(got_id, _)] = early or wait_until(lambda: claim(r, queue), message="a retry")
        assert got_id == task_id and time.monotonic() - nacked >= backoff


def test_an_expired_lease_waits_out_the_backoff_and_silent_does_not(r, queue):
    configure(r, queue, "VISIBILITY-TIMEOUT", "0.2", "BACKOFF", "FIXED", "0.5")
    task_id = r.xadd(queue, {"a": 1})
    claimed_at = time.monotonic()
    claim(r, queue)
    wait_until(lambda: info(r, queue)["delayed"] == 1, message="the expired task to wait out its backoff")
    [(got_id, _)] = wait_until(lambda: claim(r, queue, "w2"), message="the retry")
    assert got_id == task_id and time.monotonic() - claimed_at >= 0.7  # the 0.2 s lease, then 0.5 s
    assert r.execute_command("XNACK", queue, "g", "SILENT", "IDS", 1, task_id) == 1
    assert [i for i, _ in claim(r, queue, "w3")] == [task_id], "SILENT gives it back at once"


# ---------------------------------------------------------------- 5. redrive

def test_redrive_of_several_dead_tasks(r, queue):
    ids = [r.xadd(queue, {"n": n}) for n in range(5)]
    claim(r, queue, count=5)
    assert r.execute_command("XNACK", queue, "g", "FATAL", "IDS", 5, *ids) == 5
    assert (r.xlen(queue), r.xlen(f"{queue}::dead")) == (0, 5)
    assert r.execute_command("XREQUEUE", queue, "IDS", 2, ids[1], ids[3]) == 2
    assert [i for i, _ in r.xrange(f"{queue}::dead")] == [ids[0], ids[2], ids[4]]
    assert [i for i, _ in claim(r, queue, count=10)] == [ids[1], ids[3]]
    assert [p["times_delivered"] for p in pending(r, queue)] == [1, 1], "attempts were reset"
    assert r.execute_command("XREQUEUE", f"{queue}::dead", "ALL") == 3
    assert r.xlen(f"{queue}::dead") == 0 and r.execute_command("XREQUEUE", queue, "ALL") == 0


def test_xdel_on_the_dead_queue_deletes_for_good(r, queue):
    ids = [r.xadd(queue, {"n": n}) for n in range(2)]
    claim(r, queue, count=2)
    r.execute_command("XNACK", queue, "g", "FATAL", "IDS", 2, *ids)
    assert r.xdel(f"{queue}::dead", ids[0]) == 1
    assert r.execute_command("XREQUEUE", queue, "IDS", 2, *ids) == 1
    assert [i for i, _ in r.xrange(queue)] == [ids[1]]
    assert info(r, queue)["max-deleted-entry-id"] == ids[0]


# ---------------------------------------------------------------- 6. release on disconnect

WORKER = """
import sys, time, redis
r = redis.Redis(port=int(sys.argv[1]))
reply = r.xreadgroup("g", "proc-worker", {sys.argv[2]: ">"}, count=1, block=10000)
print(reply[0][1][0][0].decode(), flush=True)
time.sleep(600)  # working on it until killed
"""


def test_release_on_disconnect_after_the_worker_process_is_killed(shared_server, protocol, queue):
    r = shared_server.client(protocol)
    configure(r, queue, "RELEASE-ON-DISCONNECT", "0.2")  # and the lease is the server's 30 s
    task_id = r.xadd(queue, {"job": 1})
    proc = subprocess.Popen([sys.executable, "-c", WORKER, str(shared_server.port), queue],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == task_id.decode()
        assert pending(r, queue)[0]["consumer"] == b"proc-worker"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    [(got_id, _)] = wait_until(lambda: claim(r, queue, "w2"), timeout=10, message="the release")
    assert got_id == task_id
    assert pending(r, queue)[0]["times_delivered"] == 2
    r.close()


def test_no_release_while_another_connection_still_uses_the_name(shared_server, protocol, queue):
    admin = shared_server.client(protocol)
    configure(admin, queue, "RELEASE-ON-DISCONNECT", "0.1")
    task_id = admin.xadd(queue, {"job": 1})
    first, second = shared_server.client(protocol), shared_server.client(protocol)
    assert [i for i, _ in claim(first, queue, "pooled")] == [task_id]
    assert claim(second, queue, "pooled") == []  # the pool's other connection used the name too
    first.close()
    deadline = time.monotonic() + 1.0  # ten grace periods: nothing may be released
    while time.monotonic() < deadline:
        assert [p["consumer"] for p in pending(admin, queue)] == [b"pooled"]
        time.sleep(0.05)
    assert second.xack(queue, "g", task_id) == 1, "a pooled client acks on another connection"
    other = admin.xadd(queue, {"job": 2})
    claim(second, queue, "pooled")
    second.close()
    wait_until(lambda: pending(admin, queue) == [], message="release after the last connection closed")
    assert [i for i, _ in claim(admin, queue, "w2")] == [other]
    admin.close()


def test_release_is_off_by_default(shared_server, protocol, queue):
    r, worker = shared_server.client(protocol), shared_server.client(protocol)
    task_id = r.xadd(queue, {"job": 1})
    claim(worker, queue, "leaver")
    worker.close()
    # The name reconnects (a restarted worker) and gets its task back with id 0, as in Redis.
    again = shared_server.client(protocol)
    reply = again.xreadgroup("g", "leaver", {queue: "0"})
    assert [i for i, _ in entries_of(reply, queue)] == [task_id]
    again.close()
    r.close()


# ---------------------------------------------------------------- 7. idempotent producers

def test_idmp_returns_the_same_id_and_stores_nothing_new(r, queue):
    first = r.xadd(queue, {"amount": 100}, idmp=("shop-1", b"order-42"))
    again = r.xadd(queue, {"amount": 999}, idmp=("shop-1", b"order-42"))  # a retry after a network error
    other = r.xadd(queue, {"amount": 100}, idmp=("shop-2", b"order-42"))  # another producer
    assert again == first and other != first
    assert [fields for _, fields in r.xrange(queue)] == [{b"amount": b"100"}, {b"amount": b"100"}]
    shown = info(r, queue)
    assert (shown["pids-tracked"], shown["iids-tracked"], shown["iids-added"], shown["iids-duplicates"]) == \
        (2, 2, 2, 1)


def test_idmpauto_recognises_the_same_fields_in_any_order(r, queue):
    first = r.execute_command("XADD", queue, "IDMPAUTO", "p", "*", "a", "1", "b", "2")
    assert r.execute_command("XADD", queue, "IDMPAUTO", "p", "*", "b", "2", "a", "1") == first
    assert r.execute_command("XADD", queue, "IDMPAUTO", "p", "*", "a", "1", "b", "3") != first
    assert r.xlen(queue) == 2


def test_idmp_is_remembered_across_a_restart_and_forgotten_after_its_duration(ezra_factory):
    server = ezra_factory()
    r = server.client()
    first = r.xadd("pay", {"n": 1}, idmp=("p", b"i"))
    configure(r, "pay", "IDMP-DURATION", "100")  # the default: nothing changes
    assert r.xadd("pay", {"n": 1}, idmp=("p", b"i")) == first
    configure(r, "pay", "IDMP-DURATION", "200")
    assert r.xadd("pay", {"n": 1}, idmp=("p", b"i")) != first, "other IDMP limits start from an empty map"
    second = r.xadd("pay", {"n": 2}, idmp=("p", b"j"))
    r.close()
    server.restart()
    r = server.client(3)
    assert r.xadd("pay", {"n": 2}, idmp=("p", b"j")) == second
    configure(r, "pay", "IDMP-DURATION", "1")
    third = r.xadd("pay", {"n": 3}, idmp=("p", b"k"))
    assert r.xadd("pay", {"n": 3}, idmp=("p", b"k")) == third
    wait_until(lambda: r.xadd("pay", {"n": 3}, idmp=("p", b"k")) != third, message="the iid to expire")
    r.close()


# ---------------------------------------------------------------- 8. XACKDEL

def test_xackdel_acks_and_drops_the_record(r, queue):
    done, waiting = r.xadd(queue, {"a": 1}), r.xadd(queue, {"b": 2})
    claim(r, queue, count=1)
    assert r.xackdel(queue, "g", done, waiting) == [1, -1]  # the waiting task is never dropped
    assert [i for i, _ in r.xrange(queue)] == [waiting]
    assert pending(r, queue) == [] and r.xlen(queue) == 1
    assert r.execute_command("XACKDEL", queue, "g", "ACKED", "IDS", 1, done) == [-1]
    with pytest.raises(redis.ResponseError, match="numids"):
        r.execute_command("XACKDEL", queue, "g", "IDS", 3, done)


# ---------------------------------------------------------------- 9. XINFO

def test_xinfo_stream_groups_consumers(r, queue):
    r.xgroup_create(queue, "workers", mkstream=True)
    configure(r, queue, "MAX-ATTEMPTS", "1")
    ids = [r.xadd(queue, {"n": n}) for n in range(4)]
    r.execute_command("XADD", queue, "DELAY", "60", "*", "n", "later")
    claim(r, queue, "alice", count=1)
    claim(r, queue, "bob", count=2)
    r.xack(queue, "g", ids[0])
    r.execute_command("XNACK", queue, "g", "FATAL", "IDS", 1, ids[1])
    shown = info(r, queue)
    assert {k: shown[k] for k in ("available", "delayed", "in-flight", "done", "dead")} == \
        {"available": 1, "delayed": 1, "in-flight": 1, "done": 1, "dead": 1}
    assert shown["length"] == 3 == r.xlen(queue)  # not done yet: available, delayed, in flight
    assert shown["entries-added"] == 5 and shown["groups"] == 1
    assert shown["first-entry"][0] == ids[0] and shown["last-generated-id"] == shown["last-entry"][0]
    [group] = r.xinfo_groups(queue)
    assert group == {"name": b"workers", "consumers": 1, "pending": 1, "last-delivered-id": ids[2],
                     "entries-read": 3, "lag": 2}
    [consumer] = r.xinfo_consumers(queue, "workers")
    assert (consumer["name"], consumer["pending"]) == (b"bob", 1) and consumer["idle"] >= 0
    with pytest.raises(redis.ResponseError, match="no such key"):
        r.xinfo_stream(queue + "-missing")


def test_xinfo_stream_full(r, queue):
    ids = [r.xadd(queue, {"n": n}) for n in range(3)]
    claim(r, queue, "w1", count=2)
    full = r.xinfo_stream(queue, full=True)
    assert list(full["entries"]) == ids
    [group] = full["groups"]
    assert group["pel-count"] == 2 and [p[0] for p in group["pending"]] == ids[:2]
    # redis-py decodes the consumers' keys in RESP2 only
    assert [c.get("name", c.get(b"name")) for c in group["consumers"]] == [b"w1"]


# ---------------------------------------------------------------- 10. retention and purge

def test_retention_zero_deletes_on_ack(r, queue):
    configure(r, queue, "RETENTION", "0")
    ids = [r.xadd(queue, {"n": n}) for n in range(3)]
    claim(r, queue, count=3)
    assert r.xack(queue, "g", *ids[:2]) == 2
    assert [i for i, _ in r.xrange(queue)] == [ids[2]]
    assert info(r, queue)["entries-added"] == 3


def test_ids_never_repeat_after_the_newest_task_is_purged(ezra_factory):
    server = ezra_factory()
    r = server.client()
    configure(r, "q", "RETENTION", "0")
    last = r.xadd("q", {"a": 1}, id="9999999999999-5")
    claim(r, "q")
    r.xack("q", "g", last)
    r.close()
    server.kill9()
    server.start()
    r = server.client()
    with pytest.raises(redis.ResponseError, match="equal or smaller"):
        r.xadd("q", {"a": 1}, id="9999999999999-5")
    r.close()


def test_purge_under_load_keeps_the_file_bounded(ezra_factory):
    server = ezra_factory()
    r = server.client()
    configure(r, "load", "RETENTION", "0.2")
    payload = "x" * 2000
    latencies, stop = [], threading.Event()

    def probe():  # another client, all along: the purge must not stall the server
        client = server.client()
        while not stop.is_set():
            started = time.monotonic()
            client.ping()
            latencies.append(time.monotonic() - started)
            time.sleep(0.01)
        client.close()

    prober = threading.Thread(target=probe)
    prober.start()
    sizes = []
    try:
        for _ in range(12):  # 12 x 1500 tasks of 2 KB: 36 MB pushed, retained 0.2 s each
            pipe = r.pipeline(transaction=False)
            for n in range(1500):
                pipe.xadd("load", {"n": n, "data": payload})
            pipe.execute()
            while True:
                got = claim(r, "load", count=1000)
                if not got:
                    break
                r.xack("load", "g", *[i for i, _ in got])
            sizes.append((server.data_dir / "ezra.db").stat().st_size)  # the WAL is the writer's business
        wait_until(lambda: info(r, "load")["done"] == 0, timeout=30, message="the purge to catch up")
    finally:
        stop.set()
        prober.join()
    assert info(r, "load")["entries-added"] == 18000 and r.xlen("load") == 0
    assert max(sizes) < 24 * 1024 * 1024, sizes  # freed pages are reused: far below the 36 MB pushed (12 MB)
    assert max(latencies) < 5.0, max(latencies)  # not a speed test: a purge that stalled the server would take longer
    r.close()


# ---------------------------------------------------------------- 11. hot backup

def acked_tasks_in(path) -> set[bytes]:
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = conn.execute("SELECT id FROM tasks_readable WHERE queue = 'busy' AND state = 'done'").fetchall()
        return {row[0].encode() for row in rows}
    finally:
        conn.close()


def test_backup_during_writes_holds_every_task_acked_before_it_began(ezra_factory, tmp_path):
    server = ezra_factory("--backup-dir", str(tmp_path))  # BACKUP writes only there
    acked: list[bytes] = []
    stop = threading.Event()

    def work():  # push, claim, ack, without pause, until the backups are done
        client = server.client()
        while not stop.is_set():
            client.xadd("busy", {"data": "y" * 500})
            got = claim(client, "busy", count=10)
            if got and client.xack("busy", "g", *[i for i, _ in got]):
                acked.extend(i for i, _ in got)
        client.close()

    writer = threading.Thread(target=work)
    writer.start()
    try:
        wait_until(lambda: len(acked) > 500, message="some acked tasks")
        r = server.client()
        before_command = set(acked)
        assert r.execute_command("BACKUP", str(tmp_path / "by-command.db")) in OK_REPLIES
        before_cli = set(acked)
        cli = subprocess.run([sys.executable, "-m", "ezra", "backup", "--data-dir", str(server.data_dir),
                              str(tmp_path / "by-cli.db")], check=False, cwd=ROOT, capture_output=True, text=True,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
        assert cli.returncode == 0, cli.stderr
        with pytest.raises(redis.ResponseError, match="exists already"):
            r.execute_command("BACKUP", str(tmp_path / "by-command.db"))
        r.close()
    finally:
        stop.set()
        writer.join()
    assert before_command <= acked_tasks_in(tmp_path / "by-command.db")
    assert before_cli <= acked_tasks_in(tmp_path / "by-cli.db")
    assert not (tmp_path / "by-command.db-wal").exists(), "one self-contained file"
    # The copy is a working ezra.db: a server started on it has the tasks.
    (tmp_path / "restored").mkdir()
    os.replace(tmp_path / "by-cli.db", tmp_path / "restored" / "ezra.db")
    restored = ezra_factory(data_dir=tmp_path / "restored")
    r = restored.client()
    assert info(r, "busy")["done"] >= len(before_cli)
    r.close()
