"""Celery's chords on EZRA's dependencies: the chord's unlock task is pushed once, waiting with
XADD AFTER on the header tasks' result slots, so it runs when the last header result is stored.

    chord(header)(body)      ResultBackend.apply_chord (ezra/adapters/celery_results.py), before
                             Celery sends the header: the slot of each header task (slots.slots(ids),
                             get-or-create, pipelined: a header already done counts at once), then Celery's own
                             fallback_chord_unlock (its routing, queue and priority) with no countdown,
                             the slots in CHORD_SLOTS while it publishes
    before_task_publish      ask_for_after: celery.chord_unlock published with CHORD_SLOTS set gets
                             the message property AFTER_PROPERTY = [[results queue, slot], ...]
    the transport's _put     after_option: XADD <queue> AFTER n <results queue> <slot> ... * payload ...
                             (the property is taken out: the stored message does not carry it)
    the last header stored   its XACK ... RESULT releases the unlock task in the same transaction;
                             chord_unlock finds the whole header ready on its first run and sends
                             the body with the header's results, or runs Celery's chord error path
                             (the body's result FAILURE with a ChordError naming the failed header)

chord_unlock still checks the header's states itself: AFTER only decides when it first runs, so a
release that came too early would fall back to Celery's retries, never to a wrong body.

Only when the broker is EZRA at the same host and port as the results, and the header has at most
MAX_AFTER tasks; otherwise Celery's fallback (chord_unlock retrying itself every second). No
Celery import here: the transport imports after_option without Celery.
"""

from __future__ import annotations

import contextvars
from urllib.parse import urlsplit

AFTER_PROPERTY = "ezra_after"   # the message property the transport maps to XADD AFTER
UNLOCK_TASK = "celery.chord_unlock"
MAX_AFTER = 10_000              # XADD AFTER's most (ezra/commands/push.py)
DEFAULT_PORT = 42002
EZRA_SCHEMES = ("ezra", "ezras")

# the [queue, slot] pairs of the chord whose unlock task is being published in this context
CHORD_SLOTS: contextvars.ContextVar[list | None] = contextvars.ContextVar("ezra_chord_slots", default=None)


def after_option(message: dict) -> list:
    """XADD's `AFTER n queue id ...` for a message whose properties ask for it (taken out of them)."""
    properties = message.get("properties")
    pairs = properties.pop(AFTER_PROPERTY, None) if properties else None
    if not pairs:
        return []
    return ["AFTER", len(pairs), *(part for pair in pairs for part in pair)]


def ask_for_after(sender=None, properties=None, **_) -> None:
    """Celery's before_task_publish: the chord's unlock task, published by unlock_after, asks the
    transport for AFTER on the header's slots (nothing else does)."""
    pairs = CHORD_SLOTS.get()
    if pairs and properties is not None and sender == UNLOCK_TASK:
        properties[AFTER_PROPERTY] = pairs


def server_of(url: str) -> tuple[str, int] | None:
    """(host, port) of an ezra:// URL (localhost read as 127.0.0.1), None for any other URL."""
    if not url or ";" in url:  # a failover list: not one server
        return None
    parts = urlsplit(url.split("+", 1)[1] if "+" in url.split("://", 1)[0] else url)
    host = parts.hostname or "127.0.0.1"
    return ("127.0.0.1" if host == "localhost" else host), parts.port or DEFAULT_PORT


def broker_is(app, results_url: str) -> bool:
    """The app's broker is EZRA, the same server (host and port) as the results."""
    conf = app.conf
    url = str(conf.broker_write_url or conf.broker_url or "")
    on_ezra = url.split("://", 1)[0] in EZRA_SCHEMES or conf.broker_transport == "ezra.celery:Transport"
    return on_ezra and server_of(url) is not None and server_of(url) == server_of(results_url)


def header_ids(results) -> list[str]:
    """The Celery ids whose results make the header ready: each task's, each nested group's tasks'."""
    ids = []
    for result in results:
        inner = getattr(result, "results", None)  # a GroupResult in the header: ready when all its are
        ids += header_ids(inner) if inner is not None else [result.id]
    return ids


def unlock_after(backend, header_result, body, **kwargs) -> bool:
    """Publish the chord's unlock task waiting for the header's slots (True), or do nothing (False:
    the broker is not this EZRA, or the header is wider than AFTER takes)."""
    if not broker_is(backend.app, backend.url or backend.app.conf.result_backend or ""):
        return False
    ids = list(dict.fromkeys(header_ids(header_result.results)))
    if not ids or len(ids) > MAX_AFTER:
        return False
    slots = backend.slots
    pairs = [[slots.queue, slot.decode()] for slot in slots.slots(ids)]
    token = CHORD_SLOTS.set(pairs)
    try:
        backend.fallback_chord_unlock(header_result, body, **dict(kwargs, countdown=0))
    finally:
        CHORD_SLOTS.reset(token)
    return True
