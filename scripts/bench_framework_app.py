"""The no-op task app of scripts/bench_frameworks.py: one module, the framework and broker from the environment.

    BENCH_FRAMEWORK   celery | dramatiq | taskiq
    BENCH_BROKER      ezra (the shipped broker: ezra.celery.Transport, ezra.dramatiq.EzraBroker,
                      ezra.taskiq.EzraStreamBroker) | redis (the framework's own Redis broker)
    BENCH_PORT, BENCH_QUEUE, BENCH_DONE (the file each task appends "<n> <time.time()>" to)

The worker imports it (`celery -A`, `dramatiq`, `taskiq worker ...:broker`); the producer runs
`produce(first, n, warmup)`, which prints one JSON line with the times of its pushes.
Runs in an interpreter that has the frameworks (build/venv-frameworks), not bench.py's.
"""

import asyncio
import json
import os
import time

FRAMEWORK = os.environ["BENCH_FRAMEWORK"]
BROKER = os.environ["BENCH_BROKER"]
PORT = int(os.environ["BENCH_PORT"])
QUEUE = os.environ["BENCH_QUEUE"]
DONE = os.environ["BENCH_DONE"]
WARMUP_DEADLINE = 120.0  # seconds the producer waits for the warm-up tasks (a worker starting under load)

_done_fd = None


def record(n):
    """One O_APPEND write per task, so the processes of a worker can share the file."""
    global _done_fd
    if _done_fd is None:
        _done_fd = os.open(DONE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(_done_fd, b"%d %.6f\n" % (n, time.time()))


def done_count():
    try:
        with open(DONE, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


if FRAMEWORK == "celery":
    from celery import Celery

    if BROKER == "ezra":
        import ezra.celery  # noqa: F401  registers ezra://
        app = Celery("bench_framework_app", broker=f"ezra://127.0.0.1:{PORT}")
    else:
        app = Celery("bench_framework_app", broker=f"redis://127.0.0.1:{PORT}/0")
    app.conf.task_default_queue = QUEUE
    app.conf.task_ignore_result = True

    @app.task
    def noop(n):
        record(n)

    def push(first, n):
        for i in range(first, first + n):
            noop.delay(i)

elif FRAMEWORK == "dramatiq":
    import dramatiq

    if BROKER == "ezra":
        from ezra.dramatiq import EzraBroker
        dramatiq.set_broker(EzraBroker(url=f"redis://127.0.0.1:{PORT}"))
    else:
        from dramatiq.brokers.redis import RedisBroker
        dramatiq.set_broker(RedisBroker(url=f"redis://127.0.0.1:{PORT}/0"))

    @dramatiq.actor(queue_name=QUEUE, max_retries=0)
    def noop(n):
        record(n)

    def push(first, n):
        for i in range(first, first + n):
            noop.send(i)

elif FRAMEWORK == "taskiq":
    if BROKER == "ezra":
        from ezra.taskiq import EzraStreamBroker as StreamBroker
    else:
        from taskiq_redis import RedisStreamBroker as StreamBroker
    broker = StreamBroker(f"redis://127.0.0.1:{PORT}", queue_name=QUEUE)

    @broker.task
    async def noop(n: int) -> None:
        record(n)

    def push(first, n):
        async def kiq_all():
            for i in range(first, first + n):
                await noop.kiq(i)
        asyncio.get_event_loop().run_until_complete(kiq_all())

else:
    raise SystemExit(f"BENCH_FRAMEWORK={FRAMEWORK!r}: expected celery, dramatiq or taskiq")


def produce(first, n, warmup):
    """Push `warmup` tasks and wait until the worker ran them, then push n more and say when."""
    if FRAMEWORK == "taskiq":
        asyncio.set_event_loop(asyncio.new_event_loop())
        asyncio.get_event_loop().run_until_complete(broker.startup())
    push(0, warmup)
    deadline = time.monotonic() + WARMUP_DEADLINE
    while done_count() < warmup:
        if time.monotonic() > deadline:
            raise SystemExit(f"the worker ran {done_count()} of {warmup} warm-up tasks in {WARMUP_DEADLINE}s")
        time.sleep(0.01)  # polls the worker's file; not part of the measured pushes
    t0 = time.time()
    push(first, n)
    t1 = time.time()
    if FRAMEWORK == "taskiq":
        asyncio.get_event_loop().run_until_complete(broker.shutdown())
    print(json.dumps({"t0": t0, "t1": t1}), flush=True)
