"""taskiq on EzraStreamBroker: `taskiq worker taskiq_app:broker`; produce(n, seconds) pushes.

RESULTS=1: the broker's result backend is ezra.taskiq.EzraResultBackend."""

import asyncio
import os

from taskiq.exceptions import SendTaskError

from ezra.taskiq import EzraStreamBroker

from common import URL, QUEUE, line, report

broker = EzraStreamBroker(URL, queue_name=QUEUE)
if os.environ.get("RESULTS") == "1":
    from ezra.taskiq import EzraResultBackend
    broker = broker.with_result_backend(EzraResultBackend(URL))


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


@broker.task
async def square(n: int) -> int:
    line("START", n)
    if n < 0:
        raise ValueError(f"no square of {n}")
    line("DONE", n)
    return n * n


def send_squares(numbers) -> None:
    """square(n) for each: the task ids."""
    async def push():
        await broker.startup()
        ids = [(await square.kiq(n)).task_id for n in numbers]
        await broker.shutdown()
        return ids

    report(ids=asyncio.run(push()))


def results(ids, wait=True, timeout=60.0) -> None:
    """Each task's result: wait() (XRESULT BLOCK) or, with wait=False, is_result_ready: the
    return value, the error's text, or "not ready"."""
    backend = broker.result_backend

    async def read():
        out = []
        for task_id in ids:
            if not wait and not await backend.is_result_ready(task_id):
                out.append("not ready")
                continue
            result = await backend.wait(task_id, timeout) if wait else await backend.get_result(task_id)
            out.append(f"{type(result.error).__name__}: {result.error}" if result.is_err else result.return_value)
        await backend.shutdown()
        return out

    report(results=asyncio.run(read()))
