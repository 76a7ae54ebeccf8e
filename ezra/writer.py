"""The single writer: every database operation goes through here, in order.

Greenlets `submit` a function; a committer greenlet takes everything queued so
far as one batch and runs it on a native thread inside one transaction (group
commit: one fsync for the whole batch), so the event loop keeps serving other
connections while SQLite works. Each caller then gets its function's result or
exception. Whatever is queued when `stop` is called is still committed and
answered.
"""

from __future__ import annotations

import gevent
from gevent.event import Event
from gevent.threadpool import ThreadPool
from loguru import logger

from . import errors
from .storage import Database


class Request:
    """One submitted function; `wait` returns its result or raises its error."""

    __slots__ = ("fn", "args", "result", "error", "done")

    def __init__(self, fn, args):
        self.fn = fn
        self.args = args
        self.result = None
        self.error: BaseException | None = None
        self.done = Event()

    def wait(self):
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


class Writer:
    """Owns the database connection; runs submitted functions in batches."""

    def __init__(self, db: Database, on_rollback=None, after_batch=None):
        self.db = db
        # Hooks for the broker: rebuild its caches on the writer thread after a
        # rollback; signal served blocked readers from the event loop after a batch.
        self._on_rollback = on_rollback or (lambda: None)
        self._after_batch = after_batch or (lambda ok: None)
        self._queue: list[Request] = []
        self._has_work = Event()
        self._stopping = False
        self._thread = ThreadPool(1)  # always the same native thread for SQLite
        self._committer = gevent.spawn(self._commit_loop)
        self.batches = 0
        self.committed_requests = 0

    def submit(self, fn, *args) -> Request:
        """Queue `fn(*args)` to run on the writer thread in the next batch."""
        if self._stopping:
            raise errors.err("server is shutting down")
        request = Request(fn, args)
        self._queue.append(request)
        self._has_work.set()
        return request

    def call(self, fn, *args):
        """Submit and wait: the result of `fn(*args)` once its batch committed."""
        return self.submit(fn, *args).wait()

    def pending(self) -> int:
        return len(self._queue)

    def stop(self) -> None:
        """Commit and answer everything queued, then stop the thread."""
        self._stopping = True
        self._has_work.set()
        self._committer.join()
        self._thread.kill()

    def _commit_loop(self) -> None:
        while True:
            self._has_work.wait()
            self._has_work.clear()
            batch, self._queue = self._queue, []
            if batch:
                ok = self._thread.apply(self._run_batch, (batch,))
                for request in batch:
                    request.done.set()
                self._after_batch(ok)
            elif self._stopping:
                return

    def _run_batch(self, batch: list[Request]) -> bool:
        """On the writer thread: run the batch in one transaction. False if rolled back."""
        db = self.db
        try:
            db.begin()
            for request in batch:
                try:
                    request.result = request.fn(*request.args)
                except errors.CommandError as exc:
                    request.error = exc  # validated before writing: nothing to undo
            db.commit()
        except Exception as exc:  # a storage failure (disk full, I/O error) or a bug
            logger.opt(exception=exc).error("batch of {} requests rolled back: {}", len(batch), exc)
            self._roll_back(batch, exc)
            return False
        self.batches += 1
        self.committed_requests += len(batch)
        return True

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
