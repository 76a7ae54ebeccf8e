"""The Broker: the verbs the command handlers call, over parts that each own their state.

The verbs run in connection greenlets. Each submits a transaction (a part's `tx_*` method) to
the writer, which runs it in a batch; only batches change the queues' states, so no locks are
needed. The parts are plain objects, each given what it uses (broker/__init__.py draws them).

A blocking read is the front's to wait for (commands/table.py): `claim` answers what it
claimed or a registered Waiter, `watch` registers an Observer; `unblock` and `unwatch` end it.
"""
from __future__ import annotations

import bisect

from gevent import get_hub

from .. import errors, lifecycle
from ..lifecycle import AVAILABLE, DONE
from ..storage import SETTING_COLUMNS, Database, name_bytes
from ..writer.writer import Writer
from .admin import Admin
from .claims import Claims
from .clock import ServerClock
from .in_flight import APART_LEASES, InFlight, pending_of
from .leases import Leases
from .observers import Observer, Observers
from .queues import Defaults, Queues
from .deadlines import ReaperSchedule
from .tasks import Tasks
from .transitions import Transitions
from .reaper import Reaper
from .views import Views
from .waiters import Claim, Waiter, Waiters
from .workers import WorkerNames

DEFAULT_READ_COUNT = 1000  # XREADGROUP without COUNT: Redis means "all"; EZRA caps it
MAX_READ_COUNT = 10000


class Broker:
    """The queue operations, as greenlets call them."""

    def __init__(self, db: Database, settings, clock=None, wall_clock=None):
        """`clock` (ms) times every duration (clock.py: the server's, by default); `wall_clock`
        (ms) the schedules' slots: the system clock, by default; a test's `clock` alone is both."""
        self.db = db
        self.settings = settings
        if clock is None:
            server_clock = ServerClock()
            clock, wall_clock = server_clock.now, server_clock.wall
        self.clock = clock
        self.wall_clock = wall_clock or clock
        self.queues = Queues(Defaults(settings))
        self.waiters = Waiters()
        self.observers = Observers()
        self.schedule = ReaperSchedule(clock)
        self.workers = WorkerNames(self.queues, clock, self._release_gone_worker)
        self.in_flight = InFlight(self.queues, clock)
        self.transitions = Transitions(db, self.queues, self.in_flight, self.waiters, self.observers, self.schedule,
                                       self.workers)
        self._reload()
        if not db.in_flight_recovered:  # opened without start-up's recovery (tests, tools): read them once
            self.in_flight.load(self.db.in_flight_tasks())
            self._reload(self.queues.counts_before_batch()[0])  # counted again, those in flight known
        self.writer = Writer(db, fsync_durable=settings.durability == "full",
                             on_rollback=self._reload_after_rollback, after_batch=self._after_batch)
        self.reaper = Reaper(db, self.queues, self.in_flight, self.transitions, self.schedule, self.writer, clock)
        self.leases = Leases(db, self.queues, self.in_flight, self.transitions, self.schedule, self.workers, clock)
        self.claims = Claims(db, self.queues, self.in_flight, self.transitions, self.leases, self.waiters,
                             self.schedule, clock)
        self.tasks = Tasks(db, self.queues, self.in_flight, self.transitions, self.waiters, self.observers,
                           self.schedule, self.reaper, clock)
        self.admin = Admin(db, self.queues, self.in_flight, self.transitions, self.waiters, self.observers, self.writer,
                           settings, clock)
        self.views = Views(db, self.queues)

    # ------------------------------------------------------------ life

    def start_reaper(self) -> None:
        self.reaper.start()

    def maintain(self) -> bool:
        """One reaper pass now (tests): True when a batch was full."""
        return self.reaper.maintain()

    def stop(self) -> None:
        """Stop the reaper and release timers, then commit and answer whatever is queued."""
        self.reaper.stop()
        self.workers.stop_timers()
        try:
            self.writer.call(self._tx_last_batch)
        except errors.CommandError:
            pass  # the writer is stopping already
        self.writer.stop()
        # Every batch has ended: these are the file's counts, saved beside it once it is closed. The
        # next start takes them as a clean stop's, with no task in flight (Database.recover): if a
        # lease is left (the last batch failed), it reads the rows instead.
        if not any(queue.leases for queue in self.queues.values()):
            self.db.counts_to_save = {name: (queue.counts[DONE], queue.counts[AVAILABLE])
                                      for name, queue in self.queues.items()}

    def _tx_last_batch(self) -> None:
        """The stop's last writes: the removed-task counters, and the tasks in flight given back
        (as the next start's recovery would, which then need not read every row to find them)."""
        self.transitions.flush_deleted()
        self.leases.tx_give_back_all()

    def cancel_waiters(self) -> None:
        """Shutdown: every blocked worker (XREADGROUP) and observer (XREAD) gets a null reply now."""
        self.writer.call(self._tx_cancel_waiters, durable=False)

    def _tx_cancel_waiters(self) -> None:
        self.observers.cancel_all()
        self.waiters.serve_all_null()

    # ------------------------------------------------------------ tasks

    def push(self, queue: bytes, pushes: list):
        """Submit XADD's route (Tasks.tx_push): one XADD, or a pipeline's run of them to one queue,
        as one request; its result is each push's id, or None (NOMKSTREAM), or its error."""
        return self.writer.submit(self.tasks.tx_push, queue, pushes, grows=True)

    def trim(self, queue: bytes, trim):
        """XTRIM ~: remove done tasks as `trim` (trimming.Trim) says; how many went."""
        return self.writer.submit(self.tasks.tx_trim, queue, trim)

    def destroy_group(self, queue: bytes, group: bytes):
        """XGROUP DESTROY: 1 if XGROUP CREATE named that group (forgotten now), else 0. Tasks stay."""
        return self.writer.submit(self.tasks.tx_destroy_group, queue, group)

    def delete_worker(self, queue: bytes, worker: bytes):
        """XGROUP DELCONSUMER: the worker's in-flight tasks in `queue` go back; how many."""
        return self.writer.submit(self.tasks.tx_delete_worker, queue, worker)

    def ack(self, queue: bytes, ids: list[tuple]):
        """Submit XACK's route (Tasks.tx_ack): one XACK's ids, or a pipeline's run of single-id
        XACKs, as one request; its result is each id's count (1: it finished its task)."""
        return self.writer.submit(self.tasks.tx_ack, queue, ids)

    def nack(self, queue: bytes, ids: list[tuple], mode: str = lifecycle.FAIL,
             retry_count: int | None = None, force: bool = False, reason: bytes | None = None,
             cause: str = lifecycle.NACKED):
        """XNACK: report failed attempts, and why."""
        return self.writer.submit(self.tasks.tx_fail, queue, ids, mode, retry_count, force, reason, cause)

    def xdel(self, queue: bytes, ids: list[tuple]):
        """XDEL on a live queue: cancel (delete) the tasks nobody holds, fail those in flight."""
        return self.writer.submit(self.tasks.tx_xdel, queue, ids)

    def cancel(self, queue: bytes, ids: list[tuple]):
        """The dashboard's delete of an available or delayed task: how many went."""
        return self.writer.submit(self.tasks.tx_cancel, queue, ids)

    def delete_dead(self, queue: bytes, ids: list[tuple]):
        return self.writer.submit(self.tasks.tx_delete_dead, queue, ids)

    def create_queue(self, queue: bytes, must_exist: bool, group: bytes | None = None):
        return self.writer.submit(self.tasks.tx_create_queue, queue, must_exist, group, grows=True)

    def length(self, queue: bytes, dead: bool):
        return self.writer.submit(self.tasks.tx_length, queue, dead, durable=False)

    def range(self, queue: bytes, dead: bool, start, end, count, reverse: bool):
        """XRANGE / XREVRANGE: task rows (id_ms, id_seq, fields JSON, ...); None for COUNT 0 on a queue."""
        return self.writer.submit(self.tasks.tx_range, queue, dead, start, end, count, reverse, durable=False)

    def pending_summary(self, queue: bytes):
        """XPENDING summary: (first id, last id, [(worker, count)]) of in-flight tasks (the leases
        in memory: counted once per change of them, in_flight.py)."""
        return self.writer.submit(self.tasks.tx_pending_summary, queue, durable=False)

    def pending_entries(self, queue: bytes, start, end, count, worker, min_idle_ms, apart: bool = False):
        """XPENDING's extended form: [(id, worker, idle ms, deliveries)] of tasks in flight: a request
        for it, or, `apart` (outside EXEC, which cannot wait) and over APART_LEASES tasks in flight,
        the list itself, picked on a native thread from a copy of the leases (200,000 of them took
        85-150 ms of the loop per XPENDING; the copy, a few)."""
        held = self.queues.get(queue)  # a plain read between batches, as names_after's
        if apart and held is not None and len(held.leases) > APART_LEASES:
            leases, now = self.writer.call(self.in_flight.copy, queue, durable=False)
            return get_hub().threadpool.apply(pending_of, (leases, now, start, end, count, worker, min_idle_ms))
        return self.writer.submit(self.tasks.tx_pending_entries, queue, start, end, count, worker, min_idle_ms,
                                  durable=False)

    def names_after(self, after: bytes | None, count: int) -> list[bytes]:
        """Up to `count` queue names in byte order, after `after` (None: from the first): a page of
        the queue list (XINFO QUEUES, INFO, the dashboard) without sorting every name each time."""
        names = self.queues.names  # a plain read between batches, as nothing_to_claim's
        start = 0 if after is None else bisect.bisect_right(names, after)
        return names[start:start + count]

    def queue_counts(self) -> dict[bytes, dict[str, int]]:
        """A snapshot of every queue's counts by state."""
        return self.writer.call(self.tasks.tx_counts, durable=False)

    def existing(self, names: list[bytes]) -> set[bytes]:
        """Which of these names are queues (EXISTS, TYPE), once what was submitted before is in:
        a lookup per name, not a copy of every queue's counts (50,000 queues: ~50 ms a call)."""
        return self.writer.call(self.tasks.tx_existing, names, durable=False)

    # ------------------------------------------------------------ claims (XREADGROUP)

    def claim(self, claim: Claim, wait: bool = False):
        """XREADGROUP '>''s one claim entry, whoever asks: a read now, a pipelined one, one that
        blocks (a waiter woken later was served by the same claim, Transitions.claim_rows, in the
        batch that made tasks available). Without `wait`: the request holding what it claimed
        ({queue: task rows}; with CLAIM (id_ms, id_seq, fields, idle ms, deliveries)), answered
        with the read's other replies after their commit, or None if it claimed nothing. With
        `wait`: what it claimed, committed, or a Waiter in line for the front to wait on (then
        `unblock` it if it was not woken). commands/replies.py shapes the rows."""
        if self.claims.nothing_to_claim(claim):
            if not wait:
                return None
            waiter = Waiter(claim)
            self.waiters.register(waiter)  # no batch needed: see Claims.nothing_to_claim
            return waiter
        if not wait:
            request = self.writer.submit(self.claims.tx_claim, claim, None, durable=False)
            return None if request.result is None else request
        waiter = Waiter(claim)
        try:
            result = self.writer.call(self.claims.tx_claim, claim, waiter, durable=False)
        except errors.CommandError:
            self._forget(waiter)  # its batch rolled back: the client gets the error, nobody waits
            raise
        return waiter if result is None else result

    def unblock(self, waiter: Waiter, hung_up: bool = False):
        """The front stops waiting (timed out; `hung_up`: the client is gone): what a batch that
        committed just now claimed for it, or None. A gone client's tasks go back unspent."""
        result = self.writer.call(self.claims.tx_unblock, waiter, durable=False)
        if hung_up and result:
            self._release_unsent(result)
            return None
        return result

    def claim_own(self, queue: bytes, worker: bytes, after: tuple, count: int | None):
        """XREADGROUP with an id: this worker's own in-flight tasks after `after`."""
        return self.writer.submit(self.claims.tx_claim_own, queue, worker, after, count, durable=False)

    def blocked_clients(self) -> int:
        """Blocked XREADGROUPs and XREADs (INFO's blocked_clients)."""
        return self.waiters.count() + self.observers.count()

    def _forget(self, waiter: Waiter) -> None:
        """Its worker will not wait after all: out of line, and what a later batch may have claimed
        for it already given back."""
        if waiter.registered:
            self.waiters.unregister(waiter)
        elif waiter.result:
            self._release_unsent(waiter.result)
            waiter.result = None

    def _release_unsent(self, result: dict) -> None:
        """The worker hung up after tasks were claimed for it: give them back unspent."""
        for name, rows in result.items():
            ids = [row[:2] for row in rows]
            self.writer.submit(self.tasks.tx_fail, name, ids, lifecycle.SILENT, None, False)

    # ------------------------------------------------------------ leases

    def take_over(self, queue: bytes, worker: bytes, min_idle: int, ids: list[tuple], idle_ms=None,
                  time_ms=None, retry_count=None, force=False, justid=False):
        """XCLAIM: the tasks now leased to `worker`, (id_ms, id_seq, fields JSON) rows, or (id_ms, id_seq)
        with JUSTID."""
        return self.writer.submit(self.leases.tx_take_over, queue, worker, min_idle, ids, idle_ms, time_ms,
                                  retry_count, force, justid, durable=False)

    def autoclaim(self, queue: bytes, worker: bytes, min_idle: int, start: tuple, count: int, justid: bool):
        """XAUTOCLAIM: (next cursor, the tasks as XCLAIM's); the cursor (0, 0) when the scan is over.
        (Redis's third part, the deleted ids, is always empty in EZRA: commands/ops.py adds it.)"""
        return self.writer.submit(self.leases.tx_autoclaim, queue, worker, min_idle, start, count, justid,
                                  durable=False)

    def worker_seen(self, worker: bytes) -> None:
        """A connection started using this worker name."""
        self.workers.seen(worker)

    def worker_gone(self, worker: bytes) -> None:
        """A connection that used this worker name closed: its tasks may go back after a grace."""
        self.workers.gone(worker)

    def _release_gone_worker(self, worker: bytes, gone_at: int) -> float | None:
        """WorkerNames' timer: the gone worker's tasks go back where the grace is over."""
        return self.writer.call(self.leases.tx_release, worker, gone_at)

    # ------------------------------------------------------------ XREAD

    def look(self, reads: list[tuple], count: int):
        """XREAD without BLOCK: a request whose result is {stream: task rows} (only those with some).

        `reads`: (stream name as given, (queue, dead), after) with after an id, SINCE_NOW or LAST_ONE."""
        return self.writer.submit(self.views.tx_look, reads, count, durable=False)

    def watch(self, reads: list[tuple], count: int) -> tuple[Observer, list[tuple], dict]:
        """XREAD BLOCK's start: an Observer of the views, watching before the first look (a push
        committed after it wakes it), the reads with '$' and '+' fixed to now, and what that look
        found. The front waits on the observer, `look`s again when woken, and `unwatch`es it."""
        observer = Observer({view for _, view, _ in reads})
        self.observers.watch(observer)
        try:
            reads, found = self.writer.call(self.views.tx_first_look, reads, count, durable=False)
        except BaseException:
            self.observers.unwatch(observer)
            raise
        return observer, reads, found

    def unwatch(self, observer: Observer) -> None:
        self.observers.unwatch(observer)

    # ------------------------------------------------------------ operators (admin.py)

    def configure(self, queue: bytes, changes: dict):
        """XCFGSET: apply and store settings ({column: value}); creates the queue if needed."""
        return self.writer.submit(self.admin.tx_configure, queue, changes, grows=True)

    def requeue(self, queue: bytes, ids: list[tuple] | None):
        """XREQUEUE: dead tasks (these ids, or all with None) back to available; how many moved."""
        return self.writer.submit(self.admin.tx_requeue, queue, ids)

    def ack_delete(self, queue: bytes, ids: list[tuple]):
        """XACKDEL: per id, True (acked and deleted) or False (not in flight nor done)."""
        return self.writer.submit(self.admin.tx_ack_delete, queue, ids)

    def stream_info(self, queue: bytes, full_count: int | None = None, apart: bool = True):
        """The figures of XINFO STREAM / GROUPS / CONSUMERS (admin.StreamInfo)."""
        return self.admin.stream_info(queue, full_count, apart)

    def tasks_in(self, queue: bytes, state: str, count: int, after: tuple = (0, 0)):
        """Up to `count` tasks of one state: XINFO TASKS, the dashboard, ezra export."""
        return self.admin.tasks(queue, state, count, after)

    def task(self, queue: bytes, task_id: tuple) -> tuple | None:
        """One task by id, or None: the dashboard's task page."""
        return self.admin.task(queue, task_id)

    def figures(self, queues=(), head_since: bool = True, busiest: int | None = None):
        """One snapshot of the figures (admin.Figures): INFO, /metrics, the dashboard."""
        return self.admin.figures(queues, head_since, busiest)

    def backup(self, dest_path: str) -> dict:
        """BACKUP: a copy of the live database in the backup directory; the copy's counts by state."""
        return self.admin.backup(dest_path)

    # ------------------------------------------------------------ the writer's hooks

    def _reload(self, done: dict[bytes, int] | None = None, available: dict[bytes, int] | None = None) -> None:
        """Rebuild the caches from the database (start-up, and after a rollback). `done`, `available`:
        each queue's done and available tasks when known (they are in no index: without both every
        row is read)."""
        queues, before = {}, dict(self.queues)  # a rollback's undo left each one's leases as the file has them
        if done is None and self.db.counts_at_close is not None:  # the start after a clean stop
            counts, self.db.counts_at_close = self.db.counts_at_close, None
            done = {name: pair[0] for name, pair in counts.items()}
            available = {name: pair[1] for name, pair in counts.items()}
        for row in self.db.load_queues():
            key = name_bytes(row["name"])
            newest = None if row["newest_ms"] is None else (row["newest_ms"], row["newest_seq"])
            # Pushes do not save the last id (a page write saved per push): see _note_deleted.
            queue = self.queues.new(key, max((row["last_id_ms"], row["last_id_seq"]), newest or (0, 0)),
                                    before[key].leases if key in before else None)
            if key in before:  # counters since start survive a rollback (they never go down)
                queue.totals = before[key].totals
                queue.iids_added, queue.iids_duplicates = before[key].iids_added, before[key].iids_duplicates
            for column in SETTING_COLUMNS:
                setattr(queue, column, row[column])
            queue.set_flow(before[key].flow if key in before else None)  # a rollback keeps the hand-outs
            queue.group = None if row["group_name"] is None else name_bytes(row["group_name"])
            queue.deleted = row["deleted_count"]
            queue.unmarked_done = bool(row["unmarked_done"])
            queue.max_deleted = (row["max_deleted_ms"], row["max_deleted_seq"])
            queues[key] = queue
        in_flight = {key: len(queue.leases) for key, queue in queues.items() if queue.leases}
        for name, state, count in self.db.count_states(done, in_flight, available):
            queue = queues.get(name_bytes(name))
            if queue is not None:
                queue.counts[state] = count
        self.queues.replace(queues)
        self.schedule.reset()  # the reaper looks again at everything it keeps a time for

    def _reload_after_rollback(self) -> None:
        """The batch was rolled back: the file is as before it, and so are its done and available counts and,
        once undone, its leases."""
        self.in_flight.roll_back()
        self._reload(*self.queues.counts_before_batch())

    def _after_batch(self, committed: bool) -> bool:
        """In the event loop, after a batch: its count moves are settled, then wake the waiters it
        served, then the observers (XREAD) of the views it added entries to. Each only when the
        batch gave it something to do: nearly every batch gives none of them anything. True if
        it woke anyone (their wake-ups are callbacks to come)."""
        if self.queues.moved:
            self.queues.batch_ended()
        if self.in_flight.journal:
            self.in_flight.batch_ended()
        woke = False
        if self.waiters.to_wake:
            self.waiters.after_batch(committed)
            woke = True
        if self.observers.grown:
            self.observers.after_batch(committed)
            woke = True
        return woke

