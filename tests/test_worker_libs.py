"""Redis-Streams worker libraries against EZRA, and the ones built on Lua, lists or pub/sub.

Each library runs as its README shows, with its defaults: a producer, two consumers of one
consumer group, every task done exactly once and nothing pending. The libraries built on
Lua scripts, lists or pub/sub (BullMQ, Celery, RQ, dramatiq, huey, arq, saq, bee-queue,
NestJS's Redis transport; taskiq-redis, whose stream broker takes a Lua lock) must fail
with EZRA's clear error in front of their user, and not hang (every wait is bounded) or
lose tasks (a producer that pushed nothing was told so; what was pushed is still queued).
Also the black-box tests of EXISTS and TYPE (ezra/commands/keys.py), which walrus needs.

walrus is in setup.cfg's test extra; the others, with their dependencies, go to
build/venv-worker-libs* (made on first use) and build/node (tests/node/package.json).
The Python libraries' apps are in tests/worker_libs/, run with their own command lines.
The libraries whose default producer trims (redis-streams-broker, edx-event-bus-redis,
redisqueue) are in tests/test_worker_libs_trim.py.
Every case records library / version / status / notes in build/compat/worker_libs.json,
which scripts/compat_table.py turns into the README's table.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import redis

from support_compat import NODE_SRC, node_env, node_version, python_venv
from support_servers import ROOT, wait_until
from support_worker_libs import (VENV_REDIS5_REQUIREMENTS, Row, dist_version, first_refusal,
                                 record_worker_libs, refusals, run_json, short, walrus_database)

pytestmark = pytest.mark.slow  # worker libraries in their own venvs: not in `pytest -m "not slow"`

N = 20
APPS = ROOT / "tests" / "worker_libs"


@pytest.fixture(scope="module", autouse=True)
def compat_json():
    yield
    record_worker_libs()


@pytest.fixture(scope="module")
def venv_redis5_python():
    return python_venv("venv-worker-libs-redis5", VENV_REDIS5_REQUIREMENTS)


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


OUTSIDE = [  # what the libraries below send first, and the reason EZRA gives
    (["EVAL", "return 1", "0"], "Lua scripts"), (["EVALSHA", "f" * 40, "0"], "Lua scripts"),
    (["SCRIPT", "EXISTS", "f" * 40], "Lua scripts"), (["LPUSH", "{q}", "x"], "Lists"),
    (["BRPOP", "{q}", "5"], "Lists"), (["BLMOVE", "{q}", "{q}-b", "LEFT", "RIGHT", "5"], "Lists"),
    (["SUBSCRIBE", "{q}"], "Pub/sub channels"), (["PUBLISH", "{q}", "x"], "Pub/sub channels"),
    (["SET", "lock:{q}", "token", "NX"], "Keys other than queues (strings, hashes, sets, sorted sets)"),
    (["WATCH", "{q}"], "Keys other than queues (strings, hashes, sets, sorted sets)"),
    (["DBSIZE"], "Keys other than queues (strings, hashes, sets, sorted sets)"), (["NOSUCHCOMMAND"], None),
]


def test_commands_outside_a_queue_get_a_clear_error(shared_server, queue):
    """Lua, lists, pub/sub, keys: Redis's unknown-command error, then what EZRA is and why the
    command is not there; blocking ones answer at once; nothing is stored."""
    client = shared_server.client()
    started = time.monotonic()
    for command, reason in OUTSIDE:
        command = [arg.replace("{q}", queue) for arg in command]
        with pytest.raises(redis.ResponseError) as failure:
            client.execute_command(*command)
        message = str(failure.value)
        assert message.startswith(f"unknown command '{command[0]}', with args beginning with: "), message
        assert "(EZRA is a task queue; supported: XACK" in message and "XREADGROUP" in message, message
        assert first_refusal(message)[:2] == (command[0], reason), message
    assert time.monotonic() - started < 5, "BRPOP/BLMOVE answer at once, they do not block"
    assert client.ping() and client.xlen(queue) == 0 and client.exists(queue, "lock:" + queue) == 0
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
    # ... and so is the default create(): it adds a placeholder {'': ''} and XDELs it, and XDEL
    # deletes a task nobody holds (as Redis deletes the entry), so no placeholder is left.
    placeholder = db.consumer_group("workers", [queue + "-default"])
    placeholder.create()
    assert db.exists(queue + "-default") == 1  # the placeholder's XADD made the queue
    assert placeholder.read(count=10) == [] and db.xlen(queue + "-default") == 0
    db.close()
    row.done("works", "ConsumerGroup: create(), consumer(), read(count, block), ack: two consumers, "
                      "every task once, nothing pending; a blocking read wakes on a push. On a queue "
                      "nobody pushed to yet, the default create() adds a placeholder entry {'': ''} and "
                      "XDELs it: EZRA's XDEL deletes a task nobody holds, so, as on Redis, nothing is left "
                      "(create(ensure_keys_exist=False, mkstream=True) makes no placeholder at all)")


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


# ------------------------------------------------------------------ taskiq-redis, dramatiq, huey, arq, saq (PyPI)

class Worker:
    """A library's worker command line, in its own process group, its output in a file."""

    def __init__(self, command: list, env: dict, log: Path):
        self.log, self.exited = log, None
        with open(log, "ab") as out:  # O_APPEND: each worker process's write lands whole at the end
            self.proc = subprocess.Popen([str(arg) for arg in command], stdout=out, stderr=subprocess.STDOUT,
                                         env=env, cwd=log.parent, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, condition, timeout: float = 30) -> str:
        """Its output once `condition(output)` holds or it has exited; a timeout fails the test."""
        wait_until(lambda: self.proc.poll() is not None or condition(self.output()), timeout,
                   message=f"{self.proc.args[:4]} to show it (output: {self.log})")
        self.exited = self.proc.poll()
        return self.output()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its process group: the workers it forked too
        self.proc.wait(10)


@pytest.fixture
def start_worker(tmp_path):
    """start_worker(command, env): a Worker; whatever still runs is killed at the end."""
    started: list[Worker] = []

    def start(command: list, env: dict) -> Worker:
        started.append(Worker(command, env, tmp_path / f"worker{len(started)}.log"))
        return started[-1]

    yield start
    for worker in started:
        worker.kill()


def app_env(server, queue: str, **more: str) -> dict:
    return dict(os.environ, EZRA_PORT=str(server.port), QUEUE=queue, PYTHONPATH=str(APPS), **more)


def produce(python, app: str, env: dict, n: int = N) -> dict:
    """tests/worker_libs/<app>.py's producer: version, how many pushes returned, the error."""
    return run_json([str(python), "-c", f"import {app}; {app}.produce({n})"], env=env, timeout=60)


def queues(server) -> set[str]:
    client = server.client()
    names = set(client.info("queues"))
    client.close()
    return names


def stream_counts(server, queue: str) -> dict:
    """XINFO STREAM's task counts: available, in-flight, done, dead..."""
    client = server.client()
    reply = client.execute_command("XINFO", "STREAM", queue)
    client.close()
    fields = dict(zip(reply[::2], reply[1::2]))
    return {key.decode(): fields[key] for key in (b"available", b"delayed", b"in-flight", b"done", b"dead")}


def done_lines(output: str) -> list[tuple[int, int]]:
    """The tasks a worker ran: (n, pid) of each "DONE n pid" line the apps print."""
    return [(int(n), int(pid)) for n, pid in re.findall(r"^DONE (\d+) (\d+)$", output, re.M)]


def test_taskiq_redis_stream_broker_fails_clearly(shared_server, queue, venv_python, start_worker):
    env = app_env(shared_server, queue, BROKER="stream")
    out = produce(venv_python, "taskiq_app", env)
    row = Row("taskiq-redis (Python, RedisStreamBroker)", f"{out['version']} (taskiq {out['taskiq']})")
    assert out["error"] is None and out["pushed"] == N, out  # XGROUP CREATE ... MKSTREAM, XADD
    worker = start_worker([venv_python, "-m", "taskiq", "worker", "taskiq_app:broker"], env)  # 2 processes
    log = worker.wait_for(lambda log: "unknown command 'SCRIPT'" in log and "is dead. Scheduling reload" in log)
    assert worker.exited is None, log[-3000:]  # its process manager restarts the dead worker
    command, reason, error = first_refusal(log)
    assert (command, reason) == ("SCRIPT", "Lua scripts") and "'EXISTS'" in error, error
    worker.kill()
    counts = stream_counts(shared_server, queue)
    assert counts["dead"] == 0 and counts["available"] + counts["in-flight"] + counts["done"] == N, counts
    assert len({n for n, _ in done_lines(log)}) >= counts["done"], "an acked task ran"
    row.done("fails, clear error",
             "kiq() works (XGROUP CREATE ... MKSTREAM, XADD) and a worker hands its first XREADGROUP's tasks "
             "to its functions; then listen() takes a redis-py Lock around its XAUTOCLAIM, in a pipeline "
             "that first loads the Lock's Lua release script (SCRIPT EXISTS, then MULTI, SET NX, XAUTOCLAIM, "
             f"EVALSHA, EXEC): \"{short(error)}\". The worker process dies of it and `taskiq worker` restarts "
             "it, to die again after each read. Nothing is lost: every task stays in the queue, done, "
             "available, or in flight until its visibility timeout. No option turns the lock off (listen() "
             "takes it whatever the settings); a subclass without that step runs: see \"RedisStreamBroker "
             "without its lock\"")


def test_taskiq_redis_without_the_lock_works(shared_server, queue, venv_python, start_worker):
    """The patch: RedisStreamBroker.listen without its locked XAUTOCLAIM (tests/worker_libs/taskiq_app.py)."""
    env = app_env(shared_server, queue, BROKER="ezra")
    client = shared_server.client()

    def blocked():
        return client.info("clients")["blocked_clients"]

    wait_until(lambda: blocked() == 0, message="the readers of earlier tests to be gone")
    worker = start_worker([venv_python, "-m", "taskiq", "worker", "taskiq_app:broker"], env)  # 2 processes
    wait_until(lambda: worker.proc.poll() is None and blocked() == 2, 30,
               message=f"two taskiq worker processes waiting in XREADGROUP ({worker.log})")
    out = produce(venv_python, "taskiq_app", env)
    row = Row("taskiq-redis (Python, RedisStreamBroker without its lock)", f"{out['version']} (taskiq {out['taskiq']})")
    assert out["error"] is None and out["pushed"] == N, out
    wait_until(lambda: len(done_lines(worker.output())) >= N and client.xpending(queue, "taskiq")["pending"] == 0,
               30, message=f"every task done and acked ({worker.log})")
    done = done_lines(worker.output())
    assert sorted(n for n, _ in done) == list(range(N)), "every task exactly once"
    assert len({pid for _, pid in done}) == 2, "both worker processes took tasks"
    assert client.xlen(queue) == 0 and "unknown command" not in worker.output(), worker.output()[-3000:]
    client.close()
    row.done("works with a patch",
             "class EzraStreamBroker(RedisStreamBroker) whose listen() is RedisStreamBroker.listen's first "
             "half only: XREADGROUP (COUNT 100, BLOCK 2000) and an AckableMessage per task, acked with "
             "XACK (self._ack_generator); it drops the pipe.lock() / XAUTOCLAIM / lock.release() step, which "
             "EZRA does not need: a task whose worker died is delivered again by XREADGROUP after the "
             "visibility timeout (11 lines, tests/worker_libs/taskiq_app.py). kiq() and `taskiq worker` with "
             "two processes: every task once, by both, nothing pending")


def test_dramatiq_fails_clearly(shared_server, queue, venv_python, start_worker):
    env, before = app_env(shared_server, queue), queues(shared_server)
    out = produce(venv_python, "dramatiq_app", env)
    row = Row("dramatiq (Python, RedisBroker)", out["version"])
    command, reason, error = first_refusal(out["error"])
    assert (command, reason, out["pushed"]) == ("EVALSHA", "Lua scripts", 0), out
    worker = start_worker([venv_python, "-m", "dramatiq", "dramatiq_app", "--processes", "1", "--threads", "2"], env)
    log = worker.wait_for(lambda log: "Restarting consumer" in log)
    assert worker.exited is None and first_refusal(log)[:2] == ("EVALSHA", "Lua scripts"), log[-3000:]
    assert queues(shared_server) == before, "nothing half-written"
    row.done("fails, clear error",
             "messages live in lists and hashes changed by Lua scripts: actor.send() raises "
             f"\"{short(error)}\" (the broker's first script, maxstack.lua, probes Lua's stack before "
             "dispatch.lua would push); the `dramatiq` worker's consumers log the same error and restart "
             "every 3 s")


def test_huey_fails_clearly(shared_server, queue, venv_python, start_worker):
    env, before = app_env(shared_server, queue), queues(shared_server)
    out = produce(venv_python, "huey_app", env)
    row = Row("huey (Python, RedisHuey)", out["version"])
    command, reason, error = first_refusal(out["error"])
    assert (command, reason, out["pushed"]) == ("LPUSH", "Lists", 0), out
    worker = start_worker([venv_python, "-m", "huey.bin.huey_consumer", "huey_app.huey", "--workers", "2"], env)
    log = worker.wait_for(lambda log: {"BRPOP", "EVALSHA"} <= set(refusals(log)))
    assert worker.exited is None and "Error reading from queue" in log, log[-3000:]
    assert refusals(log)["BRPOP"] == "Lists" and refusals(log)["EVALSHA"] == "Lua scripts"
    assert queues(shared_server) == before, "nothing half-written"
    row.done("fails, clear error",
             f"tasks live in lists: calling a task raises \"{short(error)}\"; `huey_consumer`'s workers log "
             "\"Error reading from queue\" with BRPOP's error and retry, its scheduler logs EVALSHA's "
             "(a Lua script reads the schedule)")


def test_arq_fails_clearly(shared_server, queue, venv_redis5_python, start_worker):
    env, before = app_env(shared_server, queue), queues(shared_server)
    out = produce(venv_redis5_python, "arq_app", env)
    row = Row("arq (Python)", out["version"])
    command, reason, error = first_refusal(out["error"])
    assert (command, out["pushed"]) == ("WATCH", 0) and reason.startswith("Keys other than queues"), out
    assert first_refusal(out["worker"])[0] == "DBSIZE", out["worker"]
    worker = start_worker([venv_redis5_python, "-m", "arq", "arq_app.WorkerSettings"], env)
    log = worker.wait_for(lambda log: False)  # it exits
    assert worker.exited not in (None, 0) and first_refusal(log)[0] == "DEL", log[-3000:]
    assert queues(shared_server) == before, "nothing half-written"
    row.done("fails, clear error",
             "jobs live in sorted sets and string keys: enqueue_job() raises "
             f"\"{short(error)}\" (it WATCHes the job's key in a transaction); the `arq` worker exits at "
             "start: its first refused command is DBSIZE (it logs the server's figures), but the error it "
             f"prints is its cleanup's: \"{short(first_refusal(log)[2])}\"")


def test_saq_fails_clearly(shared_server, queue, venv_redis5_python, start_worker):
    env, before = app_env(shared_server, queue), queues(shared_server)
    out = produce(venv_redis5_python, "saq_app", env)
    row = Row("saq (Python, Redis queue)", out["version"])
    command, reason, error = first_refusal(out["error"])
    assert (command, reason, out["pushed"]) == ("EVALSHA", "Lua scripts", 0), out
    client = shared_server.client()
    commands = client.info("stats")["total_commands_processed"]
    worker = start_worker([venv_redis5_python, "-m", "saq", "saq_app.settings"], env)
    worker.wait_for(lambda log: "Upkeep task failed unexpectedly" in log and "EVALSHA" in refusals(log))
    # its dequeue's BLMOVE is refused at once and tried again at once: a busy loop, not logged
    wait_until(lambda: client.info("stats")["total_commands_processed"] - commands > 1000, 20,
               message="saq's worker to send a thousand commands")
    worker.kill()
    client.close()
    log = worker.output()
    assert worker.exited is None and refusals(log)["EVALSHA"] == "Lua scripts", log[-3000:]
    assert "BLMOVE" not in refusals(log), log[-3000:]
    assert queues(shared_server) == before, "nothing half-written"
    row.done("fails, clear error",
             f"jobs live in lists and hashes changed by Lua scripts: enqueue() raises \"{short(error)}\"; "
             "the `saq` worker logs \"Upkeep task failed unexpectedly\" with the same error again and again, "
             "and "
             "its dequeue (BLMOVE) fails without a log and is tried again at once, again and again")


# ------------------------------------------------------------------ bee-queue, NestJS (npm)

def test_bee_queue_fails_clearly(shared_server, queue):
    env, before = node_env(), queues(shared_server)
    row = Row("bee-queue (Node.js)", node_version("bee-queue"))
    out = run_json(["node", str(NODE_SRC / "bee_queue.js"), str(shared_server.port), queue], env=env, timeout=60)
    defaults, quiet = out["defaults"], out["noEvents"]
    for step in ("save", "ready"):
        assert first_refusal(defaults[step])[:2] == ("SUBSCRIBE", "Pub/sub channels"), out
        assert first_refusal(quiet[step])[:2] == ("SCRIPT", "Lua scripts"), out
    assert defaults["workerErrors"] and first_refusal(defaults["workerErrors"][0])[0] == "SUBSCRIBE", out
    assert queues(shared_server) == before, "nothing half-written"
    row.done("fails, clear error",
             "jobs live in lists and hashes changed by Lua scripts, announced on pub/sub: with its defaults "
             f"createJob().save() rejects with \"{short(defaults['save'])}\" (its job events channel) and a "
             "worker queue emits it as an error and never becomes ready; with getEvents: false the first "
             f"refusal is the scripts' loading: \"{short(quiet['save'])}\"")


def test_nestjs_redis_transport_fails_clearly(shared_server, queue):
    env, before = node_env(), queues(shared_server)
    row = Row("NestJS microservices (Node.js, Redis transport)", node_version("@nestjs/microservices"))
    script, port = str(NODE_SRC / "nestjs.js"), str(shared_server.port)
    client = run_json(["node", script, port, queue, "client"], env=env, timeout=60)
    assert first_refusal(client["send"])[:2] == ("SUBSCRIBE", "Pub/sub channels"), client
    assert first_refusal(client["emit"])[:2] == ("PUBLISH", "Pub/sub channels"), client
    server = subprocess.run(["node", script, port, queue, "server"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert server.returncode != 0 and '{"listen"' not in server.stdout, server.stdout
    command, reason, error = first_refusal(server.stderr)
    assert (command, reason) == ("SUBSCRIBE", "Pub/sub channels"), server.stderr[-3000:]
    assert queues(shared_server) == before, "nothing half-written"
    row.done("fails, clear error",
             "the transport is pub/sub (requests PUBLISHed, replies on a subscribed channel): a ClientProxy's "
             f"send() errors with \"{short(client['send'])}\" (its reply channel), emit() with "
             f"\"{short(client['emit'])}\"; NestFactory.createMicroservice(...).listen() SUBSCRIBEs to its "
             "patterns, the rejection is unhandled and the Node.js process exits with it")
