"""The single writer: every database operation goes through here, in order.

A greenlet `submit`s a function and it runs at once, in that greenlet, inside
the transaction of the current loop turn (opened by the turn's first submit).
One hub callback at the end of the turn commits it: everything that arrived in
one turn is one transaction (group commit), with no queue, no writer greenlet
and no event per request. A request's reply waits for its batch: claims and
reads for the commit, durable requests (XADD, XACK, XNACK...) for an fsync of
the WAL that started after it. The fsync runs inline, on the event loop, in
the commit's callback, or in one after it when the commit woke readers (they
reply first), as Redis's `appendfsync always` does: measured, ~90 µs of CPU
per task less than handing it to a thread, and bigger batches, since what
arrives during the fsync makes the next one. A slow disk must not freeze the
server for long: while the fsyncs' moving average is over SLOW_FSYNC they run
on a native thread (the `Syncer`), where the loop serves on while the disk
works, and inline again once it is under FAST_FSYNC. A lone spike costs one
slow turn; a disk that stays slow, a few (the average crosses in about three).

Why the SQL runs on the event loop and not on a thread: statements and a
no-fsync commit take microseconds, while handing each batch to a thread cost
two GIL hand-offs per statement under load. Three things leave the loop for
native threads: checkpoints (on their own connection; the PASSIVE pass runs
while batches go on, the short RESTART after it pauses them, and is skipped
while another process's snapshot pins the WAL: it would only fail), slow fsyncs, and
backups (BGSAVE: storage.backup_database reads on a connection of its own, see
broker/admin.py).

An EXEC runs inside `atomic()`: the turn's batch stays open until it ends and its
reads answer from the open transaction, so one EXEC is always one commit.

A function's CommandError is validated before it writes: nothing to undo, the
caller gets it at once. Any other error (a storage failure, a bug) rolls the
whole batch back: every request in it is answered with a storage error. A
commit that meets a full disk is the exception: the batch is rolled back and
run again without its pushes, which alone are refused (and any EXEC in it, whole).
The full-disk mode itself (the reserve, which pushes are refused, room again) is
disk_space.py's DiskGuard: the writer tells it what failed and asks it.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from contextlib import contextmanager

import gevent
from gevent import get_hub
from gevent.event import Event
from gevent.threadpool import ThreadPool
from loguru import logger

from .. import errors
from .batch import Atomic, Batch, Request, wake
from .disk_space import DiskGuard
from .histogram import BATCH_SIZE_BUCKETS, SECONDS_BUCKETS, Histogram
from ..storage import Database
from .syncer import Syncer

CHECKPOINT_EVERY_BATCHES = 500  # fold the WAL into the database this often (on a thread)
# ...or sooner when the WAL outgrows db.wal_limit, but not more often than this: a
# reader holding a snapshot (a backup) keeps the WAL long, and each RESTART pauses batches.
CHECKPOINT_MIN_BATCHES = 20
SLOW_FSYNC = 0.010  # seconds: fsyncs move to the thread while their moving average is above this...
FAST_FSYNC = 0.002  # ...and come back inline once it is below this
FSYNC_AVERAGE_WEIGHT = 0.3  # of the newest fsync in the moving average
FSYNC_AVERAGE_KEEP = 1 - FSYNC_AVERAGE_WEIGHT
WAL_SIZE_EVERY = 16  # batches between two looks at the WAL's size (an fstat each); every batch on a full disk
NEVER = float("inf")


class Writer:
    """Owns the database connection; runs submitted functions in per-turn transactions."""

    def __init__(self, db: Database, fsync_durable: bool = True, on_rollback=None, after_batch=None):
        self.db = db
        self._integrity = db.integrity  # the database's, for ever: one attribute less per submit
        # Hooks for the broker: rebuild its caches after a rollback; wake the
        # blocked readers a batch served.
        self._on_rollback = on_rollback or (lambda: None)
        self._after_batch = after_batch or (lambda ok: False)  # True: it woke someone (callbacks to come)
        self._loop = get_hub().loop
        self._batch: Batch | None = None  # the open transaction of this loop turn
        self._atomic: Atomic | None = None  # the EXEC running now (see `atomic`)
        self._to_sync: Batch | None = None  # committed, its inline fsync in the next callback
        self._stopping = False
        self._fsync_durable = fsync_durable
        self._syncer: Syncer | None = None  # made when an fsync is first slow
        self._fsync_average = 0.0  # seconds, moving average (inline and thread fsyncs alike)
        self._fsync_on_thread = False
        self._slow_work = ThreadPool(1)  # checkpoints: they fsync the database file
        self._checkpointing = False
        self._restart_wal = False
        self.snapshot_held = False  # another process's read transaction pins the WAL (see _check_checkpoint)
        self._paused: Event | None = None  # set while a RESTART checkpoint runs: new batches wait
        self._batches_at_checkpoint = 0
        self._next_checkpoint_look = 0  # the batch number at which _maybe_checkpoint looks next
        self.batches = 0
        self.batch_sizes = Histogram(BATCH_SIZE_BUCKETS)   # requests per committed batch
        self.commit_seconds = Histogram(SECONDS_BUCKETS)   # the COMMIT of a batch (no fsync)
        self.fsync_seconds = Histogram(SECONDS_BUCKETS) if fsync_durable else None
        # A checkpoint copies at most the WAL into the database: with the WAL kept
        # under half the reserve (db.wal_limit), the reserve has room for that copy.
        self.disk = DiskGuard.beside(db)  # the full-disk mode (disk_space.py)
        self.disk.start()

    @property
    def committed_requests(self) -> int:
        """Requests in the batches committed: the histogram's sum, not a counter of its own."""
        return int(self.batch_sizes.sum)

    @property
    def fsyncs(self) -> int:
        return sum(self.fsync_seconds.counts) if self.fsync_seconds is not None else 0

    @property
    def disk_full(self) -> bool:
        """Pushes are refused until there is room (INFO, /metrics, the upkeep's vacuum)."""
        return self.disk.full

    def submit(self, fn, *args, durable: bool = True, grows: bool = False) -> Request:
        """Run `fn(*args)` in this turn's transaction; a durable one is answered after fsync.

        `grows`: it adds rows (a push), so a full disk refuses it; everything
        else (claims, acks, nacks, reads) rewrites rows that exist and goes on.
        """
        if self._stopping:
            raise errors.SHUTTING_DOWN
        atomic = self._atomic
        if atomic is not None and atomic.error is not None:
            raise atomic.error  # an earlier command of this EXEC rolled the batch back: none applies
        batch = self._batch or self._open_batch()  # (never inside an EXEC: it opened its batch)
        if grows and self.disk.full:
            self.disk.check_growth()
        request = Request(batch, fn, args, durable, grows, atomic)
        if self._integrity.corrupt:
            return self._submit_read_only(request)
        try:
            request.result = fn(*args)
        except errors.CommandError:
            raise  # validated before writing: nothing to undo
        except Exception as exc:  # a storage failure (disk full, I/O error) or a bug
            self._roll_back(batch, exc, f"request {getattr(fn, '__name__', fn)}")
            raise batch.error from None
        batch.requests.append(request)
        if durable:
            batch.durable = True
            if atomic is not None:
                atomic.durable = True
        return request

    @contextmanager
    def atomic(self):
        """Everything submitted inside (one EXEC) commits in one transaction, or not at all:
        the batch is held open until the block ends, and a `wait` inside it returns at once
        (a read in an EXEC no longer commits the commands before it alone). Nothing inside
        may wait for a commit (`barrier` refuses; BACKUP is refused inside MULTI). Yields
        the Atomic, whose `wait` the EXEC's reply waits on."""
        if self._stopping:
            raise errors.SHUTTING_DOWN
        # Open first: this may wait out a checkpoint's pause, and other EXECs run meanwhile.
        # From here on nothing yields until the block ends.
        batch = self._batch or self._open_batch()
        if self._atomic is not None:
            raise errors.EXEC_INSIDE_EXEC  # a bug: the command table never nests them
        atomic = self._atomic = Atomic(batch)
        batch.held = True
        batch.atomics.append(atomic)
        try:
            yield atomic
        finally:
            self._atomic = None
            batch.held = False
            if batch is self._batch:
                self._loop.run_callback(self._end_turn, batch)  # should the turn's callback have run

    def call(self, fn, *args, durable: bool = True):
        """Submit and wait: the result of `fn(*args)` once its batch committed."""
        return self.submit(fn, *args, durable=durable).wait()

    def barrier(self) -> None:
        """Wait until everything submitted before this call has committed (or rolled back):
        work done off the writer (a backup) then sees every write sent before it."""
        if self._atomic is not None:
            raise errors.COMMIT_WAIT_INSIDE_EXEC  # it would wait for itself
        self.submit(lambda: None, durable=False).batch.wait_committed()

    def pending(self) -> int:
        """Requests in the transaction not yet committed."""
        return len(self._batch.requests) if self._batch is not None else 0

    def stop(self) -> None:
        """Commit and answer what this turn submitted, then stop the fsync thread."""
        self._stopping = True
        for batch in (self._batch, self._to_sync):
            if batch is not None:
                batch.wait_synced()  # the turn's callbacks commit and fsync it, before the file closes
        if self._syncer is not None:
            self._syncer.stop()
        self._slow_work.join()  # a checkpoint under way finishes before the database closes
        self._slow_work.kill()
        self.disk.close()

    # ------------------------------------------------------------ the turn's transaction

    def _open_batch(self) -> Batch:
        # A RESTART checkpoint needs the writer idle: the turn's first submit runs it, others wait.
        while self._batch is None and (self._paused is not None or self._restart_wal):
            if self._paused is not None:
                self._paused.wait()
            else:
                self._finish_checkpoint()
        if self._batch is not None:  # another greenlet opened it while this one waited
            return self._batch
        try:
            self.db.begin()
        except Exception as exc:
            logger.opt(exception=exc).error("cannot begin a transaction: {}", exc)
            raise errors.storage_failed(str(exc) or type(exc).__name__) from None
        batch = self._batch = Batch()
        self._loop.run_callback(self._end_turn, batch)
        return batch

    def _end_turn(self, batch: Batch) -> None:
        """On the hub, after every greenlet that ran this turn: commit, wake, fsync."""
        if batch is not self._batch:
            return  # rolled back already
        if batch.held:
            return  # an EXEC that yielded is still running: `atomic` ends the turn after it
        self._batch = None
        started = time.perf_counter()
        if self.snapshot_held and not (self.disk.full or self.db.integrity.corrupt):  # its write lock: WalFile
            self.db.wal.extend_ahead(past=2 * self.db.wal_limit, keep_free=self.disk.keep_free_past_wal())
        try:
            self.db.commit()
        except Exception as exc:
            if self.disk.is_full_error(exc) and not self.disk.full:
                self._run_again_without_growth(batch, exc)
            else:
                self._roll_back(batch, exc, f"commit of {len(batch.requests)} requests")
            return
        self._committed(batch, started)

    def _committed(self, batch: Batch, started: float) -> None:
        seconds, size = time.perf_counter() - started, len(batch.requests)
        # Histogram.observe, inlined for the two histograms of every batch: two calls less a turn.
        histogram = self.commit_seconds
        histogram.counts[bisect_left(histogram.bounds, seconds)] += 1
        histogram.sum += seconds
        histogram = self.batch_sizes
        histogram.counts[bisect_left(histogram.bounds, size)] += 1
        histogram.sum += size
        self.batches += 1
        # Blocked readers the batch served first: a worker waiting for a task
        # matters more than the producer's reply (callbacks run in this order).
        woke = self._after_batch(True) or batch.commit_waiters
        batch.requests.clear()  # they point at the batch: keeping them would hold every result till a GC
        batch.is_committed = True  # Batch.set_committed, inlined: once a turn (it is never set already here)
        if batch.commit_waiters:
            self._loop.run_callback(wake, batch.commit_waiters)  # (`woke` counted them)
        if not (batch.durable and self._fsync_durable):
            batch.set_synced()
        elif self._fsync_on_thread:
            self._syncer_now().after_sync(batch)
        elif woke:
            # After the readers this commit woke have run: their claims are answered (they
            # need no fsync) while the disk works, not after it.
            self._to_sync = batch
            self._loop.run_callback(self._fsync_inline, batch)
        else:
            self._fsync_inline(batch)  # nobody to run first: now, not in a callback of its own
        if self.batches >= self._next_checkpoint_look or self.disk.full:
            self._maybe_checkpoint()

    def _fsync_inline(self, batch: Batch) -> None:
        if self._to_sync is batch:
            self._to_sync = None
        started = time.perf_counter()
        try:
            self.db.sync_wal()  # everything committed before this call is durable after it
        except OSError as exc:
            logger.error("fsync of the WAL failed, the batch's durable replies fail: {}", exc)
            batch.sync_error = errors.storage_failed(f"fsync failed: {exc}")
        self._observe_fsync(time.perf_counter() - started)
        batch.set_synced_now()

    def _observe_fsync(self, seconds: float) -> None:
        histogram = self.fsync_seconds  # its observe, inlined: once per fsync
        histogram.counts[bisect_left(histogram.bounds, seconds)] += 1
        histogram.sum += seconds
        average = self._fsync_average = FSYNC_AVERAGE_WEIGHT * seconds + FSYNC_AVERAGE_KEEP * self._fsync_average
        if average > SLOW_FSYNC or self._fsync_on_thread:  # rarely: the disk is slow, or was
            self._move_fsyncs(average)

    def _move_fsyncs(self, average: float) -> None:
        """Fsyncs to the thread while their average is slow, back to the loop once it is fast."""
        if not self._fsync_on_thread and average > SLOW_FSYNC:
            self._fsync_on_thread = True
            logger.warning("fsyncs take {:.1f} ms on average: they run on a thread until the disk is fast "
                           "again", average * 1000)
        elif self._fsync_on_thread and average < FAST_FSYNC:
            self._fsync_on_thread = False
            logger.info("fsyncs take {:.1f} ms on average again: back on the event loop", average * 1000)

    def _syncer_now(self) -> Syncer:
        if self._syncer is None:
            self._syncer = Syncer(self.db.sync_wal, self._observe_fsync)
        return self._syncer

    def _maybe_checkpoint(self) -> None:
        """After a batch whose number is `_next_checkpoint_look` or more, or any on a full disk:
        the batches between two looks could not start a checkpoint (see `_next_look`)."""
        if self.disk.wal_must_start_over():  # a full disk: before the next batch, not in 20
            self._restart_wal = True
            self._batches_at_checkpoint = self.batches
            return
        since = self.batches - self._batches_at_checkpoint
        if not self._checkpointing and (since >= CHECKPOINT_EVERY_BATCHES or (
                since >= CHECKPOINT_MIN_BATCHES and since % WAL_SIZE_EVERY == 0
                and self.db.wal_size() > self.db.wal_limit)):
            self._checkpointing = True
            self._batches_at_checkpoint = self.batches
            since = 0
            gevent.spawn(self._start_checkpoint)  # not from the hub: the pool may switch
        self._next_checkpoint_look = self._next_look(since)

    def _next_look(self, since: int) -> int:
        """The next batch number at which `_maybe_checkpoint` could start one, `since` batches after
        the last: the next look at the WAL's size (every WAL_SIZE_EVERY from CHECKPOINT_MIN_BATCHES)
        or CHECKPOINT_EVERY_BATCHES, whichever comes first. While one runs, none can start until it
        is done (`_checkpoint_done` looks again at the next batch)."""
        if self._checkpointing:
            return NEVER
        size_look = max(since + 1, CHECKPOINT_MIN_BATCHES)
        size_look += -size_look % WAL_SIZE_EVERY  # the next multiple of WAL_SIZE_EVERY
        return self.batches + min(size_look, CHECKPOINT_EVERY_BATCHES) - since

    def _run_again_without_growth(self, batch: Batch, exc: BaseException) -> None:
        """The commit met a full disk: roll the batch back, then run it again in disk-full mode.

        Its claims, acks and reads then commit on the released reserve and only its pushes are
        refused; before, every request in it failed (a worker's XREADGROUP among them).
        """
        self._out_of_space(f"batch of {len(batch.requests)} requests (rolled back, run again without its "
                           "pushes)", exc)
        started = time.perf_counter()
        try:
            self.db.rollback()
            self._on_rollback()  # the broker's caches as on disk again
            self._after_batch(False)  # readers the rolled-back pushes served learn it now
            self.db.begin()
            for atomic in batch.atomics:
                # Its replies were built from what it read in the first run: run again, some
                # could differ. It is refused whole (its pushes with the rest), never in part.
                atomic.error = errors.storage_failed(f"disk full: the EXEC was rolled back ({exc})")
            for request in batch.requests:
                if request.atomic is not None:
                    request.result, request.error = None, request.atomic.error
                    continue
                if request.grows:
                    request.result, request.error = None, errors.DISK_FULL()
                    continue
                try:
                    request.result = request.fn(*request.args)
                except errors.CommandError as refused:
                    request.result, request.error = None, refused
            self.db.commit()
        except Exception as again_exc:
            self._roll_back(batch, again_exc, "running the batch again without its pushes")
            return
        self._committed(batch, started)

    def _roll_back(self, batch: Batch, exc: BaseException, what: str) -> None:
        """Undo the whole batch: every request in it is answered with a storage error."""
        if self.disk.is_full_error(exc):
            self._out_of_space(f"{what} (batch rolled back)", exc)
        elif self.db.integrity.is_corruption(exc):
            self.on_corruption(f"{what}: {exc}")
        else:
            logger.opt(exception=exc).error("{} failed, batch of {} requests rolled back: {}", what,
                                            len(batch.requests), exc)
        if self._batch is batch:
            self._batch = None
        try:
            self.db.rollback()
        except Exception as rollback_exc:
            logger.opt(exception=rollback_exc).error("rollback failed: {}", rollback_exc)
        batch.error = (errors.database_corrupt(self.db.integrity.reason) if self.db.integrity.corrupt
                       else errors.storage_failed(str(exc) or type(exc).__name__))
        for atomic in batch.atomics:
            atomic.error = batch.error
        try:
            self._on_rollback()
        except Exception as hook_exc:
            logger.opt(exception=hook_exc).error("reloading state after rollback failed: {}", hook_exc)
        self._after_batch(False)
        batch.requests.clear()
        batch.set_committed()
        batch.set_synced()

    # ------------------------------------------------------------ a corrupt database

    def on_corruption(self, what: str) -> None:
        """ezra.db is corrupt (a query met a malformed page, or the check at start found one):
        writes stop from here on, logged once; reads go on (storage/integrity.py)."""
        if self.db.integrity.mark_corrupt(what):
            logger.error("the database {} is corrupt ({}): EZRA has stopped writing to it; writes are refused, "
                         "reads of the pages still whole go on. Stop EZRA and restore ezra.db from a backup "
                         "(export what it can still read first: ezra export --data-dir)", self.db.path,
                         self.db.integrity.reason)

    def _submit_read_only(self, request: Request) -> Request:
        """Run `fn` on the read-only connection: a read answers; a write is refused, alone (the
        batch holds no writes to undo). The broker's caches are not rebuilt: it changes them
        after its statements, which refused writes never pass (and a rebuild reads every
        queue's counts: 0.1 s a refused write with a million tasks)."""
        fn = request.fn
        try:
            request.result = fn(*request.args)
        except Exception as exc:
            if not self.db.conn.in_transaction:  # some errors end SQLite's transaction: the turn needs one
                self.db.begin()
            if isinstance(exc, errors.CommandError):
                raise
            if not (self.db.integrity.is_refused_write(exc) or self.db.integrity.is_corruption(exc)):
                logger.opt(exception=exc).error("request {} failed on the corrupt database: {}",
                                                getattr(fn, "__name__", fn), exc)
            raise errors.database_corrupt(self.db.integrity.reason) from None
        batch = request.batch
        batch.requests.append(request)
        if request.durable:
            batch.durable = True
            if request.atomic is not None:
                request.atomic.durable = True  # as submit: the EXEC's reply waits for the same fsync
        return request

    # ------------------------------------------------------------ a full disk

    def _out_of_space(self, what: str, exc: BaseException) -> None:
        """A commit or a checkpoint met a full disk: the guard frees the reserve and refuses pushes;
        the WAL then starts over inside the released reserve after the next batch's checkpoint."""
        if self.disk.out_of_space(what, exc):
            self.checkpoint_soon()

    def checkpoint_soon(self) -> None:
        """Checkpoint after the next batch: a file the incremental vacuum shrank is cut only then."""
        self._batches_at_checkpoint = self.batches - CHECKPOINT_EVERY_BATCHES
        self._next_checkpoint_look = 0

    # ------------------------------------------------------------ checkpoints

    def _start_checkpoint(self) -> None:
        """Checkpoint on a thread while batches go on; one at a time."""
        self._slow_work.spawn(self._checkpoint, "PASSIVE").rawlink(self._checkpoint_done)

    def _checkpoint_done(self, done) -> None:
        self._checkpointing = False
        self._next_checkpoint_look = 0  # at the next batch: it may be due again already
        if self._check_checkpoint(done.value, "PASSIVE"):
            self._restart_wal = True  # before the next batch: see _finish_checkpoint

    def _finish_checkpoint(self) -> None:
        """With batches paused, copy what the passive pass left and restart the WAL."""
        self._restart_wal = False
        self._paused = Event()
        try:
            self._check_checkpoint(self._slow_work.apply(self._checkpoint, ("RESTART",)), "RESTART")
        finally:
            paused, self._paused = self._paused, None
            paused.set()

    def _check_checkpoint(self, outcome, mode: str) -> bool:
        """On the event loop: True if the checkpoint copied the whole WAL. A reader's snapshot
        (another process's open read transaction) pins the frames after it: then no RESTART
        (it could only fail, or wait for that reader with every batch paused), PASSIVE
        passes only, until the reader lets go. One that failed for want of space starts the
        disk-full mode."""
        if isinstance(outcome, BaseException):
            if self.db.is_busy(outcome):
                self._snapshot_held(True)
            elif self.disk.is_full_error(outcome):
                self._out_of_space(f"{mode} checkpoint", outcome)
            else:
                logger.opt(exception=outcome).error("{} checkpoint failed (will retry): {}", mode, outcome)
            return False
        busy, frames, copied = outcome
        self._snapshot_held(bool(busy) or copied < frames)
        return not self.snapshot_held

    def _snapshot_held(self, held: bool) -> None:
        if held != self.snapshot_held:
            self.snapshot_held = held
            if held:
                logger.info("a reader holds a snapshot of the database (ezra export, a BACKUP, Litestream): "
                            "checkpoints stay PASSIVE until it lets go; the WAL ({} bytes) grows meanwhile",
                            self.db.wal_size())
            else:
                logger.info("no reader holds a snapshot any more: the WAL ({} bytes) is folded in and starts "
                            "over", self.db.wal_size())

    def _checkpoint(self, mode: str):
        """On a thread: SQLite's (busy, frames, copied), or the error (see _check_checkpoint)."""
        try:
            return self.db.checkpoint(mode)
        except Exception as exc:
            return exc
