"""The workers blocked in XREADGROUP waiting for a task: a line (FIFO) per queue.

A blocked worker (a `Waiter`) is served inside the transaction that makes a task available
(push, nack, expiry, a delayed task coming due, requeue, resuming a paused queue): the task is
claimed for the first waiter in the same batch (Transitions.serve_waiters), and the waiter is
woken after the batch commits (`after_batch`). Waking one costs O(1) however many are idle,
and no wake-up can be lost between "nothing to claim" and "start waiting", since a waiter is
registered between batches or in one. Only the writer's batches (and greenlets between
batches) touch the lines, so no locks are needed.

The front (commands/table.py) waits on `waiter.event`, then reads `result` or `error`.
"""

from __future__ import annotations

from collections import OrderedDict

from gevent.event import Event

from .. import errors


class Claim:
    """What one XREADGROUP '>' asks for: up to `count` available tasks of `queues` for `worker`
    (NOACK: done at once; CLAIM min-idle: tasks in flight idle that long first). Plain values: a
    worker that sends the same XREADGROUP again is read as the same Claim (the session keeps it)."""

    __slots__ = ("queues", "worker", "count", "noack", "claim_idle")

    def __init__(self, queues, worker, count, noack, claim_idle=None):
        self.queues = queues
        self.worker = worker
        self.count = count
        self.noack = noack
        self.claim_idle = claim_idle  # XREADGROUP CLAIM: entries carry [idle, deliveries] too


class Waiter:
    """A blocked XREADGROUP: its Claim, woken with `result` ({queue: task rows}, as a claim's) or `error`."""

    __slots__ = ("claim", "event", "result", "error", "registered", "rolled_back")

    def __init__(self, claim: Claim):
        self.claim = claim
        self.event = Event()
        self.result = None
        self.error = None
        self.registered = False
        self.rolled_back = False  # a batch that served it was rolled back (it waited again)


class Waiters:
    """The lines of blocked workers per queue, and those the open batch served."""

    def __init__(self):
        self.blocked: dict[bytes, OrderedDict] = {}  # queue -> its waiters, first come first
        self.to_wake: list[Waiter] = []  # waiters the open batch served: woken after it

    def register(self, waiter: Waiter, first: bool = False) -> None:
        """In line on each of its queues (`first`: at the head, a waiter a rollback took back)."""
        for name in waiter.claim.queues:
            line = self.blocked.setdefault(name, OrderedDict())
            line[id(waiter)] = waiter
            if first:
                line.move_to_end(id(waiter), last=False)
        waiter.registered = True

    def unregister(self, waiter: Waiter) -> None:
        for name in waiter.claim.queues:
            line = self.blocked.get(name)
            if line is not None:
                line.pop(id(waiter), None)
                if not line:
                    del self.blocked[name]
        waiter.registered = False

    def first(self, name: bytes) -> Waiter | None:
        """The waiter first in line for the queue."""
        line = self.blocked.get(name)
        return next(iter(line.values())) if line else None

    def served(self, waiter: Waiter, result: dict | None) -> None:
        """In a batch: the waiter got `result` (None: a null reply); out of line, woken after the batch."""
        self.unregister(waiter)
        waiter.result = result
        self.to_wake.append(waiter)

    def serve_all_null(self) -> None:
        """Shutdown: every blocked worker gets a null reply after this batch."""
        for line in list(self.blocked.values()):
            for waiter in list(line.values()):
                self.served(waiter, None)

    def count(self) -> int:
        """Blocked workers (one waiting on several queues counts once)."""
        return len({id(w) for line in list(self.blocked.values()) for w in list(line.values())})

    def after_batch(self, committed: bool) -> None:
        """In the event loop, after a batch: wake the waiters it served.

        A rolled-back batch served nobody: a waiter it handed tasks to waits again, first in line
        (before, it got a storage error: a worker blocked while a push filled the disk failed).
        Once only: should serving this waiter be what fails, the next rollback answers the error.
        """
        served, self.to_wake = self.to_wake, []
        for waiter in served:
            if not committed and waiter.result is not None and not waiter.rolled_back:
                waiter.result, waiter.rolled_back = None, True
                self.register(waiter, first=True)
                continue
            if not committed:
                waiter.result, waiter.error = None, errors.storage_failed("the batch was rolled back")
            waiter.event.set()
