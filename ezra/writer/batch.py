"""A loop turn's transaction as the writer sees it: the Batch (and the flags its waiters sleep
on), each Request submitted to it, the Atomic of an EXEC in it (see writer.py)."""

from __future__ import annotations

from gevent import get_hub
from gevent.hub import Waiter


class Batch:
    """One loop turn's transaction: its requests commit, or fail, together.

    It is also its two moments' flags, each set once: committed (claims and reads wait for it)
    and synced (the fsync of the WAL after the commit: durable requests wait for it). Kept on
    the batch, not as two objects of their own: one is made every loop turn that writes.
    `set_*` (anywhere) schedules the wake-ups as a callback, so their order stays the loop's;
    `set_synced_now` (the fsync callback, on the hub) switches to each waiter at once, as the
    floor does."""

    __slots__ = ("requests", "durable", "error", "sync_error", "held", "atomics",
                 "is_committed", "is_synced", "commit_waiters", "sync_waiters")

    def __init__(self):
        self.requests: list[Request] = []  # kept to run again should the commit meet a full disk
        self.durable = False  # holds a request answered only after an fsync
        self.held = False  # an Atomic (EXEC) is running in it: it does not commit yet
        self.atomics: list[Atomic] = []  # the EXECs in it: all or nothing, even on a full disk
        self.error: BaseException | None = None       # rolled back: every request fails
        self.sync_error: BaseException | None = None  # committed, but the fsync failed: durable ones fail
        self.is_committed = False  # set after the readers the batch served are woken (callbacks' order)
        self.is_synced = False  # set with (or after) is_committed
        self.commit_waiters: list[Waiter] = []
        self.sync_waiters: list[Waiter] = []

    def wait_committed(self) -> None:
        if not self.is_committed:
            sleep_on(self.commit_waiters)

    def wait_synced(self) -> None:
        if not self.is_synced:
            sleep_on(self.sync_waiters)

    def set_committed(self) -> None:
        if not self.is_committed:
            self.is_committed = True
            if self.commit_waiters:
                get_hub().loop.run_callback(wake, self.commit_waiters)

    def set_synced(self) -> None:
        if not self.is_synced:
            self.is_synced = True
            if self.sync_waiters:
                get_hub().loop.run_callback(wake, self.sync_waiters)

    def set_synced_now(self) -> None:
        """On the hub only."""
        if not self.is_synced:
            self.is_synced = True
            wake(self.sync_waiters)


def sleep_on(waiters: list) -> None:
    """Wait (this greenlet) until `wake(waiters)`: a flag's wait, once it is known to be unset."""
    waiter = Waiter()
    waiters.append(waiter)
    waiter.get()


def wake(waiters: list) -> None:
    for waiter in waiters:
        waiter.switch(True)  # runs it until it waits again; a killed waiter's greenlet is gone: no switch


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
            if not batch.is_synced:
                waiter = Waiter()  # sleep_on, inlined: once per command
                batch.sync_waiters.append(waiter)
                waiter.get()
            if batch.sync_error is not None:
                raise batch.sync_error
        elif not batch.is_committed:
            waiter = Waiter()
            batch.commit_waiters.append(waiter)
            waiter.get()
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
            batch.wait_synced()
            if batch.sync_error is not None:
                return batch.sync_error
        else:
            batch.wait_committed()
        return self.error or batch.error
