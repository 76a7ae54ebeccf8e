"""What tests/test_frameworks_speed.py measures inside a broker's process: the commands and the
redis-py clients the shipped brokers spend per task, against the real EZRA the test started.

    dramatiq_reads(n, prefetch)   n tasks queued, one EzraConsumer taking and acking them as
                                  dramatiq's worker does: each XREADGROUP it sent (COUNT, BLOCK or
                                  not, tasks returned), then one more read on the empty queue that
                                  a push made while it blocks answers
    dramatiq_checkouts(n)         n pushes, then n tasks taken and acked one by one: the redis-py pool
                                  check-outs they made (each costs two settimeout calls and a recv);
                                  client CPU per push and per ack printed for the record
    taskiq_clients(n)             n kiq() pushes and n acks through EzraStreamBroker, one at a time
                                  (then 20 pushes and 20 acks at once):
                                  the redis-py clients made and the pool check-outs for them
                                  (RedisStreamBroker makes a client and checks a connection out
                                  per push and per ack), and the CPU each cost (printed for the record, never
                                  asserted: speed is bench.py's)
"""

from __future__ import annotations

import asyncio
import threading
import time

import redis
import redis.asyncio

from common import QUEUE, URL, report


def dramatiq_reads(n: int, prefetch: int) -> None:
    from dramatiq.message import Message

    from ezra.dramatiq import EzraBroker

    broker = EzraBroker(url=URL)
    for i in range(n):
        broker.enqueue(Message(queue_name=QUEUE, actor_name="noop", args=(i,), kwargs={}, options={}))
    consumer = broker.consume(QUEUE, prefetch=prefetch, timeout=20_000)
    reads = []
    send = consumer.client.execute_command

    def counted(*args, **options):  # the real command, recorded
        reply = send(*args, **options)
        if args[0] == "XREADGROUP":
            words = [a.decode() if isinstance(a, bytes) else str(a) for a in args]
            got = sum(len(entries) for _, entries in reply or []) if isinstance(reply, list) else \
                sum(len(entries) for entries in (reply or {}).values())
            reads.append({"count": int(words[words.index("COUNT") + 1]), "block": "BLOCK" in words, "got": got})
        return reply
    consumer.client.execute_command = counted

    taken = []
    while len(taken) < n:
        message = next(consumer)
        if message is not None:
            taken.append(message.args[0])
            consumer.ack(message)  # as dramatiq's worker thread does, once the task ran
    queued_reads = len(reads)

    def push_once_blocked():
        deadline = time.monotonic() + 30
        while broker.client.info("clients")["blocked_clients"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # poll for the consumer's blocking read, bounded by the deadline
        broker.enqueue(Message(queue_name=QUEUE, actor_name="noop", args=(n,), kwargs={}, options={}))
    pusher = threading.Thread(target=push_once_blocked)
    pusher.start()
    late = None
    while late is None:
        late = next(consumer)
    consumer.ack(late)
    pusher.join()
    consumer.close()
    broker.close()
    report(taken=sorted(taken), late=late.args[0], queued_reads=reads[:queued_reads],
           empty_reads=reads[queued_reads:])


def dramatiq_checkouts(n: int) -> None:
    from dramatiq.message import Message

    from ezra.dramatiq import EzraBroker

    checkouts = [0]
    get_connection = redis.ConnectionPool.get_connection

    def counting_get_connection(self, *args, **kwargs):  # the real check-out, counted
        checkouts[0] += 1
        return get_connection(self, *args, **kwargs)
    redis.ConnectionPool.get_connection = counting_get_connection

    broker = EzraBroker(url=URL)
    broker.enqueue(Message(queue_name=QUEUE, actor_name="noop", args=(-1,), kwargs={}, options={}))  # connects
    before, cpu = checkouts[0], time.process_time()
    for i in range(n):
        broker.enqueue(Message(queue_name=QUEUE, actor_name="noop", args=(i,), kwargs={}, options={}))
    pushes, push_cpu = checkouts[0] - before, time.process_time() - cpu
    consumer = broker.consume(QUEUE, prefetch=1, timeout=20_000)
    consumer.ack(next(consumer))  # the first push; this thread's connection is made by now
    before, ack_cpu = checkouts[0], 0.0
    for _ in range(n):
        message = next(consumer)
        cpu = time.process_time()
        consumer.ack(message)
        ack_cpu += time.process_time() - cpu
    acks = checkouts[0] - before
    consumer.close()
    broker.close()
    report(checkouts_for_pushes=pushes, checkouts_for_reads_and_acks=acks, push_cpu_us=push_cpu * 1e6 / n,
           ack_cpu_us=ack_cpu * 1e6 / n)


def taskiq_clients(n: int) -> None:
    from ezra.taskiq import EzraStreamBroker

    made, checkouts = [0], [0]
    init = redis.asyncio.Redis.__init__
    get_connection = redis.asyncio.BlockingConnectionPool.get_connection

    async def counting_get_connection(self, *args, **kwargs):  # the real check-out, counted
        checkouts[0] += 1
        return await get_connection(self, *args, **kwargs)
    redis.asyncio.BlockingConnectionPool.get_connection = counting_get_connection

    def counting_init(self, *args, **kwargs):  # the real constructor, counted
        made[0] += 1
        init(self, *args, **kwargs)
    redis.asyncio.Redis.__init__ = counting_init

    async def run():
        broker = EzraStreamBroker(URL, queue_name=QUEUE)

        @broker.task
        async def noop(i: int) -> None:
            pass

        await broker.startup()
        await noop.kiq(-1)  # connects
        before, out, cpu = made[0], checkouts[0], time.process_time()
        for i in range(n):
            await noop.kiq(i)
        pushes, push_cpu, push_checkouts = made[0] - before, time.process_time() - cpu, checkouts[0] - out
        listen = broker.listen()
        messages = [await listen.__anext__() for _ in range(n + 1)]
        before, out, cpu = made[0], checkouts[0], time.process_time()
        for message in messages:
            await message.ack()
        acks, ack_cpu, ack_checkouts = made[0] - before, time.process_time() - cpu, checkouts[0] - out
        await asyncio.gather(*(noop.kiq(i) for i in range(n, n + 20)))  # at once: the pool's connections too
        together = [await listen.__anext__() for _ in range(20)]
        await asyncio.gather(*(message.ack() for message in together))
        await listen.aclose()
        await broker.shutdown()
        report(clients_for_pushes=pushes, clients_for_acks=acks, checkouts_for_pushes=push_checkouts,
               checkouts_for_acks=ack_checkouts, push_cpu_us=push_cpu * 1e6 / n, ack_cpu_us=ack_cpu * 1e6 / (n + 1))

    asyncio.run(run())
