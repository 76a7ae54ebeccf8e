"""A writer transaction declared on the method that is its body, with its policy.

    class Tasks:                              # a part: it has a `writer` (writer.Writer)
        @transaction(durable=False)
        def length(self, name, dead): ...     # the body: runs inside a batch

    broker.tasks.length(queue, False)         # submits the body to the part's writer: a Request
    broker.tasks.length(queue, False).wait()  # ...and its result (a synchronous caller)
    Tasks.cancel.body(self, name, ids)        # from another body, in its batch: runs it there
                                              # (`self.cancel(...)` would submit a second request)

`durable` (the default): answered after the fsync that follows the commit; durable=False: at the
commit (reads, claims, renewals). `grows`: it adds rows, so a full disk refuses it (disk_space.py).
Arguments go by position: the keywords are Writer.submit's, the policy.

The first access on an instance puts functools.partial(instance.writer.submit, the bound body, the
policy) in its __dict__, which answers every later access (this is a non-data descriptor): a call
costs what a hand-written `writer.submit(body, ...)` does, with no Python frame between.
"""

from __future__ import annotations

from functools import partial


class Transaction:
    """A part's method submitted to the part's writer when called on an instance (see the module doc)."""

    def __init__(self, body, durable: bool, grows: bool):
        self.body, self.durable, self.grows = body, durable, grows  # the class's: Tasks.trim.body...
        self.__doc__ = body.__doc__
        # Only what differs from Writer.submit's defaults: most partials then pass no keywords at all.
        self._policy = {}
        if not durable:
            self._policy["durable"] = False
        if grows:
            self._policy["grows"] = True

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        submit = partial(instance.writer.submit, self.body.__get__(instance, owner), **self._policy)
        instance.__dict__[self.body.__name__] = submit  # later accesses find it there, not here
        return submit


def transaction(durable: bool = True, grows: bool = False):
    """Declare a part's method a writer transaction with its policy (see the module doc)."""
    return partial(Transaction, durable=durable, grows=grows)
