"""Celery's results on EZRA: `result_backend = "ezra://host:port"` (with `import ezra.celery`), or
`"ezra.celery:ResultBackend+ezra://host:port"` with no import.

Each Celery task id has a slot, a task of the results queue (ezra/adapters/result_slots.py):

    store_result(SUCCESS | FAILURE | REVOKED)    the slot acked with RESULT <Celery's meta, encoded>
    store_result(STARTED | RETRY | custom)       the slot's progress (XPROGRESS), still waiting
    AsyncResult.state                           XRESULT: done -> the meta's state; waiting with
                                                progress -> its state; waiting -> PENDING; dead ->
                                                FAILURE; no slot (expired) -> PENDING
    AsyncResult.get(timeout)                    XRESULT BLOCK: woken by the commit of the result
    result_expires                              the slot's TTL, from when its result is stored (the
                                                slot is found by its name, XADD NAME, while it exists)
    chords                                      Celery's chord_unlock task, pushed once with XADD
                                                AFTER on the header's slots when the broker is this
                                                EZRA (ezra/adapters/celery_chords.py); else Celery's
                                                fallback (it checks the header, retrying each second)

The results queue is `celery-results`, or result_backend_transport_options={"queue": ...}.
"""

from __future__ import annotations

from celery import states
from celery.backends.base import BaseBackend
from celery.exceptions import TimeoutError as CeleryTimeout
from kombu.utils.encoding import bytes_to_str

from .celery_chords import unlock_after
from .result_slots import ResultSlots

DEFAULT_QUEUE = "celery-results"


class ResultBackend(BaseBackend):
    """Celery's result backend over XACK RESULT / XPROGRESS / XRESULT on a results queue."""

    supports_native_join = False
    supports_autoexpire = True
    persistent = True

    def __init__(self, app, url=None, **kwargs):
        super().__init__(app, url=url, **kwargs)
        options = dict(app.conf.get("result_backend_transport_options") or {})
        url = url or app.conf.result_backend
        if "+" in url.split("://", 1)[0]:
            url = url.split("+", 1)[1]
        self.slots = ResultSlots.from_url(url, options.get("queue", DEFAULT_QUEUE), self.expires)

    def as_uri(self, include_password=False):
        return self.url if include_password or "@" not in (self.url or "") else "ezra://**@" + self.url.split("@", 1)[1]

    def _store_result(self, task_id, result, state, traceback=None, request=None, **kwargs):
        meta = self._get_result_meta(result=result, state=state, traceback=traceback, request=request)
        meta["task_id"] = bytes_to_str(task_id)
        value = self.encode(meta)
        value = value if isinstance(value, bytes) else value.encode()
        if state in states.READY_STATES:
            self.slots.store(task_id, value)
        else:
            self.slots.store_passing(task_id, value)
        return result

    def _get_task_meta_for(self, task_id, block=False, timeout=None):
        outcome = self.slots.outcome(task_id, block, timeout)
        if outcome.state == b"done" and outcome.result is not None:
            return self.decode_result(outcome.result)
        if outcome.state == b"dead":  # a slot is read by no worker: only a hand could kill it
            reason = (outcome.failure or b"the result's slot is dead").decode(errors="replace")
            return self.meta_from_decoded({"task_id": task_id, "status": states.FAILURE, "result":
                                           self.prepare_exception(RuntimeError(reason)), "traceback": None,
                                           "children": [], "date_done": None})
        if outcome.progress is not None:
            return self.decode_result(outcome.progress)
        return {"task_id": task_id, "status": states.PENDING, "result": None, "traceback": None,
                "children": [], "date_done": None}

    def apply_chord(self, header_result_args, body, **kwargs):
        """The chord's unlock task pushed once, waiting (XADD AFTER) for the header's results when
        the broker is this EZRA; else Celery's fallback, the unlock task retrying each second."""
        self.ensure_chords_allowed()
        header_result = self.app.GroupResult(*header_result_args)
        if not unlock_after(self, header_result, body, **kwargs):
            self.fallback_chord_unlock(header_result, body, **kwargs)

    def wait_for(self, task_id, timeout=None, interval=0.5, no_ack=True, on_interval=None):
        """XRESULT BLOCK until the slot is done (no polling); TimeoutError after `timeout` s."""
        self._ensure_not_eager()
        meta = self._get_task_meta_for(task_id, block=True, timeout=timeout)
        if meta["status"] not in states.READY_STATES:
            raise CeleryTimeout("The operation timed out.")
        if on_interval:
            on_interval()
        return meta

    def _forget(self, task_id):
        raise NotImplementedError("forget() is not supported on EZRA: a result goes with its TTL "
                                  "(result_expires); docs/celery.md")

    def cleanup(self):
        """Nothing to do: each result's TTL removes it (celery.backend_cleanup calls this daily)."""
