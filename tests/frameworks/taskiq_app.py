"""taskiq on EzraStreamBroker: `taskiq worker taskiq_app:broker`; produce(n, seconds) pushes."""

import asyncio
import os

from ezra.taskiq import EzraStreamBroker

from common import URL, QUEUE, line, report

broker = EzraStreamBroker(URL, queue_name=QUEUE)


@broker.task
async def work(n: int, seconds: float) -> None:
    line("START", n)
    await asyncio.sleep(seconds)
    line("DONE", n)


def produce(n: int, seconds: float) -> None:
    async def push():
        await broker.startup()
        for i in range(n):
            await work.kiq(i, seconds)
        await broker.shutdown()

    asyncio.run(push())
    report(pushed=n)
