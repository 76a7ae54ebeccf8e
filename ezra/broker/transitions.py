"""The state changes several verbs share, inside a writer's batch: a queue made, an event
counted, tasks claimed, failed deliveries decided, tasks deleted or purged, and the blocked
workers served whatever makes a task available.

Whatever makes a task available (push, nack, expiry, a delayed task coming due, requeue,
resuming a paused queue) calls `serve_waiters` in its transaction, so a blocked worker gets
it in the same batch; so does whatever frees a slot under a queue's MAX-IN-FLIGHT (an ack,
XACKDEL, and the failures: nack, expiry, release), and the reaper when a RATE-LIMIT window
opens (flow.py). A paused queue (XCFGSET PAUSED 1) hands out nothing: its waiters wait
for the resume, which serves them.
"""

from __future__ import annotations

from loguru import logger

from .. import errors, lifecycle
from ..lifecycle import AVAILABLE, DEAD, DELAYED, DONE, GONE, IN_FLIGHT
from ..storage import name_bytes
from .available import AvailableOrder
from .in_flight import ROWID
from .dependencies import Dependencies
from .lanes import Lanes, lane_of
from .queues import MAX_QUEUE_NAME, NO_MARK, QueueState


ORDER_SLICE = 10_000  # available tasks read from the file at a time into a queue's order


def new_as_idle(rows: list) -> list:
    """XREADGROUP CLAIM: new tasks in the idle claims' shape, idle 0 ms and delivered 0 times before."""
    return [(*row[:3], 0, 0) for row in rows]


class Transitions:
    """The shared state changes, over the file, the queues and the registries they touch."""

    def __init__(self, db, queues, in_flight, waiters, schedule, workers):
        self.db = db
        self.queues = queues
        self.in_flight = in_flight
        self.waiters = waiters
        self.schedule = schedule
        self.workers = workers
        self.dependencies = Dependencies(db, queues, self, schedule)  # XADD AFTER's waiting tasks

    def queue(self, name: bytes, now: int, create: bool = True) -> QueueState | None:
        """The queue's state, made (in the batch) when `create`."""
        queue = self.queues.get(name)
        if queue is None and create:
            if len(name) > MAX_QUEUE_NAME:  # raised before the batch writes anything for it
                raise errors.queue_name_too_long(len(name), MAX_QUEUE_NAME)
            self.db.insert_queue(name, now)
            queue = self.queues.new(name)
            self.queues.add(queue)
        return queue

    def order(self, queue: QueueState, wanted: int = 1) -> AvailableOrder:
        """The queue's available order, with at least `wanted` entries if the file has them: after
        a start or a rollback it is read a slice at a time (AvailableOrder says why). A lanes
        queue's (lanes.py) is read whole, in one read, with its tasks in flight (`holding`)."""
        if queue.lanes_on and queue.order is None:
            in_flight = [lease[ROWID] for lease in queue.leases.values()]
            queue.turned_to_lanes(Lanes.from_rows(*self.db.placements.rows(queue.name, in_flight), queue.partition_cap()))
        order = queue.reading_order()
        while not order.complete and len(order) < wanted:
            after = None if order.read_to is None else order.read_to[2]
            rows = self.db.available_after(queue.name, after, ORDER_SLICE)
            order.read(rows, complete=len(rows) < ORDER_SLICE)
        return order

    def became_available(self, queue: QueueState, rowid: int, placed: tuple | None = None) -> None:
        """In a batch: a task of the queue became available (a push, or one coming back). `placed`:
        its (priority, partition key) as stored, for a lanes queue (None: read here if needed)."""
        order = queue.order
        if order is not None:  # not built yet: the build will read it from the file
            if queue.lanes_on:
                priority, partition = self.db.placements.of(rowid) if placed is None else placed
                order.add(rowid, *lane_of(priority, partition))
            else:
                order.add(rowid)

    def turn_to_lanes(self, queue: QueueState) -> None:
        """The queue's first task with a priority or partition (a push, an import): its claims take
        the order by priority and partition (lanes.py) from now on, noted in the file in the same
        transaction. A complete order moves into the lanes as it is (the default priority, no
        partition: what every task before had); one not read whole yet is read by the next claim."""
        self.db.placements.use_lanes(queue.name)
        order = queue.order
        lanes = None
        if order is not None and order.complete:
            lanes = Lanes.from_order(order, [lease[ROWID] for lease in queue.leases.values()], queue.partition_cap())
        queue.turned_to_lanes(lanes)

    def forget(self, queue: QueueState, rows: list[tuple]) -> None:
        """Available tasks deleted (XDEL), (rowid, priority, partition_key) each as stored: out of the
        queue's order (a lanes queue's: each from its own lane)."""
        if queue.lanes_on:
            queue.order.forget([(rowid, *lane_of(priority, partition)) for rowid, priority, partition in rows])
        else:
            queue.order.forget({row[0] for row in rows})

    def leased_outside(self, queue: QueueState, rowid: int) -> None:
        """XCLAIM FORCE leased an available task: a lanes queue counts it in its partition."""
        if queue.lanes_on and queue.order is not None:
            priority, partition = self.db.placements.of(rowid)
            queue.order.leased_outside(rowid, *lane_of(priority, partition))

    def lease_ended(self, queue: QueueState, rowid: int) -> tuple | None:
        """A task of a lanes queue left flight: its partition has room again (lanes.py). Its
        (priority, partition) if the lanes handed it out."""
        order = queue.order
        return None if order is None else order.ended(rowid)

    def leases_ended(self, queue: QueueState, held: list[tuple], now: int) -> None:
        """These (task id, lease) pairs of a lanes queue left flight other than back to available
        (an ack, XACKDEL): their partitions have room again, and the queue's blocked workers are
        served if that lets a task out."""
        if queue.order is not None:
            queue.order.all_ended([lease[ROWID] for _, lease in held])
        if queue.name in self.waiters.blocked:
            self.serve_waiters(queue, now)

    def claim_rows(self, queue: QueueState, worker: bytes, count: int, noack: bool, now: int) -> list:
        """Up to `count` available tasks of the queue leased to `worker` (done at once with NOACK),
        in id order; a queue with priorities or partitions's in its claim order (most urgent first),
        so that a worker taking several runs them in that order."""
        state = DONE if noack else IN_FLIGHT
        deadline = None if noack else lifecycle.lease_deadline(now, queue.lease_seconds())
        want = min(count, queue.counts[AVAILABLE])
        flow = queue.flow
        if flow is not None:  # MAX-IN-FLIGHT, RATE-LIMIT: how many may go now (flow.py)
            want = min(want, flow.room(queue.counts[IN_FLIGHT], now))
        retained = self.retained_mark(queue, queue.retention()) if noack and want > 0 else None
        order = queue.order if queue.order is not None and queue.order.complete else self.order(queue, want)
        rows, rebuilt, claim_order = [], False, None
        if queue.lanes_on:  # priorities and partitions (lanes.py): what they let out is all there is
            rows = claim_order = self._claim_from_lanes(queue, order, want, worker, now, deadline, state, retained)
            rows = sorted(rows)  # the leases and counts below take them in id order; the reply, as claimed
            want = len(rows)
        while len(rows) < want:  # more than one pass only past stale entries (XCLAIM/XNACK FORCE)
            missing = want - len(rows)
            if missing == 1:  # a worker's COUNT 1, or a waiter's
                rowid = order.take_one()
                rowids = () if rowid is None else (rowid,)
            else:
                rowids = order.take(missing)
            if rowids:
                rows += self.db.claim(queue.name, rowids, worker, now, deadline, state, retained)
            elif not order.complete:
                order = self.order(queue, missing)
            elif rebuilt:
                break
            else:
                order, rebuilt = self._order_lost(queue, len(rows)), True
        if rows:
            if len(rows) > 1:
                rows.sort()
            if deadline is not None:
                self.in_flight.claimed(queue, rows, worker, deadline, now)
                self.schedule.lease_until(deadline)
                self.workers.leased(worker, queue)
            elif self.dependencies.any:  # NOACK: done, so tasks waiting for them may go
                self.dependencies.finished([row[4] for row in rows], now)
            queue.delivered(rows, state)
            if flow is not None:
                self.handed_out(queue, len(rows), now)
        return rows if claim_order is None else claim_order

    def _claim_from_lanes(self, queue: QueueState, lanes: Lanes, want: int, worker: bytes, now: int,
                          deadline: int | None, state: str, retained: int | None) -> list:
        """claim_rows' take of a lanes queue: the lanes' claim order, stale entries given back
        (`not_claimed`); fewer than `want` when every lane with work is at its PARTITION-LIMIT."""
        rows = []
        while len(rows) < want:
            rowids = lanes.take(want - len(rows))
            if not rowids:
                break
            got = self.db.claim(queue.name, rowids, worker, now, deadline, state, retained)
            if len(got) != len(rowids):
                found = {row[4] for row in got}
                lanes.not_claimed([rowid for rowid in rowids if rowid not in found])
            if deadline is None:  # NOACK: done at once, no lease held
                lanes.not_claimed([row[4] for row in got])
            if len(got) > 1:  # the write returns them in no set order: the lanes' order again
                place = {rowid: i for i, rowid in enumerate(rowids)}
                got.sort(key=lambda row: place[row[4]])
            rows += got
        return rows

    def handed_out(self, queue: QueueState, n: int, now: int) -> None:
        """n tasks of a queue with a Flow went to workers (claims, take-overs): counted in its rate
        window; a window filled wakes the reaper when it opens, for the workers blocked meanwhile."""
        if queue.flow.handed_out(n, now):
            self.window_full(queue, now)

    def window_full(self, queue: QueueState, now: int) -> None:
        """If the queue's rate window is full, the reaper serves its blocked workers when it opens."""
        opens_at = None if queue.flow is None else queue.flow.opens_at(now)
        if opens_at is not None:
            self.schedule.window_opens_at(opens_at)

    def _order_lost(self, queue: QueueState, got: int) -> AvailableOrder:
        """The counts say more tasks are available than the order held: a bug (a way into
        available that did not tell the order). Logged, and the order is built again from the
        file, so no task is left unclaimable."""
        logger.error("queue {!r}: {} available tasks counted, the order ran out after {}; building it "
                     "again from the file", queue.name, queue.counts[AVAILABLE], got)
        queue.forget_order()
        return self.order(queue, queue.counts[AVAILABLE])

    def serve_waiters(self, queue: QueueState, now: int) -> None:
        """Hand newly available tasks of `queue` to its blocked workers, first come first served
        (none while it is paused: they wait for the resume, which calls this again)."""
        if queue.is_paused():
            return
        waiters = self.waiters  # a queue at its MAX-IN-FLIGHT or RATE-LIMIT: claim_rows takes none
        while queue.counts[AVAILABLE]:
            waiter = waiters.first(queue.name)
            if waiter is None:
                return
            claim = waiter.claim
            rows = self.claim_rows(queue, claim.worker, claim.count, claim.noack, now)
            if not rows:
                return
            waiters.served(waiter, {queue.name: rows if claim.claim_idle is None else new_as_idle(rows)})

    def apply_failures(self, queue: QueueState, rows, mode: str, retry_count: int | None, now: int,
                       cause: str, reason=None) -> None:
        """The one place failed attempts are decided: nack, XDEL, expiry and release all come here.

        Rows are (rowid, attempts, state, worker, task id). Each task records this failure: `cause`
        (lifecycle.NACKED...) and `reason`, a text or a function of the worker that held it
        (None: no reason given; a SILENT nack then keeps the record the task has)."""
        max_attempts, backoff = queue.attempts_allowed(), queue.backoff_policy()
        keep_record = mode == lifecycle.SILENT and reason is None
        died = []
        for rowid, attempts, state, worker, task_id in rows:
            if retry_count is not None:
                attempts = retry_count
            new_state, attempts = lifecycle.after_failure(attempts, max_attempts, mode)
            new_state, available_at = lifecycle.retry_state(new_state, attempts, mode, backoff, now)
            failure = None
            if not keep_record:
                held_by = None if worker is None else name_bytes(worker).decode("utf-8", "replace")
                why = reason(held_by) if callable(reason) else reason
                failure = lifecycle.failure_record(cause, why, held_by, now)
            if not self.db.set_outcome(rowid, new_state, attempts, now, available_at, failure):
                raise errors.guard_failed("failure", rowid, state)  # the SELECT above said it was unfinished
            placed = None
            if state == IN_FLIGHT:
                self.in_flight.ended(queue, task_id)
                if queue.lanes_on:
                    placed = self.lease_ended(queue, rowid)
            queue.move(state, new_state)
            if new_state == AVAILABLE:
                self.became_available(queue, rowid, placed)
            elif new_state == DELAYED:
                self.schedule.due_at(available_at)
            elif new_state == DEAD:
                queue.tally("dead")
                queue.settled((task_id,))
                died.append((rowid, queue.name, task_id))
        if died and self.dependencies.any:  # the tasks waiting for them die too
            self.dependencies.lost(died, now)
        if queue.name in self.waiters.blocked:  # a blocked worker gets what went back
            self.serve_waiters(queue, now)

    def note_deleted(self, queue: QueueState, ids: list[tuple]) -> None:
        """Tasks were removed for good: count them (XINFO) and keep ids from ever repeating."""
        if not ids:
            return
        newest = max(ids)
        if newest >= queue.last_id:
            # A push does not write the last id (a page write saved per push): the newest
            # task holds it. When that task goes, the queue row must.
            self.db.save_last_id(queue.name, queue.last_id)
        queue.removed(len(ids), newest)
        self.schedule.deleted_rows(len(ids))
        queue.settled(ids)  # a producer waiting in XRESULT BLOCK learns it is gone

    def retained_mark(self, queue: QueueState, retention: float | None) -> int | None:
        """The `retained` value of tasks the queue finishes now (an ack, a NOACK claim): 1 under a
        retention limit, so the purge finds them in tasks_retained; None while it keeps done tasks
        for ever, the default, whose acks then write no index. The first done task left unmarked
        is noted in the file in the same transaction (queues.unmarked_done), so that a limit set
        later, even after a restart, marks them before it purges (Reaper._mark_retained); a
        marking walk under way starts over, since it may have passed this task. `retention`:
        queue.retention(), which the caller has read already."""
        if retention is not None:
            return 1
        if queue.mark_from != NO_MARK or not queue.unmarked_done:  # (read here: no call on every ack)
            if queue.done_unmarked():
                self.db.retention.save_unmarked_done(queue.name, True)
        return None

    def purged(self, queue: QueueState, ids: list[tuple]) -> None:
        """Done tasks were deleted (retention, trimming): count them and keep ids from repeating."""
        queue.move(DONE, GONE, len(ids))
        queue.tally("purged", len(ids))
        self.note_deleted(queue, ids)

    def flush_deleted(self) -> None:
        """Save the removed-task counters (XINFO's entries-added); the reaper calls it each second."""
        for queue in self.queues.values():
            if queue.deleted_dirty:
                self.db.save_deleted(queue.name, queue.deleted, queue.max_deleted)
                queue.deletions_saved()
