"""The Broker: builds the parts, and keeps the verbs that span them.

The command handlers call the parts' verbs (`broker.tasks.trim(...)`), each a transaction declared
on the part's method (writer/transactions.py) that the writer runs in a batch; only batches change
the queues' states, so no locks are needed. broker/__init__.py draws the parts and their verbs.

A blocking read is the front's to wait for (commands/table.py): `claim` answers what it claimed
or a registered Waiter, `watch` registers an Observer; `unblock`, `observers.unwatch` end it.
"""
from __future__ import annotations

import bisect

from gevent import get_hub

from .. import errors, lifecycle
from ..lifecycle import AVAILABLE, DONE
from ..storage import Database, name_bytes
from ..writer.transactions import transaction
from ..writer.writer import Writer
from .admin import Admin
from .claims import Claims
from .clock import ServerClock
from .in_flight import APART_LEASES, InFlight, pending_of
from .lanes import Lanes
from .leases import Leases
from .observers import Observer, Observers
from .queues import Defaults, Queues
from .deadlines import ReaperSchedule
from .tasks import Tasks
from .transitions import Transitions
from .reaper import Reaper
from .results import Results
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
        self.observers = Observers()
        self.queues = Queues(Defaults(settings), self.observers)
        self.waiters = Waiters()
        self.schedule = ReaperSchedule(clock, self.queues.journal)
        self.workers = WorkerNames(self.queues, clock, self._release_gone_worker)
        self.in_flight = InFlight(self.queues, clock)
        self.transitions = Transitions(db, self.queues, self.in_flight, self.waiters, self.schedule, self.workers)
        self._reload()
        if not db.in_flight_recovered:  # opened without start-up's recovery (tests, tools): read them once
            self.in_flight.load(self.db.in_flight_tasks())
            self._reload(self.queues.done_and_available()[0])  # counted again, those in flight known
        self.writer = Writer(db, fsync_durable=settings.durability == "full",
                             on_rollback=self._reload_after_rollback, after_batch=self._after_batch)
        self.reaper = Reaper(db, self.queues, self.in_flight, self.transitions, self.schedule, self.writer, clock)
        self.leases = Leases(db, self.queues, self.in_flight, self.transitions, self.schedule, self.workers,
                             self.writer, clock)
        self.claims = Claims(db, self.queues, self.in_flight, self.transitions, self.leases, self.waiters,
                             self.schedule, self.writer, clock)
        self.tasks = Tasks(db, self.queues, self.in_flight, self.transitions, self.waiters, self.schedule,
                           self.reaper, self.writer, clock)
        self.admin = Admin(db, self.queues, self.in_flight, self.transitions, self.waiters, self.observers, self.writer,
                           settings, clock)
        self.views = Views(db, self.queues, self.writer)
        self.results = Results(db, self.queues, self.in_flight, self.schedule, self.observers, self.writer, clock)

    # ------------------------------------------------------------ life

    def stop(self) -> None:
        """Stop the reaper and release timers, then commit and answer whatever is queued."""
        self.reaper.stop()
        self.workers.stop_timers()
        try:
            self._last_batch().wait()
        except errors.CommandError:
            pass  # the writer is stopping already
        self.writer.stop()
        # Every batch has ended: these are the file's counts, saved beside it once it is closed. The
        # next start takes them as a clean stop's, with no task in flight (Database.recover): if a
        # lease is left (the last batch failed), it reads the rows instead.
        if not any(queue.leases for queue in self.queues.values()):
            self.db.counts_to_save = {name: (queue.counts[DONE], queue.counts[AVAILABLE])
                                      for name, queue in self.queues.items()}

    @transaction()
    def _last_batch(self) -> None:
        """The stop's last writes: the removed-task counters, and the tasks in flight given back
        (as the next start's recovery would, which then need not read every row to find them)."""
        self.transitions.flush_deleted()
        self.leases.give_back_all()

    @transaction(durable=False)
    def cancel_waiters(self) -> None:
        """Shutdown: every blocked worker (XREADGROUP) and observer (XREAD) gets a null reply now."""
        self.observers.cancel_all()
        self.waiters.serve_all_null()

    # ------------------------------------------------------------ tasks

    def pending_entries(self, queue: bytes, start, end, count, worker, min_idle_ms, apart: bool = False):
        """XPENDING's extended form: [(id, worker, idle ms, deliveries)] of tasks in flight: a request
        for it, or, `apart` (outside EXEC, which cannot wait) and over APART_LEASES tasks in flight,
        the list itself, picked on a native thread from a copy of the leases (200,000 of them took
        85-150 ms of the loop per XPENDING; the copy, a few)."""
        held = self.queues.get(queue)  # a plain read between batches, as names_after's
        if apart and held is not None and len(held.leases) > APART_LEASES:
            leases, now = self.admin.leases_copy(queue).wait()
            return get_hub().threadpool.apply(pending_of, (leases, now, start, end, count, worker, min_idle_ms))
        return self.tasks.pending_entries(queue, start, end, count, worker, min_idle_ms)

    def names_after(self, after: bytes | None, count: int) -> list[bytes]:
        """Up to `count` queue names in byte order, after `after` (None: from the first): a page of
        the queue list (XINFO QUEUES, INFO, the dashboard) without sorting every name each time."""
        names = self.queues.names  # a plain read between batches, as nothing_to_claim's
        start = 0 if after is None else bisect.bisect_right(names, after)
        return names[start:start + count]

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
            request = self.claims.claim(claim, None)
            return None if request.result is None else request
        waiter = Waiter(claim)
        try:
            result = self.claims.claim(claim, waiter).wait()
        except errors.CommandError:
            self._forget(waiter)  # its batch rolled back: the client gets the error, nobody waits
            raise
        return waiter if result is None else result

    def unblock(self, waiter: Waiter, hung_up: bool = False):
        """The front stops waiting (timed out; `hung_up`: the client is gone): what a batch that
        committed just now claimed for it, or None. A gone client's tasks go back unspent."""
        result = self.claims.unblock(waiter).wait()
        if hung_up and result:
            self._release_unsent(result)
            return None
        return result

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
            self.tasks.fail(name, ids, lifecycle.SILENT)

    def _release_gone_worker(self, worker: bytes, gone_at: int) -> float | None:
        """WorkerNames' timer: the gone worker's tasks go back where the grace is over."""
        return self.leases.release(worker, gone_at).wait()

    # ------------------------------------------------------------ XREAD

    def watch(self, reads: list[tuple], count: int) -> tuple[Observer, list[tuple], dict]:
        """XREAD BLOCK's start: an Observer of the views, watching before the first look (a push
        committed after it wakes it), the reads with '$' and '+' fixed to now, and what that look
        found. The front waits on the observer, `views.look`s again when woken, and
        `observers.unwatch`es it."""
        observer = Observer({view for _, view, _ in reads})
        self.observers.watch(observer)
        try:
            reads, found = self.views.first_look(reads, count).wait()
        except BaseException:
            self.observers.unwatch(observer)
            raise
        return observer, reads, found

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
            queue = self.queues.new(key, leases=before[key].leases if key in before else None)
            queue.read(row, before.get(key))
            queues[key] = queue
        ahead, self.db.lanes_read_ahead = self.db.lanes_read_ahead, {}
        for name, groups in ahead.items():  # read during the start (storage/opening.py): the first claim needn't
            queue = queues.get(name)
            if queue is not None and queue.lanes_on and self.db.in_flight_recovered and not queue.leases:
                queue.turned_to_lanes(Lanes.from_groups(groups, (), queue.partition_cap()))
        in_flight = {key: len(queue.leases) for key, queue in queues.items() if queue.leases}
        for name, state, count in self.db.count_states(done, in_flight, available):
            queue = queues.get(name_bytes(name))
            if queue is not None:
                queue.counted(state, count)
        self.queues.replace(queues)
        self.transitions.dependencies.reload()

    def _reload_after_rollback(self) -> None:
        """The batch was rolled back: the file is as before it; the batch journal takes back what it
        changed in memory (counts, leases, the deadlines: journal.py), then the queues are read again
        with the done and available counts as the undo left them (the file's)."""
        self.queues.journal.roll_back()
        self._reload(*self.queues.done_and_available())

    def _after_batch(self, committed: bool) -> bool:
        """In the event loop, after a batch: its count moves are settled, then wake the waiters it
        served, then the observers (XREAD) of the views it added entries to. Each only when the
        batch gave it something to do: nearly every batch gives none of them anything. True if
        it woke anyone (their wake-ups are callbacks to come)."""
        if self.queues.journal:
            self.queues.journal.batch_ended()
        woke = False
        if self.waiters.to_wake:
            self.waiters.after_batch(committed)
            woke = True
        if self.observers.grown:
            self.observers.after_batch(committed)
            woke = True
        return woke

