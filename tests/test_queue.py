"""The task queue through the front door: redis-py in RESP2 and RESP3."""

from __future__ import annotations

import threading

import pytest
import redis

from support_queue import claim, entries_of
from support_servers import wait_until


def test_round_trip_push_claim_ack(r, queue):
    task_id = r.xadd(queue, {"job": "email", "to": "a@example.com"})
    assert r.xlen(queue) == 1
    [(got_id, fields)] = claim(r, queue)
    assert got_id == task_id
    assert fields == {b"job": b"email", b"to": b"a@example.com"}
    assert r.xack(queue, "g", task_id) == 1
    assert r.xack(queue, "g", task_id) == 0, "a second ack of the same task counts 0"
    assert r.xlen(queue) == 0
    assert claim(r, queue) == []


def test_ids_strictly_increase_and_order_is_fifo(r, queue):
    ids = [r.xadd(queue, {"n": str(i)}) for i in range(50)]
    parsed = [tuple(map(int, i.split(b"-"))) for i in ids]
    assert parsed == sorted(parsed) and len(set(parsed)) == 50
    got = claim(r, queue, count=20) + claim(r, queue, count=100)
    assert [i for i, _ in got] == ids
    assert [f[b"n"] for _, f in got] == [str(i).encode() for i in range(50)]


def test_fields_are_binary_safe_and_keep_their_order(r, queue):
    fields = [(b"\x00\xff\xfe", b"\r\n$3\r\n"), (b"z", b""), (b"a", "ünïcode".encode()), (b"dup", b"1"),
              (b"dup", b"2")]
    args = [x for pair in fields for x in pair]
    task_id = r.execute_command("XADD", queue, "*", *args)
    reply = r.execute_command("XRANGE", queue, "-", "+")
    assert reply[0][0] == task_id
    # redis-py turns fields into a dict, which hides order and duplicates: read the raw pairs.
    raw = redis.Redis(port=r.connection_pool.connection_kwargs["port"], protocol=2)
    raw.set_response_callback("XRANGE", lambda x, **kw: x)
    assert raw.execute_command("XRANGE", queue, "-", "+")[0][1] == args
    raw.close()


def test_explicit_ids_must_grow(r, queue):
    assert r.xadd(queue, {"a": 1}, id="5-1") == b"5-1"
    assert r.xadd(queue, {"a": 1}, id="5-*") == b"5-2"
    with pytest.raises(redis.ResponseError, match="equal or smaller"):
        r.xadd(queue, {"a": 1}, id="5-1")
    with pytest.raises(redis.ResponseError, match="greater than 0-0"):
        r.xadd(queue + "x", {"a": 1}, id="0-0")
    with pytest.raises(redis.ResponseError, match="Invalid stream ID"):
        r.xadd(queue, {"a": 1}, id="nope")


def test_blocked_worker_is_woken_by_a_push(shared_server, protocol, queue):
    worker = shared_server.client(protocol)
    producer = shared_server.client(protocol)
    result = {}

    def read():
        result["reply"] = worker.xreadgroup("g", "w1", {queue: ">"}, count=1, block=20000)

    reader = threading.Thread(target=read)
    reader.start()
    wait_until(lambda: int(producer.info("clients")["blocked_clients"]) >= 1, message="the reader to block")
    task_id = producer.xadd(queue, {"wake": "up"})
    reader.join(10)
    assert not reader.is_alive()
    assert entries_of(result["reply"], queue)[0][0] == task_id


def test_block_times_out_with_null(r, queue):
    assert r.xreadgroup("g", "w1", {queue: ">"}, block=50) in (None, [], {})


def test_blocked_workers_are_served_first_come_first_served(shared_server, queue):
    producer = shared_server.client()
    got = {}
    threads = []
    for n in range(3):
        def read(n=n):
            c = shared_server.client()
            got[n] = c.xreadgroup("g", f"w{n}", {queue: ">"}, count=1, block=20000)
        before = int(producer.info("clients")["blocked_clients"])
        thread = threading.Thread(target=read)
        thread.start()
        threads.append(thread)
        wait_until(lambda: int(producer.info("clients")["blocked_clients"]) > before,
                   message=f"reader {n} to block")
    ids = [producer.xadd(queue, {"n": n}) for n in range(3)]
    for thread in threads:
        thread.join(10)
    assert [entries_of(got[n], queue)[0][0] for n in range(3)] == ids


def test_many_workers_share_tasks_each_delivered_once(shared_server, protocol, queue):
    total = 300
    producer = shared_server.client(protocol)
    pipe = producer.pipeline(transaction=False)
    for i in range(total):
        pipe.xadd(queue, {"n": i})
    pushed = pipe.execute()
    seen: list[bytes] = []
    lock = threading.Lock()

    def work(name):
        c = shared_server.client(protocol)
        while True:
            batch = claim(c, queue, worker=name, count=7, block=300)
            if not batch:
                return
            c.xack(queue, "g", *[i for i, _ in batch])
            with lock:
                seen.extend(i for i, _ in batch)

    workers = [threading.Thread(target=work, args=(f"w{n}",)) for n in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert sorted(seen) == sorted(pushed) and len(seen) == len(set(seen)) == total
    assert producer.xpending(queue, "g")["pending"] == 0
    assert producer.xlen(queue) == 0


def test_reading_with_id_0_returns_own_in_flight_tasks(r, queue):
    ids = [r.xadd(queue, {"n": i}) for i in range(3)]
    claim(r, queue, worker="alice", count=2)
    claim(r, queue, worker="bob", count=1)
    mine = entries_of(r.xreadgroup("g", "alice", {queue: "0"}), queue)
    assert [i for i, _ in mine] == ids[:2]
    after_first = entries_of(r.xreadgroup("g", "alice", {queue: ids[0].decode()}), queue)
    assert [i for i, _ in after_first] == ids[1:2]
    r.xack(queue, "g", *ids)
    assert entries_of(r.xreadgroup("g", "alice", {queue: "0"}), queue) == []


def test_pending_summary_and_extended(r, queue):
    assert r.xpending(queue, "g")["pending"] == 0
    ids = [r.xadd(queue, {"n": i}) for i in range(3)]
    claim(r, queue, worker="alice", count=2)
    claim(r, queue, worker="bob", count=1)
    summary = r.xpending(queue, "g")
    assert summary["pending"] == 3
    assert (summary["min"], summary["max"]) == (ids[0], ids[2])
    assert sorted((c["name"], c["pending"]) for c in summary["consumers"]) == [(b"alice", 2), (b"bob", 1)]
    detail = r.xpending_range(queue, "g", "-", "+", 10)
    assert [(d["message_id"], d["consumer"], d["times_delivered"]) for d in detail] == [
        (ids[0], b"alice", 1), (ids[1], b"alice", 1), (ids[2], b"bob", 1)]
    assert [d["message_id"] for d in r.xpending_range(queue, "g", "-", "+", 10, consumername="bob")] == ids[2:]
    assert r.xpending_range(queue, "g", "-", "+", 10, idle=3_600_000) == []


def test_nack_retries_then_dead_letter(r, queue):
    task_id = r.xadd(queue, {"poison": "yes"})
    for attempt in range(1, 4):  # max attempts is 3 on the shared server
        [(got, _)] = claim(r, queue)
        assert got == task_id
        assert r.execute_command("XNACK", queue, "g", task_id) == 1
        expected_len = 1 if attempt < 3 else 0
        assert r.xlen(queue) == expected_len
    assert claim(r, queue) == []
    dead = r.xrange(queue + "::dead")
    assert [i for i, _ in dead] == [task_id] and r.xlen(queue + "::dead") == 1
    assert r.xrevrange(queue + "::dead")[0][0] == task_id
    assert r.xdel(queue + "::dead", task_id) == 1
    assert r.xlen(queue + "::dead") == 0


def test_xnack_redis_88_syntax_modes(r, queue):
    a, b, c = (r.xadd(queue, {"n": i}) for i in range(3))
    claim(r, queue, count=3)
    assert r.execute_command("XNACK", queue, "g", "SILENT", "IDS", 1, a) == 1
    assert r.execute_command("XNACK", queue, "g", "FATAL", "IDS", 1, b) == 1
    assert r.execute_command("XNACK", queue, "g", "FAIL", "IDS", 2, c, "9-9", "RETRYCOUNT", 3) == 1
    assert [i for i, _ in r.xrange(queue + "::dead")] == [b, c]  # FATAL, and FAIL with 3 of 3 attempts
    [(again, _)] = claim(r, queue)
    assert again == a
    assert r.xpending_range(queue, "g", "-", "+", 10)[0]["times_delivered"] == 1, "SILENT gave it back"
    assert r.execute_command("XNACK", queue, "g", "FAIL", "IDS", 1, a) == 1
    assert r.execute_command("XNACK", queue, "g", "FAIL", "IDS", 1, a) == 0, "no longer in flight"
    with pytest.raises(redis.ResponseError):
        r.execute_command("XNACK", queue, "g", "FAIL", "IDS", 3, a)
    with pytest.raises(redis.ResponseError, match="Invalid stream ID"):
        r.execute_command("XNACK", queue, "g", "FAIL", "IDS", 1, "bad")


def test_xdel_reports_failure_and_keeps_the_task(r, queue):
    task_id = r.xadd(queue, {"n": 1})
    claim(r, queue)
    assert r.xdel(queue, task_id) == 1
    assert r.xlen(queue) == 1
    [(again, _)] = claim(r, queue)
    assert again == task_id


def test_noack_delivers_done_at_once(r, queue):
    r.xadd(queue, {"n": 1})
    got = entries_of(r.xreadgroup("g", "w1", {queue: ">"}, noack=True), queue)
    assert len(got) == 1
    assert r.xpending(queue, "g")["pending"] == 0
    assert r.xlen(queue) == 0


def test_read_several_queues_at_once(r, queue):
    other = queue + "-b"
    empty = queue + "-empty"
    a = r.xadd(queue, {"n": 1})
    b = r.xadd(other, {"n": 2})
    reply = r.xreadgroup("g", "w1", {queue: ">", other: ">", empty: ">"}, count=5)
    assert entries_of(reply, queue)[0][0] == a
    assert entries_of(reply, other)[0][0] == b
    assert len(reply) == 2, "only queues with tasks appear"


def test_xrange_shows_available_in_flight_and_done(r, queue):
    ids = [r.xadd(queue, {"n": i}) for i in range(4)]
    claim(r, queue, count=2)
    r.xack(queue, "g", ids[0])
    assert [i for i, _ in r.xrange(queue)] == ids
    assert [i for i, _ in r.xrange(queue, min=ids[1], max=ids[2])] == ids[1:3]
    assert [i for i, _ in r.xrange(queue, count=1)] == ids[:1]
    assert [i for i, _ in r.xrevrange(queue, count=2)] == ids[:1:-1]
    assert [i for i, _ in r.xrange(queue, min="(" + ids[0].decode())] == ids[1:]


def test_xgroup_create_is_accepted(r, queue):
    assert r.xgroup_create(queue, "workers", id="$", mkstream=True)
    assert r.xgroup_create(queue, "workers", id="$", mkstream=True), "no BUSYGROUP: one implicit group"
    with pytest.raises(redis.ResponseError, match="requires the key to exist"):
        r.xgroup_create(queue + "-missing", "workers")


def test_xgroup_delconsumer_gives_the_workers_tasks_back(r, queue):
    # Redis answers how many entries the consumer had pending and drops them from its pending
    # list; EZRA answers the same count and puts the tasks back, as a lost lease would.
    ids = [r.xadd(queue, {"n": n}) for n in range(3)]
    assert [i for i, _ in claim(r, queue, worker="w1", count=2)] == ids[:2]
    assert r.xgroup_delconsumer(queue, "g", "w2") == 0
    assert r.xgroup_delconsumer(queue, "g", "w1") == 2
    assert r.xpending(queue, "g")["pending"] == 0
    assert [i for i, _ in claim(r, queue, worker="w3", count=10)] == ids
    assert [t["times_delivered"] for t in r.xpending_range(queue, "g", "-", "+", 10)] == [2, 2, 1]
    with pytest.raises(redis.ResponseError, match="requires the key to exist"):
        r.xgroup_delconsumer(queue + "-missing", "g", "w1")
    with pytest.raises(redis.ResponseError, match="wrong number of arguments for 'xgroup|delconsumer'"):
        r.execute_command("XGROUP", "DELCONSUMER", queue, "g")


def test_exact_trimming_is_refused_and_nothing_stored(r, queue):
    """redis-py's maxlen= trims approximately (kept: nothing is done), exact trimming is refused
    (tests/test_trim.py has the rest)."""
    for _ in range(3):
        assert r.xadd(queue, {"a": 1}, maxlen=1)  # MAXLEN ~ 1: no task is done, so none goes
    assert r.xlen(queue) == 3
    with pytest.raises(redis.ResponseError, match="exact trimming is refused: EZRA never drops unfinished"):
        r.xadd(queue, {"a": 1}, maxlen=10, approximate=False)
    assert r.xlen(queue) == 3


def test_nomkstream(r, queue):
    assert r.xadd(queue, {"a": 1}, nomkstream=True) is None
    assert r.xlen(queue) == 0


def test_oversized_task_is_refused_and_nothing_stored(r, queue):
    with pytest.raises(redis.ResponseError, match="task too large"):
        r.xadd(queue, {"blob": b"x" * (1024 * 1024 + 1)})
    assert r.xlen(queue) == 0
    assert r.xadd(queue, {"blob": b"x" * (1024 * 1024 - 4)})  # the limit counts names and values
    assert r.ping()


@pytest.mark.parametrize("command", [["GET", "k"], ["SET", "k", "v"], ["SUBSCRIBE", "ch"], ["FLUSHALL"]])
def test_other_redis_commands_get_a_clear_error(r, command):
    with pytest.raises(redis.ResponseError) as info:
        r.execute_command(*command)
    message = str(info.value)
    assert message.startswith(f"unknown command '{command[0]}'")
    assert "task queue" in message and "XREADGROUP" in message
    assert r.ping()


def test_bad_arguments_get_errors(r, queue):
    for command, match in [
        (["XADD", queue], "wrong number of arguments for 'xadd'"),
        (["XADD", queue, "*", "odd"], "wrong number of arguments"),
        (["XREADGROUP", "GROUP", "g", "w", "COUNT", "x", "STREAMS", queue, ">"], "not an integer"),
        (["XREADGROUP", "GROUP", "g", "w", "BLOCK", "-1", "STREAMS", queue, ">"], "timeout is negative"),
        (["XREADGROUP", "GROUP", "g", "w", "STREAMS", queue, queue + "2", ">"], "Unbalanced"),
        (["XREADGROUP", "GROUP", "g", "w", "STREAMS", queue, "$"], "meaningless"),
        (["XACK", queue, "g", "x-y"], "Invalid stream ID"),
        (["XADD", queue + "::dead", "DELAY", "1", "*", "a", "1"], "does not apply to a dead task"),
        (["SELECT", "1"], "one database"),
        (["SELECT", "x"], "not an integer"),
    ]:
        with pytest.raises(redis.ResponseError, match=match):
            r.execute_command(*command)
    assert r.xlen(queue) == 0
