"""A loop turn's transaction as the writer sees it: the Batch, each Request submitted to it,
the Atomic of an EXEC in it, and the Flag its waiters sleep on (see writer.py)."""

from __future__ import annotations

from gevent import get_hub
from gevent.hub import Waiter


class Flag:
    """Set once: a batch's commit, or its fsync. `set_now` (the fsync callback, on the hub)
    switches to each waiting greenlet at once, as the floor does; gevent's Event would schedule
    one more callback to do it. `set` (anywhere) schedules that callback, so the order of
    wake-ups stays the loop's."""

    __slots__ = ("done", "waiters")

    def __init__(self):
        self.done = False
        self.waiters: list[Waiter] = []

    def is_set(self) -> bool:
        return self.done

    def wait(self) -> bool:
        if not self.done:
            waiter = Waiter()
            self.waiters.append(waiter)
            waiter.get()
        return True

    def set(self) -> None:
        if not self.done:
            self.done = True
            waiters, self.waiters = self.waiters, []
            if waiters:
                get_hub().loop.run_callback(_wake, waiters)

    def set_now(self) -> None:
        """On the hub only."""
        if not self.done:
            self.done = True
            waiters, self.waiters = self.waiters, []
            _wake(waiters)


def _wake(waiters: list) -> None:
    for waiter in waiters:
        waiter.switch(True)  # runs it until it waits again; a killed waiter's greenlet is gone: no switch


class Batch:
    """One loop turn's transaction: its requests commit, or fail, together."""

    __slots__ = ("requests", "durable", "error", "sync_error", "committed", "synced", "held", "atomics")

    def __init__(self):
        self.requests: list[Request] = []  # kept to run again should the commit meet a full disk
        self.durable = False  # holds a request answered only after an fsync
        self.held = False  # an Atomic (EXEC) is running in it: it does not commit yet
        self.atomics: list[Atomic] = []  # the EXECs in it: all or nothing, even on a full disk
        self.error: BaseException | None = None       # rolled back: every request fails
        self.sync_error: BaseException | None = None  # committed, but the fsync failed: durable ones fail
        self.committed = Flag()  # set() wakes after the readers the batch served (callbacks' order)
        self.synced = Flag()  # set with (or after) committed; durable requests wait for it


class Request:
    """A submitted function's result; `wait` returns it once its batch is committed (and synced)."""

    __slots__ = ("batch", "fn", "args", "durable", "grows", "result", "error", "atomic")

    def __init__(self, batch: Batch, fn, args, durable: bool, grows: bool, atomic: Atomic | None = None):
        self.batch = batch
        self.fn = fn
        self.args = args
        self.durable = durable
        self.grows = grows
        self.result = None
        self.error: BaseException | None = None  # its own failure (a push refused on a full disk)
        self.atomic = atomic  # the EXEC it belongs to, if any

    def wait(self):
        batch = self.batch
        if batch.held:
            # Inside an EXEC: its result now, without yielding (which would commit the batch
            # half-way); the EXEC's own reply waits for the commit (Atomic.wait).
            if batch.error is not None or self.error is not None:
                raise batch.error or self.error
            return self.result
        # A pipeline's replies but the first find their batch's flag set: no call to wait then.
        if self.durable:
            if not batch.synced.done:
                batch.synced.wait()
            if batch.sync_error is not None:
                raise batch.sync_error
        elif not batch.committed.done:
            batch.committed.wait()
        if batch.error is not None:
            raise batch.error
        if self.error is not None:
            raise self.error
        return self.result


class Atomic:
    """One EXEC (see Writer.atomic). `error`: its batch rolled back, or a full disk refused
    it whole; every reply of the EXEC is then that error."""

    __slots__ = ("batch", "durable", "error")

    def __init__(self, batch: Batch):
        self.batch = batch
        self.durable = False
        self.error: BaseException | None = None

    def wait(self) -> BaseException | None:
        """After the EXEC ran: wait for its batch; the error that undid it all, or None."""
        batch = self.batch
        if self.durable:
            batch.synced.wait()
            if batch.sync_error is not None:
                return batch.sync_error
        else:
            batch.committed.wait()
        return self.error or batch.error
