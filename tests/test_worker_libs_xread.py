"""Group-less readers (XREAD) of worker libraries against EZRA: observers that see every entry.

FastStream's StreamSub without a group and walrus's Stream.read read a stream with XREAD
(BLOCK, '$'). On EZRA that is a read-only look: each observer sees every pushed task,
nothing is claimed or counted, and the consumer group's worker still gets each task once.
The socket.io Redis Streams adapter reads this way too, and pushes every broadcast with
XADD MAXLEN ~ 10000: its entries are tasks nobody takes, so they stay available, and trimming,
which removes done tasks only, never removes them (its stream grows until someone drains it).
Since 0.3 it also needs pub/sub (SUBSCRIBE at start, PUBLISH for serverSideEmit), which EZRA
refuses: its Node process exits at start. Its scenario is tests/node/socketio_adapter.js, run
on redis-server first, then on EZRA.

The rows go to build/compat/worker_libs.json with test_worker_libs.py's (support.py's Row and
WORKER_LIBS_RESULTS), which scripts/compat_table.py turns into the README's table.
"""

from __future__ import annotations

import subprocess
import threading
from collections import Counter

import pytest
import redis

from support_compat import NODE_SRC, node_env, node_version
from support_queue import queue_figures
from support_servers import wait_until
from support_worker_libs import (Row, dist_version, first_refusal, record_worker_libs, run_json, short,
                                 walrus_database)

pytestmark = pytest.mark.slow  # worker libraries in their own venvs: not in `pytest -m "not slow"`

N = 20


@pytest.fixture(scope="module", autouse=True)
def compat_json():
    yield
    record_worker_libs()


def delivered(client, queue: str) -> int:
    """Deliveries counted for `queue` since the server started (INFO queues)."""
    return queue_figures(client, queue)["delivered"]


# ------------------------------------------------------------------ FastStream (PyPI, own venv)

FASTSTREAM_OBSERVERS = r"""
import asyncio, json, sys
from faststream.redis import RedisBroker, StreamSub

port, queue, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
url = f"redis://127.0.0.1:{port}"

async def until(condition, seconds):
    async def poll():
        while not condition():
            await asyncio.sleep(0.02)
    await asyncio.wait_for(poll(), seconds)

async def main():
    seen = {"a": [], "b": [], "worker": []}
    observers = {name: RedisBroker(url, log_level=30) for name in ("a", "b")}
    worker = RedisBroker(url, log_level=30)
    def handler(name):
        async def handle(body: str):
            seen[name].append(body)
        return handle
    for name, broker in observers.items():  # stream=name: StreamSub without group, XREAD from '$'
        broker.subscriber(stream=queue)(handler(name))
    worker.subscriber(stream=StreamSub(queue, group="workers", consumer="w1"))(handler("worker"))
    brokers = [*observers.values(), worker]
    for broker in brokers:
        await broker.start()
    # '$' means "after my XREAD": publish until each observer is reading (it saw one), then the tasks.
    warmups = 0
    async def warm():
        nonlocal warmups
        while not all(seen[name] for name in observers):
            await worker.publish(f"warmup {warmups}", stream=queue)
            warmups += 1
            await asyncio.sleep(0.05)
    await asyncio.wait_for(warm(), 10)
    for i in range(n):
        await worker.publish(f"task {i}", stream=queue)
    await worker.publish("end", stream=queue)  # read in order: a duplicate would come before it
    await until(lambda: all("end" in seen[name] for name in seen), 20)
    for broker in brokers:
        await broker.stop()
    print(json.dumps({"seen": seen, "warmups": warmups}))

asyncio.run(main())
"""


def test_faststream_stream_subscriber_without_group(shared_server, queue, venv_python):  # noqa: F811
    row = Row("FastStream (Python), StreamSub without group", dist_version(venv_python, "faststream"))
    out = run_json([str(venv_python), "-c", FASTSTREAM_OBSERVERS, str(shared_server.port), queue, str(N)])
    seen, warmups = out["seen"], out["warmups"]
    tasks = [f"task {i}" for i in range(N)] + ["end"]
    for name in ("a", "b"):
        assert [body for body in seen[name] if not body.startswith("warmup")] == tasks, seen[name]
    assert seen["worker"] == [f"warmup {i}" for i in range(warmups)] + tasks, "the worker got each task once"
    client = shared_server.client()
    wait_until(lambda: client.xpending(queue, "workers")["pending"] == 0, message="every task acked")
    assert client.xlen(queue) == 0
    assert delivered(client, queue) == warmups + N + 1, "the observers' reads delivered nothing"
    client.close()
    row.done("works", "RedisBroker and subscriber(stream=name): StreamSub without group reads with "
                      "XREAD BLOCK (polling_interval) from '$'. Two such subscribers and a consumer group's "
                      "worker: each observer saw every task, in order, once; the worker got each task once "
                      "and acked it; the observers' reads claimed and counted nothing (an observer, not "
                      "fan-out: a task is still done once, by a worker)")


# ------------------------------------------------------------------ walrus (PyPI, in-process)

def test_walrus_stream_read(shared_server, queue):
    walrus, db = walrus_database(shared_server.port)
    row = Row("walrus (Python), Stream.read", walrus.__version__)
    stream = db.Stream(queue)
    pushed = [stream.add({"n": str(i)}) for i in range(N)]
    # Paging from the start: every entry, in order, once.
    pages, last = [], "0-0"
    while page := stream.read(count=7, last_id=last):
        pages.append(page)
        last = page[-1][0]
    assert [entry_id for page in pages for entry_id, _ in page] == pushed
    assert [len(page) for page in pages] == [7, 7, 6]
    assert db.xpending(queue, "workers")["pending"] == 0 and delivered(db, queue) == 0, "nothing claimed"
    # Two observers blocked on '$' both get the next push, at once.
    got: dict[str, list] = {"a": [], "b": []}
    readers = [threading.Thread(target=lambda name=name: got[name].extend(stream.read(block=20000, last_id="$")))
               for name in got]
    before = db.info("clients")["blocked_clients"]
    for reader in readers:
        reader.start()
    wait_until(lambda: db.info("clients")["blocked_clients"] >= before + 2, message="two blocked observers")
    woke = stream.add({"n": "wake"})
    for reader in readers:
        reader.join(10)
    assert got == {"a": [(woke, {b"n": b"wake"})], "b": [(woke, {b"n": b"wake"})]}, got
    assert stream.read(block=100, last_id=woke) == [], "a timeout reads as empty"
    # A consumer group's worker still gets every task, each delivered once.
    group = db.consumer_group("workers", {queue: "0"})
    group.create()
    [(_, tasks)] = group.consumer("w1").read(count=100)
    assert [entry_id for entry_id, _ in tasks] == pushed + [woke]
    assert group.streams[queue].ack(*[entry_id for entry_id, _ in tasks]) == N + 1
    assert delivered(db, queue) == N + 1 and db.xlen(queue) == 0
    db.close()
    row.done("works", "Stream.add, Stream.read(count, last_id) paging from 0-0 and Stream.read(block, "
                      "last_id='$'): every entry in order once; two readers blocked on '$' both woke on one "
                      "push; a timeout reads as []. Nothing was claimed: a consumer group's worker then got "
                      "every task, each delivered once")


# ------------------------------------------------------------------ @socket.io/redis-streams-adapter (npm)

SOCKETIO = str(NODE_SRC / "socketio_adapter.js")
ADAPTER = "@socket.io/redis-streams-adapter"
ADAPTER_02 = "socketio-streams-adapter02"  # tests/node/package.json: npm:@socket.io/redis-streams-adapter@^0.2.3
BROADCAST, SERVER_SIDE_EMIT = "3", "9"  # socket.io-adapter's MessageType, the entries' "type" field
INITIAL_HEARTBEAT, HEARTBEAT = "1", "2"  # 0.2 also sends its heartbeats through the stream
NUDGE = "nudge"  # the scenario's own entries, should a warm-up need them (socketio_adapter.js: warm)


def socketio(port: int, stream: str, package: str, client: str, env: dict) -> dict:
    """Two socket.io servers with the adapter, two clients on each: what each client got."""
    return run_json(["node", SOCKETIO, str(port), stream, str(N), package, client], env=env, timeout=90)


def socketio_on_ezra(server, stream: str, package: str, client: str, env: dict) -> dict:
    """socketio() on EZRA; a failure says what the stream held and what the server logged last."""
    try:
        return socketio(server.port, stream, package, client, env)
    except AssertionError as failure:
        with server.client() as look:
            census = stream_census(look, stream) if look.exists(stream) else "no such stream"
        raise AssertionError(f"{failure}\nthe stream: {census}\nthe server's log, last lines:\n"
                             + "\n".join(server.log().splitlines()[-40:])) from None


def assert_broadcasts(out: dict) -> int:
    """Every client got every broadcast once, each server's in the order it sent them, the room's
    only in the room; the broadcasts the servers sent (each one XADD)."""
    sent = {"A": list(range(0, N, 2)), "B": list(range(1, N, 2))}
    for got in out["clients"]:
        for origin, numbers in sent.items():
            assert [i for name, i in got["all"] if name == origin] == numbers, got
            in_room = [i for i in numbers if i % 3 == 0] if got["room"] else []
            assert [i for name, i in got["inRoom"] if name == origin] == in_room, got
        assert len(got["all"]) == N and sorted(got["ends"]) == ["A", "B"], got
    return sum(out["warmups"].values()) + N + out["rooms"] + 2


def stream_census(client, stream: str) -> tuple[Counter, dict]:
    """The entries' types, and XINFO STREAM's counts."""
    types = Counter(fields[b"type"].decode() for _, fields in client.xrange(stream))
    info = client.xinfo_stream(stream)
    return types, {key: info[key] for key in ("length", "available", "in-flight", "done", "entries-added")}


def assert_never_trimmed(client, stream: str, entries: int) -> None:
    """The adapter's entries are tasks nobody takes: all available, so no trimming removes one;
    a reader of a consumer group that acks them makes them done, and then they trim."""
    assert stream_census(client, stream)[1] == {"length": entries, "available": entries, "in-flight": 0,
                                                "done": 0, "entries-added": entries}
    assert client.xtrim(stream, maxlen=0, approximate=True) == 0, "XTRIM ~ 0 removes none of them"
    assert client.xlen(stream) == entries
    [(_, drained)] = client.xreadgroup("drain", "d1", {stream: ">"}, count=entries + 1)
    assert len(drained) == entries and client.xack(stream, "drain", *[i for i, _ in drained]) == entries
    assert client.xlen(stream) == 0 and stream_census(client, stream)[1]["done"] == entries
    assert client.xtrim(stream, maxlen=0, approximate=True) == entries and client.xrange(stream) == []


class Drainer(threading.Thread):
    """docs/usage.md's advice for the adapter's stream: a consumer group's reader that acks every entry."""

    def __init__(self, port: int, stream: str):
        super().__init__(daemon=True)
        self.client, self.stream = redis.Redis(port=port, socket_timeout=30), stream
        self.stopping, self.acked, self.error = threading.Event(), 0, None

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                for _, entries in self.client.xreadgroup("drain", "d1", {self.stream: ">"}, count=1000, block=100):
                    self.acked += self.client.xack(self.stream, "drain", *[i for i, _ in entries])
        except Exception as error:  # re-raised by stop(), in the test
            self.error = error

    def stop(self) -> int:
        self.stopping.set()
        self.join(10)
        self.client.close()
        if self.error:
            raise self.error
        return self.acked


def test_socketio_redis_streams_adapter_03(shared_server, redis_server_port, queue):
    env = node_env()
    row = Row("@socket.io/redis-streams-adapter (Node.js, on node-redis)", node_version(ADAPTER))
    on_redis = socketio(redis_server_port, queue, ADAPTER, "redis5", env)
    assert_broadcasts(on_redis)
    assert on_redis["unhandled"] == [] and on_redis["serverSideEmit"] == [["from A"]], on_redis
    # As its README shows (no handler for unhandled rejections): its first SUBSCRIBE ends the process.
    client = shared_server.client()
    for redis_client in ("redis5", "ioredis"):
        start = subprocess.run(["node", SOCKETIO, str(shared_server.port), queue, str(N), ADAPTER, redis_client,
                                "startup"], env=env, capture_output=True, text=True, timeout=60)
        assert start.returncode != 0 and '{"started"' not in start.stdout, (start.stdout, start.stderr[-3000:])
        assert first_refusal(start.stderr)[:2] == ("SUBSCRIBE", "Pub/sub channels"), start.stderr[-3000:]
    assert client.xlen(queue) == 0 and client.xrange(queue) == [], "the adapter pushed nothing"
    # With a handler: the broadcasts go through the stream; what goes over pub/sub is refused.
    out = socketio_on_ezra(shared_server, queue, ADAPTER, "redis5", env)
    broadcasts = assert_broadcasts(out)
    refused = [first_refusal(message)[:2] for message in out["unhandled"]]
    assert refused == [("SUBSCRIBE", "Pub/sub channels")] * 2 + [("PUBLISH", "Pub/sub channels")], out["unhandled"]
    assert out["serverSideEmit"] == [], out
    assert stream_census(client, queue)[0] == Counter({BROADCAST: broadcasts, NUDGE: out["nudges"]})
    assert_never_trimmed(client, queue, broadcasts + out["nudges"])
    client.close()
    row.done("fails, clear error",
             "createAdapter(redisClient) as its README shows: each server SUBSCRIBEs at start (since 0.3 "
             "serverSideEmit, emitWithAck and fetchSockets go over pub/sub) and leaves the refusal unhandled, "
             f"so the Node process exits with \"{short(out['unhandled'][0])}\" (node-redis 5 and ioredis alike). "
             "An app that handles unhandled rejections keeps running: then io.emit and room broadcasts go "
             f"through the stream (XADD MAXLEN ~ 10000, XREAD BLOCK 5000 from the last id) and {N} of them, "
             "from two servers, reached each of four clients once, in order; serverSideEmit is refused "
             f"(\"{short(out['unhandled'][2])}\", unhandled too) and never arrives. Its entries are never "
             "acked: XLEN is the number of broadcasts, all available, and XTRIM MAXLEN ~ 0 removes none (see "
             "0.2.3's row). The same run passes on redis-server")


def test_socketio_redis_streams_adapter_02(shared_server, redis_server_port, queue):
    env = node_env()
    row = Row("@socket.io/redis-streams-adapter (Node.js, on ioredis)", node_version(ADAPTER_02))
    on_redis = socketio(redis_server_port, queue, ADAPTER_02, "ioredis", env)
    assert_broadcasts(on_redis)
    assert on_redis["unhandled"] == [] and on_redis["serverSideEmit"] == [["from A"]], on_redis
    client = shared_server.client()
    out = socketio_on_ezra(shared_server, queue, ADAPTER_02, "ioredis", env)
    broadcasts = assert_broadcasts(out)
    assert out["unhandled"] == [] and out["serverSideEmit"] == [["from A"]], out
    types, counts = stream_census(client, queue)
    assert types[BROADCAST] == broadcasts and types[SERVER_SIDE_EMIT] == 1, types
    assert types[INITIAL_HEARTBEAT] >= 2, types
    assert types[NUDGE] == out["nudges"], types
    assert set(types) <= {BROADCAST, SERVER_SIDE_EMIT, INITIAL_HEARTBEAT, HEARTBEAT, NUDGE}, types
    assert_never_trimmed(client, queue, counts["length"])
    # The advice: with a reader that acks each entry as it comes, the servers still read them all
    # (XREAD shows done tasks until they are trimmed), and they are done, for trimming to remove.
    drained = queue + "-drained"
    drainer = Drainer(shared_server.port, drained)
    drainer.start()
    try:
        assert_broadcasts(socketio_on_ezra(shared_server, drained, ADAPTER_02, "ioredis", env))
        wait_until(lambda: client.xlen(drained) == 0, message="the drainer acks every entry")
    finally:
        entries = drainer.stop()  # its XREADGROUP BLOCK must not outlive the test on the shared server
    assert stream_census(client, drained)[1] == {"length": 0, "available": 0, "in-flight": 0, "done": entries,
                                                 "entries-added": entries}
    assert client.xtrim(drained, maxlen=0, approximate=True) == entries
    client.close()
    row.done("works, but its stream is never trimmed",
             "createAdapter(redisClient) on ioredis, as its README shows (0.2's node-redis path imports the "
             "`redis` package itself); every message goes through the stream: XADD MAXLEN ~ 10000 and XREAD "
             f"BLOCK 100 from the last id. Two servers, four clients: {N} io.emit and {out['rooms']} room "
             "broadcasts reached each client once, in order, only the room's members for the room; "
             "serverSideEmit arrived. But no one acks its entries (XREAD takes nothing): they stay available "
             "tasks, which no trimming removes (its MAXLEN ~ 10000, XTRIM MAXLEN ~ 0: none), nor a retention "
             "(done tasks only), so the stream grows with every broadcast and heartbeat: XLEN is the number "
             "of entries pushed, all available. With a consumer group's reader that acks each entry as "
             "it comes (docs/usage.md), the same run delivered every broadcast once and left only done tasks, "
             "which trimming removes; for socket.io fan-out, Redis is the better home")
