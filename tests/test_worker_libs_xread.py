"""Group-less readers (XREAD) of worker libraries against EZRA: observers that see every entry.

FastStream's StreamSub without a group and walrus's Stream.read read a stream with XREAD
(BLOCK, '$'). On EZRA that is a read-only look: each observer sees every pushed task,
nothing is claimed or counted, and the consumer group's worker still gets each task once.
The socket.io redis-streams adapter also reads this way, but every publish it makes
trims (XADD MAXLEN ~ maxLen, with no option to turn it off), so it has no case here.

The rows go to build/compat/worker_libs.json with test_worker_libs.py's (its Row and
RESULTS), which scripts/compat_table.py turns into the README's table.
"""

from __future__ import annotations

import threading

import pytest

import test_worker_libs as worker_libs
from conftest import wait_until
from test_clients import record_results
from test_worker_libs import Row, dist_version, run_json, venv_python, walrus_database  # noqa: F401

N = 20


@pytest.fixture(scope="module", autouse=True)
def compat_json():
    yield
    record_results("worker_libs", worker_libs.RESULTS, key=lambda e: (e["library"], e["version"]))


def delivered(client, queue: str) -> int:
    """Deliveries counted for `queue` since the server started (INFO queues)."""
    return client.info("queues")[f"queue_{queue}"]["delivered"]


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
