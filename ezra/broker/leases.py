"""Leases: part of the Broker (a mixin). Taking tasks over, heartbeats, release on disconnect.

    XCLAIM q g w <min-idle> id...     by the owner: renews the lease (a heartbeat, no attempt
                                      counted); by another worker: takes over a task idle that
                                      long (an attempt, as Redis counts a delivery)
    XAUTOCLAIM q g w <min-idle> start  the same for the in-flight tasks from `start` on
    XREADGROUP ... CLAIM <min-idle>   idle tasks first (longest idle first), then new ones

On a paused queue no task changes hands: XCLAIM and XAUTOCLAIM only renew the
caller's own leases (the heartbeat goes on, so a task being worked on is not
lost to its timeout), and XREADGROUP CLAIM takes nothing over.

Release on disconnect (beanstalkd's rule, per queue, off by default): connections
report the worker names they use; when the last connection that used a name
closes, its tasks in queues with RELEASE-ON-DISCONNECT go back after the grace
period, through the failure rule (as a timeout would), unless the name comes back.
Acks carry no worker name, so a pooled client may ack on any connection.

What a close costs is what the name holds: per name, the broker keeps the queues
where tasks were leased to it (`held_in`, a superset of where it holds some: a
task acked since is looked for and not found). A name that was never given a task
costs a dict lookup when its connection closes, however many queues there are
(30,000 names x 3,000 queues took 3.4-5.9 s of the event loop when every name was
checked against every queue).
"""

from __future__ import annotations

import gevent
from loguru import logger

from .. import errors, lifecycle
from ..lifecycle import AVAILABLE, IN_FLIGHT
from ..storage import name_bytes
from .base import BrokerCore

SCAN_OVER = (0, 0)  # XAUTOCLAIM's cursor once every in-flight task was looked at
AUTOCLAIM_SCAN_FACTOR = 10  # XAUTOCLAIM looks at up to COUNT x 10 in-flight tasks, as Redis does


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


class Leases(BrokerCore):
    """Lease operations and the worker-name registry (mixed into Broker)."""

    def __init__(self):
        self.worker_connections: dict[bytes, int] = {}  # worker name -> open connections that used it
        self.held_in: dict[bytes, set[bytes]] = {}  # worker name -> queues where tasks were leased to it
        self._release_timers: dict[bytes, gevent.Greenlet] = {}

    # ------------------------------------------------------------ greenlet API

    def take_over(self, queue: bytes, worker: bytes, min_idle: int, ids: list[tuple], idle_ms=None,
                   time_ms=None, retry_count=None, force=False, justid=False):
        """XCLAIM: the tasks now leased to `worker`, (id_ms, id_seq, fields JSON) rows, or (id_ms, id_seq)
        with JUSTID."""
        return self.writer.submit(self._tx_take_over, queue, worker, min_idle, ids, idle_ms, time_ms,
                                  retry_count, force, justid, durable=False)

    def autoclaim(self, queue: bytes, worker: bytes, min_idle: int, start: tuple, count: int,
                  justid: bool):
        """XAUTOCLAIM: (next cursor, the tasks as XCLAIM's); the cursor (0, 0) when the scan is over.
        (Redis's third part, the deleted ids, is always empty in EZRA: commands/ops.py adds it.)"""
        return self.writer.submit(self._tx_autoclaim, queue, worker, min_idle, start, count, justid,
                                  durable=False)

    def worker_seen(self, worker: bytes) -> None:
        """A connection started using this worker name."""
        self.worker_connections[worker] = self.worker_connections.get(worker, 0) + 1
        timer = self._release_timers.pop(worker, None)
        if timer is not None:
            timer.kill(block=False)  # the name came back within the grace period

    def worker_gone(self, worker: bytes) -> None:
        """A connection that used this worker name closed."""
        left = self.worker_connections.get(worker, 0) - 1
        if left > 0:
            self.worker_connections[worker] = left
            return
        self.worker_connections.pop(worker, None)
        self._release_soon(worker)

    def _release_soon(self, worker: bytes) -> None:
        """The name has no connection left: its tasks go back after the shortest grace of the queues
        where it holds some; a name that holds nothing where a grace applies is forgotten."""
        graces = [grace for grace in map(self._release_grace, self._queues_held(worker)) if grace is not None]
        if graces:
            self._release_after(worker, min(graces), self.clock())
        else:
            self.held_in.pop(worker, None)

    def _queues_held(self, worker: bytes) -> list:
        """The queues (QueueState) where the worker may hold tasks in flight."""
        queues = (self.queues.get(name) for name in self.held_in.get(worker, ()))
        return [queue for queue in queues if queue is not None and queue.counts[IN_FLIGHT]]

    def _leased(self, worker: bytes, queue) -> None:
        """In a batch: tasks of `queue` were leased to `worker` (claims and take-overs call this)."""
        held = self.held_in.get(worker)
        if held is None:
            held = self.held_in[worker] = set()
        if queue.name not in held:
            held.add(queue.name)
            if worker not in self.worker_connections and worker not in self._release_timers:
                self._release_soon(worker)  # leased by a request that ran after its connection closed

    def stop_release_timers(self) -> None:
        for timer in list(self._release_timers.values()):
            timer.kill(block=False)
        self._release_timers.clear()

    def _release_after(self, worker: bytes, seconds: float, gone_at: int) -> None:
        self._release_timers[worker] = gevent.spawn_later(seconds, self._release, worker, gone_at)

    def _release(self, worker: bytes, gone_at: int) -> None:
        self._release_timers.pop(worker, None)
        if worker in self.worker_connections:
            return
        try:
            later = self.writer.call(self._tx_release, worker, gone_at)
        except Exception as exc:
            logger.opt(exception=exc).error("releasing the tasks of worker {!r} failed: {}", worker, exc)
            return
        if later is not None:  # queues with a longer grace period
            self._release_after(worker, later, gone_at)

    # ------------------------------------------------------------ writer's batch

    def _tx_release(self, worker: bytes, gone_at: int) -> float | None:
        """Release the gone worker's tasks where the grace is over; seconds until the next, or None."""
        if worker in self.worker_connections:
            return None
        now, wait = self.clock(), None
        for queue in self._queues_held(worker):
            grace = self._release_grace(queue)
            if grace is None:
                continue
            due = gone_at + lifecycle.to_ms(grace)
            if now < due:
                wait = min(wait or float("inf"), (due - now) / 1000)
                continue
            rows = self.db.held_by(queue.name, worker)
            if rows:
                self._apply_failures(queue, rows, lifecycle.FAIL, None, now, lifecycle.WORKER_GONE,
                                     f"worker {name_bytes(worker).decode('utf-8', 'replace')} gone: its last "
                                     f"connection closed and it did not return within {grace:g} s "
                                     "(RELEASE-ON-DISCONNECT)")
                self._tally(queue, "released", len(rows))
                logger.debug("released {} tasks of gone worker {!r} in {!r}", len(rows), worker, queue.name)
        if wait is None:
            self.held_in.pop(worker, None)  # released wherever a grace applies: nothing left to watch
        return wait

    def _tx_take_over(self, name: bytes, worker: bytes, min_idle: int, ids: list[tuple], idle_ms,
                       time_ms, retry_count, force: bool, justid: bool) -> list:
        queue = self.queues.get(name)
        if queue is None:
            return []
        now = self.clock()
        delivered_at = delivery_time(now, idle_ms, time_ms)
        states = (IN_FLIGHT, AVAILABLE) if force else (IN_FLIGHT,)
        claimed = []
        for row in self.db.lease_rows(name, ids, states):
            state, delivered = row[3], row[5]
            if (state == IN_FLIGHT and now - delivered < min_idle) or not self._may_claim(queue, row, worker):
                continue
            claimed.append(self._take_over_or_renew(queue, row, worker, now, justid, retry_count, delivered_at))
        return claimed

    def _tx_autoclaim(self, name: bytes, worker: bytes, min_idle: int, start: tuple, count: int,
                      justid: bool) -> tuple:
        queue = self.queues.get(name)
        if queue is None:
            return SCAN_OVER, []
        now = self.clock()
        limit = count * AUTOCLAIM_SCAN_FACTOR
        rows = self.db.in_flight_from(name, start, limit + 1)
        claimed, examined = [], 0
        for row in rows[:limit]:
            if len(claimed) == count:
                break
            examined += 1
            if now - row[5] >= min_idle and self._may_claim(queue, row, worker):
                claimed.append(self._take_over_or_renew(queue, row, worker, now, justid))
        cursor = rows[examined][1:3] if examined < len(rows) else SCAN_OVER
        return cursor, claimed

    def _may_claim(self, queue, row, worker: bytes) -> bool:
        """While the queue is paused, a claim may only renew the owner's own lease (LEASE_COLUMNS row)."""
        return not self._paused(queue) or (row[3] == IN_FLIGHT and name_bytes(row[4]) == worker)

    def _claim_idle(self, queue, worker: bytes, count: int, min_idle: int, now: int) -> list:
        """XREADGROUP CLAIM: claim tasks in flight idle >= min_idle; rows (id_ms, id_seq, fields JSON,
        idle ms, deliveries so far)."""
        claimed = []
        for row in self.db.idle_in_flight(queue.name, now - min_idle, count):
            idle, attempts = now - row[5], row[6]
            # Redis counts a CLAIM as a delivery, even of the worker's own task.
            claimed.append((*self._take_over_or_renew(queue, row, worker, now, count_attempt=True), idle, attempts))
        return claimed

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
        deadline = lifecycle.lease_deadline(now, self._visibility_timeout(queue))
        if not self.db.set_lease(rowid, worker, now if delivered_at is None else delivered_at, deadline, attempts):
            raise errors.guard_failed("lease", rowid, state)  # the SELECT above said in flight or available
        self.lease_until(deadline)
        if state == AVAILABLE:  # XCLAIM FORCE of a task nobody held
            queue.move(AVAILABLE, IN_FLIGHT)
            queue.last_delivered = max(queue.last_delivered or (0, 0), (ms, seq))
        self._leased(worker, queue)
        if not renewal:
            self._tally(queue, "delivered")
            if attempts > 1 or state == IN_FLIGHT:  # delivered before, or taken from another worker
                self._tally(queue, "redelivered")
        return (ms, seq) if justid else (ms, seq, fields)
