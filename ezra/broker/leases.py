"""Leases: taking tasks over, heartbeats, and a gone worker's tasks released.

    XCLAIM q g w <min-idle> id...     by the owner: renews the lease (a heartbeat, no attempt
                                      counted); by another worker: takes over a task idle that
                                      long (an attempt, as Redis counts a delivery)
    XAUTOCLAIM q g w <min-idle> start  the same for the in-flight tasks from `start` on
    XREADGROUP ... CLAIM <min-idle>   idle tasks first (longest idle first), then new ones

On a paused queue no task changes hands: XCLAIM and XAUTOCLAIM only renew the
caller's own leases (the heartbeat goes on, so a task being worked on is not
lost to its timeout), and XREADGROUP CLAIM takes nothing over. A take-over counts for the
queue's RATE-LIMIT, and a full window holds it back as a pause does; MAX-IN-FLIGHT does not
limit it (the task is in flight already: flow.py).

Release on disconnect: workers.py keeps the names and their timers; `release` here
gives a gone worker's tasks back, through the failure rule, where the grace is over.
"""

from __future__ import annotations

from loguru import logger

from .. import errors, lifecycle
from ..lifecycle import AVAILABLE, IN_FLIGHT
from ..storage import name_bytes
from ..protocol.stream_ids import TOP
from ..writer.transactions import transaction
from .in_flight import DELIVERED_AT, ROWID, failure_rows

SCAN_OVER = (0, 0)  # XAUTOCLAIM's cursor once every in-flight task was looked at
AUTOCLAIM_SCAN_FACTOR = 10  # XAUTOCLAIM looks at up to COUNT x 10 in-flight tasks, as Redis does


def by_delivery(pair: tuple) -> tuple:
    """A (task id, lease) pair's place among the longest idle: delivered first, then by id."""
    return pair[1][DELIVERED_AT], pair[0]


def delivery_time(now: int, idle_ms: int | None, time_ms: int | None) -> int | None:
    """XCLAIM's IDLE / TIME: when the task counts as last delivered (None: now).

    As in Redis, a time before the epoch or in the future means now: the idle
    times reported later (now - this) stay 64-bit integers."""
    if idle_ms is not None:
        delivered = now - idle_ms
    elif time_ms is not None:
        delivered = time_ms
    else:
        return None
    return delivered if 0 <= delivered <= now else now


class Leases:
    """XCLAIM's, XAUTOCLAIM's and XREADGROUP CLAIM's transactions, and a gone worker's release."""

    def __init__(self, db, queues, in_flight, transitions, schedule, workers, writer, clock):
        self.db = db
        self.queues = queues
        self.in_flight = in_flight
        self.transitions = transitions
        self.schedule = schedule
        self.workers = workers
        self.writer = writer
        self.clock = clock

    @transaction()
    def release(self, worker: bytes, gone_at: int) -> float | None:
        """Release the gone worker's tasks where the grace is over; seconds until the next, or None."""
        if self.workers.connected(worker):
            return None
        now, wait = self.clock(), None
        for queue in self.workers.queues_held(worker):
            grace = queue.release_grace()
            if grace is None:
                continue
            due = gone_at + lifecycle.to_ms(grace)
            if now < due:
                wait = min(wait or float("inf"), (due - now) / 1000)
                continue
            rows = failure_rows(self.in_flight.held_by(queue, worker))
            if rows:
                self.transitions.apply_failures(
                    queue, rows, lifecycle.FAIL, None, now, lifecycle.WORKER_GONE,
                    f"worker {name_bytes(worker).decode('utf-8', 'replace')} gone: its last connection closed "
                    f"and it did not return within {grace:g} s (RELEASE-ON-DISCONNECT)")
                queue.tally("released", len(rows))
                logger.debug("released {} tasks of gone worker {!r} in {!r}", len(rows), worker, queue.name)
        if wait is None:
            self.workers.forget(worker)
        return wait

    def give_back_all(self) -> int:
        """In a clean stop's last batch: every task in flight back to available, attempts as they are
        (as start-up's recovery makes them); how many."""
        given = 0
        for queue in self.queues.values():
            held = list(queue.leases.items())
            if not held:
                continue
            if self.db.give_back([lease[ROWID] for _, lease in held]) != len(held):
                raise errors.guard_failed("give back", [lease[ROWID] for _, lease in held], IN_FLIGHT)
            self.in_flight.all_ended(queue, held)
            queue.move(IN_FLIGHT, AVAILABLE, len(held))
            for _, lease in held:
                placed = self.transitions.lease_ended(queue, lease[ROWID]) if queue.lanes_on else None
                self.transitions.became_available(queue, lease[ROWID], placed)
            given += len(held)
        if given:
            logger.info("gave {} tasks in flight back to available for the next start", given)
        return given

    @transaction(durable=False)
    def take_over(self, name: bytes, worker: bytes, min_idle: int, ids: list[tuple], idle_ms=None,
                  time_ms=None, retry_count=None, force: bool = False, justid: bool = False) -> list:
        """XCLAIM: the tasks now leased to `worker`: (id_ms, id_seq, fields JSON) rows, (id_ms, id_seq) with JUSTID."""
        queue = self.queues.get(name)
        if queue is None:
            return []
        now = self.clock()
        delivered_at = delivery_time(now, idle_ms, time_ms)
        # Without FORCE only tasks in flight are taken: their leases know their rows. FORCE takes
        # available ones too, found in the file by their ids (a search each: storage/row_ranges.py).
        rows = (self.db.lease_rows(name, ids, (IN_FLIGHT, AVAILABLE)) if force
                else self._lease_rows(self.in_flight.held(queue, ids)))
        claimed = []
        for row in rows:
            state, delivered = row[3], row[5]
            if (state == IN_FLIGHT and now - delivered < min_idle) or not self._may_claim(queue, row, worker, now):
                continue
            claimed.append(self._take_over_or_renew(queue, row, worker, now, justid, retry_count, delivered_at))
        return claimed

    @transaction(durable=False)
    def autoclaim(self, name: bytes, worker: bytes, min_idle: int, start: tuple, count: int,
                  justid: bool) -> tuple:
        """XAUTOCLAIM: (next cursor, the tasks as XCLAIM's); the cursor (0, 0) when the scan is over.
        (Redis's third part, the deleted ids, is always empty in EZRA: commands/ops.py adds it.)"""
        queue = self.queues.get(name)
        if queue is None:
            return SCAN_OVER, []
        now = self.clock()
        limit = count * AUTOCLAIM_SCAN_FACTOR
        rows = self._lease_rows(self.in_flight.entries(queue, start, TOP, limit + 1))
        claimed, examined = [], 0
        for row in rows[:limit]:
            if len(claimed) == count:
                break
            examined += 1
            if now - row[5] >= min_idle and self._may_claim(queue, row, worker, now):
                claimed.append(self._take_over_or_renew(queue, row, worker, now, justid))
        cursor = rows[examined][1:3] if examined < len(rows) else SCAN_OVER
        return cursor, claimed

    def claim_idle(self, queue, worker: bytes, count: int, min_idle: int, now: int) -> list:
        """XREADGROUP CLAIM: claim tasks in flight idle >= min_idle; rows (id_ms, id_seq, fields JSON,
        idle ms, deliveries so far)."""
        claimed, leases, before = [], queue.leases, now - min_idle
        longest_idle = leases.first(count, [pair for pair in leases.items() if pair[1][DELIVERED_AT] <= before],
                                    key=by_delivery)
        for row in self._lease_rows(longest_idle):
            idle, attempts = now - row[5], row[6]
            # Redis counts a CLAIM as a delivery, even of the worker's own task.
            claimed.append((*self._take_over_or_renew(queue, row, worker, now, count_attempt=True), idle, attempts))
        return claimed

    def _lease_rows(self, held: list[tuple]) -> list[tuple]:
        """The rows (storage LEASE_COLUMNS) of these (task id, lease) pairs, in their order."""
        if not held:
            return []
        rows = self.db.lease_rows_of([lease[ROWID] for _, lease in held])
        return [rows[lease[ROWID]] for _, lease in held]

    @staticmethod
    def _may_claim(queue, row, worker: bytes, now: int) -> bool:
        """While the queue is paused, or its RATE-LIMIT window is full, a claim may only renew the
        owner's own lease (LEASE_COLUMNS row)."""
        if row[3] == IN_FLIGHT and name_bytes(row[4]) == worker:
            return True
        return not queue.is_paused() and (queue.flow is None or queue.flow.rate_room(now) > 0)

    def _take_over_or_renew(self, queue, row, worker: bytes, now: int, justid: bool = False, retry_count=None,
                            delivered_at=None, count_attempt: bool = False) -> tuple:
        """Claim one task (LEASE_COLUMNS row) for `worker`, leased from now: the owner renews its lease,
        another worker takes it over. (id_ms, id_seq, fields JSON), or (id_ms, id_seq) with JUSTID."""
        rowid, ms, seq, state, owner, _, attempts, fields = row
        renewal = state == IN_FLIGHT and name_bytes(owner) == worker and not count_attempt
        if retry_count is not None:
            attempts = retry_count
        elif not (justid or renewal):
            attempts += 1  # a delivery to another worker counts, as Redis counts XCLAIM
        deadline = lifecycle.lease_deadline(now, queue.lease_seconds())
        delivered_at = now if delivered_at is None else delivered_at
        if not self.db.set_lease(rowid, worker, delivered_at, deadline, attempts):
            raise errors.guard_failed("lease", rowid, state)  # the SELECT above said in flight or available
        self.in_flight.leased(queue, (ms, seq), (rowid, worker, deadline, delivered_at, attempts))
        self.schedule.lease_until(deadline)
        self.workers.leased(worker, queue)
        if state == AVAILABLE:  # XCLAIM FORCE of a task nobody held
            queue.delivered([(ms, seq, fields, attempts)])
            self.transitions.leased_outside(queue, rowid)
        elif not renewal:
            queue.tally("delivered")
            if attempts > 1 or state == IN_FLIGHT:  # delivered before, or taken from another worker
                queue.tally("redelivered")
        if not renewal and queue.flow is not None:  # a take-over counts for the queue's RATE-LIMIT (flow.py)
            self.transitions.handed_out(queue, 1, now)
        return (ms, seq) if justid else (ms, seq, fields)
