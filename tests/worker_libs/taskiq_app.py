"""taskiq-redis's RedisStreamBroker (BROKER=stream), or EzraStreamBroker (BROKER=ezra): the
same broker without its locked XAUTOCLAIM. `python -m taskiq worker taskiq_app:broker`."""

import asyncio
import importlib.metadata
import os

from redis.asyncio import Redis
from taskiq import AckableMessage
from taskiq_redis import RedisStreamBroker

from scenario import QUEUE, URL, done, report


class EzraStreamBroker(RedisStreamBroker):
    """RedisStreamBroker.listen without its second half: after each read it takes a redis-py
    Lock (SET NX, then EVALSHA to release it, in a pipeline that first sends SCRIPT EXISTS)
    around an XAUTOCLAIM of tasks idle for idle_timeout. EZRA has no scripts and needs no
    claim: a task whose worker died is delivered again by XREADGROUP > after the queue's
    visibility timeout."""

    async def listen(self):
        async with Redis(connection_pool=self.connection_pool) as redis:
            while True:
                fetched = await redis.xreadgroup(
                    self.consumer_group_name, self.consumer_name, {self.queue_name: ">", **self.additional_streams},
                    block=self.block, count=self.count)
                for stream, messages in fetched or []:
                    for message_id, fields in messages:
                        yield AckableMessage(data=fields[b"data"],
                                             ack=self._ack_generator(id=message_id, queue_name=stream))


broker = (EzraStreamBroker if os.environ.get("BROKER") == "ezra" else RedisStreamBroker)(URL, queue_name=QUEUE)


@broker.task
async def work(n: int) -> None:
    done(n)


def produce(n: int) -> None:
    async def push():
        await broker.startup()  # XGROUP CREATE ... MKSTREAM
        for i in range(n):
            await work.kiq(i)
            pushed.append(i)
        await broker.shutdown()

    pushed, error = [], None
    try:
        asyncio.run(push())
    except Exception as failure:
        error = failure
    report(importlib.metadata.version("taskiq-redis"), len(pushed), error,
           taskiq=importlib.metadata.version("taskiq"))
