"""Dramatiq's results on EZRA: `Results(backend=EzraBackend(url="redis://host:port"))`.

Each message's result key has a slot, a task of the results queue (ezra/adapters/result_slots.py;
the queue is the backend's namespace, `dramatiq-results`):

    store_result / store_exception    the slot acked with RESULT <the encoded result>, its TTL
                                      the actor's result_ttl (when the store makes the slot)
    get_result(block=False)           XRESULT: ResultMissing until the slot is done
    get_result(block=True, timeout)   XRESULT BLOCK (no polling), ResultTimeout after `timeout` ms
"""

from __future__ import annotations

from dramatiq.results import ResultMissing, ResultTimeout
from dramatiq.results.backend import DEFAULT_TIMEOUT, Missing, ResultBackend

from .result_slots import ResultSlots

DEFAULT_TTL = 600.0  # s: a slot made by a reader first lives as long as Dramatiq's default result_ttl


class EzraBackend(ResultBackend):
    """A Results middleware backend keeping results in EZRA (url as redis-py's: redis://, rediss://)."""

    def __init__(self, *, url: str = "redis://127.0.0.1:42002", namespace: str = "dramatiq-results",
                 encoder=None, ttl: float = DEFAULT_TTL, **client_options):
        super().__init__(namespace=namespace, encoder=encoder)
        self.slots = ResultSlots.from_url(url, namespace, ttl, **client_options)

    def get_result(self, message, *, block: bool = False, timeout: int | None = None):
        timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        outcome = self.slots.outcome(self.build_message_key(message), block, timeout / 1000)
        if outcome.state == b"done" and outcome.result is not None:
            return self.unwrap_result(self.encoder.decode(outcome.result))
        raise (ResultTimeout if block else ResultMissing)(message)

    def _get(self, message_key: str):
        outcome = self.slots.outcome(message_key)
        if outcome.state == b"done" and outcome.result is not None:
            return self.encoder.decode(outcome.result)
        return Missing

    def _store(self, message_key: str, result, ttl: int) -> None:
        self.slots.store(message_key, self.encoder.encode(result), ttl / 1000)
