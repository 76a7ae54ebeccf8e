"""The order a queue's available tasks are handed out in, kept in memory: oldest first.

A claim takes the oldest available task. The file no longer keeps an index of available tasks
for it (schema 8 dropped `tasks_available`: one B-tree, one WAL frame, less per push and per
claim); each queue keeps the row ids instead. Within a queue a row id orders as the task id
does: both only grow as tasks are pushed (a new row's id is above every row's there, its task
id above every task id of its queue), and a task keeps its row for life.

Pushes append to `_tail`, in order. A task that comes back with an older id (a nack, a lease
expiring, a delayed task coming due, XREQUEUE, a gone worker's release) goes to `_returns`, a
heap; `take` merges the two heads. Ways out of available other than a claim (XCLAIM FORCE,
XNACK FORCE, XDEL) leave their entry behind (XDEL takes those at the head out): the claim's
UPDATE is guarded by the state (and the queue: a row id can be reused once its row is
deleted), so a stale entry is stepped over.

An order is read from the file after start-up and after a rollback (the broker's reload makes
new queue states), a slice at a time as claims need it (Transitions.order): the first claim
after a restart with a million queued reads 10,000, not a million. Until the last slice is in
(`complete`), a task that becomes available past the slices read is left for a later slice,
which will find it in the file. 8 bytes per task waiting in order: a million take 8 MB.
"""

from __future__ import annotations

import heapq
from array import array

COMPACT_AFTER = 4096  # taken entries at the tail's start before it is cut (a copy of the rest)


class AvailableOrder:
    """Row ids of a queue's available tasks (and stale entries the claims will skip), oldest first."""

    __slots__ = ("_tail", "_head", "_returns", "read_to", "complete")

    def __init__(self, rowids=(), complete: bool = True):
        self._tail = array("q", rowids)  # ascending: pushes, and the slices read from the file
        self._head = 0                   # entries before it were taken
        self._returns: list[int] = []    # a heap: tasks back with older ids
        self.read_to = None              # (id_ms, id_seq, rowid) of the last task a slice read
        self.complete = complete         # every available task is here (no slice left to read)

    def __len__(self) -> int:
        return len(self._tail) - self._head + len(self._returns)

    def add(self, rowid: int) -> None:
        """A task became available (a push, or one coming back)."""
        if not self.complete and (self.read_to is None or rowid > self.read_to[2]):
            return  # past the slices read: a later slice finds it in the file
        tail = self._tail
        if self._head == len(tail) or rowid > tail[-1]:
            tail.append(rowid)
        else:
            heapq.heappush(self._returns, rowid)

    def add_pushed(self, rowids) -> None:
        """A run of pushes became available: `add` each, in one step when they go on the tail
        (a range of row ids: ascending; the hand-edited file's fallback lists them one by one)."""
        tail = self._tail
        if self.complete and type(rowids) is range and rowids and (self._head == len(tail) or rowids[0] > tail[-1]):
            tail.extend(rowids)  # ascending, all above the tail: what `add` would do with each
            return
        for rowid in rowids:
            self.add(rowid)

    def read(self, rows: list[tuple], complete: bool) -> None:
        """A slice from the file: (rowid, id_ms, id_seq) of available tasks after `read_to`, in order."""
        if rows:
            self._tail.extend(row[0] for row in rows)
            rowid, ms, seq = rows[-1]
            self.read_to = (ms, seq, rowid)
        self.complete = complete

    def take_one(self) -> int | None:
        """The oldest row id, out of the order (None: none here)."""
        tail, returns, head = self._tail, self._returns, self._head
        if head < len(tail) and not (returns and returns[0] < tail[head]):
            rowid = tail[head]
            self._head = head + 1
            if head >= COMPACT_AFTER and head * 2 >= len(tail):
                del tail[:head + 1]
                self._head = 0
            return rowid
        return heapq.heappop(returns) if returns else None

    def take(self, n: int) -> list[int]:
        """Up to `n` row ids, oldest first, out of the order."""
        taken, tail, returns = [], self._tail, self._returns
        head, end = self._head, len(self._tail)
        if not returns:  # nothing came back: the tail's next ones, in one slice (a claim of 50: no loop)
            taken, head = tail[head:head + n].tolist(), min(head + n, end)
        while len(taken) < n:
            if returns and (head == end or returns[0] < tail[head]):
                taken.append(heapq.heappop(returns))
            elif head < end:
                taken.append(tail[head])
                head += 1
            else:
                break
        self._head = head
        if head >= COMPACT_AFTER and head * 2 >= end:
            del tail[:head]
            self._head = 0
        return taken

    def forget(self, rowids: set) -> None:
        """These tasks left available other than by a claim (XDEL): those at the head go now, so
        that the head (the oldest waiting's age) is a task's; the others are stepped over later."""
        while (head := self.head()) is not None and head in rowids:
            self.take_one()

    def head(self) -> int | None:
        """The oldest row id in the order (perhaps a stale entry), without taking it."""
        tail, returns, head = self._tail, self._returns, self._head
        if head < len(tail):
            return min(tail[head], returns[0]) if returns else tail[head]
        return returns[0] if returns else None
