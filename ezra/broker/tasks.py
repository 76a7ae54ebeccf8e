"""The task verbs' transactions: push, ack, fail, cancel, delete, and the reads of a queue's tasks.

Each `@transaction` method, called, runs in a writer's batch (writer/transactions.py); only
batches change the queues' states, so no locks are needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat

from .. import errors, lifecycle
from ..writer.transactions import transaction
from ..protocol import stream_ids
from ..lifecycle import AVAILABLE, DEAD, DELAYED, DONE, GONE, IN_FLIGHT, WAITING, due_after
from .in_flight import ROWID, failure_rows, pending_of
from .queues import QueueState


@dataclass(slots=True)
class Push:
    """One XADD with options, checked (commands/push.py): a plain push (`XADD q * field value...`)
    is its stored fields alone. `requested_id`: None for a new id, else as
    stream_ids.push_id read it. `idmp` is (producer, iid):
    a push already made with them answers the first id. `attempts` (ATTEMPTS) and `dead` (XADD
    q::dead) bring tasks in from elsewhere (ezra import) with the deliveries they had, or as dead
    letters; `failure` (FAILURE) with their last failure (lifecycle.failure_record). `trim`
    (trimming.Trim): done tasks removed after the push, in its transaction. `unique` (UNIQUE):
    while an unfinished task of the queue holds that key, its id is the answer and nothing is stored.
    `priority` (PRIORITY, 0-9; None: lifecycle.DEFAULT_PRIORITY) and `partition` (PARTITION) are
    kept on the task, dead ones too. `progress` (PROGRESS) and `result` (RESULT: the task is pushed
    done, with it) bring a task's progress and result in from elsewhere (ezra import). `after` (AFTER):
    [(queue, id text, id)] of the tasks it waits for (broker/dependencies.py). `name` (NAME): while a
    task of the queue named so exists (any state), its id is the answer and nothing is stored."""

    fields: bytes
    requested_id: tuple | None = None
    nomkstream: bool = False
    delay_ms: int = 0
    ttl_ms: int | None = None
    idmp: tuple | None = None
    attempts: int = 0
    dead: bool = False
    trim: object = None
    unique: bytes | None = None
    failure: dict | None = None
    priority: int | None = None
    partition: bytes | None = None
    progress: bytes | None = None
    result: bytes | None = None
    after: list | None = None
    name: bytes | None = None


class Tasks:
    """Push, ack, nack, delete and read tasks, over the file, the queues and what they touch."""

    def __init__(self, db, queues, in_flight, transitions, waiters, schedule, reaper, writer, clock):
        self.db = db
        self.queues = queues
        self.in_flight = in_flight
        self.transitions = transitions
        self.schedule = schedule
        self.reaper = reaper
        self.writer = writer
        self.clock = clock
        self.dependencies = transitions.dependencies  # XADD AFTER (dependencies.py)
        # What a push reads on every call, held directly (the dict the waiters own): an
        # attribute hop less per push (scripts/core_paths.py).
        self.blocked = waiters.blocked

    @transaction()
    def trim(self, name: bytes, trim) -> int:
        """XTRIM ~: remove done tasks as `trim` (trimming.Trim) says; how many went."""
        queue = self.queues.get(name)
        return 0 if queue is None else self.reaper.trim_done(queue, trim)

    @transaction()
    def delete_worker(self, name: bytes, worker: bytes) -> int:
        """XGROUP DELCONSUMER: Redis drops a deleted consumer's pending entries; EZRA fails them as a
        lost lease would (the attempt counts: back to available, or dead without attempts left)."""
        queue = self.queues.get(name)
        if queue is None:
            raise errors.XGROUP_NEEDS_KEY
        rows = failure_rows(self.in_flight.held_by(queue, worker))
        if rows:
            self.transitions.apply_failures(queue, rows, lifecycle.FAIL, None, self.clock(),
                                            lifecycle.CONSUMER_DELETED,
                                            lambda held_by: f"XGROUP DELCONSUMER removed worker {held_by}")
            queue.tally("released", len(rows))
        return len(rows)

    @transaction()
    def destroy_group(self, name: bytes, group: bytes) -> int:
        """XGROUP DESTROY: 1 if XGROUP CREATE named that group (forgotten now), else 0. Tasks stay."""
        queue = self.queues.get(name)
        if queue is None:
            raise errors.XGROUP_NEEDS_KEY
        if queue.group is None or group != queue.group:
            return 0
        self.db.save_group_name(name, None)
        queue.named_group(None)
        return 1

    @transaction(grows=True)
    def create_queue(self, name: bytes, must_exist: bool, group: bytes | None = None) -> bool:
        """XGROUP CREATE: make the queue (unless `must_exist`) and name its group."""
        if must_exist and name not in self.queues:
            raise errors.XGROUP_NEEDS_KEY
        queue = self.transitions.queue(name, self.clock())
        if group is not None and group != queue.group:
            self.db.save_group_name(name, group)
            queue.named_group(group)
        return True

    @transaction(grows=True)
    def push(self, name: bytes, pushes: list) -> list:
        """XADD's one route: the pushes of one XADD, or of a pipeline's run of them, to one queue.
        `pushes` are plain pushes (`XADD q * field value...`: their fields as stored), or one Push
        with options. Each push's result, in order: its id, None (NOMKSTREAM, no queue), or the
        error that refused it when others of the run are stored."""
        first = pushes[0]
        if type(first) is not bytes:
            if type(first) is tuple:
                return self._push_placed(name, pushes)
            return [self._push_with_options(name, first)]
        now = self.clock()
        queue = self.queues.get(name) or self.transitions.queue(name, now, create=True)
        if len(pushes) == 1:  # one XADD, as most producers send: its row alone (an id error is its reply)
            task_id = stream_ids.new_id(None, queue.last_id, now)
            self._joined_available(queue, task_id, 1, self.db.insert_plain(name, task_id, first, now, now), now)
            return [b"%d-%d" % task_id]  # stream_ids.format_id, inlined
        results, tasks, last = self._run_ids(queue, pushes, now)
        if tasks:
            self._joined_available(queue, last, len(tasks), self.db.insert_available(name, tasks, now), now)
        return results

    @staticmethod
    def _run_ids(queue: QueueState, pushes: list, now: int) -> tuple[list, list, tuple]:
        """A run's new ids: (each push's result, (id_ms, id_seq, push) of each push stored, the last id)."""
        run = stream_ids.new_ids(len(pushes), queue.last_id, now)
        if run is not None:  # nearly always: one ms, consecutive seqs, each step in C (no loop here)
            ms, seqs = run
            tasks = list(zip(repeat(ms), seqs, pushes))
            results = list(map(b"%d-%d".__mod__, zip(repeat(ms), seqs)))  # stream_ids.format_id of each
            return results, tasks, (ms, seqs[-1])
        # the seqs run out within the run: the pushes past the largest id are refused
        results, tasks, last = [], [], queue.last_id
        for push in pushes:
            try:
                last = stream_ids.new_id(None, last, now)
            except errors.CommandError as exc:
                results.append(exc)
                continue
            tasks.append((last[0], last[1], push))
            results.append(stream_ids.format_id(last))
        return results, tasks, last

    def _push_placed(self, name: bytes, pushes: list) -> list:
        """A run of placed pushes ((fields, priority, partition) each: XADD PRIORITY, PARTITION and
        nothing else), stored as a plain run is, with the two columns, into the queue's lanes."""
        now = self.clock()
        queue = self.queues.get(name) or self.transitions.queue(name, now, create=True)
        if not queue.lanes_on:
            self.transitions.turn_to_lanes(queue)  # for good: its claims take priorities and partitions
        results, tasks, last = self._run_ids(queue, pushes, now)
        if not tasks:
            return results
        rows = [(ms, seq, *push) for ms, seq, push in tasks]
        rowids = self.db.insert_available(name, rows, now)
        queue.pushed(last, AVAILABLE, len(rows))
        order = queue.order
        if order is not None:  # not built yet: the build reads them from the file
            for rowid, (_, _, _, priority, partition) in zip(rowids, rows):
                order.add(rowid, lifecycle.DEFAULT_PRIORITY if priority is None else priority, partition)
        if name in self.blocked:
            self.transitions.serve_waiters(queue, now)
        return results

    def _push_with_options(self, name: bytes, push: Push):
        """One XADD with options (Push): its id, or None (NOMKSTREAM and no queue). NAME is looked up
        first: a name taken answers its task's id whatever the other options (nothing else is looked
        up or stored: AFTER's tasks, IDMP, UNIQUE); a free one leaves the push as it was without it."""
        now = self.clock()
        if push.name is not None and name in self.queues:
            named = self.db.task_names.task(name, push.name)
            if named is not None:
                return stream_ids.format_id(named)
        waits = dead_dependency = None
        if push.after is not None:  # before anything is written: an unknown task refuses the push
            waits, dead_dependency = self.dependencies.plan(push.after)
        queue = self.queues.get(name) or self.transitions.queue(name, now, create=not push.nomkstream)
        if queue is None:
            return None
        idmp, unique, dead = push.idmp, push.unique, push.dead
        if idmp is not None:
            first = self.db.producers.lookup(name, idmp[0], idmp[1], now)
            if first is not None:
                queue.idmp_repeated()
                return stream_ids.format_id(first)
        if unique is not None:
            holder = self.db.unique_keys.holder(name, unique)
            if holder is not None:  # the key's task is unfinished: it is the answer, nothing is stored
                if idmp is not None:
                    self.remember_push(queue, idmp, holder, now)  # a retry answers the same id
                return stream_ids.format_id(holder)
        task_id = stream_ids.new_id(push.requested_id, queue.last_id, now)
        if (push.priority is not None or push.partition is not None) and not queue.lanes_on:
            self.transitions.turn_to_lanes(queue)  # for good: its claims take priorities and partitions
        state, available_at = (DELAYED, due_after(now, push.delay_ms)) if push.delay_ms > 0 else (AVAILABLE, now)
        failure = push.failure
        if dead:
            state = DEAD
        elif push.result is not None:
            state = DONE
        elif dead_dependency is not None:  # a task it names is dead: so is it (XREQUEUE may bring it back)
            state, failure = DEAD, self.dependencies.lost_record(*dead_dependency, now)
        elif waits:
            state = WAITING  # available_at kept: a DELAY still runs once it is released
        rowid = self.db.insert_task(name, task_id, push.fields, now, available_at, state, push.ttl_ms, push.attempts,
                                    failure, unique, push.priority, push.partition, push.name)
        if waits:
            self.dependencies.added(rowid, waits)
        if push.result is not None or push.progress is not None:  # ezra import's
            retained = self.transitions.retained_mark(queue, queue.retention()) if state == DONE else None
            self.db.results.carry(rowid, push.result, push.progress, now if state == DONE else None, retained)
        if idmp is not None:
            self.remember_push(queue, idmp, task_id, now)
        queue.pushed(task_id, state)
        if push.trim is not None:
            self.reaper.trim_done(queue, push.trim)  # as Redis: after the add, the new task counted
        if state == AVAILABLE:
            self.transitions.became_available(queue, rowid, (push.priority, push.partition))
            if name in self.blocked:
                self.transitions.serve_waiters(queue, now)
        elif state == DELAYED:
            self.schedule.due_at(available_at)
        return stream_ids.format_id(task_id)

    def _joined_available(self, queue: QueueState, last_id: tuple, n: int, rowids, now: int) -> None:
        """n tasks pushed available, the last of them `last_id`, written as `rowids` (a row id,
        or a range of them): the queue's counts and order, and its blocked workers served."""
        queue.pushed(last_id, AVAILABLE, n)
        name = queue.name
        if queue.order is not None:
            if type(rowids) is int:
                queue.order.add(rowids)
            else:
                queue.order.add_pushed(rowids)
        if name in self.blocked:
            self.transitions.serve_waiters(queue, now)

    def remember_push(self, queue: QueueState, idmp: tuple, task_id: tuple, now: int) -> None:
        duration, maxsize = queue.idmp_limits()
        expires_at = now + duration * 1000
        self.db.producers.record(queue.name, idmp[0], idmp[1], task_id, expires_at, maxsize)
        queue.idmp_recorded()
        self.schedule.idmp_expires_at(expires_at)

    @transaction()
    def ack(self, name: bytes, ids: list[tuple], results: list[bytes] | None = None) -> list[int]:
        """XACK's one route: the ids of one XACK, or of a pipeline's run of single-id XACKs, to
        one queue. Per id, 1 if this ack finished its task (in flight until now), else 0: an id
        not in flight, or named again. An XACK answers the sum of its ids'; a run's XACKs each
        answer their own, as each would have alone, one after another. `results` (XACK ... RESULT,
        or a run of them): each id's result, kept with its done task, written with the ack; an id
        not in flight keeps nothing, and one named again keeps its first ack's."""
        queue = self.queues.get(name)
        if queue is None:
            return [0] * len(ids)
        held = self.in_flight.take(queue, ids)  # each id once, in id order; those not in flight are left out
        if len(held) == len(ids):  # the usual: every id acks a task of its own
            counts = [1] * len(ids)
        else:  # 1 for the id that took a lease; 0 for one not in flight or named before
            taken = {task_id for task_id, _ in held}
            counts = []
            for task_id in ids:
                if task_id in taken:
                    counts.append(1)
                    taken.discard(task_id)
                else:
                    counts.append(0)
        if held:
            self._finish(queue, held, results and (ids, results))  # (a plain ack's: None, one test)
            queue.tally("acked", len(held))
            if queue.lanes_on:  # their partitions have room again (lanes.py)
                self.transitions.leases_ended(queue, held, self.clock())
            elif queue.flow is not None and name in self.blocked:  # a slot under MAX-IN-FLIGHT freed
                self.transitions.serve_waiters(queue, self.clock())
        return counts

    def _finish(self, queue: QueueState, held: list[tuple], results: tuple | None = None) -> None:
        """in_flight -> done for these (task id, lease) pairs, each row by its row id, their leases
        taken already (InFlight.take); under retention 0 the record goes with the ack, unless the
        task has a TTL of its own."""
        try:
            self._write_done(queue, held, results)
        except BaseException:
            # A write refused on a corrupt file is no batch rollback (Writer._submit_read_only):
            # the leases go back here. (A rollback's journal would put the same ones back.)
            self.in_flight.put_back(queue, held)
            raise

    def _write_done(self, queue: QueueState, held: list[tuple], results: tuple | None) -> None:
        retention = queue.retention()
        if retention == 0:  # the done task goes at once (unless it has a TTL), and its result with it
            held = self._delete_acked(queue, held)
            if not held:
                return
        if results is not None:  # XACK ... RESULT, (ids, their results): each row written once, result and all
            # {task id: result}, built from the last id back: an id named twice keeps its first ack's
            result_of = dict(zip(reversed(results[0]), reversed(results[1])))
            now, retained = self.clock(), self.transitions.retained_mark(queue, retention)
            rows = [(now, retained, result_of[task_id], lease[ROWID]) for task_id, lease in held]
            rowids = [row[3] for row in rows]
            if self.db.ack_with_results(rows) != len(rows):
                raise errors.guard_failed("ack", rowids, IN_FLIGHT)
        else:
            rowids = [held[0][1][ROWID]] if len(held) == 1 else [lease[ROWID] for _, lease in held]
            if self.db.ack(rowids, self.clock(), self.transitions.retained_mark(queue, retention)) != len(rowids):
                raise errors.guard_failed("ack", rowids, IN_FLIGHT)  # the leases said in flight
        queue.finished(held)
        if self.dependencies.any:  # tasks may wait for these (XADD AFTER): released in this transaction
            self.dependencies.finished(rowids, self.clock())

    def _delete_acked(self, queue: QueueState, held: list[tuple]) -> list[tuple]:
        """Retention 0: the acked tasks' rows go at once; those with a TTL of their own are kept
        (returned, for `_finish` to mark done)."""
        deleted, kept = [], []
        for pair in held:
            (deleted if self.db.delete_acked(pair[1][ROWID]) else kept).append(pair)
        if deleted:
            queue.move(IN_FLIGHT, GONE, len(deleted))
            self.transitions.note_deleted(queue, [task_id for task_id, _ in deleted])
            if self.dependencies.any:  # acked: done, though its record is gone
                self.dependencies.finished([lease[ROWID] for _, lease in deleted], self.clock())
        return kept

    @transaction()
    def fail(self, name: bytes, ids: list[tuple], mode: str = lifecycle.FAIL, retry_count: int | None = None,
             force: bool = False, reason: bytes | None = None, cause: str = lifecycle.NACKED) -> int:
        """XNACK: report failed attempts, and why (back, with backoff, or dead); how many."""
        queue = self.queues.get(name)
        if queue is None:
            return 0
        if force:  # tasks nobody holds too: read from the file
            rows = self.db.unfinished_attempts(name, ids, (IN_FLIGHT, AVAILABLE, DELAYED))
        else:
            rows = failure_rows(self.in_flight.held(queue, ids))
        if cause == lifecycle.XDEL_REPORT:
            why = "XDEL reported the failure"
        else:
            why = None if reason is None else lifecycle.bound_reason(reason)
        self.transitions.apply_failures(queue, rows, mode, retry_count, self.clock(), cause, why)
        if mode != lifecycle.SILENT:  # SILENT: given back unsent, not a failure report
            queue.tally("failed", len(rows))
        return len(rows)

    @transaction()
    def delete(self, name: bytes, ids: list[tuple]) -> int:
        """XDEL on a live queue: the tasks nobody holds are cancelled (deleted), then a failure of
        those in flight is reported (in that order: a failed task that goes back stays)."""
        cancelled = Tasks.cancel.body(self, name, ids)
        return cancelled + Tasks.fail.body(self, name, ids, cause=lifecycle.XDEL_REPORT)

    @transaction()
    def cancel(self, name: bytes, ids: list[tuple]) -> int:
        """The dashboard's delete (and XDEL's first step): available and delayed tasks deleted for good
        (their UNIQUE keys free with their rows); how many went. In flight, done or dead: left alone."""
        queue = self.queues.get(name)
        if queue is None:
            return 0
        deleted, available, gone = [], [], []
        for task_id in dict.fromkeys(ids):
            row = self.db.delete_by_id(name, task_id, (AVAILABLE, DELAYED, WAITING))
            if row is not None:
                queue.move(row[0], GONE)
                deleted.append(task_id)
                gone.append((row[1], name, task_id))
                if row[0] == AVAILABLE:
                    available.append(row[1:])
        if available and queue.order is not None:
            self.transitions.forget(queue, available)
        self.transitions.note_deleted(queue, deleted)
        if gone and self.dependencies.any:  # tasks waiting for these die; what these waited for is forgotten
            self.dependencies.lost(gone, self.clock(), deleted=True)
        return len(deleted)

    @transaction()
    def delete_dead(self, name: bytes, ids: list[tuple]) -> int:
        """XDEL q::dead: remove dead letters; how many went."""
        queue = self.queues.get(name)
        if queue is None:
            return 0
        rows = [(self.db.dependencies.row_of(name, task_id), name, task_id) for task_id in ids] \
            if self.dependencies.any else ()
        deleted = self.db.delete_dead(name, ids)
        queue.move(DEAD, GONE, len(deleted))
        self.transitions.note_deleted(queue, deleted)
        if rows:  # a dead task's edges go with it (its dependents died with it already)
            went = set(deleted)
            self.dependencies.lost([row for row in rows if row[2] in went and row[0] is not None], self.clock(),
                                   deleted=True)
        return len(deleted)

    @transaction(durable=False)
    def length(self, name: bytes, dead: bool) -> int:
        """XLEN of a queue (its tasks not done) or of its dead view."""
        queue = self.queues.get(name)
        if queue is None:
            return 0
        if dead:
            return queue.counts[DEAD]
        return sum(queue.counts[state] for state in lifecycle.UNFINISHED)

    @transaction(durable=False)
    def range(self, name: bytes, dead: bool, start, end, count, reverse: bool):
        """XRANGE / XREVRANGE: task rows (id_ms, id_seq, fields JSON, ...); None for COUNT 0 on a queue."""
        if count <= 0:  # XRANGE ... COUNT 0: None if the queue exists (Redis answers a null array)
            return None if name in self.queues else []
        states = (DEAD,) if dead else (AVAILABLE, DELAYED, IN_FLIGHT, DONE, WAITING)
        return self.db.range(name, states, start, end, count, reverse)

    @transaction(durable=False)
    def pending_summary(self, name: bytes):
        """XPENDING's summary: (first id, last id, [(worker, count)]) of the tasks in flight."""
        queue = self.queues.get(name)
        return (None, None, []) if queue is None else self.in_flight.summary(queue)

    @transaction(durable=False)
    def pending_entries(self, name, start, end, count, worker, min_idle_ms):
        """XPENDING's extended form: [(id, worker, idle ms, deliveries)] (Broker.pending_entries)."""
        queue = self.queues.get(name)
        if queue is None:
            return []
        return pending_of(queue.leases, self.clock(), start, end, count, worker, min_idle_ms)

    @transaction(durable=False)
    def existing(self, names: list[bytes]) -> set[bytes]:
        """Which of these names are queues (EXISTS, TYPE): a lookup each, no copy of every queue's counts."""
        return {name for name in names if name in self.queues}
