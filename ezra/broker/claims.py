"""XREADGROUP's claims: available tasks leased to a worker, or the worker put in line to wait.

    claim        XREADGROUP >       claim available tasks (after idle ones, with CLAIM), or wait
    claim_own    XREADGROUP <id>    the worker's own tasks in flight, again, with a fresh lease

A claim that finds nothing registers a Waiter (waiters.py) in the same batch, or between
batches when the counts already say there is nothing: either way no push can come between
"nothing to claim" and "in line". The front (commands/table.py) then waits for it.

A paused queue (XCFGSET PAUSED 1) is skipped by every claim: `>` claims, their
waiters and take-overs (leases.py) hand out nothing from it, while pushes,
acks, nacks, expiry and delayed tasks coming due go on as usual. Resuming
serves its waiters at once.

A queue's MAX-IN-FLIGHT and RATE-LIMIT (flow.py) bound what a `>` claim takes, in
Transitions.claim_rows and, between batches, in `nothing_to_claim`: a claim at a limit
finds nothing, and waits with BLOCK until a slot frees or the window opens. So does a claim
of a queue whose every partition with work is at its PARTITION-LIMIT (lanes.py), until one of
their leases ends.
"""

from __future__ import annotations

from ..lifecycle import AVAILABLE, IN_FLIGHT
from .. import errors, lifecycle
from ..writer.transactions import transaction
from .in_flight import ROWID
from .transitions import new_as_idle
from .waiters import Claim, Waiter


class Claims:
    """XREADGROUP's transactions over the queues, their waiters and the leases."""

    def __init__(self, db, queues, in_flight, transitions, leases, waiters, schedule, writer, clock):
        self.db = db
        self.queues = queues
        self.in_flight = in_flight
        self.transitions = transitions
        self.leases = leases
        self.waiters = waiters
        self.schedule = schedule
        self.writer = writer  # for the claims' transactions (writer/transactions.py)
        self.clock = clock

    def nothing_to_claim(self, claim: Claim) -> bool:
        """No queue that is not paused has an available task: known from the counts, without a batch.

        The writer runs its batches on the event loop and never yields inside
        one, so between two batches a greenlet sees the counts as committed and
        can register a waiter before any later push looks for one.
        """
        if claim.claim_idle is not None:
            return False
        queues = self.queues
        for name in claim.queues:
            queue = queues.get(name)
            if queue is not None and queue.counts[AVAILABLE] and not queue.is_paused():
                flow = queue.flow  # MAX-IN-FLIGHT, RATE-LIMIT (flow.py): the same room as claim_rows'
                if (flow is None or flow.room(queue.counts[IN_FLIGHT], self.clock())) and (
                        not queue.lanes_on or queue.order is None or queue.order.ready()):  # PARTITION-LIMIT
                    return False
        return True

    @transaction(durable=False)
    def claim(self, claim: Claim, waiter: Waiter | None):
        """{queue: task rows} claimed, or None (and `waiter`, if given, is in line)."""
        now = self.clock()
        result = {}
        worker, count, claim_idle = claim.worker, claim.count, claim.claim_idle
        for name in claim.queues:
            queue = self.queues.get(name)
            if queue is None or queue.is_paused():
                continue
            rows = []
            if claim_idle is not None and queue.counts[IN_FLIGHT]:  # take-overs: the rate limits them
                take = count if queue.flow is None else min(count, queue.flow.rate_room(now))
                if take > 0:
                    rows = self.leases.claim_idle(queue, worker, take, claim_idle, now)
            room = count - len(rows)
            if room > 0 and queue.counts[AVAILABLE]:
                new = self.transitions.claim_rows(queue, worker, room, claim.noack, now)
                rows = new if claim_idle is None else rows + new_as_idle(new)
            if rows:
                result[name] = rows
        if result:
            return result
        if waiter is not None:
            self.waiters.register(waiter)
        return None

    @transaction(durable=False)
    def unblock(self, waiter: Waiter):
        """The waiter stops waiting (timed out, or its client hung up): what a batch that committed
        just now claimed for it, or None (out of line now)."""
        if waiter.registered:
            self.waiters.unregister(waiter)
            return None
        if waiter.error is not None:
            raise waiter.error
        return waiter.result

    @transaction(durable=False)
    def claim_own(self, name: bytes, worker: bytes, after: tuple, count: int | None):
        """XREADGROUP with an id: this worker's own in-flight tasks after `after`, leased again."""
        queue = self.queues.get(name)
        if queue is None:
            return []
        held = self.in_flight.held_by(queue, worker, after, -1 if count is None else count)
        if not held:
            return []
        now = self.clock()
        deadline = lifecycle.lease_deadline(now, queue.lease_seconds())
        rows = self.db.renew([lease[ROWID] for _, lease in held], now, deadline)
        if len(rows) != len(held):
            raise errors.guard_failed("claim own", [lease[ROWID] for _, lease in held], IN_FLIGHT)
        for (task_id, lease), row in zip(held, rows):  # both in id order
            self.in_flight.leased(queue, task_id, (lease[ROWID], worker, deadline, now, row[3]))
        self.schedule.lease_until(deadline)
        return rows
