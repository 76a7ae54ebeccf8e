"""The leases a framework's worker holds on EZRA, renewed while its tasks run (ezra.celery, ezra.dramatiq).

EZRA leases a delivered task for the queue's visibility timeout (30 s by default); a task
still held when the lease runs out is delivered again. A Celery or Dramatiq task may run
longer, so the worker renews the leases of the tasks it holds: `XCLAIM queue group worker 0
id ... JUSTID` by their owner with min-idle 0 is EZRA's heartbeat (SPEC §3). One thread per
worker does it every third of the shortest lease of its queues. Client side only: it needs
redis-py, never the server's modules.
"""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger(__name__)

DEFAULT_VISIBILITY_TIMEOUT = 30.0  # EZRA's --visibility-timeout default, when XINFO STREAM cannot tell


def visibility_timeout(client, queue: str) -> float:
    """The queue's lease in seconds, from XINFO STREAM (the server's default if the queue is new)."""
    try:
        reply = client.execute_command("XINFO", "STREAM", queue)
    except Exception:
        logger.warning("XINFO STREAM %s failed: taking EZRA's default lease of %ss", queue,
                       DEFAULT_VISIBILITY_TIMEOUT, exc_info=True)
        return DEFAULT_VISIBILITY_TIMEOUT
    fields = reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2]))
    fields = {(k.decode() if isinstance(k, bytes) else k): v for k, v in fields.items()}
    value = fields.get("visibility-timeout", DEFAULT_VISIBILITY_TIMEOUT)
    return float(value.decode() if isinstance(value, bytes) else value)


PENDING_SLACK = 10_000  # XPENDING may list this many of the worker's tasks beyond those it holds


def as_text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def id_order(task_id: str) -> tuple[int, int]:
    ms, _, seq = task_id.partition("-")
    return int(ms), int(seq or 0)


def pending_query(ids: list[str]) -> tuple[str, str, int]:
    """XPENDING's start, end and count that list the worker's tasks among `ids` (held in one queue)."""
    ordered = sorted(ids, key=id_order)
    return ordered[0], ordered[-1], len(ids) + PENDING_SLACK


def split_held(ids: list[str], leased) -> tuple[list[str], list[str]]:
    """`ids` split into those still leased to the worker and those it lost.

    `leased` is what the server says the worker holds: XPENDING's entries for the worker (dicts
    with message_id) or the ids an XCLAIM JUSTID renewed. A lost task was given back by a
    server restart or a run-out lease and will be delivered again, maybe to another worker
    already: renewing it (XCLAIM with min-idle 0) would take it over from that worker, so it
    would run twice at once. So a heartbeat renews only the tasks XPENDING says are the
    worker's, and the worker drops the rest."""
    kept = {as_text(entry["message_id"] if isinstance(entry, dict) else entry) for entry in leased or ()}
    return [i for i in ids if i in kept], [i for i in ids if i not in kept]


class LeaseKeeper:
    """The (queue, id) a worker holds; a daemon thread renews their leases every `period` seconds."""

    def __init__(self, client, group: str, worker: str, period: float = DEFAULT_VISIBILITY_TIMEOUT / 3):
        self.client, self.group, self.worker, self.period = client, group, worker, period
        self._held: dict[tuple[str, str], None] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, queue: str, task_id: str) -> None:
        self.hold_all(queue, [task_id])

    def hold_all(self, queue: str, task_ids: list[str]) -> None:
        """Hold the tasks of one read: one lock for all of them."""
        if not task_ids:
            return
        with self._lock:
            for task_id in task_ids:
                self._held[(queue, task_id)] = None
            if self._thread is None and not self._stopped.is_set():
                self._thread = threading.Thread(target=self._run, name=f"ezra-leases-{self.worker}", daemon=True)
                self._thread.start()

    def release(self, queue: str, task_id: str) -> None:
        with self._lock:
            self._held.pop((queue, task_id), None)

    def held(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self._held)

    def shorten(self, period: float) -> None:
        """Renew at least every `period` seconds (a queue with a shorter lease joined)."""
        self.period = min(self.period, period)

    def stop(self) -> None:
        self._stopped.set()

    def renew(self) -> None:
        """One round: an XCLAIM heartbeat per queue for the tasks held now."""
        by_queue: dict[str, list[str]] = {}
        for queue, task_id in self.held():
            by_queue.setdefault(queue, []).append(task_id)
        for queue, ids in by_queue.items():
            try:
                start, end, count = pending_query(ids)
                ours, lost = split_held(ids, self.client.xpending_range(queue, self.group, start, end, count,
                                                                        consumername=self.worker))
                if ours:  # xclaim(justid=True): redis-py parses the reply in RESP2 and RESP3 alike
                    ours, gone = split_held(ours, self.client.xclaim(queue, self.group, self.worker, 0, ours,
                                                                     justid=True))
                    lost += gone
            except Exception:
                logger.warning("renewing the leases of %d tasks of %s for %s failed; trying again in %.1fs",
                               len(ids), queue, self.worker, self.period, exc_info=True)
                continue
            if lost:
                with self._lock:
                    for task_id in lost:
                        self._held.pop((queue, task_id), None)
                logger.warning("%d tasks of %s held by %s are no longer leased to it (a server restart or a "
                               "run-out lease gave them back): not renewed, delivered again",
                               len(lost), queue, self.worker)

    def _run(self) -> None:
        while not self._stopped.wait(self.period):
            self.renew()
