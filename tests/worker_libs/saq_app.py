"""saq with its Redis queue: `saq saq_app.settings`."""

import asyncio
import importlib.metadata

from saq import Queue

from scenario import QUEUE, URL, done, report


async def work(ctx, *, n):
    done(n)


queue = Queue.from_url(URL, name=QUEUE)
settings = {"queue": queue, "functions": [work], "concurrency": 2}


def produce(n: int) -> None:
    async def push():
        await queue.connect()
        try:
            for i in range(n):
                await queue.enqueue("work", n=i)
                pushed.append(i)
        finally:
            await queue.disconnect()

    pushed, error = [], None
    try:
        asyncio.run(push())
    except Exception as failure:
        error = failure
    report(importlib.metadata.version("saq"), len(pushed), error)
