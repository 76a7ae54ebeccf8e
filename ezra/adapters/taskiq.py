"""taskiq on EZRA: `EzraStreamBroker`, taskiq-redis's RedisStreamBroker without its Lua lock.

    from ezra.taskiq import EzraStreamBroker
    broker = EzraStreamBroker("redis://127.0.0.1:42002", queue_name="taskiq")

`pip install 'ezra[taskiq]'` (taskiq-redis). Everything but `listen()` is RedisStreamBroker's:
kiq() is an XADD, startup() an XGROUP CREATE ... MKSTREAM, a message's ack an XACK. Its
listen() reads with XREADGROUP > and then, after each read, takes a redis-py Lock (SET NX
and a Lua release script) around an XAUTOCLAIM of tasks idle for `idle_timeout`; EZRA has
no Lua, so on EZRA that step kills the worker process after each read. EZRA needs no claim:
a task whose worker died is delivered again by XREADGROUP > after the queue's visibility
timeout, counting an attempt (dead after the queue's max attempts). So this listen() reads
only. While a message is unacked its lease is renewed (XCLAIM by its owner with min-idle 0)
every third of the queue's visibility timeout, so a task longer than the lease runs once.
kiq() and the acks send the same XADD and XACK as RedisStreamBroker's, through clients made
once (a connection of their own while one at a time is sent), where RedisStreamBroker makes a
redis-py client per push and per ack (~100 µs of CPU each: a sequential producer waits for it).
A task's `priority` label (`.kicker().with_labels(priority=3)`) is XADD's PRIORITY: 0 to 9, 0 first;
any other value is refused at kiq(). docs/taskiq.md tells the rest.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable

from redis.asyncio import Redis
from taskiq import AckableMessage, BrokerMessage
from taskiq_redis import RedisStreamBroker

from .priorities import PRIORITIES
from .leases import pending_query, split_held
from .taskiq_results import EzraResultBackend  # noqa: F401  (re-exported: ezra.taskiq.EzraResultBackend)

logger = logging.getLogger("ezra.taskiq")  # the public module's name (ezra/taskiq.py), which users configure

DEFAULT_VISIBILITY_TIMEOUT = 30.0  # EZRA's --visibility-timeout default, if XINFO STREAM does not say


def visibility_timeout(info: dict) -> float:
    """The queue's lease from redis-py's XINFO STREAM dict (keys str or bytes, by decode_responses)."""
    fields = {(key.decode() if isinstance(key, bytes) else key): value for key, value in info.items()}
    value = fields.get("visibility-timeout", DEFAULT_VISIBILITY_TIMEOUT)
    return float(value.decode() if isinstance(value, bytes) else value)


def priority_option(labels: dict) -> list:
    """XADD's PRIORITY for the task's `priority` label ([] without one: the queue's default). Only
    0 to 9 as EZRA takes them (0 first); anything else is refused (ValueError), nothing pushed."""
    priority = labels.get("priority")
    if priority is None:
        return []
    text = str(priority)
    if not (text.isascii() and text.isdigit() and int(text) in PRIORITIES):
        raise ValueError(f"the priority label is EZRA's XADD PRIORITY, an integer from 0 (first) to 9; "
                         f"got {priority!r}")
    return ["PRIORITY", str(int(text))]


class EzraStreamBroker(RedisStreamBroker):
    """RedisStreamBroker (same arguments) that reads with XREADGROUP only and renews its leases."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._held: dict[tuple[str, str], None] = {}  # (stream, id) of the tasks read and not yet acked
        self._renewer: asyncio.Task | None = None
        # Pushes and acks: a lone one (a sequential producer, a worker's acks one at a time) goes on
        # a connection kept out of the pool, skipping the pool's check-out and its check of the
        # connection (~55 µs of client CPU each, measured); concurrent ones take the pool, as before.
        self._own: Redis | None = None
        self._own_busy = False
        self._pooled: Redis | None = None

    async def _send(self, command: str, *args, **kwargs):
        if self._own_busy:  # no await between the test and the set: one coroutine at a time gets it
            if self._pooled is None:
                self._pooled = Redis(connection_pool=self.connection_pool)
            return await getattr(self._pooled, command)(*args, **kwargs)
        self._own_busy = True
        try:
            if self._own is None:
                self._own = Redis(connection_pool=self.connection_pool, single_connection_client=True)
            return await getattr(self._own, command)(*args, **kwargs)
        finally:
            self._own_busy = False

    async def kick(self, message: BrokerMessage) -> None:
        """XADD, as RedisStreamBroker.kick (its queue label, maxlen and approximate), with PRIORITY
        from the priority label."""
        queue_name = message.labels.get("queue_name") or self.queue_name
        priority = priority_option(message.labels)
        if not priority:  # redis-py's xadd: the same bytes as RedisStreamBroker's
            await self._send("xadd", queue_name, {b"data": message.message}, maxlen=self.maxlen,
                             approximate=self.approximate)
            return
        trim = [] if self.maxlen is None else ["MAXLEN", *(["~"] if self.approximate else []), self.maxlen]
        await self._send("execute_command", "XADD", queue_name, *trim, *priority, "*", b"data", message.message)

    def _ack_generator(self, id: str, queue_name: str) -> Callable[[], Awaitable[None]]:
        async def ack() -> None:
            await self._send("xack", queue_name, self.consumer_group_name, id)
            self._held.pop((queue_name, id), None)
        return ack

    async def listen(self) -> AsyncGenerator[AckableMessage, None]:
        """XREADGROUP > across the broker's streams, blocking `xread_block` ms; an AckableMessage per task.

        taskiq takes the messages one at a time, as its slots free up, so most of a read waits
        here before taskiq starts it: every task read is held (its lease renewed) from the read
        on, not from the moment taskiq takes it. A waiting task whose lease was lost meanwhile
        (the renewal no longer finds it ours: a server restart gave it back) is skipped, since
        it will be read again; a task read again while this process still holds it is skipped
        too, since the copy held runs it and its ack settles the new delivery."""
        streams = {self.queue_name: ">", **self.additional_streams}
        async with Redis(connection_pool=self.connection_pool) as redis:
            if self._renewer is None:
                period = await self._renewal_period(redis)
                self._renewer = asyncio.create_task(self._renew_leases(period))
            while True:
                fetched = await redis.xreadgroup(self.consumer_group_name, self.consumer_name, streams,
                                                 block=self.block, count=self.count)
                for stream, message_id, data in self._hold(fetched):
                    if (stream, message_id) not in self._held:
                        continue  # its lease was lost while it waited: it is read again
                    yield AckableMessage(data=data, ack=self._ack_generator(id=message_id, queue_name=stream))

    def _hold(self, fetched) -> list[tuple[str, str, bytes]]:
        """(stream, id, data) of each task of a read that this process does not hold yet, now held."""
        read = []
        for stream, messages in fetched or []:
            stream = stream.decode() if isinstance(stream, bytes) else stream
            for message_id, fields in messages:
                message_id = message_id.decode() if isinstance(message_id, bytes) else message_id
                if (stream, message_id) in self._held:
                    continue
                self._held[(stream, message_id)] = None
                read.append((stream, message_id, fields[b"data"]))
        return read

    async def shutdown(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            self._renewer = None
        for client in (self._own, self._pooled):
            if client is not None:
                await client.aclose()  # the own connection back to the pool, which super().shutdown() closes
        self._own = self._pooled = None
        await super().shutdown()

    async def _renewal_period(self, redis: Redis) -> float:
        """A third of the shortest visibility timeout of the streams read (XINFO STREAM says it)."""
        timeouts = []
        for stream in (self.queue_name, *self.additional_streams):
            try:
                timeouts.append(visibility_timeout(await redis.xinfo_stream(stream)))
            except Exception:
                logger.warning("XINFO STREAM %s failed: renewing leases as for a %ss visibility timeout",
                               stream, DEFAULT_VISIBILITY_TIMEOUT, exc_info=True)
                timeouts.append(DEFAULT_VISIBILITY_TIMEOUT)
        return min(timeouts) / 3

    async def _renew_leases(self, period: float) -> None:
        """Every `period` s: XCLAIM stream group me 0 ids... JUSTID, the heartbeat of EZRA's leases."""
        async with Redis(connection_pool=self.connection_pool) as redis:
            while True:
                await asyncio.sleep(period)
                by_stream: dict[str, list[str]] = {}
                for stream, message_id in list(self._held):
                    by_stream.setdefault(stream, []).append(message_id)
                for stream, ids in by_stream.items():
                    try:
                        start, end, count = pending_query(ids)
                        ours, lost = split_held(ids, await redis.xpending_range(
                            stream, self.consumer_group_name, start, end, count, consumername=self.consumer_name))
                        if ours:  # renew only the worker's own: see leases.split_held
                            ours, gone = split_held(ours, await redis.xclaim(
                                stream, self.consumer_group_name, self.consumer_name, 0, ours, justid=True))
                            lost += gone
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        logger.warning("renewing the leases of %d tasks of %s failed; retrying in %.1fs",
                                       len(ids), stream, period, exc_info=True)
                        continue
                    for message_id in lost:
                        self._held.pop((stream, message_id), None)
                    if lost:
                        logger.warning("%d tasks of %s held by %s are no longer leased to it (a server restart "
                                       "or a run-out lease gave them back): not renewed, delivered again",
                                       len(lost), stream, self.consumer_name)
