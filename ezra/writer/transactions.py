"""A writer transaction declared where its body is: `@transaction(...)` on a part's method.

    class Tasks:                                  # a part: it has a `writer` (writer.Writer)
        @transaction(durable=False)
        def length(self, name, dead): ...         # the body: runs inside a batch

    broker.tasks.length(queue, False)             # submits the body to tasks.writer: a Request
    broker.tasks.length(queue, False).wait()      # ...and waits for it (a synchronous caller)
    Tasks.cancel.body(self, name, ids)            # inside a batch (another body): runs it here

The policy, beside the body (Writer.submit acts on it):

    durable   True (the default): the reply waits for the fsync of the WAL after the commit.
              False: for the commit only (reads, claims, lease renewals: what a crash may undo
              without losing a task or an outcome the client was told was kept)
    grows     True: it adds rows (a push, a queue made, settings stored), so a full disk refuses
              it (disk_space.py); everything else rewrites rows and goes on in the reserve

A transaction's arguments are passed by position: its keywords are Writer.submit's, the policy
(`length(queue, dead=True)` is a TypeError; `durable=` or `grows=` would override the policy).

A body calls another transaction's body by the class: `Tasks.cancel.body(self, ...)`, or
`Tasks.push.body(tasks, ...)` from another part. `self.cancel(...)` inside a body would submit a
second request to the same batch and hand back a Request, not the result.

The decorated method is a non-data descriptor. Its first access on an instance puts
functools.partial(instance.writer.submit, the bound body, policy...) in the instance's __dict__,
which answers every later access before the descriptor is asked: a call costs what writing
`writer.submit(body, ...)` costs, with no Python frame of its own between. The part's `writer`
must be set before the first call and never replaced.
"""

from __future__ import annotations

from functools import partial


class Transaction:
    """A part's method submitted to the part's writer when called on an instance (see the module doc)."""

    def __init__(self, body, durable: bool, grows: bool):
        self.body = body
        self.durable = durable
        self.grows = grows
        self.name = body.__name__
        self.__doc__ = body.__doc__
        # Only what differs from Writer.submit's defaults: a partial without keywords is called
        # without building a dict of them per call.
        self._policy = {}
        if not durable:
            self._policy["durable"] = False
        if grows:
            self._policy["grows"] = True

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, instance, owner=None):
        if instance is None:
            return self  # the class's: `.body` runs it inline, `.durable` and `.grows` say its policy
        submit = partial(instance.writer.submit, self.body.__get__(instance, owner), **self._policy)
        instance.__dict__[self.name] = submit  # later accesses find it there, not here
        return submit

    def __repr__(self) -> str:
        return f"<transaction {self.body.__qualname__} durable={self.durable} grows={self.grows}>"


def transaction(durable: bool = True, grows: bool = False):
    """Declare a part's method a writer transaction with its policy (see the module doc)."""
    return partial(Transaction, durable=durable, grows=grows)
