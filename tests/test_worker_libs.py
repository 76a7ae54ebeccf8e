"""Redis-Streams worker libraries against EZRA, and the list-based ones that cannot work.

Each library runs as its README shows, with its defaults: a producer, two consumers of one
consumer group, every task done exactly once and nothing pending. The libraries built on
Redis lists and Lua (RQ, Celery, BullMQ) must fail at once with EZRA's clear error, not
hang or lose tasks.
Also the black-box tests of EXISTS and TYPE (ezra/commands_keys.py), which walrus needs.

walrus is in setup.cfg's test extra; the others, with their dependencies, go to
build/venv-worker-libs (made on first use) and build/node (tests/node/package.json).
The libraries whose default producer trims (redis-streams-broker, edx-event-bus-redis,
redisqueue) are in tests/test_worker_libs_trim.py.
Every case records library / version / status / notes in build/compat/worker_libs.json,
which scripts/compat_table.py turns into the README's table.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest
import redis

from conftest import wait_until
from test_clients import NODE_SRC, node_env, node_version, python_venv, record_results

N = 20
RESULTS: list[dict] = []
VENV_REQUIREMENTS = ["celery[redis]>=5.4,<6", "rq>=2,<4", "faststream[redis]>=0.6,<0.8"]


@pytest.fixture(scope="module", autouse=True)
def compat_json():
    yield
    record_results("worker_libs", RESULTS, key=lambda e: (e["library"], e["version"]))


class Row:
    """One library's line in the README: it starts as a failure until the test says otherwise."""

    def __init__(self, library: str, version: str):
        self.entry = dict(library=library, version=version, status="fail (test did not finish)",
                          notes="", when=time.strftime("%Y-%m-%d %H:%M:%S"))
        RESULTS.append(self.entry)

    def done(self, status: str, notes: str) -> None:
        self.entry.update(status=status, notes=notes)


def short(message: str) -> str:
    """An error for the README's table, without what varies from run to run (the arguments,
    the list of supported commands): "unknown command 'SET', with args beginning with: … (EZRA
    is a task queue; …)"."""
    head, hint, _ = message.partition(" (EZRA is a task queue;")
    command, args, _ = head.partition(" with args beginning with:")
    return command + (" with args beginning with: …" if args else "") + (" (EZRA is a task queue; …)" if hint else "")


@pytest.fixture(scope="module")
def venv_python():
    return python_venv("venv-worker-libs", VENV_REQUIREMENTS)


def dist_version(python, distribution: str) -> str:
    """The installed version of a distribution in another interpreter (build/venv-*)."""
    return subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({distribution!r}))"],
                          capture_output=True, text=True, check=True).stdout.strip()


def run_json(command: list[str], timeout: float = 60, **kwargs) -> dict:
    """Run a scenario script; its last stdout line that is a JSON object is its summary."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])


def assert_once(pushed: list[str], done: dict[str, list[str]]) -> None:
    """Every pushed task done exactly once (by either consumer)."""
    all_done = [task for tasks in done.values() for task in tasks]
    assert len(set(pushed)) == len(pushed) == N
    assert sorted(all_done) == sorted(pushed), "every task exactly once"


# ------------------------------------------------------------------ EXISTS and TYPE

def keys_scenario(client: redis.Redis, queue: str) -> list:
    """What EXISTS and TYPE answer before and after a stream (a queue) is made."""
    answers = [client.exists(queue), client.type(queue)]
    client.xgroup_create(queue, "workers", id="0", mkstream=True)
    answers += [client.exists(queue), client.exists(queue, queue + "-other", queue), client.type(queue)]
    client.xadd(queue, {"n": "1"})
    answers += [client.exists(queue), client.type(queue), client.type(queue + "-other")]
    return answers


def test_exists_and_type(r, queue):
    assert keys_scenario(r, queue) == [0, b"none", 1, 2, b"stream", 1, b"stream", b"none"]
    assert r.exists(queue + "::dead") == 1 and r.type(queue + "::dead") == b"stream"  # its dead-letter view
    configured = queue + "-configured"
    assert r.execute_command("XCFGSET", configured, "VISIBILITY-TIMEOUT", "5") == b"OK"
    assert r.exists(configured) == 1 and r.type(configured) == b"stream"  # XCFGSET makes the queue
    for bad in (["EXISTS"], ["TYPE"], ["TYPE", queue, queue]):
        with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
            r.execute_command(*bad)


def test_exists_and_type_answer_as_redis(shared_server, redis_server_port, queue):
    ezra, real = shared_server.client(), redis.Redis(port=redis_server_port)
    assert keys_scenario(ezra, queue) == keys_scenario(real, queue)
    for client in (ezra, real):
        client.close()


def test_list_commands_get_a_clear_error(shared_server, queue):
    """RQ, Celery, BullMQ... speak lists: Redis's unknown-command error, then what EZRA is."""
    client = shared_server.client()
    started = time.monotonic()
    for command in (["LPUSH", queue, "x"], ["RPUSH", queue, "x"], ["BRPOP", queue, "5"],
                    ["BLMOVE", queue, queue + "-b", "LEFT", "RIGHT", "5"], ["EVAL", "return 1", "0"]):
        with pytest.raises(redis.ResponseError) as failure:
            client.execute_command(*command)
        message = str(failure.value)
        assert message.startswith(f"unknown command '{command[0]}', with args beginning with: "), message
        assert "(EZRA is a task queue; supported: XACK" in message and "XREADGROUP" in message, message
    assert time.monotonic() - started < 5, "BRPOP/BLMOVE answer at once, they do not block"
    assert client.ping() and client.xlen(queue) == 0
    client.close()


def test_transactional_pipelines(shared_server, queue, protocol):
    """redis-py's default pipeline wraps its commands in MULTI/EXEC: they all run, in order;
    a command refused while queuing (here an unknown one) aborts them all, nothing stored."""
    client = shared_server.client(protocol)
    ids = client.pipeline().xadd(queue, {"n": "1"}).xadd(queue, {"n": "2"}).xlen(queue).execute()
    assert ids[2] == 2 and client.xlen(queue) == 2
    refused = client.pipeline()
    refused.xadd(queue, {"n": "3"}).execute_command("LPUSH", queue, "x")
    with pytest.raises(redis.ResponseError):
        refused.execute()
    assert client.xlen(queue) == 2, "EXECABORT: the queued XADD did not run"
    plain = client.pipeline(transaction=False)
    assert len(plain.xadd(queue, {"n": "3"}).xadd(queue, {"n": "4"}).execute()) == 2
    assert client.xlen(queue) == 4
    client.close()


# ------------------------------------------------------------------ walrus (PyPI, in-process)

def walrus_database(port: int):
    try:
        import walrus
    except ImportError:
        pytest.skip("walrus is not installed (pip install -e '.[test]')")
    return walrus, walrus.Database(port=port)


def test_walrus_consumer_group(shared_server, queue):
    walrus, db = walrus_database(shared_server.port)
    row = Row("walrus (Python)", walrus.__version__)
    producer = db.consumer_group("workers", {queue: "0"})  # from the start, as Redis needs it
    pushed = [producer.streams[queue].add({"n": str(i)}).decode() for i in range(N)]
    assert producer.create() == {queue: True}  # default create(): EXISTS, TYPE, XGROUP CREATE
    done: dict[str, list[str]] = {"w1": [], "w2": []}
    errors = []

    def work(name):
        consumer = producer.consumer(name)
        try:
            while sum(map(len, done.values())) < N:
                for _, tasks in consumer.read(count=1, block=500):
                    for task_id, fields in tasks:
                        assert fields[b"n"].isdigit(), fields
                        assert consumer.streams[queue].ack(task_id) == 1
                        done[name].append(task_id.decode())
        except Exception as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(name,)) for name in done]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    assert_once(pushed, done)
    assert producer.streams[queue].pending() == []

    # a blocking read wakes on a push
    got = []
    reader = threading.Thread(target=lambda: got.extend(producer.consumer("w1").read(count=1, block=10000)))
    reader.start()
    wait_until(lambda: db.info("clients")["blocked_clients"] >= 1, message="a blocked reader")
    task_id = producer.streams[queue].add({"n": "wake"})
    reader.join(10)
    assert [t[0] for _, tasks in got for t in tasks] == [task_id]
    producer.streams[queue].ack(task_id)

    # a queue nobody pushed to: create(ensure_keys_exist=False, mkstream=True) is clean ...
    fresh = db.consumer_group("workers", [queue + "-fresh"])
    assert fresh.create(ensure_keys_exist=False, mkstream=True) == {queue + "-fresh": True}
    assert fresh.read(count=10) == []
    # ... the default create() adds a placeholder {'': ''} and XDELs it: XDEL is a failure
    # report in EZRA, so the placeholder stays a task (measured here, told in the README).
    placeholder = db.consumer_group("workers", [queue + "-default"])
    placeholder.create()
    [(_, tasks)] = placeholder.read(count=10)
    assert tasks == [(b"0-1", {b"": b""})], tasks
    placeholder.streams[queue + "-default"].ack(b"0-1")
    db.close()
    row.done("works", "ConsumerGroup: create(), consumer(), read(count, block), ack: two consumers, "
                      "every task once, nothing pending; a blocking read wakes on a push. On a queue "
                      "nobody pushed to yet, use create(ensure_keys_exist=False, mkstream=True): the "
                      "default create() adds a placeholder entry {'': ''} and XDELs it, and EZRA's XDEL "
                      "is a failure report, so the placeholder stays a task")


# ------------------------------------------------------------------ FastStream (PyPI, own venv)

FASTSTREAM_SCENARIO = r"""
import asyncio, json, sys
from faststream.redis import RedisBroker, StreamSub

port, queue, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])

async def main():
    broker = RedisBroker(f"redis://127.0.0.1:{port}", log_level=30)  # warnings only
    done, finished = {"w1": [], "w2": []}, asyncio.Event()
    def handler(name):
        async def handle(body: str):
            done[name].append(body)
            if sum(map(len, done.values())) >= n:
                finished.set()
        return handle
    for name in done:  # two subscribers of one consumer group, each its own consumer name
        broker.subscriber(stream=StreamSub(queue, group="workers", consumer=name))(handler(name))
    async with broker:
        await broker.start()
        for i in range(n):
            await broker.publish(f"task {i}", stream=queue)
        await asyncio.wait_for(finished.wait(), 20)
        await asyncio.sleep(0)
    print(json.dumps({"done": done}))

asyncio.run(main())
"""


def test_faststream_stream_subscriber(shared_server, queue, venv_python):
    row = Row("FastStream (Python)", dist_version(venv_python, "faststream"))
    out = run_json([str(venv_python), "-c", FASTSTREAM_SCENARIO, str(shared_server.port), queue, str(N)])
    assert_once([f"task {i}" for i in range(N)], out["done"])
    client = shared_server.client()
    wait_until(lambda: client.xpending(queue, "workers")["pending"] == 0, message="every task acked")
    assert client.xlen(queue) == 0
    client.close()
    row.done("works", "RedisBroker, publish(stream=...) and two StreamSub(stream, group, consumer) "
                      "subscribers: every task once, acked after its handler returned, nothing pending")


# ------------------------------------------------------------------ BullMQ, RQ and Celery: lists, clear errors

def test_bullmq_fails_clearly(shared_server, queue):
    env = node_env()
    row = Row("BullMQ (Node.js)", node_version("bullmq"))
    out = run_json(["node", str(NODE_SRC / "bullmq.js"), str(shared_server.port), queue], env=env, timeout=30)
    for step in ("add", "worker"):
        assert out[step] and "unknown command 'eval" in out[step] and "EZRA is a task queue" in out[step], out
    assert out["workerErrors"] == 3, out
    row.done("fails, clear error",
             "jobs live in lists, hashes and sorted sets changed by Lua scripts: Queue.add rejects with "
             f"\"{short(out['add'])}\"; a Worker emits \"{short(out['worker'])}\" and retries, "
             "emitting it again and again")



RQ_SCENARIO = r"""
import json, sys, warnings
import redis, rq
warnings.simplefilter("ignore")  # rq warns that CLIENT LIST is missing
conn = redis.Redis(port=int(sys.argv[1]))
queue = rq.Queue(sys.argv[2], connection=conn)
out = {"version": rq.__version__}
for step, call in (("enqueue", lambda: queue.enqueue(print, "hello")),
                   ("worker", lambda: rq.Worker([queue], connection=conn).work(burst=True))):
    try:
        call()
        out[step] = None
    except redis.ResponseError as error:
        out[step] = str(error)
print(json.dumps(out))
"""


def test_rq_fails_clearly(shared_server, queue, venv_python):
    out = run_json([str(venv_python), "-c", RQ_SCENARIO, str(shared_server.port), queue], timeout=30)
    row = Row("RQ (Python)", out["version"])
    for step in ("enqueue", "worker"):
        assert out[step] and "unknown command" in out[step] and "EZRA is a task queue" in out[step], out
    row.done("fails, clear error",
             "built on lists, sets and hashes, not streams: Queue.enqueue raises ResponseError "
             f"\"{short(out['enqueue'])}\", and so does Worker.work: \"{short(out['worker'])}\"")


CELERY_APP = r"""
import os
from celery import Celery
app = Celery("ezra_probe", broker="redis://127.0.0.1:%s/0" % os.environ["EZRA_PORT"])
app.conf.task_default_queue = os.environ["QUEUE"]

@app.task
def add(x, y):
    return x + y
"""

CELERY_PRODUCER = r"""
import json
import celery, kombu
from ezra_probe import add
try:
    add.delay(2, 3)
    error = None
except Exception as failure:
    error = f"{type(failure).__module__}.{type(failure).__name__}: {failure}"
print(json.dumps({"version": celery.__version__, "kombu": kombu.__version__, "delay": error}))
"""


def test_celery_fails_clearly(shared_server, queue, venv_python, tmp_path):
    (tmp_path / "ezra_probe.py").write_text(CELERY_APP)
    env = dict(os.environ, EZRA_PORT=str(shared_server.port), QUEUE=queue)
    out = run_json([str(venv_python), "-c", CELERY_PRODUCER], cwd=tmp_path, env=env, timeout=60)
    row = Row("Celery (Python, redis broker)", f"{out['version']} (kombu {out['kombu']})")
    assert out["delay"] and "unknown command" in out["delay"] and "EZRA is a task queue" in out["delay"], out
    worker = subprocess.run([str(venv_python), "-m", "celery", "-A", "ezra_probe", "worker", "--pool", "solo",
                             "--loglevel", "warning"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=60)
    last = worker.stderr.strip().splitlines()[-1] if worker.stderr.strip() else ""
    assert worker.returncode != 0 and "unknown command" in last and "EZRA is a task queue" in last, \
        worker.stderr[-2000:]
    row.done("fails, clear error",
             "kombu's redis transport uses lists and sets, not streams: task.delay() raises "
             f"{short(out['delay'])}; `celery worker` exits at start with {short(last)}")
