"""Push, claim, ack, nack, expire, purge; blocked readers; the reaper.

The public methods run in connection greenlets. Each submits a transaction
script (the `_tx_*` methods) to the writer, which runs it on the writer's
thread in a batch; only those scripts touch `self.queues` (per-queue caches:
last id, settings, counts) and `self.blocked` (the FIFO of blocked readers per
queue), so no locks are needed.

A blocked reader is served inside the transaction that makes a task available
(push, nack, expiry): the task is claimed for the first waiter in the same
batch and the waiter is woken after the batch commits. Waking one waiter costs
O(1) however many are idle, and no wake-up can be lost between "nothing to
claim" and "start waiting", since both happen on the writer thread.
"""

from __future__ import annotations

import time
from collections import OrderedDict

import gevent
from gevent.event import Event
from loguru import logger

from . import errors, lifecycle
from .lifecycle import AVAILABLE, DEAD, DONE, IN_FLIGHT
from .resp import PairsMap
from .storage import Database, entry, name_bytes
from .writer import Writer

DEFAULT_READ_COUNT = 1000  # XREADGROUP without COUNT: Redis means "all"; EZRA caps it
MAX_READ_COUNT = 10000
EXPIRE_BATCH = 1000
PURGE_BATCH = 500
REAPER_INTERVAL = 0.1  # seconds between checks for expired leases and old done tasks


def now_ms() -> int:
    return int(time.time() * 1000)


class QueueState:
    """What the writer thread remembers about one queue."""

    __slots__ = ("name", "last_id", "visibility_timeout", "max_attempts", "retention", "counts")

    def __init__(self, name: bytes, last_id=(0, 0), visibility_timeout=None, max_attempts=None,
                 retention=None):
        self.name = name
        self.last_id = last_id
        self.visibility_timeout = visibility_timeout
        self.max_attempts = max_attempts
        self.retention = retention
        self.counts = dict.fromkeys(lifecycle.STATES, 0)

    def move(self, from_state: str, to_state: str, n: int = 1) -> None:
        self.counts[from_state] -= n
        self.counts[to_state] += n


class Waiter:
    """A blocked XREADGROUP: woken with `result` (a PairsMap) or `error`."""

    __slots__ = ("queues", "worker", "count", "noack", "event", "result", "error", "registered")

    def __init__(self, queues, worker, count, noack):
        self.queues = queues
        self.worker = worker
        self.count = count
        self.noack = noack
        self.event = Event()
        self.result = None
        self.error = None
        self.registered = False


class Broker:
    """The queue operations, as greenlets call them."""

    def __init__(self, db: Database, settings, clock=now_ms):
        self.db = db
        self.settings = settings
        self.clock = clock
        self.queues: dict[bytes, QueueState] = {}
        self.blocked: dict[bytes, OrderedDict] = {}
        self._served: list[Waiter] = []
        # No lease can expire before this: the reaper skips its query until then.
        self._earliest_deadline = 0
        self._reload()
        self.writer = Writer(db, fsync_durable=settings.durability == "full",
                             on_rollback=self._reload, after_batch=self._after_batch)
        self._reaper = None
        self.stats = {"pushed": 0, "delivered": 0, "acked": 0, "failed": 0, "expired": 0, "dead": 0}

    # ------------------------------------------------------------ life

    def start_reaper(self) -> None:
        self._reaper = gevent.spawn(self._reap_forever)

    def cancel_waiters(self) -> None:
        """Shutdown: every blocked reader gets a null reply now."""
        self.writer.call(self._tx_cancel_waiters, durable=False)

    def stop(self) -> None:
        """Stop the reaper, then commit and answer whatever is queued."""
        if self._reaper is not None:
            self._reaper.kill()
        self.writer.stop()

    def _reap_forever(self) -> None:
        while True:
            gevent.sleep(REAPER_INTERVAL)
            try:
                self.writer.call(self._tx_maintain, durable=False)
            except Exception as exc:
                logger.opt(exception=exc).error("reaper pass failed: {}", exc)

    # ------------------------------------------------------------ greenlet API

    def push(self, queue: bytes, id_arg: bytes, fields: list[bytes], nomkstream: bool = False):
        """Submit XADD; the request's result is the new id (bytes) or None (NOMKSTREAM)."""
        return self.writer.submit(self._tx_push, queue, id_arg, fields, nomkstream)

    def read(self, queues: list[bytes], worker: bytes, count: int, noack: bool,
             block_ms: int | None, wait):
        """XREADGROUP with '>': claim, or block until a task comes or the time is up.

        `wait(event, seconds)` waits for the event and returns True, or False on
        a timeout, or None when the client hung up.
        """
        if block_ms is None:
            return self.writer.call(self._tx_claim, queues, worker, count, noack, None, durable=False)
        waiter = Waiter(queues, worker, count, noack)
        result = self.writer.call(self._tx_claim, queues, worker, count, noack, waiter, durable=False)
        if result is not None:
            return result
        woken = wait(waiter.event, block_ms / 1000 if block_ms else None)
        if not woken:
            # Served in a batch that committed just now, or still waiting: ask the writer.
            result = self.writer.call(self._tx_unblock, waiter, durable=False)
            if woken is None and result:
                self._release_unsent(result)
                return None
            return result
        if waiter.error is not None:
            raise waiter.error
        return waiter.result

    def reread(self, queue: bytes, worker: bytes, after: tuple, count: int | None):
        """XREADGROUP with an id: this worker's own in-flight tasks after `after`."""
        return self.writer.submit(self._tx_reread, queue, worker, after, count, durable=False)

    def ack(self, queue: bytes, ids: list[tuple]):
        return self.writer.submit(self._tx_ack, queue, ids)

    def fail(self, queue: bytes, ids: list[tuple], mode: str = lifecycle.FAIL,
             retry_count: int | None = None, force: bool = False):
        """XNACK (and XDEL on a live queue): report failed attempts."""
        return self.writer.submit(self._tx_fail, queue, ids, mode, retry_count, force)

    def delete_dead(self, queue: bytes, ids: list[tuple]):
        return self.writer.submit(self._tx_delete_dead, queue, ids)

    def create_queue(self, queue: bytes, must_exist: bool):
        return self.writer.submit(self._tx_create_queue, queue, must_exist)

    def length(self, queue: bytes, dead: bool):
        return self.writer.submit(self._tx_length, queue, dead, durable=False)

    def range(self, queue: bytes, dead: bool, start, end, count, reverse: bool):
        return self.writer.submit(self._tx_range, queue, dead, start, end, count, reverse, durable=False)

    def pending_summary(self, queue: bytes):
        """XPENDING summary: (first id, last id, [(worker, count)]) of in-flight tasks."""
        return self.writer.submit(self._tx_pending_summary, queue, durable=False)

    def pending_entries(self, queue: bytes, start, end, count, worker, min_idle_ms):
        return self.writer.submit(self._tx_pending_entries, queue, start, end, count, worker, min_idle_ms,
                                  durable=False)

    def queue_counts(self) -> dict[bytes, dict[str, int]]:
        """A snapshot of every queue's counts by state (INFO)."""
        return self.writer.call(self._tx_counts, durable=False)

    def blocked_clients(self) -> int:
        return len({id(w) for fifo in list(self.blocked.values()) for w in list(fifo.values())})

    # ------------------------------------------------------------ writer thread

    def _reload(self) -> None:
        """Rebuild the caches from the database (start-up, and after a rollback)."""
        queues = {}
        for name, saved_id, newest_id, vt, attempts, retention in self.db.load_queues():
            key = name_bytes(name)
            last_id = max(saved_id, newest_id or (0, 0))  # pushes do not save it: see _save_last_id
            queues[key] = QueueState(key, last_id, vt, attempts, retention)
        for name, state, count in self.db.count_states():
            queue = queues.get(name_bytes(name))
            if queue is not None:
                queue.counts[state] = count
        self.queues = queues

    def _after_batch(self, ok: bool) -> None:
        """In the event loop, after a batch: wake the readers it served."""
        served, self._served = self._served, []
        for waiter in served:
            if not ok:
                waiter.result, waiter.error = None, errors.storage_failed("the batch was rolled back")
            waiter.event.set()

    def _queue(self, name: bytes, now: int, create: bool = True) -> QueueState | None:
        queue = self.queues.get(name)
        if queue is None and create:
            self.db.insert_queue(name, now)
            queue = self.queues[name] = QueueState(name)
        return queue

    def _visibility_timeout(self, queue: QueueState) -> float:
        vt = queue.visibility_timeout
        return self.settings.visibility_timeout if vt is None else vt

    def _max_attempts(self, queue: QueueState) -> int:
        attempts = queue.max_attempts
        return self.settings.max_attempts if attempts is None else attempts

    def _retention(self, queue: QueueState) -> float | None:
        retention = queue.retention
        return self.settings.retention_seconds if retention is None else retention

    def _tx_create_queue(self, name: bytes, must_exist: bool) -> bool:
        if must_exist and name not in self.queues:
            raise errors.XGROUP_NEEDS_KEY
        self._queue(name, self.clock())
        return True

    def _tx_push(self, name: bytes, id_arg: bytes, fields: list[bytes], nomkstream: bool):
        now = self.clock()
        queue = self._queue(name, now, create=not nomkstream)
        if queue is None:
            return None
        task_id = lifecycle.new_id(id_arg, queue.last_id, now)
        self.db.insert_task(name, task_id, fields, now, now)
        queue.last_id = task_id
        queue.counts[AVAILABLE] += 1
        self.stats["pushed"] += 1
        self._serve_waiters(queue, now)
        return lifecycle.format_id(task_id)

    def _claim_rows(self, queue: QueueState, worker: bytes, count: int, noack: bool, now: int):
        state = DONE if noack else IN_FLIGHT
        deadline = None if noack else lifecycle.lease_deadline(now, self._visibility_timeout(queue))
        rows = self.db.claim(queue.name, worker, count, now, deadline, state)
        if rows and deadline is not None:
            self._earliest_deadline = min(self._earliest_deadline, deadline)
        queue.move(AVAILABLE, state, len(rows))
        self.stats["delivered"] += len(rows)
        return rows

    def _tx_claim(self, names: list[bytes], worker: bytes, count: int, noack: bool,
                  waiter: Waiter | None):
        now = self.clock()
        result = PairsMap()
        for name in names:
            queue = self.queues.get(name)
            if queue is None or not queue.counts[AVAILABLE]:
                continue
            rows = self._claim_rows(queue, worker, count, noack, now)
            if rows:
                result[name] = [entry(row) for row in rows]
        if result:
            return result
        if waiter is not None:
            for name in waiter.queues:
                self.blocked.setdefault(name, OrderedDict())[id(waiter)] = waiter
            waiter.registered = True
        return None

    def _serve_waiters(self, queue: QueueState, now: int) -> None:
        """Hand newly available tasks of `queue` to its blocked readers, first come first served."""
        fifo = self.blocked.get(queue.name)
        while fifo and queue.counts[AVAILABLE]:
            waiter = next(iter(fifo.values()))
            rows = self._claim_rows(queue, waiter.worker, waiter.count, waiter.noack, now)
            if not rows:
                return  # what is available is delayed
            self._unregister(waiter)
            waiter.result = PairsMap({queue.name: [entry(row) for row in rows]})
            self._served.append(waiter)

    def _unregister(self, waiter: Waiter) -> None:
        for name in waiter.queues:
            fifo = self.blocked.get(name)
            if fifo is not None:
                fifo.pop(id(waiter), None)
                if not fifo:
                    del self.blocked[name]
        waiter.registered = False

    def _tx_unblock(self, waiter: Waiter):
        if waiter.registered:
            self._unregister(waiter)
            return None
        if waiter.error is not None:
            raise waiter.error
        return waiter.result

    def _tx_cancel_waiters(self) -> None:
        for fifo in list(self.blocked.values()):
            for waiter in list(fifo.values()):
                self._unregister(waiter)
                self._served.append(waiter)  # woken with result None: a null reply

    def _release_unsent(self, result: PairsMap) -> None:
        """The reader hung up after tasks were claimed for it: give them back unspent."""
        for name, entries in result.items():
            ids = [lifecycle.parse_id(task_id) for task_id, _ in entries]
            self.writer.submit(self._tx_fail, name, ids, lifecycle.SILENT, None, False)

    def _tx_reread(self, name: bytes, worker: bytes, after: tuple, count: int | None):
        queue = self.queues.get(name)
        if queue is None:
            return []
        now = self.clock()
        deadline = lifecycle.lease_deadline(now, self._visibility_timeout(queue))
        self._earliest_deadline = min(self._earliest_deadline, deadline)
        return [entry(row) for row in self.db.reread(name, worker, after, count, now, deadline)]

    def _tx_ack(self, name: bytes, ids: list[tuple]) -> int:
        queue = self.queues.get(name)
        if queue is None:
            return 0
        acked = self.db.ack(name, ids, self.clock())
        queue.move(IN_FLIGHT, DONE, acked)
        self.stats["acked"] += acked
        return acked

    def _tx_fail(self, name: bytes, ids: list[tuple], mode: str, retry_count: int | None,
                 force: bool) -> int:
        queue = self.queues.get(name)
        if queue is None:
            return 0
        states = (IN_FLIGHT, AVAILABLE) if force else (IN_FLIGHT,)
        rows = self.db.in_flight_attempts(name, ids, states)
        now = self.clock()
        self._apply_failures(queue, rows, mode, retry_count, now)
        self.stats["failed"] += len(rows)
        return len(rows)

    def _apply_failures(self, queue: QueueState, rows, mode: str, retry_count: int | None, now: int):
        """The one place failed attempts are decided: nack, XDEL and expiry all come here."""
        max_attempts = self._max_attempts(queue)
        for rowid, attempts, state, *_ in rows:
            if retry_count is not None:
                attempts = retry_count
            new_state, attempts = lifecycle.after_failure(attempts, max_attempts, mode)
            self.db.set_outcome(rowid, new_state, attempts, now, now)
            queue.move(state, new_state)
            if new_state == DEAD:
                self.stats["dead"] += 1
        self._serve_waiters(queue, now)

    def _save_last_id(self, queue: QueueState) -> None:
        # A push does not write the last id (a page write saved per push): the
        # newest task holds it. Before tasks are deleted, the queue row keeps it.
        self.db.save_last_id(queue.name, queue.last_id)

    def _tx_delete_dead(self, name: bytes, ids: list[tuple]) -> int:
        queue = self.queues.get(name)
        if queue is None:
            return 0
        self._save_last_id(queue)
        deleted = self.db.delete_dead(name, ids)
        queue.counts[DEAD] -= deleted
        return deleted

    def _tx_length(self, name: bytes, dead: bool) -> int:
        queue = self.queues.get(name)
        if queue is None:
            return 0
        if dead:
            return queue.counts[DEAD]
        return queue.counts[AVAILABLE] + queue.counts[IN_FLIGHT]

    def _tx_range(self, name: bytes, dead: bool, start, end, count, reverse):
        states = (DEAD,) if dead else (AVAILABLE, IN_FLIGHT, DONE)
        rows = self.db.range(name, states, start, end, count, reverse)
        return [entry(row) for row in rows]

    def _tx_pending_summary(self, name: bytes):
        first, last, workers = self.db.pending_summary(name)
        return first, last, [(name_bytes(worker), n) for worker, n in workers]

    def _tx_pending_entries(self, name, start, end, count, worker, min_idle_ms):
        now = self.clock()
        before = None if min_idle_ms is None else now - min_idle_ms
        rows = self.db.pending_entries(name, start, end, count, worker, before)
        return [[b"%d-%d" % (ms, seq), name_bytes(owner), max(now - delivered, 0), attempts]
                for ms, seq, owner, delivered, attempts in rows]

    def _tx_counts(self) -> dict:
        return {name: dict(queue.counts) for name, queue in self.queues.items()}

    def _tx_maintain(self) -> None:
        """The reaper's pass: expire leases (as failures), purge old done tasks."""
        now = self.clock()
        if now >= self._earliest_deadline:
            self._expire(now)
        for queue in list(self.queues.values()):
            retention = self._retention(queue)
            if retention is not None and queue.counts[DONE]:
                self._save_last_id(queue)
                purged = self.db.purge_done(queue.name, now - int(retention * 1000), PURGE_BATCH)
                queue.counts[DONE] -= purged

    def _expire(self, now: int) -> None:
        """In-flight tasks whose lease ran out fail, through the same rule as a nack."""
        expired = self.db.expired(now, EXPIRE_BATCH)
        by_queue: dict[bytes, list] = {}
        for row in expired:
            by_queue.setdefault(name_bytes(row[3]), []).append(row)
        for name, rows in by_queue.items():
            queue = self.queues.get(name)
            if queue is not None:
                self._apply_failures(queue, rows, lifecycle.FAIL, None, now)
                self.stats["expired"] += len(rows)
        next_deadline = self.db.next_deadline()
        self._earliest_deadline = now if len(expired) == EXPIRE_BATCH else (
            next_deadline if next_deadline is not None else float("inf"))
