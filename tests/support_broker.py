"""Tests that drive a Broker in-process, as the command handlers do: a push is a run of one
(Tasks.push takes a list), an ack answers each id's count, a claim is a Claim."""

from __future__ import annotations

from ezra.broker.tasks import Push
from ezra.broker.waiters import Claim


def push_one(broker, queue: bytes, fields: bytes, **options) -> bytes:
    """Push one task (its fields as stored; `options` as Push's) and wait: its id."""
    push = Push(fields, **options) if options else fields
    (task_id,) = broker.tasks.push(queue, [push]).wait()
    if isinstance(task_id, Exception):
        raise task_id
    return task_id


def claim_committed(broker, queues: list[bytes], worker: bytes, count: int, noack: bool = False,
                    claim_idle: int | None = None) -> dict | None:
    """XREADGROUP '>' without waiting, answered once committed: what it claimed, or None."""
    request = broker.claim(Claim(queues, worker, count, noack, claim_idle))
    return None if request is None else request.wait()


def acked(broker, queue: bytes, ids: list[tuple]) -> int:
    """XACK's reply: how many of the ids were in flight and are done now."""
    return sum(broker.tasks.ack(queue, ids).wait())
