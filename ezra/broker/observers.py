"""XREAD's observers: part of the Broker (a mixin). A read-only look at a queue, able to wait.

XREAD reads what XRANGE shows, entries with ids above the one given: on a live
queue its available, delayed, in-flight and retained done tasks, on `q::dead`
its dead ones. Nothing is claimed, leased or counted: an observer, not fan-out.

A blocked XREAD is an `Observer`, registered per view (queue, dead) before it
reads, so no entry can slip in between "nothing to read" and "start waiting".
A transaction that adds entries to a view notes it (`_view_grew`: a push or a
requeue for the live view, a task dying for the dead one); when that batch
commits, every observer of the view is woken (they consume nothing, so all of
them) and reads again. A rolled-back batch wakes nobody. Observers are kept
apart from XREADGROUP's waiters: a push still hands its task to the first
blocked worker in the same transaction, whatever observers watch the queue.

An observer reads through the writer like XRANGE, so its reply waits for the
batch it read in to commit: it never answers an entry whose push is then
rolled back (a disk-full batch is run again without its pushes, the read too).
"""

from __future__ import annotations

import time

from gevent.event import Event

from ..lifecycle import AVAILABLE, DEAD, DELAYED, DONE, IN_FLIGHT
from ..stream_ids import LAST_ONE, MAX_ID_PART, SINCE_NOW, previous_id
from .base import BrokerCore

LIVE_VIEW = (AVAILABLE, DELAYED, IN_FLIGHT, DONE)  # what XRANGE shows of a live queue
DEAD_VIEW = (DEAD,)
NEWEST = (MAX_ID_PART, MAX_ID_PART)


class Observer:
    """A blocked XREAD, woken when a batch that added entries to a view it watches commits."""

    __slots__ = ("views", "event", "cancelled")

    def __init__(self, views):
        self.views = views  # {(queue, dead)}
        self.event = Event()
        self.cancelled = False  # the server is stopping: answer null


class Observers(BrokerCore):
    """XREAD (mixed into Broker)."""

    def __init__(self):
        self.observers: dict[tuple[bytes, bool], dict[int, Observer]] = {}
        self._grown: set[tuple[bytes, bool]] = set()  # views the open batch added entries to

    # ------------------------------------------------------------ greenlet API

    def look(self, reads: list[tuple], count: int):
        """XREAD without BLOCK: a request whose result is {stream: task rows} (only those with some).

        `reads`: (stream name as given, (queue, dead), after) with after an id, SINCE_NOW or LAST_ONE."""
        return self.writer.submit(self._tx_look, reads, count, durable=False)

    def observe(self, reads: list[tuple], count: int, block_ms: int, wait):
        """XREAD BLOCK: entries as `look` finds them, else wait for some until the time is up (None).

        `wait(event, seconds)` as XREADGROUP's: True, False on timeout, None when the client hung up."""
        deadline = None if block_ms == 0 else time.monotonic() + block_ms / 1000
        observer = Observer({view for _, view, _ in reads})
        self._watch(observer)  # before the first look: a push committed after it wakes us
        try:
            # Later looks read after the same ids: '$' means the time of the call.
            reads, result = self.writer.call(self._tx_first_look, reads, count, durable=False)
            while not result:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                if not wait(observer.event, left) or observer.cancelled:
                    return None  # timed out, hung up, or the server is stopping
                observer.event.clear()  # before the look: a commit after this sets it again
                result = self.writer.call(self._tx_look, reads, count, durable=False)
            return result
        finally:
            self._unwatch(observer)

    def observers_blocked(self) -> int:
        """Blocked XREADs (INFO's blocked_clients counts them with blocked workers)."""
        return len({id(o) for watching in list(self.observers.values()) for o in list(watching.values())})

    # ------------------------------------------------------------ registry

    def _watch(self, observer: Observer) -> None:
        for view in observer.views:
            self.observers.setdefault(view, {})[id(observer)] = observer

    def _unwatch(self, observer: Observer) -> None:
        for view in observer.views:
            watching = self.observers.get(view)
            if watching is not None:
                watching.pop(id(observer), None)
                if not watching:
                    del self.observers[view]

    def _view_grew(self, name: bytes, dead: bool) -> None:
        """In a transaction: entries were added to a view; its observers look again once it commits."""
        if (name, dead) in self.observers:
            self._grown.add((name, dead))

    def _wake_observers(self, committed: bool) -> None:
        """After a batch: wake the observers of the views it grew (none if it was rolled back)."""
        grown, self._grown = self._grown, set()
        if not committed:
            return
        for view in grown:
            for observer in list(self.observers.get(view, {}).values()):
                observer.event.set()

    def _cancel_observers(self) -> None:
        """Shutdown: every blocked XREAD answers null now."""
        for watching in list(self.observers.values()):
            for observer in list(watching.values()):
                observer.cancelled = True
                observer.event.set()

    # ------------------------------------------------------------ writer's batch

    def _tx_look(self, reads: list[tuple], count: int) -> dict:
        result = {}
        for stream, (name, dead), after in reads:
            states = DEAD_VIEW if dead else LIVE_VIEW
            rows = self.db.entries_after(name, states, self._resolve(name, states, after), count)
            if rows:
                result[stream] = rows
        return result

    def _tx_first_look(self, reads: list[tuple], count: int) -> tuple[list[tuple], dict]:
        """The ids '$' and '+' stand for now, and what is there after them."""
        reads = [(stream, (name, dead), self._resolve(name, DEAD_VIEW if dead else LIVE_VIEW, after))
                 for stream, (name, dead), after in reads]
        return reads, self._tx_look(reads, count)

    def _resolve(self, name: bytes, states: tuple, after):
        """'$' and '+' as ids, now (a queue that does not exist yet: from its start, as Redis)."""
        if after == SINCE_NOW:
            queue = self.queues.get(name)
            return (0, 0) if queue is None else queue.last_id
        if after == LAST_ONE:
            newest = self.db.range(name, states, (0, 0), NEWEST, 1, True)
            return previous_id(newest[0][:2]) if newest else (0, 0)
        return after
