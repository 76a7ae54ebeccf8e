"""XADD AFTER: tasks that wait for others (dependencies), inside a writer's batch.

    XADD q AFTER 2 a 1-0 b 7-0 * ...   every named task must exist (a done one counts at once);
                                       the task is `waiting` until the last of them is done
    a task named is done (XACK, XACKDEL, NOACK, an ack under retention 0)
        -> its edges go; a dependent with none left is released: available (or delayed while its
           own DELAY runs), in the transaction of that ack, its queue's blocked workers served
    a task named dies (a failure with no attempts left, FATAL, expiry...) or is deleted (XDEL)
        -> its waiting dependents die, the failure's reason naming it, and theirs in turn (a chain)
    XREQUEUE of such a dependent -> dead again if a task it names is still dead or gone; waiting if one
                                    is not done yet; available if all are done. Requeueing the
                                    dependency alone never revives the dependent.

The edges are on disk (storage/dependencies.py), keyed by the dependency's row id: an ack finds its
dependents in one search, O(dependents). In memory only `any`: whether an edge exists at all, so a
plain ack costs one attribute test. It is read from the file at start and after a rollback, set by a
push that adds edges, and read again after a batch removed some.
"""

from __future__ import annotations

from collections import Counter

from .. import errors, lifecycle
from ..lifecycle import AVAILABLE, DEAD, DONE, WAITING
from ..protocol.stream_ids import format_id
from ..storage import name_bytes

DEPENDENCY_LOST = "dependency"  # the failure's cause on a task whose dependency died or went


class Dependencies:
    """The waiting tasks' edges, and what a dependency's end does to its dependents."""

    def __init__(self, db, queues, transitions, schedule):
        self.edges = db.dependencies  # storage/dependencies.py
        self.queues = queues
        self.transitions = transitions
        self.schedule = schedule
        self.any = False  # some edge exists (read at start: `reload`)

    def reload(self) -> None:
        """Start-up and a rollback: whether any edge exists, as the file says."""
        self.any = self.edges.any()

    # ------------------------------------------------------------ a push

    def plan(self, after: list) -> tuple[list[int], tuple | None]:
        """A push's AFTER, [(queue, id text, id)]: (the row ids of the named tasks not done, the
        (queue, id text) of the first dead one or None). An unknown task refuses the push (nothing
        is stored yet)."""
        waits, dead = [], None
        for queue, text, task_id in after:
            found = self.edges.find(queue, task_id)
            if found is None:
                raise errors.dependency_unknown(queue, text)
            rowid, state = found
            if state == DONE:
                continue
            waits.append(rowid)
            if state == DEAD and dead is None:
                dead = (queue, text)
        return waits, dead

    def added(self, dependent: int, waits: list[int]) -> None:
        """A push stored `dependent` waiting (or dead: a named task is dead) for `waits`."""
        self.edges.add(dependent, waits)
        self.any = True

    @staticmethod
    def lost_record(queue: bytes, text: bytes, now: int, deleted: bool = False) -> dict:
        """The failure record of a task whose dependency died (or was deleted)."""
        how = "was deleted" if deleted else "is dead"
        return lifecycle.failure_record(DEPENDENCY_LOST, f"dependency {queue.decode('utf-8', 'replace')} "
                                        f"{text.decode('utf-8', 'replace')} {how}", None, now)

    def waits_of(self, name: bytes, ids: list[tuple]) -> dict:
        """{task id: [(queue, id)]}: what each of these tasks of the queue waits for (not done yet; a task
        deleted since is left out)."""
        waits = {}
        for task_id in ids:
            rowid = self.edges.row_of(name, task_id)
            if rowid is not None:
                waits[task_id] = [(name_bytes(queue), (ms, seq)) for _, queue, ms, seq, _ in self.edges.waited_for(rowid)
                                  if queue is not None]
        return waits

    # ------------------------------------------------------------ a dependency done

    def finished(self, rowids: list[int], now: int) -> None:
        """These tasks are done (an ack): the dependents waiting for nothing else are released. The
        caller tests `any` first, so a plain ack pays nothing more."""
        served, moved, any_done = {}, Counter(), False
        for dependents in self.edges.done(rowids):  # a slice at a time (a task a million wait for)
            any_done = True
            # Those waiting for nothing more (a dead one, which died with another dependency, is XREQUEUE's)
            for rowid, name, state, available_at, priority, partition in self.edges.release(dependents, now):
                queue = self.queues[name_bytes(name)]
                moved[queue, state] += 1
                if state == AVAILABLE:
                    self.transitions.became_available(queue, rowid, (priority, partition))
                    served[queue.name] = queue
                else:
                    self.schedule.due_at(available_at)
        if not any_done:
            return
        for (queue, state), n in moved.items():  # one count move per queue and state, however many went
            queue.move(WAITING, state, n)
        blocked = self.transitions.waiters.blocked
        for name, queue in served.items():
            if name in blocked:
                self.transitions.serve_waiters(queue, now)
        self.any = self.edges.any()

    # ------------------------------------------------------------ a dependency dead or deleted

    def lost(self, tasks: list[tuple], now: int, deleted: bool = False) -> None:
        """These tasks, (row id, queue, task id) each, died (or were deleted): their waiting dependents
        die, and theirs in turn. Their edges stay, for a requeue of them (`requeued`); a deleted
        task's own edges (what it waited for) go."""
        if deleted:
            self.edges.forget([task[0] for task in tasks])
        pending = [(rowid, queue, format_id(task_id), deleted) for rowid, queue, task_id in tasks]
        while pending:
            rowid, queue_name, text, gone = pending.pop()
            for dependent in self.edges.dependents([rowid]):
                row = self.edges.orphan(dependent, self.lost_record(queue_name, text, now, gone), now)
                if row is None:  # dead already
                    continue
                queue = self.queues[name_bytes(row[0])]
                queue.move(WAITING, DEAD)
                queue.tally("dead")
                queue.settled((tuple(row[1:3]),))  # XRESULT BLOCK on it answers now
                pending.append((dependent, queue.name, format_id(row[1:3]), False))

    def purged(self, rowids: list[int]) -> None:
        """These dead tasks were purged (TTL): what they waited for is forgotten (their dependents died
        with them already)."""
        if rowids:
            self.edges.forget(rowids)
            self.any = self.edges.any()

    # ------------------------------------------------------------ a requeue

    def requeued(self, rows: list[tuple], now: int) -> tuple[list[tuple], list[int]]:
        """XREQUEUE set these dead tasks available, (row id, priority, partition) each: (those that stay
        available, the row ids of those waiting again). One whose named task is still dead or gone is
        dead again (the requeue does not count it)."""
        kept, waiting = [], []
        for row in rows:
            edges = self.edges.waited_for(row[0])
            if not edges:
                kept.append(row)
                continue
            lost = next(((queue, ms, seq, state) for _, queue, ms, seq, state in edges
                         if queue is None or state == DEAD), None)
            if lost is None:
                self.edges.wait_again(row[0])
                waiting.append(row[0])
                continue
            queue, ms, seq, state = lost
            record = (lifecycle.failure_record(DEPENDENCY_LOST, "a task it waits for was deleted", None, now)
                      if queue is None else self.lost_record(name_bytes(queue), format_id((ms, seq)), now))
            self.edges.orphan(row[0], record, now, AVAILABLE)
        return kept, waiting
