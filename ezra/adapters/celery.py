"""Celery on EZRA: `ezra.celery.Transport`, a kombu virtual transport over EZRA's queue commands.

    import ezra.celery                      # registers ezra:// and ezras:// with kombu
    app = Celery("app", broker="ezra://127.0.0.1:42002")
    # or, with no import: broker_url = "ezra://..." and broker_transport = "ezra.celery:Transport"

`pip install 'ezra[celery]'`. What maps to what (docs/celery.md tells it for users):

    publish                    XADD queue [DELAY s] [PRIORITY p] * payload <kombu's JSON message>
                               (DELAY from the message's ETA / countdown, rounded up to 1 ms;
                               PRIORITY from its `priority`, 0 first as kombu's Redis transport
                               reads it, clamped to 0-9 as kombu does; none given: no PRIORITY,
                               told apart from 0 by sent_without_priority below)
    a chord's unlock task      XADD queue AFTER n <results queue> <slot> ... * payload ... (asked for by
                               the result backend through a message property, after_option:
                               ezra/adapters/celery_chords.py)
    the worker waiting         one XREADGROUP GROUP celery <worker> COUNT <what prefetch allows>
                               BLOCK <the drain timeout> STREAMS <its queues> > ...
    ack                        XACK
    reject(requeue=True)       XNACK FAIL (the attempt counts: a lost worker, Reject(requeue=True))
    reject(requeue=False)      XNACK FATAL: the dead queue (acks_late, task_acks_on_failure_or_timeout=False)
                               Both with REASON: the exception's type and message when the task ran
                               in this process (solo, threads, gevent pools: Celery's task_failure
                               signal), else "rejected by Celery (requeue=...)" (prefork: the
                               exception stays in the pool process and the worker's log)
    unacked at shutdown        XNACK SILENT: prefetched tasks handed back without counting an attempt
    a task held long           its lease renewed (ezra/adapters/leases.py)

Routing keys name queues (direct exchanges only). EZRA has no fanout or pub/sub, so the
transport does not offer them: Celery then leaves remote control, mingle and gossip out, and
the events it would publish are dropped: task events (worker -E) with a warning, the worker's
own online/heartbeat events (sent with events off too) with a debug line.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import uuid
from datetime import datetime, timezone
from queue import Empty
from urllib.parse import quote

import redis
from kombu.transport import TRANSPORT_ALIASES, virtual
from kombu.utils.json import dumps, loads
from kombu.utils.url import as_url

from .celery_chords import after_option, ask_for_after
from .priorities import clamped
from .leases import LeaseKeeper, visibility_timeout

logger = logging.getLogger("ezra.celery")  # the public module's name (ezra/celery.py), which users configure

TRANSPORT_ALIASES["ezra"] = "ezra.celery:Transport"
TRANSPORT_ALIASES["ezras"] = "ezra.celery:Transport"

GROUP = "celery"            # accepted and ignored by EZRA (one implicit group per queue)
PAYLOAD = b"payload"        # the one field of a task: kombu's message as JSON
DEFAULT_PORT = 42002
DEFAULT_COUNT = 100         # tasks per read when prefetch is unlimited
BLOCK_WHEN_UNTIMED = 5.0    # seconds a read blocks when drain_events has no timeout
READ_MARGIN = 10.0          # the socket timeout is the block plus this
FAILURES_KEPT = 10000       # exceptions remembered for a reject to come (a failure acked instead leaves one)


class Failures:
    """The exceptions of tasks that failed in this process, by Celery task id, until their reject."""

    def __init__(self):
        self.by_task: dict[str, str] = {}
        self.lock = threading.Lock()

    def failed(self, sender=None, task_id=None, exception=None, **_):
        """Celery's task_failure signal: remember why (the oldest go past FAILURES_KEPT)."""
        if task_id is None or exception is None:
            return
        with self.lock:
            self.by_task[task_id] = exception_reason(exception)
            while len(self.by_task) > FAILURES_KEPT:
                self.by_task.pop(next(iter(self.by_task)))

    def reason(self, message, requeue: bool) -> str:
        """Why the task behind a kombu message is rejected: its exception if it failed here."""
        headers = getattr(message, "headers", None) or {}
        with self.lock:
            reason = self.by_task.pop(headers.get("id"), None)
        return reason or f"rejected by Celery (requeue={requeue})"


def exception_reason(exception: BaseException) -> str:
    """'ValueError: the message' (XNACK REASON: EZRA keeps up to 8 KB of it)."""
    return f"{type(exception).__name__}: {exception}"


FAILURES = Failures()
try:  # kombu without Celery (a plain kombu consumer) has no signal to listen to
    from celery import current_app
    from celery.signals import before_task_publish, task_failure
except ImportError:  # pragma: no cover - Celery is the point of this transport
    task_failure = None
if task_failure is not None:
    task_failure.connect(FAILURES.failed, weak=False)
    from celery.app.backends import BACKEND_ALIASES
    from .celery_results import ResultBackend
    # result_backend = "ezra://...": results in EZRA (ezra/adapters/celery_results.py)
    BACKEND_ALIASES["ezra"] = BACKEND_ALIASES["ezras"] = "ezra.celery:ResultBackend"
else:  # pragma: no cover - a plain kombu consumer has no result backend to offer
    ResultBackend = None


def eta_delay(message: dict, now: datetime | None = None) -> float:
    """Seconds until the message's ETA (Celery's `eta` header, ISO 8601), 0 if none or past."""
    eta = (message.get("headers") or {}).get("eta")
    if not eta:
        return 0.0
    when = datetime.fromisoformat(eta)
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)  # Celery sends naive ETAs in UTC (enable_utc)
    seconds = (when - (now or datetime.now(timezone.utc))).total_seconds()
    return math.ceil(seconds * 1000) / 1000 if seconds > 0 else 0.0


def sent_without_priority(properties=None, **_) -> None:
    """Celery's before_task_publish: a task sent without a priority is published with priority None
    (no PRIORITY), not kombu Producer.publish's default 0, which the transport could not tell from
    priority=0. Only for an app whose broker is EZRA (looked up once per app: ~13 µs a publish
    otherwise): other transports keep kombu's default."""
    if properties is None or "priority" in properties:
        return
    app = current_app._get_current_object()
    on_ezra = app.__dict__.get("_ezra_broker")
    if on_ezra is None:
        conf = app.conf
        url = str(conf.broker_write_url or conf.broker_url or "")
        on_ezra = app._ezra_broker = (url.startswith(("ezra://", "ezras://"))
                                      or conf.broker_transport == "ezra.celery:Transport")
    if on_ezra:
        properties["priority"] = None


if task_failure is not None:
    before_task_publish.connect(sent_without_priority, weak=False)
    before_task_publish.connect(ask_for_after, weak=False)


def priority_option(message: dict) -> list:
    """XADD's PRIORITY for the message's `priority` property, clamped to 0-9 as kombu's Redis
    transport does ([] when the message has none: the queue's default). A value that is no integer
    is refused (ValueError): kombu's Redis transport would quietly serve it first."""
    priority = (message.get("properties") or {}).get("priority")
    if priority is None:
        return []
    try:
        number = int(priority)
    except (TypeError, ValueError):
        raise ValueError(f"priority must be an integer from 0 (first) to 9, got {priority!r}") from None
    return clamped(number)


class QoS(virtual.QoS):
    """Prefetch as kombu's; acks and rejects settle the task on EZRA."""

    def ack(self, delivery_tag):
        self.channel.settle(delivery_tag, None)
        super().ack(delivery_tag)

    def reject(self, delivery_tag, requeue=False):
        reason = FAILURES.reason(self._delivered.get(delivery_tag), requeue)
        self.channel.settle(delivery_tag, "FAIL" if requeue else "FATAL", reason)
        self._quick_ack(delivery_tag)  # not kombu's requeue: that would be a second XADD

    def restore_unacked(self):
        """Hand back what was delivered and not acked (prefetched, at shutdown): XNACK SILENT."""
        self._flush()
        errors = []
        while self._delivered:
            tag, message = self._delivered.popitem()
            try:
                self.channel.settle(tag, "SILENT")
            except Exception as exc:
                errors.append((exc, message))
        return errors


class Channel(virtual.Channel):
    """One EZRA connection pool; the tasks this worker holds, by delivery tag."""

    QoS = QoS
    do_restore = True
    from_transport_options = virtual.Channel.from_transport_options + ("visibility_timeout",)
    visibility_timeout = None  # broker_transport_options's: compared with the queue's at start

    def __init__(self, connection, **kwargs):
        super().__init__(connection, **kwargs)
        self.client = redis.Redis(**self.connection_params(connection.client))
        self.worker = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.tasks: dict[str, tuple[str, str]] = {}  # delivery tag -> (queue, task id)
        self.tasks_lock = threading.Lock()
        self.slot_freed = threading.Event()  # an ack or reject made room under the prefetch limit
        self.leases = LeaseKeeper(self.client, GROUP, self.worker)
        self.client.ping()

    @staticmethod
    def connection_params(conninfo) -> dict:
        params = {"host": conninfo.hostname or "127.0.0.1", "port": conninfo.port or DEFAULT_PORT,
                  "password": conninfo.password or None, "username": conninfo.userid or None,
                  "socket_timeout": BLOCK_WHEN_UNTIMED + READ_MARGIN,
                  "socket_connect_timeout": conninfo.connect_timeout or 10}
        ssl = conninfo.ssl or conninfo.transport_cls == "ezras"
        if ssl:
            params["ssl"] = True
            if isinstance(conninfo.ssl, dict):
                params.update({k: v for k, v in conninfo.ssl.items() if k.startswith("ssl_")})
        return params

    # ------------------------------------------------------------ producing

    def prepare_message(self, body, priority=None, content_type=None, content_encoding=None, headers=None,
                        properties=None):
        """kombu's, but a message sent without a priority has none (kombu's gives it 0, the first)."""
        unset = priority is None and "priority" not in (properties or {})
        message = super().prepare_message(body, priority, content_type, content_encoding, headers, properties)
        if unset:
            message["properties"].pop("priority", None)
        return message

    def _put(self, queue, message, **kwargs):
        delay = eta_delay(message)
        options = (["DELAY", repr(delay)] if delay else []) + priority_option(message) + after_option(message)
        self.client.execute_command("XADD", queue, *options, "*", PAYLOAD, dumps(message))

    def _lookup(self, exchange, routing_key, default=None):
        """The queues bound in this process, else the queue the routing key names (EZRA keeps no bindings)."""
        try:
            queues = self.typeof(exchange).lookup(self.get_table(exchange), exchange, routing_key, None)
        except KeyError:
            queues = []
        return queues or [routing_key or exchange]

    def basic_publish(self, message, exchange, routing_key, **kwargs):
        kind = self.state.exchanges.get(exchange, {}).get("type", "direct") if exchange else "direct"
        if kind != "direct":  # Celery's events and remote control: no fanout or pub/sub on EZRA
            text = (f"a message to the {kind} exchange {exchange!r} (Celery's events or remote control) "
                    "was dropped: EZRA has no fanout or pub/sub; see docs/celery.md")
            if exchange == "celeryev" and str(routing_key).startswith("worker."):
                # every worker sends its own online/heartbeat events, events on or off: not worth a warning
                debug_once(f"{text} (routing key {routing_key})")
            else:
                warn_once(text)
            return None
        return super().basic_publish(message, exchange, routing_key, **kwargs)

    # ------------------------------------------------------------ queues

    def _new_queue(self, queue, **kwargs):
        """The queue exists from its declaration on (XGROUP CREATE ... MKSTREAM), so its lease can be read."""
        try:
            self.client.execute_command("XGROUP", "CREATE", queue, GROUP, "$", "MKSTREAM")
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _size(self, queue):
        return self.client.xlen(queue)

    def _purge(self, queue):
        raise NotImplementedError("EZRA never drops waiting tasks: `celery purge` is not supported "
                                  "(docs/celery.md)")

    def _delete(self, queue, *args, **kwargs):
        """Queues stay: EZRA keeps every task until it is done."""

    def _has_queue(self, queue, **kwargs):
        return True

    def _get(self, queue):
        """basic_get: one task of `queue`, without waiting."""
        delivered = self.read([queue], 1, None)
        if not delivered:
            raise Empty()
        return delivered[0][0]

    def basic_consume(self, queue, no_ack, *args, **kwargs):
        self.check_lease(queue)
        result = super().basic_consume(queue, no_ack, *args, **kwargs)
        self.connection.consumers_changed.set()
        return result

    def check_lease(self, queue: str) -> None:
        """Renew at a third of the queue's lease; warn if Celery's visibility_timeout says otherwise."""
        lease = visibility_timeout(self.client, queue)
        self.leases.shorten(lease / 3)
        if self.visibility_timeout is not None and float(self.visibility_timeout) != lease:
            logger.warning("broker_transport_options visibility_timeout=%s, but EZRA leases the tasks of "
                           "queue %r for %ss: EZRA's setting applies (set it with XCFGSET %s "
                           "VISIBILITY-TIMEOUT <s> or the server's --visibility-timeout; docs/celery.md)",
                           self.visibility_timeout, queue, lease, queue)

    # ------------------------------------------------------------ consuming

    def read(self, queues: list[str], count: int, timeout: float | None) -> list[tuple[dict, str]]:
        """XREADGROUP > across `queues`: (message, queue) for each task, its tag in its properties."""
        block = None if timeout is None else max(int(timeout * 1000), 1)
        reply = self.client.xreadgroup(GROUP, self.worker, {q: ">" for q in queues}, count=count, block=block)
        delivered = []
        for queue, entries in reply or []:
            queue = queue.decode() if isinstance(queue, bytes) else queue
            for task_id, fields in entries:
                task_id = task_id.decode()
                message = self.decode(queue, task_id, fields)
                if message is None:
                    continue
                tag = f"{queue}/{task_id}"
                message.setdefault("properties", {})["delivery_tag"] = tag
                with self.tasks_lock:
                    self.tasks[tag] = (queue, task_id)
                self.leases.hold(queue, task_id)
                delivered.append((message, queue))
        return delivered

    def decode(self, queue: str, task_id: str, fields: dict) -> dict | None:
        """kombu's message from a task; a task that is not one goes to the dead queue, with a log."""
        try:
            message = loads(fields[PAYLOAD])
            if isinstance(message, dict) and "body" in message:
                return message
            error = "not a kombu message"
        except (KeyError, ValueError, TypeError) as exc:
            error = repr(exc)
        logger.error("task %s of queue %r is not a Celery message (%s; fields %s): sent to %s::dead",
                     task_id, queue, error, sorted(fields)[:5], queue)
        self.client.execute_command("XNACK", queue, GROUP, "FATAL", "IDS", 1, task_id, "REASON",
                                    f"not a Celery message: {error}")
        return None

    def drain(self, timeout: float | None) -> bool:
        """One blocking read for as many tasks as prefetch allows, each delivered; False if none."""
        if not self.qos.can_consume():
            self.slot_freed.clear()
            if not self.qos.can_consume():
                self.slot_freed.wait(BLOCK_WHEN_UNTIMED if timeout is None else timeout)
                return False
        count = self.qos.can_consume_max_estimate() or DEFAULT_COUNT
        delivered = self.read(list(dict.fromkeys(self._active_queues)), count,
                              BLOCK_WHEN_UNTIMED if timeout is None else timeout)
        for message, queue in delivered:
            self.connection._deliver(message, queue)
        return bool(delivered)

    def settle(self, tag: str, how: str | None, reason: str | None = None) -> None:
        """XACK (how None) or XNACK SILENT|FAIL|FATAL the task behind a delivery tag (with REASON)."""
        with self.tasks_lock:
            held = self.tasks.pop(tag, None)
        if held is None:
            logger.warning("no task behind delivery tag %r to %s", tag, how or "ack")
            return
        queue, task_id = held
        self.leases.release(queue, task_id)
        try:
            if how is None:
                self.client.xack(queue, GROUP, task_id)
            else:
                why = [] if reason is None else ["REASON", reason]
                self.client.execute_command("XNACK", queue, GROUP, how, "IDS", 1, task_id, *why)
        finally:
            self.slot_freed.set()

    def close(self):
        super().close()  # hands back the unacked (restore_unacked) before the pool goes
        self.leases.stop()
        self.client.close()


WARNED: set[str] = set()


def warn_once(text: str) -> None:
    if text not in WARNED:
        WARNED.add(text)
        logger.warning(text)


def debug_once(text: str) -> None:
    if text not in WARNED:
        WARNED.add(text)
        logger.debug(text)


class Transport(virtual.Transport):
    """kombu's transport for `ezra://host:port` and `ezras://` (TLS); a password as in redis://."""

    Channel = Channel
    default_port = DEFAULT_PORT
    driver_type = driver_name = "ezra"
    polling_interval = None  # drain_events blocks in XREADGROUP: nothing polls
    implements = virtual.Transport.implements.extend(
        asynchronous=False, exchange_type=frozenset(["direct"]), heartbeats=False)
    connection_errors = virtual.Transport.connection_errors + (redis.ConnectionError, redis.TimeoutError)
    channel_errors = virtual.Transport.channel_errors

    def __init__(self, client, **kwargs):
        super().__init__(client, **kwargs)
        self.consumers_changed = threading.Event()
        # kombu parses the URL (the class says can_parse_url = False); this instance's True only
        # makes Connection.as_uri ask as_uri below for the URL that logs and Celery's banner show
        self.can_parse_url = True

    def as_uri(self, uri, include_password=False, mask="**"):
        """The URL for logs, with the password masked if there is one (kombu's own masks a missing
        one too: `ezra://:**@127.0.0.1:42002//` for a server with no password)."""
        client = self.client
        scheme = client.transport_cls if isinstance(client.transport_cls, str) else "ezra"
        return as_url(scheme, client.hostname or "localhost", client.port or DEFAULT_PORT, client.userid,
                      client.password or None, quote(client.virtual_host or "/"),
                      sanitize=not include_password, mask=mask)

    def driver_version(self):
        return redis.__version__

    def drain_events(self, connection, timeout=None):
        """Deliver the next tasks of the consuming channel (one blocking read); socket.timeout if none."""
        channel = next((c for c in self.channels if c._consumers), None)
        if channel is None:  # nothing consumes yet: wait for basic_consume, not in a loop
            self.consumers_changed.clear()
            self.consumers_changed.wait(BLOCK_WHEN_UNTIMED if timeout is None else timeout)
            raise socket.timeout()
        if not channel.drain(timeout):
            raise socket.timeout()
