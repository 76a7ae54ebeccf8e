"""arq: `arq arq_app.WorkerSettings`."""

import asyncio
import importlib.metadata

from arq import create_pool
from arq.connections import RedisSettings
from arq.worker import create_worker

from scenario import PORT, QUEUE, done, failure, report


async def work(ctx, n):
    done(n)


class WorkerSettings:
    functions = [work]
    redis_settings = RedisSettings(host="127.0.0.1", port=PORT)
    queue_name = QUEUE


async def first_worker_error() -> str | None:
    """What stops a worker first: Worker.main, which `arq` runs (its cleanup's error hides this one)."""
    try:
        await create_worker(WorkerSettings).main()
    except Exception as error:
        return failure(error)
    return None


def produce(n: int) -> None:
    async def push():
        pool = await create_pool(WorkerSettings.redis_settings, default_queue_name=QUEUE)
        try:
            for i in range(n):
                await pool.enqueue_job("work", i)
                pushed.append(i)
        finally:
            await pool.aclose()

    pushed, error = [], None
    try:
        asyncio.run(push())
    except Exception as failure:
        error = failure
    report(importlib.metadata.version("arq"), len(pushed), error, worker=asyncio.run(first_worker_error()))
