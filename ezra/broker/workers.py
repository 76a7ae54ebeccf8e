"""Worker names: which are connected, where each was leased tasks, and the timers that release
a gone worker's tasks (RELEASE-ON-DISCONNECT).

Release on disconnect (beanstalkd's rule, per queue, off by default): connections report the
worker names they use; when the last connection that used a name closes, its tasks in queues
with RELEASE-ON-DISCONNECT go back after the grace period, through the failure rule (as a
timeout would), unless the name comes back. Acks carry no worker name, so a pooled client may
ack on any connection.

What a close costs is what the name holds: per name, this keeps the queues where tasks were
leased to it (`held_in`, a superset of where it holds some: a task acked since is looked for
and not found). A name that was never given a task costs a dict lookup when its connection
closes, however many queues there are (30,000 names x 3,000 queues took 3.4-5.9 s of the event
loop when every name was checked against every queue).
"""

from __future__ import annotations

import gevent
from loguru import logger

from ..lifecycle import IN_FLIGHT


class WorkerNames:
    """Connections per worker name, the queues where each was leased tasks, and release timers.

    `release(worker, gone_at)` (the broker's) gives the gone worker's tasks back where the grace
    is over, and returns the seconds until the next queue's grace ends, or None."""

    def __init__(self, queues, clock, release):
        self.queues = queues
        self.clock = clock
        self.release = release
        self.connections: dict[bytes, int] = {}     # worker name -> open connections that used it
        self.held_in: dict[bytes, set[bytes]] = {}  # worker name -> queues where tasks were leased to it
        self._timers: dict[bytes, gevent.Greenlet] = {}

    def seen(self, worker: bytes) -> None:
        """A connection started using this worker name."""
        self.connections[worker] = self.connections.get(worker, 0) + 1
        timer = self._timers.pop(worker, None)
        if timer is not None:
            timer.kill(block=False)  # the name came back within the grace period

    def gone(self, worker: bytes) -> None:
        """A connection that used this worker name closed."""
        left = self.connections.get(worker, 0) - 1
        if left > 0:
            self.connections[worker] = left
            return
        self.connections.pop(worker, None)
        self._release_soon(worker)

    def connected(self, worker: bytes) -> bool:
        return worker in self.connections

    def leased(self, worker: bytes, queue) -> None:
        """In a batch: tasks of `queue` were leased to `worker` (claims and take-overs call this)."""
        held = self.held_in.get(worker)
        if held is None:
            held = self.held_in[worker] = set()
        if queue.name not in held:
            held.add(queue.name)
            if worker not in self.connections and worker not in self._timers:
                self._release_soon(worker)  # leased by a request that ran after its connection closed

    def queues_held(self, worker: bytes) -> list:
        """The queues (QueueState) where the worker may hold tasks in flight."""
        queues = (self.queues.get(name) for name in self.held_in.get(worker, ()))
        return [queue for queue in queues if queue is not None and queue.counts[IN_FLIGHT]]

    def forget(self, worker: bytes) -> None:
        """Released wherever a grace applies: nothing left to watch."""
        self.held_in.pop(worker, None)

    def stop_timers(self) -> None:
        for timer in list(self._timers.values()):
            timer.kill(block=False)
        self._timers.clear()

    def _release_soon(self, worker: bytes) -> None:
        """The name has no connection left: its tasks go back after the shortest grace of the queues
        where it holds some; a name that holds nothing where a grace applies is forgotten."""
        graces = [grace for grace in (queue.release_grace() for queue in self.queues_held(worker))
                  if grace is not None]
        if graces:
            self._release_after(worker, min(graces), self.clock())
        else:
            self.held_in.pop(worker, None)

    def _release_after(self, worker: bytes, seconds: float, gone_at: int) -> None:
        self._timers[worker] = gevent.spawn_later(seconds, self._on_timer, worker, gone_at)

    def _on_timer(self, worker: bytes, gone_at: int) -> None:
        self._timers.pop(worker, None)
        if worker in self.connections:
            return
        try:
            later = self.release(worker, gone_at)
        except Exception as exc:
            logger.opt(exception=exc).error("releasing the tasks of worker {!r} failed: {}", worker, exc)
            return
        if later is not None:  # queues with a longer grace period
            self._release_after(worker, later, gone_at)
