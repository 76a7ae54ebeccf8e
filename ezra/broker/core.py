"""The Broker: push, ack, fail; queue state and the settings in force. The rest is in five mixins.

The public methods run in connection greenlets. Each submits a transaction
script (the `_tx_*` methods) to the writer, which runs it in a batch; only
those scripts touch `self.queues` (per-queue caches: last id, settings, counts),
so no locks are needed. The mixins follow the same rule:

    claims.py       XREADGROUP's claims and the workers blocked waiting for one
    leases.py       XCLAIM / XAUTOCLAIM / XREADGROUP CLAIM; release on disconnect
    upkeep.py       the reaper: expiry, delayed tasks coming due, retention, TTL, vacuum
    admin.py        XCFGSET, XREQUEUE, XACKDEL, XINFO's figures, hot backup
    observers.py    XREAD: a read-only look at a queue, woken by pushes without taking them

Whatever makes a task available (push, nack, expiry...) calls `_serve_waiters`
(claims.py) in its transaction, so a blocked worker gets it in the same batch.
"""
from __future__ import annotations

import bisect
import time

from .. import errors, lifecycle, queue_settings, stream_ids
from .claims import Claims
from .leases import Leases
from ..lifecycle import AVAILABLE, DEAD, DELAYED, DONE, GONE, IN_FLIGHT
from .observers import Observers
from .admin import QueueAdmin
from ..storage import SETTING_COLUMNS, Database, name_bytes, reads
from .upkeep import Upkeep
from ..writer import Writer

# A queue's name is in every row of its tasks, every INFO line, /metrics series and dashboard row:
# 10 queues with 1 MB names made each scrape 162 MB. A new queue's name is at most this long;
# queues an older EZRA created with longer names keep working (drain, settings, XINFO), and
# /metrics and the dashboard show their names cut (web/).
MAX_QUEUE_NAME = 256  # bytes
# Past this many tasks in flight, XPENDING's summary is counted apart (on a native thread): up to
# it, counting in the transaction costs well under a millisecond and answers without a thread hop.
READ_APART_IN_FLIGHT = 2000
DEFAULT_READ_COUNT = 1000  # XREADGROUP without COUNT: Redis means "all"; EZRA caps it
MAX_READ_COUNT = 10000
INF = float("inf")
# Events counted since start, per queue and in all (INFO stats, /metrics, the dashboard):
# pushed, delivered (of which redelivered: a task delivered before), acked, failed (XNACK,
# XDEL), expired (lease ran out), released (worker gone), dead, requeued (from dead), purged.
TALLIES = ("pushed", "delivered", "redelivered", "acked", "failed", "expired", "released", "dead",
           "requeued", "purged")
# The events that add entries to what XREAD sees: to the live queue, or to its dead view (True).
VIEW_GROWS = {"pushed": False, "requeued": False, "dead": True}


def now_ms() -> int:
    return int(time.time() * 1000)


class Answered:
    """A verb's result computed off the writer (a read apart): `wait()` returns it, as a request's does."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def wait(self):
        return self.value


class QueueState:
    """What the broker remembers about one queue (settings as stored: None = the server's)."""

    __slots__ = ("name", "last_id", "counts", "group", "last_delivered", "next_purge", "trim_floor",
                 "deleted", "max_deleted", "deleted_dirty", "iids_added", "iids_duplicates",
                 "totals", *SETTING_COLUMNS)

    def __init__(self, name: bytes, last_id=(0, 0)):
        self.name = name
        self.last_id = last_id
        self.counts = dict.fromkeys(lifecycle.STATES, 0)
        self.group = None           # the name XGROUP CREATE gave
        self.last_delivered = None  # newest id delivered; None: not known since start
        self.next_purge = 0         # no done task is due for purging before this (ms)
        self.trim_floor = (0, 0)    # no done task has a lower id (trimming scans from here)
        self.deleted = 0            # tasks removed for good, and the newest of them
        self.max_deleted = (0, 0)
        self.deleted_dirty = False
        self.iids_added = self.iids_duplicates = 0
        self.totals = dict.fromkeys(TALLIES, 0)  # events since start (metrics, dashboard)
        for column in SETTING_COLUMNS:
            setattr(self, column, None)

    def move(self, from_state: str | None, to_state: str | None, n: int = 1) -> None:
        """The one place state counts change: n tasks moved (lifecycle.MOVES; GONE, None, is
        outside the queue: a push comes from it, a delete or purge goes to it)."""
        if (from_state, to_state) not in lifecycle.MOVES:
            raise errors.move_not_drawn(from_state, to_state)
        counts = self.counts
        if from_state is not GONE:
            counts[from_state] -= n
        if to_state is not GONE:
            counts[to_state] += n


class Broker(Claims, Leases, Upkeep, QueueAdmin, Observers):
    """The queue operations, as greenlets call them."""

    def __init__(self, db: Database, settings, clock=now_ms):
        self.db = db
        self.settings = settings
        self.default_backoff = queue_settings.backoff_policy(settings.backoff)
        self.clock = clock
        self.queues: dict[bytes, QueueState] = {}
        self.stats = dict.fromkeys(TALLIES, 0)
        Claims.__init__(self)
        Leases.__init__(self)
        Upkeep.__init__(self)
        Observers.__init__(self)
        self._reload()
        self.writer = Writer(db, fsync_durable=settings.durability == "full",
                             on_rollback=self._reload, after_batch=self._after_batch)

    # ------------------------------------------------------------ life

    def stop(self) -> None:
        """Stop the reaper and release timers, then commit and answer whatever is queued."""
        self.stop_reaper()
        self.stop_release_timers()
        try:
            self.writer.call(self._tx_flush_deleted, durable=False)
        except errors.CommandError:
            pass  # the writer is stopping already
        self.writer.stop()

    # ------------------------------------------------------------ greenlet API

    def push(self, queue: bytes, id_arg: bytes, fields: list[bytes], nomkstream: bool = False,
             delay_ms: int = 0, ttl_ms: int | None = None, idmp: tuple | None = None,
             attempts: int = 0, dead: bool = False, trim=None, unique: bytes | None = None,
             failure: dict | None = None):
        """Submit XADD; the request's result is the id (bytes) or None (NOMKSTREAM).

        `idmp` is (producer, iid): a push already made with them returns the first id.
        `attempts` (XADD ATTEMPTS) and `dead` (XADD q::dead) bring tasks in from elsewhere
        (ezra import) with the deliveries they had, or as dead letters; `failure` (XADD FAILURE)
        with the last failure they had (lifecycle.failure_record).
        `trim` (trimming.Trim): done tasks removed after the push, in its transaction.
        `unique` (XADD UNIQUE): while an unfinished task of the queue holds that key, its id is the
        result and nothing is stored."""
        return self.writer.submit(self._tx_push, queue, id_arg, fields, nomkstream, delay_ms, ttl_ms, idmp,
                                  attempts, dead, trim, unique, failure, grows=True)

    def trim(self, queue: bytes, trim):
        """XTRIM ~: remove done tasks as `trim` (trimming.Trim) says; how many went."""
        return self.writer.submit(self._tx_trim, queue, trim)

    def destroy_group(self, queue: bytes, group: bytes):
        """XGROUP DESTROY: 1 if XGROUP CREATE named that group (forgotten now), else 0. Tasks stay."""
        return self.writer.submit(self._tx_destroy_group, queue, group)

    def delete_worker(self, queue: bytes, worker: bytes):
        """XGROUP DELCONSUMER: the worker's in-flight tasks in `queue` go back; how many."""
        return self.writer.submit(self._tx_delete_worker, queue, worker)

    def ack(self, queue: bytes, ids: list[tuple]):
        return self.writer.submit(self._tx_ack, queue, ids)

    def fail(self, queue: bytes, ids: list[tuple], mode: str = lifecycle.FAIL,
             retry_count: int | None = None, force: bool = False, reason: bytes | None = None,
             cause: str = lifecycle.NACKED):
        """XNACK (and XDEL on a live queue, cause XDEL_REPORT): report failed attempts, and why."""
        return self.writer.submit(self._tx_fail, queue, ids, mode, retry_count, force, reason, cause)

    def delete_dead(self, queue: bytes, ids: list[tuple]):
        return self.writer.submit(self._tx_delete_dead, queue, ids)

    def create_queue(self, queue: bytes, must_exist: bool, group: bytes | None = None):
        return self.writer.submit(self._tx_create_queue, queue, must_exist, group, grows=True)

    def length(self, queue: bytes, dead: bool):
        return self.writer.submit(self._tx_length, queue, dead, durable=False)

    def range(self, queue: bytes, dead: bool, start, end, count, reverse: bool):
        """XRANGE / XREVRANGE: task rows (id_ms, id_seq, fields JSON, ...); None for COUNT 0 on a queue."""
        return self.writer.submit(self._tx_range, queue, dead, start, end, count, reverse, durable=False)

    def pending_summary(self, queue: bytes, apart: bool = True):
        """XPENDING summary: (first id, last id, [(worker, count)]) of in-flight tasks.

        It counts them row by row (400,000 in flight: 28 ms), so above READ_APART_IN_FLIGHT it
        is read apart, on a native thread, unless `apart` is False (inside EXEC, which cannot wait)."""
        state = self.queues.get(queue)  # a plain read between batches, as _nothing_to_claim's
        if apart and state is not None and state.counts[IN_FLIGHT] > READ_APART_IN_FLIGHT:
            first, last, workers = self._read_apart(reads.pending_summary, queue)
            return Answered((first, last, [(name_bytes(worker), n) for worker, n in workers]))
        return self.writer.submit(self._tx_pending_summary, queue, durable=False)

    def pending_entries(self, queue: bytes, start, end, count, worker, min_idle_ms):
        """XPENDING's extended form: [(id, worker, idle ms, deliveries)] of tasks in flight."""
        return self.writer.submit(self._tx_pending_entries, queue, start, end, count, worker, min_idle_ms,
                                  durable=False)

    def names_after(self, after: bytes | None, count: int) -> list[bytes]:
        """Up to `count` queue names in byte order, after `after` (None: from the first): a page of
        the queue list (XINFO QUEUES, INFO, the dashboard) without sorting every name each time."""
        names = self.queue_names  # a plain read between batches, as _nothing_to_claim's
        start = 0 if after is None else bisect.bisect_right(names, after)
        return names[start:start + count]

    def queue_counts(self) -> dict[bytes, dict[str, int]]:
        """A snapshot of every queue's counts by state."""
        return self.writer.call(self._tx_counts, durable=False)

    def existing(self, names: list[bytes]) -> set[bytes]:
        """Which of these names are queues (EXISTS, TYPE), once what was submitted before is in:
        a lookup per name, not a copy of every queue's counts (50,000 queues: ~50 ms a call)."""
        return self.writer.call(self._tx_existing, names, durable=False)

    # ------------------------------------------------------------ settings, as they apply now

    def _visibility_timeout(self, queue: QueueState) -> float:
        vt = queue.visibility_timeout
        return self.settings.visibility_timeout if vt is None else vt

    def _max_attempts(self, queue: QueueState) -> int:
        attempts = queue.max_attempts
        return self.settings.max_attempts if attempts is None else attempts

    def _retention(self, queue: QueueState) -> float | None:
        """Seconds done tasks are kept; None: forever."""
        retention = queue.retention_seconds
        if retention is None:
            return self.settings.retention_seconds
        return None if retention < 0 else retention

    def _backoff(self, queue: QueueState):
        text = queue.backoff
        return self.default_backoff if text is None else queue_settings.backoff_policy(text)

    def _release_grace(self, queue: QueueState) -> float | None:
        """Seconds before a gone worker's tasks go back; None: never (off)."""
        grace = queue.release_on_disconnect
        if grace is None:
            return self.settings.release_on_disconnect
        return None if grace < 0 else grace

    @staticmethod
    def _paused(queue: QueueState) -> bool:
        """XCFGSET PAUSED 1: nothing is handed out from this queue (stored 1; 0 or None: running)."""
        return bool(queue.paused)

    def _idmp_limits(self, queue: QueueState) -> tuple[int, int]:
        """(IDMP-DURATION seconds, IDMP-MAXSIZE)."""
        return (queue.idmp_duration or queue_settings.IDMP_DURATION_DEFAULT,
                queue.idmp_maxsize or queue_settings.IDMP_MAXSIZE_DEFAULT)

    # ------------------------------------------------------------ writer's batch

    def _reload(self) -> None:
        """Rebuild the caches from the database (start-up, and after a rollback)."""
        queues, before = {}, getattr(self, "queues", {})
        for row in self.db.load_queues():
            key = name_bytes(row["name"])
            newest = None if row["newest_ms"] is None else (row["newest_ms"], row["newest_seq"])
            # Pushes do not save the last id (a page write saved per push): see _note_deleted.
            queue = QueueState(key, max((row["last_id_ms"], row["last_id_seq"]), newest or (0, 0)))
            if key in before:  # counters since start survive a rollback (they never go down)
                queue.totals = before[key].totals
                queue.iids_added, queue.iids_duplicates = before[key].iids_added, before[key].iids_duplicates
            for column in SETTING_COLUMNS:
                setattr(queue, column, row[column])
            queue.group = None if row["group_name"] is None else name_bytes(row["group_name"])
            queue.deleted = row["deleted_count"]
            queue.max_deleted = (row["max_deleted_ms"], row["max_deleted_seq"])
            queues[key] = queue
        for name, state, count in self.db.count_states():
            queue = queues.get(name_bytes(name))
            if queue is not None:
                queue.counts[state] = count
        self.queues = queues
        self.queue_names = sorted(queues)  # kept in order as queues are made (_queue)
        self.reset_schedule()  # the reaper looks again at everything it keeps a time for

    def _tally(self, queue: QueueState, event: str, n: int = 1) -> None:
        self.stats[event] += n
        queue.totals[event] += n
        if self.observers and n and event in VIEW_GROWS:  # XREAD's blocked readers: seldom any
            self._view_grew(queue.name, VIEW_GROWS[event])

    def _queue(self, name: bytes, now: int, create: bool = True) -> QueueState | None:
        queue = self.queues.get(name)
        if queue is None and create:
            if len(name) > MAX_QUEUE_NAME:  # raised before the batch writes anything for it
                raise errors.queue_name_too_long(len(name), MAX_QUEUE_NAME)
            self.db.insert_queue(name, now)
            queue = self.queues[name] = QueueState(name)
            bisect.insort(self.queue_names, name)
        return queue

    def _tx_trim(self, name: bytes, trim) -> int:
        queue = self.queues.get(name)
        return 0 if queue is None else self._trim_done(queue, trim)

    def _tx_delete_worker(self, name: bytes, worker: bytes) -> int:
        """Redis drops a deleted consumer's pending entries; EZRA fails them as a lost lease would
        (the attempt counts: back to available, or dead without attempts left)."""
        queue = self.queues.get(name)
        if queue is None:
            raise errors.XGROUP_NEEDS_KEY
        rows = self.db.held_by(name, worker) if queue.counts[IN_FLIGHT] else []
        if rows:
            self._apply_failures(queue, rows, lifecycle.FAIL, None, self.clock(), lifecycle.CONSUMER_DELETED,
                                 lambda held_by: f"XGROUP DELCONSUMER removed worker {held_by}")
            self._tally(queue, "released", len(rows))
        return len(rows)

    def _tx_destroy_group(self, name: bytes, group: bytes) -> int:
        queue = self.queues.get(name)
        if queue is None:
            raise errors.XGROUP_NEEDS_KEY
        if queue.group is None or group != queue.group:
            return 0
        self.db.save_group_name(name, None)
        queue.group = None
        return 1

    def _tx_create_queue(self, name: bytes, must_exist: bool, group: bytes | None) -> bool:
        if must_exist and name not in self.queues:
            raise errors.XGROUP_NEEDS_KEY
        queue = self._queue(name, self.clock())
        if group is not None and group != queue.group:
            self.db.save_group_name(name, group)
            queue.group = group
        return True

    def _tx_push(self, name: bytes, id_arg: bytes, fields: list[bytes], nomkstream: bool,
                 delay_ms: int, ttl_ms: int | None, idmp: tuple | None, attempts: int = 0, dead: bool = False,
                 trim=None, unique: bytes | None = None,
                 failure: dict | None = None):
        now = self.clock()
        queue = self.queues.get(name) or self._queue(name, now, create=not nomkstream)
        if queue is None:
            return None
        if idmp is not None:
            first = self.db.producers.lookup(name, idmp[0], idmp[1], now)
            if first is not None:
                queue.iids_duplicates += 1
                return stream_ids.format_id(first)
        if unique is not None:
            holder = self.db.unique_keys.holder(name, unique)
            if holder is not None:  # the key's task is unfinished: it is the answer, nothing is stored
                if idmp is not None:
                    self._remember_push(queue, idmp, holder, now)  # a retry answers the same id
                return stream_ids.format_id(holder)
        task_id = stream_ids.new_id(id_arg, queue.last_id, now)
        state, available_at = (DELAYED, now + delay_ms) if delay_ms > 0 else (AVAILABLE, now)
        if dead:
            state = DEAD
        if unique is None:
            self.db.insert_task(name, task_id, fields, now, available_at, state, ttl_ms, attempts, failure)
        else:
            self.db.unique_keys.insert_task(name, task_id, fields, now, available_at, state, ttl_ms, attempts,
                                            unique, failure)
        if idmp is not None:
            self._remember_push(queue, idmp, task_id, now)
        queue.last_id = task_id
        queue.move(GONE, state)
        # _tally's work, inlined: this runs once per task (the call was ~0.2 µs of it).
        self.stats["pushed"] += 1
        queue.totals["pushed"] += 1
        if self.observers:  # XREAD's blocked readers: seldom any
            self._view_grew(name, False)
            if dead:
                self._view_grew(name, True)  # XREAD's observers of q::dead look again
        if trim is not None:
            self._trim_done(queue, trim)  # as Redis: after the add, the new task counted
        if state == AVAILABLE:
            if name in self.blocked:  # a blocked worker gets it in this batch (none blocked: nothing to do)
                self._serve_waiters(queue, now)
        elif state == DELAYED:
            self.due_at(available_at)
        return stream_ids.format_id(task_id)

    def _remember_push(self, queue: QueueState, idmp: tuple, task_id: tuple, now: int) -> None:
        duration, maxsize = self._idmp_limits(queue)
        expires_at = now + duration * 1000
        self.db.producers.record(queue.name, idmp[0], idmp[1], task_id, expires_at, maxsize)
        queue.iids_added += 1
        self.idmp_expires_at(expires_at)

    def _tx_ack(self, name: bytes, ids: list[tuple]) -> int:
        queue = self.queues.get(name)
        if queue is None:
            return 0
        deleted = []
        if self._retention(queue) == 0:  # retention 0: the record goes with the ack
            deleted = [task_id for task_id in dict.fromkeys(ids) if self.db.ack_delete(name, [task_id])]
            queue.move(IN_FLIGHT, GONE, len(deleted))
            self._note_deleted(queue, deleted)
        acked = self.db.ack(name, ids, self.clock())
        if acked:
            queue.trim_floor = min(queue.trim_floor, *ids)  # some of them are done now
            queue.move(IN_FLIGHT, DONE, acked)
        n = acked + len(deleted)
        self.stats["acked"] += n  # "acked" grows no XREAD view: no observers to tell
        queue.totals["acked"] += n
        return n

    def _tx_fail(self, name: bytes, ids: list[tuple], mode: str, retry_count: int | None,
                 force: bool, reason: bytes | None = None, cause: str = lifecycle.NACKED) -> int:
        queue = self.queues.get(name)
        if queue is None:
            return 0
        states = (IN_FLIGHT, AVAILABLE, DELAYED) if force else (IN_FLIGHT,)
        rows = self.db.in_flight_attempts(name, ids, states)
        if cause == lifecycle.XDEL_REPORT:
            why = "XDEL reported the failure"
        else:
            why = None if reason is None else lifecycle.bound_reason(reason)
        self._apply_failures(queue, rows, mode, retry_count, self.clock(), cause, why)
        if mode != lifecycle.SILENT:  # SILENT: given back unsent, not a failure report
            self._tally(queue, "failed", len(rows))
        return len(rows)

    def _apply_failures(self, queue: QueueState, rows, mode: str, retry_count: int | None, now: int,
                        cause: str, reason=None):
        """The one place failed attempts are decided: nack, XDEL, expiry and release all come here.

        Rows are (rowid, attempts, state, worker, ...). Each task records this failure: `cause`
        (lifecycle.NACKED...) and `reason`, a text or a function of the worker that held it
        (None: no reason given; a SILENT nack then keeps the record the task has)."""
        max_attempts, backoff = self._max_attempts(queue), self._backoff(queue)
        keep_record = mode == lifecycle.SILENT and reason is None
        for rowid, attempts, state, worker, *_ in rows:
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
            queue.move(state, new_state)
            if new_state == DELAYED:
                self.due_at(available_at)
            elif new_state == DEAD:
                self._tally(queue, "dead")
        if queue.name in self.blocked:  # a blocked worker gets what went back (none blocked: nothing to do)
            self._serve_waiters(queue, now)

    def _note_deleted(self, queue: QueueState, ids: list[tuple]) -> None:
        """Tasks were removed for good: count them (XINFO) and keep ids from ever repeating."""
        if not ids:
            return
        newest = max(ids)
        if newest >= queue.last_id:
            # A push does not write the last id (a page write saved per push): the newest
            # task holds it. When that task goes, the queue row must.
            self.db.save_last_id(queue.name, queue.last_id)
        queue.deleted += len(ids)
        queue.max_deleted = max(queue.max_deleted, newest)
        queue.deleted_dirty = True
        self.deleted_rows(len(ids))

    def _tx_flush_deleted(self) -> None:
        """Save the removed-task counters (XINFO's entries-added); the reaper calls it each second."""
        for queue in self.queues.values():
            if queue.deleted_dirty:
                self.db.save_deleted(queue.name, queue.deleted, queue.max_deleted)
                queue.deleted_dirty = False

    def _tx_delete_dead(self, name: bytes, ids: list[tuple]) -> int:
        queue = self.queues.get(name)
        if queue is None:
            return 0
        deleted = self.db.delete_dead(name, ids)
        queue.move(DEAD, GONE, len(deleted))
        self._note_deleted(queue, deleted)
        return len(deleted)

    def _tx_length(self, name: bytes, dead: bool) -> int:
        queue = self.queues.get(name)
        if queue is None:
            return 0
        if dead:
            return queue.counts[DEAD]
        return sum(queue.counts[state] for state in lifecycle.WAITING)

    def _tx_range(self, name: bytes, dead: bool, start, end, count, reverse):
        if count <= 0:  # XRANGE ... COUNT 0: None if the queue exists (Redis answers a null array)
            return None if name in self.queues else []
        states = (DEAD,) if dead else (AVAILABLE, DELAYED, IN_FLIGHT, DONE)
        return self.db.range(name, states, start, end, count, reverse)

    def _tx_pending_summary(self, name: bytes):
        first, last, workers = self.db.pending_summary(name)
        return first, last, [(name_bytes(worker), n) for worker, n in workers]

    def _tx_pending_entries(self, name, start, end, count, worker, min_idle_ms):
        now = self.clock()
        before = None if min_idle_ms is None else now - min_idle_ms
        rows = self.db.pending_entries(name, start, end, count, worker, before)
        return [((ms, seq), name_bytes(owner), max(now - delivered, 0), attempts)
                for ms, seq, owner, delivered, attempts in rows]

    def _tx_existing(self, names: list[bytes]) -> set[bytes]:
        return {name for name in names if name in self.queues}

    def _tx_counts(self) -> dict:
        return {name: dict(queue.counts) for name, queue in self.queues.items()}
