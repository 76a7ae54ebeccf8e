"""A task as its producer sees it: XRESULT's look at its outcome, XPROGRESS's report, and the
watch XRESULT BLOCK keeps on a task until it ends.

    XRESULT q id [BLOCK ms]    outcome: (state, attempts, last failure, result, progress, name)
    XRESULT q NAME n ...       named: the id of the task pushed with XADD ... NAME n, then as above
    XPROGRESS q id value       report_progress: kept on the task in flight, and its lease
                               renewed from now, as the owner's XCLAIM renews it (a heartbeat)
    XACK q g id RESULT value   Tasks.ack: the result is written by the ack, in its transaction

Progress is committed and durable before XPROGRESS answers, like the ack it precedes: a producer
that has read a value never sees it go back after a crash. It stays on the task across
redeliveries (what was last reported; XRESULT's attempts tells which delivery that was) until a
worker reports again. A result and a progress live in the task's row, so they go with it
(retention, TTL, XTRIM, XACKDEL, XDEL on q::dead).
"""

from __future__ import annotations

from .. import errors, lifecycle
from ..writer.transactions import transaction
from .observers import Observer


class Results:
    """XRESULT's and XPROGRESS's transactions, and XRESULT BLOCK's watchers."""

    def __init__(self, db, queues, in_flight, schedule, observers, writer, clock):
        self.db = db
        self.queues = queues
        self.in_flight = in_flight
        self.schedule = schedule
        self.observers = observers
        self.writer = writer
        self.clock = clock

    @transaction(durable=False)
    def outcome(self, name: bytes, task_id: tuple) -> tuple:
        """XRESULT: (state, attempts, failure JSON, result, progress, name) of one task; an error if the
        queue or the task is not there."""
        if name not in self.queues:
            raise errors.no_such_queue(name)
        found = self.db.results.outcome(name, task_id)
        if found is None:
            raise errors.no_such_task(name, task_id)
        return found

    @transaction(durable=False)
    def named(self, name: bytes, task_name: bytes) -> tuple:
        """XRESULT NAME: the id of the queue's task named `task_name` (XADD NAME); an error if the
        queue or the name is not there."""
        if name not in self.queues:
            raise errors.no_such_queue(name)
        found = self.db.task_names.task(name, task_name)
        if found is None:
            raise errors.no_such_name(name, task_name)
        return found

    @transaction()
    def report_progress(self, name: bytes, task_id: tuple, progress: bytes) -> None:
        """XPROGRESS: the progress of a task in flight, kept; its holder's lease runs from now."""
        queue = self.queues.get(name)
        if queue is None:
            raise errors.no_such_queue(name)
        held = self.in_flight.held(queue, [task_id])
        if not held:
            state = self.db.results.state_of(name, task_id)
            raise errors.no_such_task(name, task_id) if state is None else errors.progress_not_in_flight(task_id, state)
        rowid, worker, _, _, attempts = held[0][1]
        now = self.clock()
        deadline = lifecycle.lease_deadline(now, queue.lease_seconds())
        if self.db.results.report_progress(rowid, progress, now, deadline) != 1:
            raise errors.guard_failed("progress", rowid, lifecycle.IN_FLIGHT)  # the lease said in flight
        self.in_flight.leased(queue, task_id, (rowid, worker, deadline, now, attempts))
        self.schedule.lease_until(deadline)

    def watch(self, name: bytes, task_id: tuple) -> Observer:
        """XRESULT BLOCK's start, between batches and before its first look: an Observer of the task,
        woken after the commit of the batch that ends it (observers.py). The front `unwatch`es it."""
        observer = Observer({(name, task_id)})
        self.observers.watch(observer)
        return observer

    def unwatch(self, observer: Observer) -> None:
        self.observers.unwatch(observer)
