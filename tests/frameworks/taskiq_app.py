"""taskiq on EzraStreamBroker: `taskiq worker taskiq_app:broker`; produce(n, seconds) pushes."""

import asyncio
import os

from taskiq.exceptions import SendTaskError

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


def produce_priorities(priorities) -> None:
    """work(i) for each priority label (None: no label); one refused at kiq() (ValueError) is
    reported with the broker's error instead."""
    refused = {}

    async def push():
        await broker.startup()
        for i, priority in enumerate(priorities):
            kicker = work.kicker() if priority is None else work.kicker().with_labels(priority=priority)
            try:
                await kicker.kiq(i, 0.0)
            except SendTaskError as exc:  # taskiq's, from the broker's ValueError
                refused[i] = str(exc.__cause__)
        await broker.shutdown()

    asyncio.run(push())
    report(pushed=len(priorities) - len(refused), refused=refused)
