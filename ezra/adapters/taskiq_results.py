"""taskiq's results on EZRA: `broker.with_result_backend(EzraResultBackend("redis://host:port"))`.

Each task id has a slot, a task of the results queue (ezra/adapters/result_slots.py; the queue is
`taskiq-results`):

    set_result                 the slot acked with RESULT <TaskiqResult, serialized (JSON)>
    is_result_ready            XRESULT: the slot is done
    get_result                 XRESULT; ResultGetError if there is none yet
    set_progress / get_progress  the slot's progress (XPROGRESS), while it waits
    wait(task_id, timeout)     XRESULT BLOCK: woken by the commit of the result (taskiq's own
                               task.wait_result() asks is_result_ready every check_interval)

The calls run redis-py's blocking client in a thread (asyncio.to_thread): a slot is two round
trips, and a BLOCK must not hold the event loop.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from taskiq import AsyncResultBackend
from taskiq.abc.serializer import TaskiqSerializer
from taskiq.depends.progress_tracker import TaskProgress
from taskiq.exceptions import ResultGetError, TaskiqResultTimeoutError
from taskiq.result import TaskiqResult
from taskiq.serializers import JSONSerializer

from .result_slots import ResultSlots

_ReturnType = TypeVar("_ReturnType")


class EzraResultBackend(AsyncResultBackend[_ReturnType]):
    """Results in EZRA; `result_ttl` (s): how long a result is kept (None: until removed by hand)."""

    def __init__(self, url: str = "redis://127.0.0.1:42002", queue: str = "taskiq-results",
                 result_ttl: float | None = 86400, serializer: TaskiqSerializer | None = None,
                 **client_options):
        self.slots = ResultSlots.from_url(url, queue, result_ttl, **client_options)
        self.serializer = serializer or JSONSerializer()

    async def shutdown(self) -> None:
        await asyncio.to_thread(self.slots.close)

    async def set_result(self, task_id: str, result: TaskiqResult[_ReturnType]) -> None:
        value = self.serializer.dumpb(result.model_dump(mode="json"))
        await asyncio.to_thread(self.slots.store, task_id, value)

    async def is_result_ready(self, task_id: str) -> bool:
        outcome = await asyncio.to_thread(self.slots.outcome, task_id)
        return outcome.state == b"done" and outcome.result is not None

    async def get_result(self, task_id: str, with_logs: bool = False) -> TaskiqResult[_ReturnType]:
        outcome = await asyncio.to_thread(self.slots.outcome, task_id)
        return self._result(task_id, outcome)

    async def wait(self, task_id: str, timeout: float | None = None) -> TaskiqResult[_ReturnType]:
        """The result once it is stored (XRESULT BLOCK); TaskiqResultTimeoutError after `timeout` s."""
        outcome = await asyncio.to_thread(self.slots.outcome, task_id, True, timeout)
        if outcome.state != b"done" or outcome.result is None:
            raise TaskiqResultTimeoutError(timeout=timeout)
        return self._result(task_id, outcome)

    def _result(self, task_id: str, outcome) -> TaskiqResult[_ReturnType]:
        if outcome.state != b"done" or outcome.result is None:
            raise ResultGetError()  # taskiq-redis raises it so for a result not there yet
        return TaskiqResult[_ReturnType].model_validate(self.serializer.loadb(outcome.result))

    async def set_progress(self, task_id: str, progress: TaskProgress[Any]) -> None:
        value = self.serializer.dumpb(progress.model_dump(mode="json"))
        await asyncio.to_thread(self.slots.store_passing, task_id, value)

    async def get_progress(self, task_id: str) -> TaskProgress[Any] | None:
        outcome = await asyncio.to_thread(self.slots.outcome, task_id)
        if outcome.progress is None:
            return None
        return TaskProgress[Any].model_validate(self.serializer.loadb(outcome.progress))
