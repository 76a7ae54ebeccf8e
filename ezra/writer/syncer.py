"""The fsync thread: while the disk is slow, batches' fsyncs leave the event loop.

The writer fsyncs the WAL inline while fsyncs are fast (writer.py says why);
while their moving average is slow it hands committed batches to this native
thread, which fsyncs and wakes the loop to set each batch's `synced`.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from gevent import get_hub
from loguru import logger

from .. import errors

if TYPE_CHECKING:
    from .batch import Batch


class Syncer:
    """A native thread that fsyncs the WAL for committed batches, while fsyncs are slow."""

    def __init__(self, sync_wal, observe):
        self._sync_wal = sync_wal
        self._observe = observe  # observe(seconds): counted on the event loop's side
        self._cond = threading.Condition()
        self._waiting: list[Batch] = []  # committed, not yet synced
        self._synced: list[tuple[list[Batch], float, OSError | None]] = []
        self._stopping = False
        self._wakeup = get_hub().loop.async_()
        self._wakeup.start(self._answer_synced)
        self._thread = threading.Thread(target=self._run, name="ezra-fsync", daemon=True)
        self._thread.start()

    def after_sync(self, batch: Batch) -> None:
        """Set the batch synced once the WAL is on disk."""
        with self._cond:
            self._waiting.append(batch)
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()
        self._answer_synced()
        self._wakeup.stop()
        self._wakeup.close()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._stopping:
                    self._cond.wait()
                if not self._waiting:
                    return
                batches, self._waiting = self._waiting, []
            error = None
            started = time.perf_counter()
            try:
                self._sync_wal()  # everything committed before this call is durable after it
            except OSError as exc:
                error = exc
            with self._cond:
                self._synced.append((batches, time.perf_counter() - started, error))
            self._wakeup.send()  # thread-safe: the event loop runs _answer_synced

    def _answer_synced(self) -> None:
        with self._cond:
            synced, self._synced = self._synced, []
        for batches, seconds, error in synced:
            self._observe(seconds)
            if error is not None:
                logger.error("fsync of the WAL failed, {} batches' durable replies fail: {}", len(batches), error)
            for batch in batches:
                if error is not None:
                    batch.sync_error = errors.storage_failed(f"fsync failed: {error}")
                batch.set_synced()
