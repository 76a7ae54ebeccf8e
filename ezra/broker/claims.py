"""Claims: part of the Broker (a mixin). XREADGROUP's claims and the workers blocked waiting for one.

    claim        XREADGROUP >       claim available tasks (after idle ones, with CLAIM), or block
    claim_own    XREADGROUP <id>    the worker's own tasks in flight, again, with a fresh lease

A blocked worker (a `Waiter`) is served inside the transaction that makes a task
available (push, nack, expiry, a delayed task coming due, requeue, resuming a
paused queue): the task is claimed for the first waiter in the same batch and
the waiter is woken after the batch commits. Waking one waiter costs O(1) however
many are idle, and no wake-up can be lost between "nothing to claim" and "start
waiting", since both happen in the writer's batch. Only the writer's batches
touch `self.blocked` (the FIFO of waiters per queue), so no locks are needed.

A paused queue (XCFGSET PAUSED 1) is skipped by every claim: `>` claims, their
waiters and take-overs (leases.py) hand out nothing from it, while pushes,
acks, nacks, expiry and delayed tasks coming due go on as usual. Resuming
serves its waiters at once.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from gevent.event import Event

from .. import errors, lifecycle
from ..lifecycle import AVAILABLE, DONE, IN_FLIGHT
from .base import BrokerCore

if TYPE_CHECKING:
    from .core import QueueState


def new_as_idle(rows: list) -> list:
    """XREADGROUP CLAIM: new tasks in the idle claims' shape, idle 0 ms and delivered 0 times before."""
    return [(*row[:3], 0, 0) for row in rows]


class Waiter:
    """A blocked XREADGROUP: woken with `result` ({queue: task rows}, as `_tx_claim`'s) or `error`."""

    __slots__ = ("queues", "worker", "count", "noack", "claim_idle", "event", "result", "error",
                 "registered", "rolled_back")

    def __init__(self, queues, worker, count, noack, claim_idle=None):
        self.queues = queues
        self.worker = worker
        self.count = count
        self.noack = noack
        self.claim_idle = claim_idle  # XREADGROUP CLAIM: entries carry [idle, deliveries] too
        self.event = Event()
        self.result = None
        self.error = None
        self.registered = False
        self.rolled_back = False  # a batch that served it was rolled back (it waited again)


class Claims(BrokerCore):
    """Claims and blocked workers (mixed into Broker)."""

    def __init__(self):
        self.blocked: dict[bytes, OrderedDict] = {}  # waiters, FIFO per queue
        self._served: list[Waiter] = []  # waiters the open batch served: woken after it

    # ------------------------------------------------------------ greenlet API

    def claim(self, queues: list[bytes], worker: bytes, count: int, noack: bool,
             block_ms: int | None, wait, claim_idle: int | None = None):
        """XREADGROUP with '>': claim, or block until a task comes or the time is up. What it claimed
        is {queue: task rows} (id_ms, id_seq, fields JSON, ...), or None; with CLAIM the rows are
        (id_ms, id_seq, fields JSON, idle ms, deliveries). commands/replies.py shapes them.

        `wait(event, seconds)` waits for the event and returns True, or False on
        a timeout, or None when the client hung up. With `claim_idle` (CLAIM ms),
        tasks in flight for that long are taken over first.
        """
        nothing_to_claim = self._nothing_to_claim(queues, claim_idle)
        if block_ms is None:
            if nothing_to_claim:
                return None
            return self.writer.call(self._tx_claim, queues, worker, count, noack, None, claim_idle,
                                    durable=False)
        waiter = Waiter(queues, worker, count, noack, claim_idle)
        if nothing_to_claim:
            self._register(waiter)  # no batch needed: see _nothing_to_claim
        else:
            try:
                result = self.writer.call(self._tx_claim, queues, worker, count, noack, waiter, claim_idle,
                                          durable=False)
            except errors.CommandError:
                self._forget(waiter)  # its batch rolled back: the client gets the error, nobody waits
                raise
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

    def claim_now(self, queues: list[bytes], worker: bytes, count: int, noack: bool,
                  claim_idle: int | None = None):
        """XREADGROUP with '>', without waiting: the request holding what it claimed, or None if it
        claimed nothing. Its reply waits for the commit like any other (Deferred), so the claims of
        one pipelined read share a commit and a send, where `claim` waits for each one's commit."""
        if self._nothing_to_claim(queues, claim_idle):
            return None
        request = self.writer.submit(self._tx_claim, queues, worker, count, noack, None, claim_idle,
                                     durable=False)
        return None if request.result is None else request

    def claim_own(self, queue: bytes, worker: bytes, after: tuple, count: int | None):
        """XREADGROUP with an id: this worker's own in-flight tasks after `after`."""
        return self.writer.submit(self._tx_claim_own, queue, worker, after, count, durable=False)

    def blocked_clients(self) -> int:
        """Blocked XREADGROUPs and XREADs (INFO's blocked_clients)."""
        workers = len({id(w) for fifo in list(self.blocked.values()) for w in list(fifo.values())})
        return workers + self.observers_blocked()

    def cancel_waiters(self) -> None:
        """Shutdown: every blocked worker (XREADGROUP) and observer (XREAD) gets a null reply now."""
        self.writer.call(self._tx_cancel_waiters, durable=False)

    # ------------------------------------------------------------ writer's batch

    def _claim_rows(self, queue: QueueState, worker: bytes, count: int, noack: bool, now: int):
        state = DONE if noack else IN_FLIGHT
        deadline = None if noack else lifecycle.lease_deadline(now, self._visibility_timeout(queue))
        rows = self.db.claim(queue.name, worker, count, now, deadline, state)
        if rows:
            if deadline is not None:
                self.lease_until(deadline)
            else:  # NOACK: done at once
                queue.trim_floor = min(queue.trim_floor, rows[0][:2])
            queue.last_delivered = max(queue.last_delivered or (0, 0), rows[-1][:2])
        queue.move(AVAILABLE, state, len(rows))
        if rows and deadline is not None:
            self._leased(worker, queue)
        self._tally(queue, "delivered", len(rows))
        redelivered = sum(1 for row in rows if row[3] > 1)  # row[3]: attempts, this one included
        if redelivered:
            self._tally(queue, "redelivered", redelivered)
        return rows

    def _tx_claim(self, names: list[bytes], worker: bytes, count: int, noack: bool,
                  waiter: Waiter | None, claim_idle: int | None):
        now = self.clock()
        result = {}
        for name in names:
            queue = self.queues.get(name)
            if queue is None or self._paused(queue):
                continue
            rows = []
            if claim_idle is not None and queue.counts[IN_FLIGHT]:
                rows = self._claim_idle(queue, worker, count, claim_idle, now)
            room = count - len(rows)
            if room > 0 and queue.counts[AVAILABLE]:
                new = self._claim_rows(queue, worker, room, noack, now)
                rows = new if claim_idle is None else rows + new_as_idle(new)
            if rows:
                result[name] = rows
        if result:
            return result
        if waiter is not None:
            self._register(waiter)
        return None

    def _nothing_to_claim(self, names: list[bytes], claim_idle: int | None) -> bool:
        """No queue that is not paused has an available task: known from the counts, without a batch.

        The writer runs its batches on the event loop and never yields inside
        one, so between two batches a greenlet sees the counts as committed and
        can register a waiter before any later push looks for one.
        """
        if claim_idle is not None:
            return False
        for name in names:
            queue = self.queues.get(name)
            if queue is not None and queue.counts[AVAILABLE] and not self._paused(queue):
                return False
        return True

    def _register(self, waiter: Waiter, first: bool = False) -> None:
        for name in waiter.queues:
            fifo = self.blocked.setdefault(name, OrderedDict())
            fifo[id(waiter)] = waiter
            if first:
                fifo.move_to_end(id(waiter), last=False)
        waiter.registered = True

    def _serve_waiters(self, queue: QueueState, now: int) -> None:
        """Hand newly available tasks of `queue` to its blocked workers, first come first served
        (none while it is paused: they wait for the resume, which calls this again)."""
        if self._paused(queue):
            return
        fifo = self.blocked.get(queue.name)
        while fifo and queue.counts[AVAILABLE]:
            waiter = next(iter(fifo.values()))
            rows = self._claim_rows(queue, waiter.worker, waiter.count, waiter.noack, now)
            if not rows:
                return
            self._unregister(waiter)
            waiter.result = {queue.name: rows if waiter.claim_idle is None else new_as_idle(rows)}
            self._served.append(waiter)

    def _unregister(self, waiter: Waiter) -> None:
        for name in waiter.queues:
            fifo = self.blocked.get(name)
            if fifo is not None:
                fifo.pop(id(waiter), None)
                if not fifo:
                    del self.blocked[name]
        waiter.registered = False

    def _forget(self, waiter: Waiter) -> None:
        """Its worker will not wait after all: take it off the queues' lines, and give back what a
        later batch may have claimed for it already."""
        if waiter.registered:
            self._unregister(waiter)
        elif waiter.result:
            self._release_unsent(waiter.result)
            waiter.result = None

    def _tx_unblock(self, waiter: Waiter):
        if waiter.registered:
            self._unregister(waiter)
            return None
        if waiter.error is not None:
            raise waiter.error
        return waiter.result

    def _tx_cancel_waiters(self) -> None:
        self._cancel_observers()
        for fifo in list(self.blocked.values()):
            for waiter in list(fifo.values()):
                self._unregister(waiter)
                self._served.append(waiter)  # woken with result None: a null reply

    def _release_unsent(self, result: dict) -> None:
        """The worker hung up after tasks were claimed for it: give them back unspent."""
        for name, rows in result.items():
            ids = [row[:2] for row in rows]
            self.writer.submit(self._tx_fail, name, ids, lifecycle.SILENT, None, False)

    def _tx_claim_own(self, name: bytes, worker: bytes, after: tuple, count: int | None):
        queue = self.queues.get(name)
        if queue is None:
            return []
        now = self.clock()
        deadline = lifecycle.lease_deadline(now, self._visibility_timeout(queue))
        self.lease_until(deadline)
        return self.db.claim_own(name, worker, after, count, now, deadline)

    def _after_batch(self, ok: bool) -> None:
        """In the event loop, after a batch: wake the waiters it served, then the observers
        (XREAD) of the queues it added entries to.

        A rolled-back batch served nobody: a waiter it handed tasks to waits again, first in line
        (before, it got a storage error: a worker blocked while a push filled the disk failed).
        Once only: should serving this waiter be what fails, the next rollback answers the error.
        """
        served, self._served = self._served, []
        for waiter in served:
            if not ok and waiter.result is not None and not waiter.rolled_back:
                waiter.result, waiter.rolled_back = None, True
                self._register(waiter, first=True)
                continue
            if not ok:
                waiter.result, waiter.error = None, errors.storage_failed("the batch was rolled back")
            waiter.event.set()
        self._wake_observers(ok)
