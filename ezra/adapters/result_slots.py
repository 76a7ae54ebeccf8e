"""Result slots: the frameworks' result backends keep their results in EZRA, as tasks of a
results queue, one task per framework task id (a "slot").

A framework's result API is keyed by its own task id (a Celery uuid, a Dramatiq message key, a
taskiq id), not by EZRA's stream id, and its worker stores a result apart from the ack of the
task's message (Celery acks before running unless acks_late). So each result gets a task of its
own in the results queue:

    the slot's id        XADD <results> NAME <framework id> [TTL s] * id <framework id>
                         (get-or-create: a push whose name is taken answers that task's id; a
                         blocking reader and the writer both call it, whoever comes first makes
                         the slot, an available task that no worker reads)
    the final result     MULTI; XCLAIM <results> results <me> 0 <slot> FORCE JUSTID;
                         XACK <results> results <slot> RESULT <value>; EXEC
                         (one transaction: the slot is done with its value, or untouched)
    a passing state      MULTI; XCLAIM ... FORCE JUSTID; XPROGRESS <results> <slot> <value>;
                         XNACK <results> results SILENT IDS 1 <slot>; EXEC
                         (Celery's STARTED / RETRY: kept as the slot's progress, no attempt counted)
    a look at it         XRESULT <results> NAME <framework id>: no slot yet answers an error
                         (MISSING), and makes none
    waiting for it       XRESULT <results> <slot> BLOCK <ms>: woken by the commit of the XACK

A framework id finds its slot for as long as the slot's row exists, however long and however many
results: the name goes with the row, when the slot's TTL (when given) or the queue's retention
removes it and its result.
"""

from __future__ import annotations

import logging
import socket
import os
import time
import uuid
from urllib.parse import unquote, urlsplit

import redis

logger = logging.getLogger("ezra.results")

GROUP = "results"           # accepted and ignored by EZRA (one implicit group per queue)
MAX_PROGRESS = 8 * 1024     # XPROGRESS's cap
BLOCK_CHUNK = 30.0          # one XRESULT BLOCK waits at most this (the socket's timeout is bounded)
READ_MARGIN = 10.0          # the socket timeout is the block plus this
DEFAULT_PORT = 42002
ENDED = (b"done", b"dead")


def connection_params(url: str) -> dict:
    """redis-py's arguments for ezra://[user:password@]host[:port] (ezras://: TLS)."""
    parts = urlsplit(url)
    params = {"host": parts.hostname or "127.0.0.1", "port": parts.port or DEFAULT_PORT,
              "password": unquote(parts.password) if parts.password else None,
              "username": unquote(parts.username) if parts.username else None,
              "socket_timeout": BLOCK_CHUNK + READ_MARGIN, "socket_connect_timeout": 10}
    if parts.scheme in ("ezras", "rediss"):
        params["ssl"] = True
    return params


class Outcome:
    """XRESULT's answer for a slot: state (bytes, b"missing" when there is no slot), result, progress."""

    def __init__(self, state: bytes, result: bytes | None = None, progress: bytes | None = None,
                 failure: bytes | None = None):
        self.state, self.result, self.progress, self.failure = state, result, progress, failure

    @property
    def ended(self) -> bool:
        return self.state in ENDED


MISSING = Outcome(b"missing")


class ResultSlots:
    """The slots of one results queue, over one redis-py client (thread-safe: a connection pool)."""

    def __init__(self, client: redis.Redis, queue: str, ttl: float | None = None):
        self.client, self.queue = client, queue
        self.ttl = None if not ttl or ttl <= 0 else max(1, round(ttl))
        self.worker = f"results-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    @classmethod
    def from_url(cls, url: str, queue: str, ttl: float | None = None, **params) -> "ResultSlots":
        return cls(redis.Redis(**dict(connection_params(url), **params)), queue, ttl)

    def slot(self, key: str, ttl: float | None = None) -> bytes:
        """The id of `key`'s slot, made (available, read by nobody) if it is not there yet, with
        `ttl` seconds (default: the instance's) to live; an existing slot keeps its own."""
        return self.client.execute_command(*self._slot_command(key, ttl))

    def slots(self, keys: list[str]) -> list[bytes]:
        """slot() of each key, in one pipeline (a chord's header: 1,000 slots one round trip each
        took 0.42 s)."""
        with self.client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.execute_command(*self._slot_command(key, None))
            return pipe.execute()

    def _slot_command(self, key: str, ttl: float | None) -> list:
        ttl = self.ttl if ttl is None else max(1, round(ttl))
        ttl = [] if ttl is None else ["TTL", ttl]
        return ["XADD", self.queue, "NAME", key, *ttl, "*", "id", key]

    def store(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        """The final result: the slot done with `value`. False if it was done already (kept as it was)."""
        slot = self.slot(key, ttl)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.xclaim(self.queue, GROUP, self.worker, 0, [slot], force=True, justid=True)
            pipe.execute_command("XACK", self.queue, GROUP, slot, "RESULT", value)
            acked = pipe.execute()[-1]
        if not acked:
            logger.warning("the result of %r was not stored: its slot %s in %r has a result already",
                           key, slot.decode(), self.queue)
        return bool(acked)

    def store_passing(self, key: str, value: bytes) -> None:
        """A state on the way (started, retrying): the slot's progress, the slot still waiting."""
        slot = self.slot(key)
        if len(value) > MAX_PROGRESS:
            logger.warning("the state of %r is %d bytes, over XPROGRESS's %d: not recorded",
                           key, len(value), MAX_PROGRESS)
            return
        with self.client.pipeline(transaction=True) as pipe:
            pipe.xclaim(self.queue, GROUP, self.worker, 0, [slot], force=True, justid=True)
            pipe.execute_command("XPROGRESS", self.queue, slot, value)
            pipe.execute_command("XNACK", self.queue, GROUP, "SILENT", "IDS", 1, slot)
            try:
                pipe.execute()
            except redis.ResponseError as exc:  # done already: a late STARTED changes nothing
                logger.info("the state of %r was not recorded: %s", key, exc)

    def outcome(self, key: str, block: bool = False, timeout: float | None = None) -> Outcome:
        """The slot's outcome now (MISSING if there is none: the look makes no slot), or with `block`
        once it ended or `timeout` seconds (None: for ever) are up (the wait makes the slot, so that
        the store's ack wakes it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        slot = self.slot(key) if block else None
        while True:
            wait = BLOCK_CHUNK if deadline is None else min(BLOCK_CHUNK, deadline - time.monotonic())
            command = ["XRESULT", self.queue, slot] if slot is not None else ["XRESULT", self.queue, "NAME", key]
            if block and wait > 0:
                command += ["BLOCK", max(1, int(wait * 1000))]
            try:
                reply = self.client.execute_command(*command)
            except redis.ResponseError as exc:
                if "no such" in str(exc) or "no task named" in str(exc):  # none yet, or removed (TTL): as if never stored
                    return MISSING
                raise
            fields = dict(zip(reply[::2], reply[1::2])) if isinstance(reply, list) else reply
            outcome = Outcome(fields[b"state"], fields.get(b"result"), fields.get(b"progress"),
                              fields.get(b"failure-reason"))
            # one BLOCK is at most BLOCK_CHUNK (the socket's timeout): wait again until the deadline
            if outcome.ended or command[-2] != "BLOCK" or (deadline is not None and time.monotonic() >= deadline):
                return outcome

    def close(self) -> None:
        self.client.close()
