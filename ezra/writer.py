"""The single writer: every database operation goes through here, in order.

Greenlets `submit` a function; a committer greenlet takes everything queued so
far as one batch, runs it inside one transaction and commits (group commit).
The commit itself only writes the WAL (synchronous=NORMAL); the fsync that
makes it durable runs on a native thread, the `Syncer`, while the event loop
serves other connections and the next batch runs. A durable request (XADD,
XACK, XNACK...) is answered once an fsync that started after its commit has
finished; claims and reads are answered right after the commit: losing a
claim in a power cut only makes the task available again. While an fsync is
under way, a queue holding only durable requests waits for it to end before
committing: none of their replies could leave sooner, and one commit then
replaces several (cycle-batched: -10% CPU per task, BENCHMARKS.md).

Why the SQL runs on the event loop and not on a thread: statements and a
no-fsync commit take microseconds, while handing each batch to a thread cost
two GIL hand-offs per statement under load (the other thread waits up to the
5 ms switch interval for the GIL each time). Measured in BENCHMARKS.md. Only
the slow parts, fsync and checkpoints (on their own connection, PASSIVE, so
batches never wait for them), leave the loop.
"""

from __future__ import annotations

import os
import threading
import time

import gevent
from gevent import get_hub
from gevent.event import Event
from gevent.threadpool import ThreadPool
from loguru import logger

from . import errors
from .histogram import BATCH_SIZE_BUCKETS, SECONDS_BUCKETS, Histogram
from .storage import Database

CHECKPOINT_EVERY_BATCHES = 500  # fold the WAL into the database this often (on a thread)
# ...or sooner when the WAL outgrows db.wal_limit, but not more often than this: a
# reader holding a snapshot (a backup) keeps the WAL long, and each RESTART pauses batches.
CHECKPOINT_MIN_BATCHES = 20
MIN_ROOM = 1024 * 1024  # free bytes needed before pushes resume after the disk was full
class Request:
    """One submitted function; `wait` returns its result or raises its error."""

    __slots__ = ("fn", "args", "durable", "grows", "result", "error", "done")

    def __init__(self, fn, args, durable, grows):
        self.fn = fn
        self.args = args
        self.durable = durable
        self.grows = grows  # adds rows: refused while the disk is full
        self.result = None
        self.error: BaseException | None = None
        self.done = Event()

    def wait(self):
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


class Syncer:
    """A native thread that fsyncs the WAL for batches of durable requests."""

    def __init__(self, wal_path: str, on_synced=None):
        self._fd = os.open(wal_path, os.O_RDONLY)
        self._on_synced = on_synced or (lambda: None)
        self.in_flight = 0  # requests handed over and not yet answered (only the event loop touches it)
        self._cond = threading.Condition()
        self._waiting: list[Request] = []  # committed, not yet synced
        self._synced: list[tuple[list[Request], OSError | None]] = []
        self._stopping = False
        self._wakeup = get_hub().loop.async_()
        self._wakeup.start(self._answer_synced)
        self._thread = threading.Thread(target=self._run, name="ezra-fsync", daemon=True)
        self._thread.start()
        self.fsyncs = 0
        self.fsync_seconds = Histogram(SECONDS_BUCKETS)  # only this thread observes it

    def after_sync(self, requests: list[Request]) -> None:
        """Answer these committed requests once the WAL is on disk."""
        self.in_flight += len(requests)
        with self._cond:
            self._waiting.extend(requests)
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()
        self._answer_synced()
        self._wakeup.stop()
        self._wakeup.close()
        os.close(self._fd)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._stopping:
                    self._cond.wait()
                if not self._waiting:
                    return
                batch, self._waiting = self._waiting, []
            error = None
            try:
                started = time.perf_counter()
                os.fdatasync(self._fd)  # everything committed before this call is durable after it
                self.fsync_seconds.observe(time.perf_counter() - started)
                self.fsyncs += 1
            except OSError as exc:
                error = exc
            with self._cond:
                self._synced.append((batch, error))
            self._wakeup.send()  # thread-safe: the event loop runs _answer_synced

    def _answer_synced(self) -> None:
        with self._cond:
            synced, self._synced = self._synced, []
        for batch, _ in synced:
            self.in_flight -= len(batch)
        if synced:
            self._on_synced()
        for batch, error in synced:
            if error is not None:
                logger.error("fsync of the WAL failed, {} replies fail: {}", len(batch), error)
            for request in batch:
                if error is not None:
                    request.result, request.error = None, errors.storage_failed(f"fsync failed: {error}")
                request.done.set()


class Writer:
    """Owns the database connection; runs submitted functions in batches."""

    def __init__(self, db: Database, fsync_durable: bool = True, on_rollback=None, after_batch=None):
        self.db = db
        # Hooks for the broker: rebuild its caches after a rollback; wake the
        # blocked readers a batch served.
        self._on_rollback = on_rollback or (lambda: None)
        self._after_batch = after_batch or (lambda ok: None)
        self._queue: list[Request] = []
        self._has_work = Event()
        self._stopping = False
        self._syncer = Syncer(db.wal_path, on_synced=self._has_work.set) if fsync_durable else None
        self._slow_work = ThreadPool(1)  # checkpoints: they fsync the database file
        self._checkpointing = False
        self._restart_wal = False
        self._batches_at_checkpoint = 0
        self.batches = 0
        self.committed_requests = 0
        self.batch_sizes = Histogram(BATCH_SIZE_BUCKETS)   # requests per committed batch
        self.commit_seconds = Histogram(SECONDS_BUCKETS)   # BEGIN .. COMMIT of a batch (no fsync)
        # A checkpoint copies at most the WAL into the database: with the WAL kept
        # under half the reserve (db.wal_limit), the reserve has room for that copy.
        self.disk_full = not db.make_reserve()
        if self.disk_full:
            logger.warning("cannot set {} bytes aside in {}: the disk is nearly full, pushes are refused "
                           "until there is room", db.reserve_bytes, db.reserve_path)
        self._committer = gevent.spawn(self._commit_loop)

    @property
    def fsyncs(self) -> int:
        return self._syncer.fsyncs if self._syncer else 0

    @property
    def fsync_seconds(self) -> Histogram | None:
        return self._syncer.fsync_seconds if self._syncer else None

    def submit(self, fn, *args, durable: bool = True, grows: bool = False) -> Request:
        """Queue `fn(*args)` for the next batch; a durable one is answered after fsync.

        `grows`: it adds rows (a push), so a full disk refuses it; everything
        else (claims, acks, nacks, reads) rewrites rows that exist and goes on.
        """
        if self._stopping:
            raise errors.err("server is shutting down")
        request = Request(fn, args, durable, grows)
        self._queue.append(request)
        self._has_work.set()
        return request

    def call(self, fn, *args, durable: bool = True):
        """Submit and wait: the result of `fn(*args)` once its batch committed."""
        return self.submit(fn, *args, durable=durable).wait()

    def pending(self) -> int:
        return len(self._queue)

    def stop(self) -> None:
        """Commit and answer everything queued, then stop the fsync thread."""
        self._stopping = True
        self._has_work.set()
        self._committer.join()
        if self._syncer is not None:
            self._syncer.stop()
        self._slow_work.join()  # a checkpoint under way finishes before the database closes
        self._slow_work.kill()

    def _commit_loop(self) -> None:
        while True:
            self._has_work.wait()
            self._has_work.clear()
            if self._restart_wal:
                self._finish_checkpoint()
            if self._queue and self._can_wait_for_fsync(self._queue):
                continue  # committed when the fsync under way ends (_has_work is set then)
            batch, self._queue = self._queue, []
            if batch:
                self._commit(batch)
                gevent.sleep(0)  # let connections run and queue more before the next batch
            elif self._stopping:
                return

    def _can_wait_for_fsync(self, queued: list[Request]) -> bool:
        """Only durable requests, and an fsync is under way: their replies wait for an fsync that
        starts after their commit, which cannot start before this one ends. Committing them
        then, as one batch, costs them nothing and saves the commits in between."""
        return bool(self._syncer and self._syncer.in_flight) and all(r.durable for r in queued)

    def _commit(self, batch: list[Request]) -> None:
        ok = self._run_batch(batch)
        # Blocked readers the batch served first: a worker waiting for a task
        # matters more than the producer's reply (callbacks run in this order).
        self._after_batch(ok)
        if ok and self._syncer is not None:
            durable = [request for request in batch if request.durable]
            if durable:
                self._syncer.after_sync(durable)
            for request in batch:
                if not request.durable:
                    request.done.set()
        else:
            for request in batch:
                request.done.set()
        since = self.batches - self._batches_at_checkpoint
        if ok and not self._checkpointing and (since >= CHECKPOINT_EVERY_BATCHES or (
                since >= CHECKPOINT_MIN_BATCHES and self.db.wal_size() > self.db.wal_limit)):
            self._start_checkpoint()

    def _run_batch(self, batch: list[Request], retry: bool = True) -> bool:
        """Run the batch in one transaction. False if it was rolled back."""
        db = self.db
        if self.disk_full:
            self._refuse_growth(batch)
        started = time.perf_counter()
        try:
            db.begin()
            for request in batch:
                if request.error is not None:
                    continue  # refused above
                try:
                    request.result = request.fn(*request.args)
                except errors.CommandError as exc:
                    request.error = exc  # validated before writing: nothing to undo
            db.commit()
        except Exception as exc:  # a storage failure (disk full, I/O error) or a bug
            if retry and not self.disk_full and db.is_disk_full(exc):
                return self._run_again_without_growth(batch, exc)
            if db.is_disk_full(exc):
                self._on_disk_full(f"batch of {len(batch)} requests (rolled back)", exc)
            else:
                logger.opt(exception=exc).error("batch of {} requests rolled back: {}", len(batch), exc)
            self._roll_back(batch, exc)
            return False
        self.commit_seconds.observe(time.perf_counter() - started)
        self.batch_sizes.observe(len(batch))
        self.batches += 1
        self.committed_requests += len(batch)
        return True

    def _run_again_without_growth(self, batch: list[Request], exc: BaseException) -> bool:
        """The batch that met the full disk: roll it back, then run it again in disk-full mode.

        Its claims, acks and reads then commit on the released reserve and only its pushes are
        refused; before, every request in it failed (a worker's XREADGROUP among them).
        """
        self._on_disk_full(f"batch of {len(batch)} requests (rolled back, run again without its pushes)", exc)
        try:
            self.db.rollback()
            self._on_rollback()  # the broker's caches as on disk again
        except Exception as undo_exc:
            logger.opt(exception=undo_exc).error("undoing the batch that met the full disk failed: {}", undo_exc)
            self._roll_back(batch, exc)
            return False
        self._after_batch(False)  # readers the rolled-back pushes served learn it now, not after the rerun
        for request in batch:
            request.result = request.error = None
        return self._run_batch(batch, retry=False)

    def _on_disk_full(self, what: str, exc: BaseException) -> None:
        """The file system is full: free the reserve so acks and claims go on, refuse pushes.

        The reserve (a ballast file made at start) is what lets the WAL grow a
        little and the checkpoint that follows copy it into the database, after
        which the WAL is written over from its start: consuming work needs no
        new space. Without it, a full disk would stop workers too.
        """
        if self.disk_full:
            logger.debug("{} failed, the disk is still full: {}", what, exc)  # logged once per episode
            return
        self.disk_full = True
        self.db.release_reserve()
        logger.error("disk full: {} failed ({}); released the {}-byte reserve, refusing pushes until "
                     "there is room again", what, exc, self.db.reserve_bytes)
        self.checkpoint_soon()

    def _refuse_growth(self, batch: list[Request]) -> None:
        """While the disk is full, answer pushes with DISK_FULL, unless the reserve fits again."""
        growing = [request for request in batch if request.grows]
        if not growing:
            return
        if self._room_again():
            self.disk_full = False
            logger.info("disk space available again: {} bytes set aside, pushes accepted", self.db.reserve_bytes)
            return
        for request in growing:
            request.error = errors.DISK_FULL

    def _room_again(self) -> bool:
        """Room for the reserve and as much again (else the next push fills the disk at once): the
        reserve in the file system, with MIN_ROOM beside it for the WAL; the rest may be free pages
        in the database file, which new rows reuse without the file system giving a byte."""
        db = self.db
        if self.room_missing() > 0:
            return False
        if db.free_bytes() + db.free_bytes_inside() < max(2 * db.reserve_bytes, MIN_ROOM):
            return False
        return db.make_reserve()

    def room_missing(self) -> int:
        """Bytes the file system lacks for the reserve and MIN_ROOM beside it (see _room_again)."""
        return self.db.reserve_bytes + MIN_ROOM - self.db.free_bytes()

    def checkpoint_soon(self) -> None:
        """Checkpoint after the next batch: a file the incremental vacuum shrank is cut only then."""
        self._batches_at_checkpoint = self.batches - CHECKPOINT_EVERY_BATCHES

    def _roll_back(self, batch: list[Request], exc: Exception) -> None:
        try:
            self.db.rollback()
        except Exception as rollback_exc:
            logger.opt(exception=rollback_exc).error("rollback failed: {}", rollback_exc)
        failure = errors.storage_failed(str(exc) or type(exc).__name__)
        for request in batch:
            request.result, request.error = None, failure
        try:
            self._on_rollback()
        except Exception as hook_exc:
            logger.opt(exception=hook_exc).error("reloading state after rollback failed: {}", hook_exc)

    def _start_checkpoint(self) -> None:
        """Checkpoint on a thread while batches go on; one at a time."""
        self._checkpointing = True
        self._batches_at_checkpoint = self.batches
        self._slow_work.spawn(self._checkpoint, "PASSIVE").rawlink(self._checkpoint_done)

    def _checkpoint_done(self, done) -> None:
        self._checkpointing = False
        self._restart_wal = True  # before the next batch: see _finish_checkpoint
        self._check_checkpoint(done.value, "PASSIVE")

    def _finish_checkpoint(self) -> None:
        """With batches paused, copy what the passive pass left and restart the WAL."""
        self._restart_wal = False
        self._check_checkpoint(self._slow_work.apply(self._checkpoint, ("RESTART",)), "RESTART")

    def _check_checkpoint(self, error: BaseException | None, mode: str) -> None:
        """On the event loop: a checkpoint that failed for want of space starts the disk-full mode."""
        if error is None:
            return
        if self.db.is_disk_full(error):
            self._on_disk_full(f"{mode} checkpoint", error)
        else:
            logger.opt(exception=error).error("{} checkpoint failed (will retry): {}", mode, error)

    def _checkpoint(self, mode: str) -> BaseException | None:
        """On a thread; returns the error (handled on the loop: see _check_checkpoint)."""
        try:
            self.db.checkpoint(mode)
        except Exception as exc:
            return exc
        return None
