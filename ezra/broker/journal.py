"""The batch journal: one way to take back what a rolled-back batch changed in memory.

SQLite's rollback undoes the file; the broker's memory is undone here, for every shape of task
state it keeps. A change cheap to take back step by step appends its undo, `(function, *args)`:
a queue's counts moved (QueueState.move), a lease given, renewed or ended (InFlight). A shape
cheaper to build again than to undo registers, once, how (`on_rollback`): the leases' deadline
heap (InFlight), the reaper's deadlines (ReaperSchedule.reset). `roll_back` runs the undos, last
first, then the rebuilds; the broker's reload then reads each queue's state from the file (its
settings; its available order, read again a slice at a time), with the counts the undo left.

A committed batch's steps are forgotten (`batch_ended`). The hot paths pay one tuple appended per
change: a run of 50 pushes moves the counts once.
"""

from __future__ import annotations


class BatchJournal(list):
    """The undo steps of the writer's batch under way, and the rebuilds a rollback runs after them."""

    __slots__ = ("_rebuilds",)

    def __init__(self):
        super().__init__()
        self._rebuilds: list = []

    def on_rollback(self, rebuild) -> None:
        """After every rollback's undos, call `rebuild()`."""
        self._rebuilds.append(rebuild)

    def roll_back(self) -> None:
        """The batch was rolled back: its changes undone, last first, then the rebuilds."""
        while self:
            undo, *args = self.pop()
            undo(*args)
        for rebuild in self._rebuilds:
            rebuild()

    # The batch committed: its changes stay (list.clear itself: no frame, once a batch).
    batch_ended = list.clear
