"""Blocked readers (observers): XREAD's, who watch a view, and XRESULT BLOCK's, who watch one task;
and what the open batch changed that they watch.

XREAD reads what XRANGE shows, entries with ids above the one given: on a live queue its
available, delayed, in-flight and retained done tasks, on `q::dead` its dead ones
(views.py reads them). Nothing is claimed, leased or counted: an observer, not fan-out.

A blocked XREAD is an `Observer`, watching per view (queue, dead) before its first read, so
no entry can slip in between "nothing to read" and "start waiting". A transaction that adds
entries to a view notes it (`grew`: a push or a requeue for the live view, a task dying for
the dead one); when that batch commits, every observer of the view is woken (they consume
nothing, so all of them) and the front reads again. A rolled-back batch wakes nobody.
Observers are kept apart from XREADGROUP's waiters: a push still hands its task to the first
blocked worker in the same transaction, whatever observers watch the queue.

A producer blocked in `XRESULT queue id BLOCK ms` is an Observer of one task, key (queue, task
id), registered before its first look at the task. A transaction that ends a task (an ack, a NOACK
claim, death, a deletion) tells its queue (`QueueState.settled`), which notes it here (`ended`)
only if someone watches it; once the batch commits, its observers look again. Nothing is polled,
and a batch that ends tasks nobody watches pays one test of an empty dict (`watching`).
"""

from __future__ import annotations

from gevent.event import Event

# The events that add entries to what XREAD sees: to the live queue, or to its dead view (True).
VIEW_GROWS = {"pushed": False, "requeued": False, "dead": True}


class Observer:
    """A blocked XREAD, woken when a batch that added entries to a view it watches commits; or a
    blocked XRESULT, woken when a batch that ended its task commits."""

    __slots__ = ("views", "event", "cancelled")

    def __init__(self, views):
        self.views = views  # {(queue, dead)} (XREAD), or {(queue, task id)} (XRESULT)
        self.event = Event()
        self.cancelled = False  # the server is stopping: answer null


class Observers:
    """The observers per view, and the views the open batch grew."""

    def __init__(self):
        self.watching: dict[tuple[bytes, bool], dict[int, Observer]] = {}
        self.grown: set[tuple[bytes, bool]] = set()

    def watch(self, observer: Observer) -> None:
        for view in observer.views:
            self.watching.setdefault(view, {})[id(observer)] = observer

    def unwatch(self, observer: Observer) -> None:
        for view in observer.views:
            watchers = self.watching.get(view)
            if watchers is not None:
                watchers.pop(id(observer), None)
                if not watchers:
                    del self.watching[view]

    def grew(self, name: bytes, dead: bool) -> None:
        """In a transaction: entries were added to a view; its observers look again once it commits."""
        if (name, dead) in self.watching:
            self.grown.add((name, dead))

    def ended(self, name: bytes, ids) -> None:
        """In a transaction: these tasks of the queue ended (done, dead or removed); XRESULT's
        observers of them look again once it commits."""
        watching = self.watching
        for task_id in ids:
            if (name, task_id) in watching:
                self.grown.add((name, task_id))

    def after_batch(self, committed: bool) -> None:
        """After a batch: wake the observers of the views it grew (none if it was rolled back)."""
        grown, self.grown = self.grown, set()
        if not committed:
            return
        for view in grown:
            for observer in list(self.watching.get(view, {}).values()):
                observer.event.set()

    def cancel_all(self) -> None:
        """Shutdown: every blocked XREAD answers null now."""
        for watchers in list(self.watching.values()):
            for observer in list(watchers.values()):
                observer.cancelled = True
                observer.event.set()

    def count(self) -> int:
        """Blocked XREADs and XRESULTs (one watching several views counts once)."""
        return len({id(o) for watchers in list(self.watching.values()) for o in list(watchers.values())})
