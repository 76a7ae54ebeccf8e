"""The claim order of a queue whose tasks have priorities or partitions (XADD PRIORITY, PARTITION).

A queue none of whose tasks has either keeps its plain AvailableOrder (available.py): oldest
first, and nothing here costs it anything. Once one has, its available tasks are in Lanes:

    priority 0 .. 9        the most urgent priority that has a task the claim may hand out
      partitions in turn   round-robin among the partitions with work and room (in flight
                           below the queue's PARTITION-LIMIT); the tasks without a partition
                           are one more lane in the turn, never limited
        push order         within a lane, oldest first (an AvailableOrder each)

So a partition with 100,000 tasks queued takes one turn in a round like a partition with one:
another partition's first task waits at most one round, not behind the 100,000.

A lane's turn is kept only while it has work and room: a partition at its limit leaves the
round, and comes back when one of its tasks ends its lease (`ended`) if it still has work. The
limit counts a partition's tasks in flight at every priority together (`flying`). A
claim is O(1) in the tasks and partitions queued (the priorities are ten).

The lanes remember, for each task they handed out and whose lease has not ended, its priority
and partition (`holding`): the count of a partition's tasks in flight, and where a task that
comes back (a nack, an expired lease) goes again. The tasks without a partition are never
limited, so theirs are not counted: their lane hands out many at once when it is alone in its
round (a queue of priorities only), and their acks only forget where they were. A task taken that the claim's write did not
find available any more (a stale entry: XDEL, XCLAIM FORCE took it) is given back
(`not_claimed`). XCLAIM FORCE of an available task leases it outside the lanes' order: it
counts against its partition's limit all the same (`leased_outside`), as it does once the lanes
are read again from the file, and its entry left in a lane is stepped over.
"""

from __future__ import annotations

from collections import defaultdict, deque

from ..lifecycle import DEFAULT_PRIORITY
from ..storage import name_bytes
from ..storage.placements import grouped
from .available import AvailableOrder

PRIORITIES = 10  # 0 (served first) .. 9
NO_PARTITION = None  # the lane of the tasks pushed without PARTITION: no limit


def lane_of(priority, partition) -> tuple:
    """(priority, partition key) of a task as stored (NULL: the default priority, no partition; a
    key as TEXT or BLOB), as the lanes name its lane."""
    return DEFAULT_PRIORITY if priority is None else priority, None if partition is None else name_bytes(partition)


class Lane:
    """One partition's available tasks (or those without a partition) at one priority."""

    __slots__ = ("key", "order", "in_flight", "in_turn")

    def __init__(self, key, order: AvailableOrder | None = None):
        self.key = key
        self.order = AvailableOrder() if order is None else order
        self.in_flight = 0    # its tasks handed out whose leases have not ended (a partition's lane only)
        self.in_turn = False  # in its level's round now (it has work and room)


class Level:
    """One priority's lanes, by partition key, and the round of those with work and room."""

    __slots__ = ("lanes", "turns")

    def __init__(self):
        self.lanes: dict = {}
        self.turns: deque[Lane] = deque()


class Lanes:
    """A queue's available tasks in claim order: priority, then partitions in turn, then push order."""

    __slots__ = ("levels", "partition_limit", "holding", "flying", "_waiting")
    complete = True  # as a complete AvailableOrder: every available task of the queue is here

    def __init__(self, partition_limit: int = 1):
        self.levels: list[Level | None] = [None] * PRIORITIES
        self.partition_limit = partition_limit
        self.holding: dict[int, tuple] = {}  # row id handed out -> (priority, partition key)
        self.flying: dict = {}  # partition key -> its tasks handed out, at every priority (the limit's count)
        self._waiting = 0  # entries in the lanes' orders (stale ones included)

    def __len__(self) -> int:
        return self._waiting

    @classmethod
    def from_order(cls, order: AvailableOrder, in_flight_rowids, partition_limit: int = 1) -> Lanes:
        """A plain queue's complete order, and its tasks in flight, as the lanes of a queue that
        turns to them (the first push with PRIORITY or PARTITION): all of the default priority,
        in no partition, the order itself the one lane (no copy)."""
        lanes = cls(partition_limit)
        level = lanes.levels[DEFAULT_PRIORITY] = Level()
        lane = level.lanes[NO_PARTITION] = Lane(NO_PARTITION, order)
        lanes._waiting = len(order)
        lanes.holding = dict.fromkeys(in_flight_rowids, (DEFAULT_PRIORITY, NO_PARTITION))
        lanes._in_turn_if_ready(level, lane)
        lanes._drop_if_idle(level, lane)
        return lanes

    @classmethod
    def from_rows(cls, available, in_flight, partition_limit: int = 1) -> Lanes:
        """The lanes of a queue as the file has them (after a rollback, or the first claim after a
        start): its available tasks and its tasks in flight, (rowid, priority, partition_key) each, in
        row id order (storage/placements.py: the available ones read as they come, never a list of
        them all), grouped in one pass."""
        return cls.from_groups(grouped(available), in_flight, partition_limit)

    @classmethod
    def from_groups(cls, waiting: dict, in_flight, partition_limit: int = 1) -> Lanes:
        """The lanes of the available tasks grouped by (priority, partition_key) as stored (placements.grouped:
        each group's row ids in order) and of the tasks in flight: each lane's order made from its
        group at once (a million tasks: no `add` each)."""
        flying: dict[tuple, list] = defaultdict(list)
        for rowid, priority, partition in in_flight:
            flying[DEFAULT_PRIORITY if priority is None else priority, partition].append(rowid)
        lanes = cls(partition_limit)
        keyed: dict[tuple, list] = {}
        for (priority, partition), rowids in waiting.items():
            key = lane_of(priority, partition)
            if key in keyed:  # NULL and 5, or a key stored as text and as BLOB: one lane, kept in order
                rowids = sorted([*keyed[key], *rowids])
            keyed[key] = rowids
        for (priority, key), rowids in keyed.items():  # the oldest first task's lane first in the round
            level = lanes.levels[priority]
            if level is None:
                level = lanes.levels[priority] = Level()
            level.lanes[key] = Lane(key, AvailableOrder(rowids))  # its order made at once, from its list
            lanes._waiting += len(rowids)
        for (priority, partition), rowids in flying.items():
            key = None if partition is None else name_bytes(partition)
            lanes.holding.update(dict.fromkeys(rowids, (priority, key)))
            if key is not NO_PARTITION:
                lanes._lane(priority, key).in_flight += len(rowids)
                lanes.flying[key] = lanes.flying.get(key, 0) + len(rowids)
        for level in lanes.levels:
            if level is not None:
                for lane in list(level.lanes.values()):
                    lanes._in_turn_if_ready(level, lane)
        return lanes

    def _lane(self, priority: int, partition) -> Lane:
        level = self.levels[priority]
        if level is None:
            level = self.levels[priority] = Level()
        lane = level.lanes.get(partition)
        if lane is None:
            lane = level.lanes[partition] = Lane(partition)
        return lane

    # ------------------------------------------------------------ in

    def add_pushed(self, rowids) -> None:
        """A run of plain pushes (no PRIORITY, no PARTITION): the default priority, no partition."""
        for rowid in rowids:
            self.add(rowid)

    def ready(self) -> bool:
        """Some lane has work and room: a claim would take a task (or a stale entry: the claim
        steps over it)."""
        for level in self.levels:
            if level is None:
                continue
            turns = level.turns
            while turns and not self._has_room(turns[0].key):  # full since it joined: out of the round
                turns.popleft().in_turn = False
            if turns:
                return True
        return False

    def add(self, rowid: int, priority: int = DEFAULT_PRIORITY, partition=NO_PARTITION) -> None:
        """A task became available (a push, or one coming back)."""
        lane = self._lane(priority, partition)
        lane.order.add(rowid)
        self._waiting += 1
        self._in_turn_if_ready(self.levels[priority], lane)

    def ended(self, rowid: int) -> tuple | None:
        """A task handed out left flight (acked, failed, expired, released): its partition has room
        again. Its (priority, partition), for a task that comes back (None: not handed out here)."""
        placed = self.holding.pop(rowid, None)
        if placed is not None and placed[1] is not NO_PARTITION:  # (never limited: nothing counted)
            self._partition_ended(*placed)
        return placed

    def all_ended(self, rowids) -> None:
        """`ended` for each of these tasks (an ack of many)."""
        pop = self.holding.pop
        for rowid in rowids:
            placed = pop(rowid, None)
            if placed is not None and placed[1] is not NO_PARTITION:
                self._partition_ended(*placed)

    def _partition_ended(self, priority: int, partition) -> None:
        """One of the partition's tasks at that priority left flight: room for the partition, its
        lanes with work, at every priority, into their rounds."""
        self.levels[priority].lanes[partition].in_flight -= 1
        flying = self.flying[partition] - 1
        if flying:
            self.flying[partition] = flying
        else:
            del self.flying[partition]
        for level in self.levels:
            if level is not None and (lane := level.lanes.get(partition)) is not None:
                self._in_turn_if_ready(level, lane)
                self._drop_if_idle(level, lane)

    def leased_outside(self, rowid: int, priority: int, partition) -> None:
        """An available task was leased other than by `take` (XCLAIM FORCE): held, and counted in
        its partition (over its limit, maybe: the worker asked for that task)."""
        if rowid not in self.holding:
            self.holding[rowid] = (priority, partition)
            if partition is not NO_PARTITION:
                self._lane(priority, partition).in_flight += 1
                self.flying[partition] = self.flying.get(partition, 0) + 1

    def not_claimed(self, rowids) -> None:
        """Taken here, but the claim's write found them no longer available (stale entries)."""
        for rowid in rowids:
            self.ended(rowid)

    # ------------------------------------------------------------ out

    def take(self, n: int) -> list[int]:
        """Up to `n` row ids in claim order, out of the lanes and counted in flight (`holding`)."""
        taken = []
        for priority in range(PRIORITIES):
            level = self.levels[priority]
            if level is None:
                continue
            turns = level.turns
            while turns and len(taken) < n:
                lane = turns.popleft()
                if lane.key is NO_PARTITION and not turns:  # alone in its round: many at once
                    self._take_alone(level, lane, priority, n - len(taken), taken)
                    continue
                if not self._has_room(lane.key):  # its partition filled up at another priority since
                    lane.in_turn = False
                    continue
                rowid = lane.order.take_one()
                if rowid is None:  # emptied by `forget`: out of the round until a task comes
                    lane.in_turn = False
                    self._drop_if_idle(level, lane)
                    continue
                self._waiting -= 1
                if rowid in self.holding:  # a stale entry (XNACK FORCE of an available task added one)
                    lane.in_turn = False
                    self._in_turn_if_ready(level, lane)
                    self._drop_if_idle(level, lane)
                    continue
                if lane.key is not NO_PARTITION:
                    lane.in_flight += 1
                    self.flying[lane.key] = self.flying.get(lane.key, 0) + 1
                self.holding[rowid] = (priority, lane.key)
                lane.in_turn = False
                self._in_turn_if_ready(level, lane)
                taken.append(rowid)
            if len(taken) == n:
                break
        return taken

    def _take_alone(self, level: Level, lane: Lane, priority: int, n: int, taken: list) -> None:
        """`take` from the lane of the tasks without a partition while no other lane of its priority
        is in the round: up to n in one slice of its order, stale entries stepped over."""
        rowids = lane.order.take(n)
        self._waiting -= len(rowids)
        holding = self.holding
        if not holding.keys().isdisjoint(rowids):  # stale entries (XNACK FORCE of an available task)
            rowids = [rowid for rowid in rowids if rowid not in holding]
        holding.update(dict.fromkeys(rowids, (priority, NO_PARTITION)))
        taken += rowids
        lane.in_turn = False
        self._in_turn_if_ready(level, lane)
        self._drop_if_idle(level, lane)

    def forget(self, placed: list[tuple]) -> None:
        """These tasks, (rowid, priority, partition key) each, left available other than by a claim
        (XDEL): those at their lane's head go now (the others are stepped over when their turn comes)."""
        rowids = {row[0] for row in placed}
        for _, priority, partition in placed:
            level = self.levels[priority]
            lane = None if level is None else level.lanes.get(partition)
            if lane is not None:
                while (head := lane.order.head()) is not None and head in rowids:
                    lane.order.take_one()
                    self._waiting -= 1  # an emptied lane leaves the round at its turn (`take`)

    def head(self) -> int | None:
        """The oldest row id waiting in any lane (the queue's oldest waiting task), or None. For the
        figures (INFO, /metrics, the dashboard) and a listing of done tasks, never a claim: a walk of
        the lanes, 1.5 ms at 10,000 partitions (measured), as partitions_with_work's."""
        heads = [head for level in self.levels if level is not None
                 for lane in level.lanes.values() if (head := lane.order.head()) is not None]
        return min(heads) if heads else None

    def partitions_with_work(self) -> int:
        """Partitions that have available tasks (at any priority), for the figures."""
        return len({key for level in self.levels if level is not None
                    for key, lane in level.lanes.items() if key is not NO_PARTITION and len(lane.order)})

    def set_partition_limit(self, limit: int) -> None:
        """XCFGSET PARTITION-LIMIT: partitions that have room under the new limit join the round."""
        self.partition_limit = limit
        for level in self.levels:
            if level is not None:
                for lane in level.lanes.values():
                    self._in_turn_if_ready(level, lane)

    # ------------------------------------------------------------ the round

    def _has_room(self, key) -> bool:
        """The partition may have one more task in flight (the tasks without one always may)."""
        return key is NO_PARTITION or self.flying.get(key, 0) < self.partition_limit

    def _in_turn_if_ready(self, level: Level, lane: Lane) -> None:
        """Into the round when it has work and room, unless there already. (A partition's limit
        counts its tasks in flight at every priority: a lane of it in a round may find it full
        when its turn comes, and leaves the round then.)"""
        if not lane.in_turn and len(lane.order) and self._has_room(lane.key):
            lane.in_turn = True
            level.turns.append(lane)

    @staticmethod
    def _drop_if_idle(level: Level, lane: Lane) -> None:
        """A lane with nothing waiting and nothing in flight goes: partition keys come and go
        (one per customer, per order...), and an idle one must not stay in memory."""
        if not lane.in_turn and not lane.in_flight and not len(lane.order):
            del level.lanes[lane.key]
