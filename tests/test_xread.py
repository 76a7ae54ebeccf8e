"""XREAD through the front door: a read-only look at a queue (XRANGE's view), able to block.

Nothing is claimed, leased or counted; every observer sees every push; a blocked worker
still gets the pushed task. redis-py in RESP2 and RESP3; the error texts are Redis 7.0's.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
import redis

from support_disk import leave_free
from support_queue import queue_figures
from support_resp import RespConnection, blocked_clients, encode_command
from support_servers import wait_until


def raw(server, protocol):
    """A client that hands XREAD's reply back as parsed from the wire (null stays None)."""
    client = server.client(protocol)
    client.set_response_callback("XREAD", lambda reply, **options: reply)
    return client


def read(client, *args):
    """XREAD's reply as {queue: [(id, [field, value, ...]), ...]}, or None for the null reply."""
    reply = client.execute_command("XREAD", *args)
    if reply is None:
        return None
    pairs = reply.items() if isinstance(reply, dict) else reply
    return {name.decode(): [(entry_id, fields) for entry_id, fields in entries] for name, entries in pairs}


def ids(entries):
    return [entry_id for entry_id, _ in entries]


def blocked(client) -> int:
    return client.info("clients")["blocked_clients"]


def in_thread(fn):
    """Run fn in a thread; a list that gets its result (or its exception) when it ends."""
    out: list = []

    def run():
        try:
            out.append(fn())
        except Exception as exc:  # asserted by the test
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


@pytest.fixture
def x(shared_server, protocol):
    client = raw(shared_server, protocol)
    yield client
    client.close()


# ------------------------------------------------------------------ what it reads

def test_reads_entries_after_the_id_in_either_protocol(x, protocol, queue):
    pushed = [x.xadd(queue, {"n": str(n)}, id=task_id) for n, task_id in enumerate(["5-1", "5-2", "6-1", "7-1"])]
    reply = x.execute_command("XREAD", "STREAMS", queue, "0")
    assert isinstance(reply, dict) if protocol == 3 else isinstance(reply, list), reply  # map / pairs
    assert read(x, "STREAMS", queue, "0") == {queue: [(i, [b"n", str(n).encode()]) for n, i in enumerate(pushed)]}
    assert ids(read(x, "STREAMS", queue, "5-1")[queue]) == [b"5-2", b"6-1", b"7-1"]
    assert ids(read(x, "STREAMS", queue, "5")[queue]) == pushed, "'5' is 5-0"
    assert ids(read(x, "STREAMS", queue, "6-0")[queue]) == [b"6-1", b"7-1"]
    assert ids(read(x, "COUNT", "2", "STREAMS", queue, "5-1")[queue]) == [b"5-2", b"6-1"]
    assert read(x, "STREAMS", queue, "7-1") is None, "nothing after the last id: the null reply"
    assert read(x, "STREAMS", queue, "$") is None, "'$' without BLOCK: nothing is newer than now"
    assert read(x, "STREAMS", queue, "18446744073709551615-18446744073709551615") is None  # Redis's top id


def test_reads_nothing_it_claims(x, shared_server, queue):
    pushed = [x.xadd(queue, {"n": str(n)}) for n in range(3)]
    before = queue_figures(shared_server.client(), queue)
    for _ in range(3):
        assert ids(read(x, "STREAMS", queue, "0")[queue]) == pushed
    assert x.xpending(queue, "g")["pending"] == 0
    assert x.xlen(queue) == 3
    assert queue_figures(x, queue) == before, "no delivery counted"
    got = x.xreadgroup("g", "w1", {queue: ">"})
    claimed = got[queue.encode()][0] if isinstance(got, dict) else got[0][1]
    assert ids(claimed) == pushed, "a worker still gets every task"
    assert [p["times_delivered"] for p in x.xpending_range(queue, "g", "-", "+", 10)] == [1, 1, 1]


def test_shows_what_xrange_shows_whatever_the_state(x, queue):
    """Available, in flight and done (retained) tasks on the queue; dead ones on q::dead."""
    first, second, third = (x.xadd(queue, {"n": str(n)}) for n in range(3))
    x.xreadgroup("g", "w1", {queue: ">"}, count=2)  # first, second in flight
    x.xack(queue, "g", first)  # done
    x.execute_command("XNACK", queue, "g", "FATAL", "IDS", 1, second)  # dead
    assert ids(read(x, "STREAMS", queue, "0")[queue]) == [first, third] == [i for i, _ in x.xrange(queue)]
    assert ids(read(x, "STREAMS", queue + "::dead", "0")[queue + "::dead"]) == [second]
    both = read(x, "STREAMS", queue, queue + "::dead", "0", "0")
    assert {name: ids(entries) for name, entries in both.items()} == {queue: [first, third],
                                                                      queue + "::dead": [second]}
    delayed = x.execute_command("XADD", queue, "DELAY", "60", "*", "n", "later")
    assert ids(read(x, "STREAMS", queue, third)[queue]) == [delayed], "a delayed task shows, as in XRANGE"


def test_several_queues_count_and_missing_ones(x, queue):
    a = [x.xadd(queue + "-a", {"n": str(n)}) for n in range(3)]
    b = [x.xadd(queue + "-b", {"n": str(n)}) for n in range(2)]
    got = read(x, "COUNT", "2", "STREAMS", queue + "-a", queue + "-missing", queue + "-b", "0", "0", "0")
    assert list(got) == [queue + "-a", queue + "-b"], "only queues with entries, in the order asked"
    assert ids(got[queue + "-a"]) == a[:2] and ids(got[queue + "-b"]) == b
    assert ids(read(x, "COUNT", "0", "STREAMS", queue + "-a", "0")[queue + "-a"]) == a, "COUNT 0: all"
    assert read(x, "STREAMS", queue + "-missing", "0") is None
    assert ids(read(x, "STREAMS", queue + "-a", queue + "-a", "0", a[0])[queue + "-a"]) == a, \
        "a queue named twice is read once, with its first id"


def test_plus_reads_the_last_entry(x, queue):
    """'+' (Redis 7.4): the view's newest entry; on an empty or missing queue, nothing yet."""
    pushed = [x.xadd(queue, {"n": str(n)}) for n in range(3)]
    assert ids(read(x, "STREAMS", queue, "+")[queue]) == [pushed[-1]]
    assert read(x, "STREAMS", queue + "-missing", "+") is None


# ------------------------------------------------------------------ blocking

def test_dollar_blocks_until_a_push_and_sees_only_new_entries(shared_server, protocol, queue):
    observer, producer = raw(shared_server, protocol), shared_server.client(protocol)
    producer.xadd(queue, {"n": "old"})
    # Counted from before: another test's client blocked on this shared server must not pass
    # for this one, or the push could land before the read and '$' would never see it.
    before = blocked(producer)
    started = time.monotonic()
    thread, out = in_thread(lambda: read(observer, "BLOCK", "20000", "STREAMS", queue, "$"))
    wait_until(lambda: blocked(producer) == before + 1, message="the XREAD to block")
    new = producer.xadd(queue, {"n": "new"})
    thread.join(10)
    assert out == [{queue: [(new, [b"n", b"new"])]}]
    assert time.monotonic() - started < 10, "woken by the push, not by the timeout"
    assert producer.xlen(queue) == 2 and producer.xpending(queue, "g")["pending"] == 0


def test_a_push_wakes_every_observer(shared_server, protocol, queue):
    producer = shared_server.client(protocol)
    before = blocked(producer)
    observers = [raw(shared_server, protocol) for _ in range(3)]
    reads = [in_thread(lambda c=c: read(c, "BLOCK", "0", "STREAMS", queue, "$")) for c in observers]
    wait_until(lambda: blocked(producer) == before + 3, message="three blocked observers")
    pushed = producer.xadd(queue, {"n": "1"})
    for thread, _ in reads:
        thread.join(10)
    assert [out for _, out in reads] == [[{queue: [(pushed, [b"n", b"1"])]}]] * 3
    assert blocked(producer) == before


def test_block_times_out_with_the_null_reply(x, queue):
    x.xadd(queue, {"n": "1"})
    started = time.monotonic()
    assert read(x, "BLOCK", "200", "STREAMS", queue, queue + "-missing", "$", "$") is None
    assert time.monotonic() - started >= 0.19
    assert ids(read(x, "BLOCK", "200", "STREAMS", queue, "0")[queue]), "entries there: no wait"


def test_an_explicit_id_blocks_until_an_entry_above_it(shared_server, protocol, queue):
    observer, producer = raw(shared_server, protocol), shared_server.client(protocol)
    last = producer.xadd(queue, {"n": "1"})
    thread, out = in_thread(lambda: read(observer, "BLOCK", "20000", "STREAMS", queue + "-other", queue,
                                         "0", last))
    wait_until(lambda: blocked(producer) >= 1, message="the XREAD to block")
    pushed = producer.xadd(queue, {"n": "2"})
    thread.join(10)
    assert out == [{queue: [(pushed, [b"n", b"2"])]}]


def test_a_blocked_worker_still_gets_the_task_an_observer_sees(shared_server, protocol, queue):
    producer, worker, observer = (shared_server.client(protocol), shared_server.client(protocol),
                                  raw(shared_server, protocol))
    before = blocked(producer)
    claim, claimed = in_thread(lambda: worker.xreadgroup("g", "w1", {queue: ">"}, count=1, block=20000))
    wait_until(lambda: blocked(producer) == before + 1, message="the worker to block")
    look, seen = in_thread(lambda: read(observer, "BLOCK", "20000", "STREAMS", queue, "$"))
    wait_until(lambda: blocked(producer) == before + 2, message="the observer to block")
    task = producer.xadd(queue, {"n": "1"})
    claim.join(10)
    look.join(10)
    got = claimed[0][queue.encode()][0] if protocol == 3 else claimed[0][0][1]
    assert ids(got) == [task], claimed
    assert seen == [{queue: [(task, [b"n", b"1"])]}]
    assert producer.xpending(queue, "g")["pending"] == 1, "the worker holds it"


def test_the_dead_view_wakes_when_a_task_dies(shared_server, protocol, queue):
    observer, client = raw(shared_server, protocol), shared_server.client(protocol)
    task = client.xadd(queue, {"n": "1"})
    thread, out = in_thread(lambda: read(observer, "BLOCK", "20000", "STREAMS", queue + "::dead", "0"))
    wait_until(lambda: blocked(client) >= 1, message="the XREAD to block")
    client.xreadgroup("g", "w1", {queue: ">"})
    client.execute_command("XNACK", queue, "g", "FATAL", "IDS", 1, task)
    thread.join(10)
    assert out == [{queue + "::dead": [(task, [b"n", b"1"])]}]


def test_the_dead_view_wakes_when_a_dead_task_is_pushed(shared_server, protocol, queue):
    # XADD q::dead (what `ezra import` uses for dead letters) adds to the dead view, not the live one.
    observer, client = raw(shared_server, protocol), shared_server.client(protocol)
    client.xadd(queue, {"n": "0"})
    thread, out = in_thread(lambda: read(observer, "BLOCK", "20000", "STREAMS", queue + "::dead", "0"))
    wait_until(lambda: blocked(client) >= 1, message="the XREAD to block")
    task = client.xadd(queue + "::dead", {"n": "1"})
    thread.join(10)
    assert out == [{queue + "::dead": [(task, [b"n", b"1"])]}]


def test_block_inside_multi_does_not_block(x, queue):
    pushed = x.xadd(queue, {"n": "1"})
    pipe = x.pipeline(transaction=True)
    pipe.execute_command("XREAD", "BLOCK", "0", "STREAMS", queue, "$")
    pipe.execute_command("XREAD", "BLOCK", "0", "STREAMS", queue, "0")
    started = time.monotonic()
    nothing, found = pipe.execute()
    assert time.monotonic() - started < 5
    assert nothing is None
    assert [entry_id for entry_id, _ in (found[queue.encode()] if isinstance(found, dict) else found[0][1])] \
        == [pushed]


def test_a_client_that_hangs_up_while_blocked_is_forgotten(shared_server, queue):
    client = shared_server.client()
    before = blocked(client)
    sock = socket.create_connection(("127.0.0.1", shared_server.port))
    sock.sendall(f"XREAD BLOCK 0 STREAMS {queue} $\r\n".encode())
    wait_until(lambda: blocked(client) == before + 1, message="the XREAD to block")
    sock.close()
    wait_until(lambda: blocked(client) == before, message="the hung-up observer to go")
    client.xadd(queue, {"n": "1"})
    assert client.xlen(queue) == 1 and client.ping()


def test_a_stopping_server_answers_blocked_observers(ezra_factory):
    server = ezra_factory()
    observer, client = raw(server, 2), server.client()
    thread, out = in_thread(lambda: read(observer, "BLOCK", "0", "STREAMS", "q", "$"))
    wait_until(lambda: blocked(client) == 1, message="the XREAD to block")
    assert server.stop() == 0, server.log()
    thread.join(10)
    assert out in ([None], ) or isinstance(out[0], redis.ConnectionError), out


# ------------------------------------------------------------------ byte for byte as redis-server

PARITY_SCRIPT = [  # {q}: a queue of this test's own; explicit ids, so both servers answer the same bytes
    ["XADD", "{q}", "1-1", "a", "1"], ["XADD", "{q}", "1-2", "b", "2"], ["XADD", "{q}-t", "2-1", "c", "3"],
    ["XREAD", "STREAMS", "{q}", "0"], ["XREAD", "COUNT", "1", "STREAMS", "{q}", "{q}-t", "0", "0"],
    ["XREAD", "STREAMS", "{q}", "1-1"], ["XREAD", "STREAMS", "{q}", "1"], ["XREAD", "STREAMS", "{q}", "1-2"],
    ["XREAD", "STREAMS", "{q}", "$"], ["XREAD", "STREAMS", "{q}-missing", "0"],
    ["XREAD", "STREAMS", "{q}", "{q}-missing", "0", "0"], ["xread", "count", "0", "streams", "{q}", "0"],
    ["XREAD", "BLOCK", "100", "STREAMS", "{q}", "0"], ["XREAD", "BLOCK", "50", "STREAMS", "{q}", "{q}-t", "$", "$"],
    ["XREAD", "STREAMS", "{q}", "18446744073709551615-18446744073709551615"],
    ["MULTI"], ["XREAD", "BLOCK", "0", "STREAMS", "{q}", "$"], ["XREAD", "BLOCK", "0", "STREAMS", "{q}", "1-1"],
    ["EXEC"],
    ["XREAD", "STREAMS", "{q}", "{q}-t", "0"], ["XREAD", "STREAMS", "{q}", ">"], ["XREAD", "STREAMS", "{q}", "-"],
    ["XREAD", "STREAMS", "{q}", "x"], ["XREAD", "COUNT", "1", "STREAMS"], ["XREAD", "STREAMS", "{q}"],
    ["XREAD", "NOACK", "STREAMS", "{q}", "0"], ["XREAD", "GROUP", "g", "c", "STREAMS", "{q}", "0"],
    ["XREAD", "COUNT", "x", "STREAMS", "{q}", "0"], ["XREAD", "BLOCK", "-1", "STREAMS", "{q}", "0"],
]


def blocked_read_args(queue: str) -> list[str]:
    """A read of what is pushed after it."""
    return ["XREAD", "BLOCK", "10000", "STREAMS", queue, "$"]


def parity_run(port: int, protocol: int, queue: str) -> list[bytes]:
    """PARITY_SCRIPT's replies, then a '$' read woken by a push from another connection."""
    conn, producer = RespConnection(port), RespConnection(port)
    if protocol == 3:
        conn.call(["HELLO", "3"])
    replies = [conn.call([arg.format(q=queue) for arg in args]) for args in PARITY_SCRIPT]
    before = blocked_clients(producer)
    conn.send(encode_command(blocked_read_args(queue)))
    wait_until(lambda: blocked_clients(producer) == before + 1, message="the XREAD to block")
    producer.call(["XADD", queue, "3-1", "n", "woken"])
    replies.append(conn.read_reply())
    conn.close()
    producer.close()
    return replies


def test_replies_are_redis_byte_for_byte(shared_server, redis_server_port, protocol, queue):
    ezra = parity_run(shared_server.port, protocol, queue)
    real = parity_run(redis_server_port, protocol, queue)
    for args, got, want in zip(PARITY_SCRIPT + [blocked_read_args("{q}")], ezra, real):
        assert got == want, args


# ------------------------------------------------------------------ errors, as Redis 7.0 words them

@pytest.mark.parametrize("args, message", [
    (["STREAMS", "q"], "wrong number of arguments for 'xread' command"),
    (["COUNT", "1", "STREAMS"], "syntax error"),
    (["COUNT", "1", "q", "0"], "syntax error"),
    (["FOO", "STREAMS", "q", "0"], "syntax error"),
    (["STREAMS", "q", "q2", "0"],
     "Unbalanced XREAD list of streams: for each stream key an ID or '$' must be specified."),
    (["STREAMS", "q", "abc"], "Invalid stream ID specified as stream command argument"),
    (["STREAMS", "q", "-"], "Invalid stream ID specified as stream command argument"),
    (["STREAMS", "q", "1-*"], "Invalid stream ID specified as stream command argument"),
    (["STREAMS", "q", "18446744073709551616"], "Invalid stream ID specified as stream command argument"),
    (["STREAMS", "q", ">"],
     "The > ID can be specified only when calling XREADGROUP using the GROUP <group> <consumer> option."),
    (["COUNT", "x", "STREAMS", "q", "0"], "value is not an integer or out of range"),
    (["BLOCK", "-1", "STREAMS", "q", "0"], "timeout is negative"),
    (["BLOCK", "x", "STREAMS", "q", "0"], "timeout is not an integer or out of range"),
    (["NOACK", "STREAMS", "q", "0"], "The NOACK option is only supported by XREADGROUP. You called XREAD instead."),
    (["GROUP", "g", "c", "STREAMS", "q", "0"],
     "The GROUP option is only supported by XREADGROUP. You called XREAD instead."),
])
def test_errors_as_redis_words_them(x, args, message):
    with pytest.raises(redis.ResponseError) as failure:
        x.execute_command("XREAD", *args)
    assert str(failure.value) == message


# ------------------------------------------------------------------ only committed entries

def test_an_observer_never_sees_a_push_that_was_rolled_back(small_fs, ezra_factory):
    """The push in the batch that meets the full disk is refused: an observer blocked on its
    queue is not woken by it, and gets the first push that commits once there is room."""
    server = ezra_factory("--disk-reserve", str(2 * 1024 * 1024), data_dir=small_fs)
    client, observer = server.client(), raw(server, 2)
    thread, out = in_thread(lambda: read(observer, "BLOCK", "60000", "STREAMS", "jobs", "$"))
    wait_until(lambda: blocked(client) == 1, message="the XREAD to block")
    filler = leave_free(small_fs, 4 * 1024 * 1024)
    pipe = client.pipeline(transaction=True)
    pipe.xadd("jobs", {"n": "lost"})
    for _ in range(7):
        pipe.xadd("filler", {"pad": b"x" * (1024 * 1024 - 100)})
    assert all(isinstance(reply, redis.ResponseError) for reply in pipe.execute(raise_on_error=False))
    assert "disk full: batch of" in server.log()
    assert not out and blocked(client) == 1, out
    filler.unlink()
    after = wait_until(lambda: _push_accepted(client, "jobs"), 20, message="a push once there is room")
    thread.join(20)
    assert out == [{"jobs": [(after, [b"n", b"after"])]}]


def _push_accepted(client, queue):
    try:
        return client.xadd(queue, {"n": "after"})
    except redis.ResponseError as exc:
        assert "disk full" in str(exc), exc
        time.sleep(0.1)
        return None
