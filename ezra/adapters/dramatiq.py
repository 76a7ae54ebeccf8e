"""Dramatiq on EZRA: `EzraBroker`, a dramatiq Broker over EZRA's queue commands.

    import dramatiq
    from ezra.dramatiq import EzraBroker
    dramatiq.set_broker(EzraBroker(url="redis://127.0.0.1:42002"))

`pip install 'ezra[dramatiq]'`. What maps to what (docs/dramatiq.md tells it for users):

    actor.send() / enqueue      XADD queue * message <dramatiq's encoded message>
    enqueue(delay=ms)           XADD queue DELAY <s> ... (EZRA holds it; no delay queue, no eta)
    priority (lower first)      XADD queue PRIORITY 5 + priority, clamped to 0-9: the message's
                                `priority` option, else its actor's; 0, dramatiq's default, sends
                                no PRIORITY (the queue's default, 5)
    the consumer waiting        XREADGROUP GROUP dramatiq <consumer> COUNT <prefetch left>
                                BLOCK <worker timeout> STREAMS queue >  (no BLOCK right after
                                a read that filled the prefetch: more are likely waiting)
    ack                         XACK
    nack (failed for good)      XNACK FATAL: the dead queue, REASON the exception's type and message
    requeue (worker shutdown)   XNACK SILENT: back, no attempt counted
    a task held long            its lease renewed (ezra/adapters/leases.py)

Dramatiq's Retries middleware works unchanged: a retry is a new push with a delay, and a
message out of retries is nacked, so it ends in `queue::dead`.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Iterable

import redis
from dramatiq.broker import Broker, Consumer, MessageProxy
from dramatiq.errors import ConnectionClosed
from dramatiq.logging import get_logger
from dramatiq.message import Message

from .priorities import DEFAULT_PRIORITY, clamped
from .leases import LeaseKeeper, visibility_timeout
from .dramatiq_results import EzraBackend  # noqa: F401  (re-exported: ezra.dramatiq.EzraBackend)

GROUP = "dramatiq"     # accepted and ignored by EZRA (one implicit group per queue)
FIELD = b"message"     # the one field of a task: dramatiq's encoded message
READ_MARGIN = 10.0     # seconds the socket waits beyond a blocking read


def delay_seconds(delay_ms) -> str:
    """XADD DELAY's seconds for dramatiq's milliseconds, rounded up to EZRA's millisecond."""
    return repr(math.ceil(delay_ms) / 1000)


def priority_option(priority) -> list:
    """XADD's PRIORITY for a dramatiq priority (any integer, lower first, 0 the default): EZRA's
    default 5 plus it, clamped to 0-9, so -5 and below are 0 and 4 and above 9; [] for 0 (the
    queue's default). One that is no integer is refused (ValueError), as dramatiq would when it
    sorts its work queue."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"a dramatiq priority is an integer (lower first), got {priority!r}")
    if priority == 0:
        return []
    return clamped(DEFAULT_PRIORITY + priority)


class EzraMessage(MessageProxy):
    """A delivered message and the id of its task on EZRA."""

    def __init__(self, message: Message, task_id: str) -> None:
        super().__init__(message)
        self.task_id = task_id


class EzraBroker(Broker):
    """A dramatiq broker for an EZRA server: `url` as redis-py's (redis://[:password@]host:port, rediss://)."""

    def __init__(self, *, url: str = "redis://127.0.0.1:42002", middleware=None, **client_options) -> None:
        super().__init__(middleware=middleware)
        self.url, self.client_options = url, client_options
        self.client = self.connect()  # a pool: join(), the consumers' lease renewals
        self.queues: set[str] = set()
        self._local = threading.local()
        # every live thread_client(), for close(); a thread's client goes (and closes) with its thread
        self._thread_clients: weakref.WeakSet[redis.Redis] = weakref.WeakSet()
        self._thread_clients_lock = threading.Lock()

    def connect(self, block_seconds: float = 0.0, single: bool = False) -> redis.Redis:
        options = {"socket_timeout": block_seconds + READ_MARGIN, "single_connection_client": single,
                   **self.client_options}
        return redis.Redis.from_url(self.url, **options)

    def thread_client(self) -> redis.Redis:
        """This thread's own connection, for pushes and acks. redis-py's pool checks a connection
        on each check-out (two settimeout calls and a recv: ~40 µs of client CPU per command,
        measured), and one connection shared by every thread would make them wait for each
        other's round trips, where EZRA commits concurrent pushes together."""
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self.connect(single=True)
            with self._thread_clients_lock:
                self._thread_clients.add(client)
        return client

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> Consumer:
        return EzraConsumer(self, queue_name, prefetch, timeout)

    def declare_queue(self, queue_name: str) -> None:
        if queue_name not in self.queues:
            self.emit_before("declare_queue", queue_name)
            self.queues.add(queue_name)
            self.emit_after("declare_queue", queue_name)

    def enqueue(self, message: Message, *, delay: int | None = None) -> Message:
        """XADD; with `delay` (ms) EZRA holds the task until then, so no worker does."""
        options = (["DELAY", delay_seconds(delay)] if delay else []) + priority_option(self.priority_of(message))
        self.logger.debug("Enqueueing message %r on queue %r.", message.message_id, message.queue_name)
        self.emit_before("enqueue", message, delay)
        try:
            self.thread_client().execute_command("XADD", message.queue_name, *options, "*", FIELD,
                                                 message.encode())
        except redis.ConnectionError as exc:
            raise ConnectionClosed(exc) from None
        self.emit_after("enqueue", message, delay)
        return message

    def priority_of(self, message: Message) -> int:
        """The message's `priority` option (send_with_options(priority=...)), else its actor's (0 if
        the actor is not declared in this process)."""
        if "priority" in message.options:
            return message.options["priority"]
        actor = self.actors.get(message.actor_name)
        return 0 if actor is None else actor.priority

    def get_declared_queues(self) -> set[str]:
        return self.queues.copy()

    def get_declared_delay_queues(self) -> set[str]:
        """None: delayed tasks wait on EZRA (XADD DELAY), not in a delay queue a worker holds."""
        return set()

    def flush(self, queue_name: str) -> None:
        raise NotImplementedError("EZRA never drops waiting tasks: flush is not supported (docs/dramatiq.md)")

    def flush_all(self) -> None:
        raise NotImplementedError("EZRA never drops waiting tasks: flush_all is not supported (docs/dramatiq.md)")

    def join(self, queue_name: str, *, interval: int = 100, timeout: int | None = None) -> None:
        """Wait until the queue has no task available, delayed or in flight (as RedisBroker.join, by polling)."""
        deadline = None if timeout is None else time.monotonic() + timeout / 1000
        while True:
            reply = self.client.xinfo_stream(queue_name)
            counts = {(k.decode() if isinstance(k, bytes) else k): v for k, v in reply.items()}
            if counts["available"] + counts["delayed"] + counts["in-flight"] == 0:
                return
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"queue {queue_name!r} still has unfinished tasks")
            time.sleep(interval / 1000)

    def close(self) -> None:
        with self._thread_clients_lock:
            clients, self._thread_clients = list(self._thread_clients), weakref.WeakSet()
        for client in clients:
            client.close()
        self.client.close()


class EzraConsumer(Consumer):
    """One queue's consumer: its own worker name on EZRA, its leases renewed while it holds tasks."""

    def __init__(self, broker: EzraBroker, queue_name: str, prefetch: int, timeout: int) -> None:
        self.logger = get_logger("ezra.dramatiq", type(self))  # the public module's name, which users configure
        self.broker, self.queue_name, self.prefetch, self.timeout = broker, queue_name, prefetch, timeout
        self.worker = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.cache: deque[EzraMessage] = deque()  # read, not yet handed to dramatiq
        self.more_waiting = False            # the last read filled the prefetch: read the next without BLOCK
        self.outstanding: set[str] = set()   # handed to dramatiq, not yet acked or nacked
        self.settled = threading.Event()     # an ack or nack made room under the prefetch limit
        try:
            self.client = broker.connect(timeout / 1000, single=True)  # its reads: only this consumer's thread
            self.client.execute_command("XGROUP", "CREATE", queue_name, GROUP, "$", "MKSTREAM")
            self.leases = LeaseKeeper(broker.client, GROUP, self.worker,
                                      visibility_timeout(self.client, queue_name) / 3)
        except redis.ConnectionError as exc:
            raise ConnectionClosed(exc) from None

    def __next__(self) -> MessageProxy | None:
        """The next message, or None after `timeout` ms without one (one blocking read, no sleeps)."""
        if self.cache:
            message = self.cache.popleft()
            self.outstanding.add(message.task_id)
            return message
        room = self.prefetch - len(self.outstanding)
        if room <= 0:  # wait for an ack or nack rather than reading past the prefetch limit
            self.settled.clear()
            if self.prefetch - len(self.outstanding) <= 0:
                self.settled.wait(self.timeout / 1000)
            return None
        # After a full read more tasks are likely queued: take them without BLOCK, so EZRA sets up
        # no blocked reader for them; a read that comes back short (or empty) means the next blocks.
        block = None if self.more_waiting else max(self.timeout, 1)
        try:
            reply = self.client.xreadgroup(GROUP, self.worker, {self.queue_name: ">"}, count=room, block=block)
        except redis.ConnectionError as exc:
            raise ConnectionClosed(exc) from None
        read = 0
        for _, entries in reply or []:
            read += len(entries)
            for task_id, fields in entries:
                message = self.decode(task_id.decode(), fields)
                if message is not None:
                    self.cache.append(message)
        self.more_waiting = read >= room
        self.leases.hold_all(self.queue_name, [message.task_id for message in self.cache])
        if self.cache:
            return next(self)
        return None

    def decode(self, task_id: str, fields: dict) -> EzraMessage | None:
        """dramatiq's message from a task; a task that is not one goes to the dead queue, with a log."""
        try:
            return EzraMessage(Message.decode(fields[FIELD]), task_id)
        except Exception as exc:
            self.logger.error("task %s of queue %r is not a dramatiq message (%r): sent to %s::dead",
                              task_id, self.queue_name, exc, self.queue_name)
            self.client.execute_command("XNACK", self.queue_name, GROUP, "FATAL", "IDS", 1, task_id, "REASON",
                                        f"not a dramatiq message: {exc!r}")
            return None

    def ack(self, message: EzraMessage) -> None:
        self.settle([message], None)

    def nack(self, message: EzraMessage) -> None:
        """Failed for good (Retries gave up, or no Retries): the dead queue, with the exception as REASON."""
        exception = getattr(message, "_exception", None)  # MessageProxy.stuff_exception's
        reason = ("failed in dramatiq (no exception recorded)" if exception is None
                  else f"{type(exception).__name__}: {exception}")
        self.settle([message], "FATAL", reason)

    def requeue(self, messages: Iterable[EzraMessage]) -> None:
        """Handed back unprocessed (worker shutdown): available again, no attempt counted."""
        self.settle(list(messages), "SILENT")

    def settle(self, messages: list[EzraMessage], how: str | None, reason: str | None = None) -> None:
        ids = [message.task_id for message in messages]
        if not ids:
            return
        try:
            client = self.broker.thread_client()  # dramatiq's worker threads ack: not on the reads' connection
            if how is None:
                client.xack(self.queue_name, GROUP, *ids)
            else:
                why = [] if reason is None else ["REASON", reason]
                client.execute_command("XNACK", self.queue_name, GROUP, how, "IDS", len(ids), *ids, *why)
        except redis.ConnectionError as exc:
            raise ConnectionClosed(exc) from None
        finally:
            for task_id in ids:
                self.leases.release(self.queue_name, task_id)
                self.outstanding.discard(task_id)
            self.settled.set()

    def close(self) -> None:
        """Hand back what was read and not yet given to dramatiq, stop renewing, close."""
        try:
            cached, self.cache = list(self.cache), deque()
            self.requeue(cached)
        finally:
            self.leases.stop()
            self.client.close()
