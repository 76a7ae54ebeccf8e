"""XADD AFTER's dependencies across `ezra export` and `ezra import` (move.py).

Export copies a waiting task as an entry of stream q, as any unfinished task, and keeps what it
waits for (the tasks not done yet) in the hash q::ezra-after: id -> a JSON array of [queue, id]
pairs. Redis has no dependencies: its workers get such an entry at once. Import pushes an entry
of q that is new to the group (never delivered in Redis) and has a q::ezra-after value with
XADD AFTER, naming the tasks of that list that EZRA has; one it does not have (done in Redis, so
not copied, or in a queue not imported yet: import the dependencies' queues first, on the same
command line) counts as done, and the summary says how many did.
"""

from __future__ import annotations

import json

from ..adapters.client import Client
from .stream_copy import MoveError, format_id, parse_id, shown

AFTER_SUFFIX = b"::ezra-after"
DEAD_SUFFIX = b"::dead"


def after_text(after: list) -> bytes:
    """q::ezra-after's value: [[queue, id], ...] (queue names that are not UTF-8 kept as \\udcXX escapes)."""
    return json.dumps([[queue.decode("utf-8", "surrogateescape"), format_id(task_id).decode()]
                       for queue, task_id in after]).encode()


def after_of(raw: bytes) -> list[tuple[bytes, tuple]]:
    """q::ezra-after's value back as [(queue, id)]; MoveError if it is not one (nothing is copied then)."""
    try:
        pairs = json.loads(raw)
        return [(queue.encode("utf-8", "surrogateescape"), parse_id(task_id.encode())) for queue, task_id in pairs]
    except (ValueError, TypeError, AttributeError):
        raise MoveError(f"its {AFTER_SUFFIX.decode()} hash holds {shown(raw)!r}, not a JSON array of "
                        "[queue, id] pairs") from None


def keep_after(pipeline, queue: bytes, task, counts) -> None:
    """Export: a waiting task's dependencies into q::ezra-after, before its entry."""
    if task.after is not None:
        counts["waiting with dependencies"] += 1
        pipeline.add([b"HSET", queue + AFTER_SUFFIX, format_id(task.id), after_text(task.after)])


def waits_for(task: dict) -> list | None:
    """An XINFO TASKS map's `waits-for` (a waiting task's) as [(queue, id)], or None."""
    waits = task.get(b"waits-for")
    return None if waits is None else [(queue, parse_id(task_id)) for queue, task_id in waits]


def after_options(pipeline, task, counts) -> list:
    """Import: XADD's AFTER for a task with dependencies (those EZRA has), else []. The pipeline is
    sent first: a dependency may be among the XADDs not sent yet. A dry run (no client) counts them."""
    if not task.after or task.state != "available":  # delivered in Redis: it ran there
        return []
    pipeline.flush()
    ezra = pipeline.client
    named = [(queue, task_id) for queue, task_id in task.after if ezra is None or in_ezra(ezra, queue, task_id)]
    counts["waiting"] += 1
    counts["dependencies not in EZRA"] += len(task.after) - len(named)
    if not named:
        return []
    return [b"AFTER", b"%d" % len(named), *[part for queue, task_id in named for part in (queue, format_id(task_id))]]


def in_ezra(ezra: Client, queue: bytes, task_id: tuple) -> bool:
    """The task is in EZRA (live or dead)."""
    text = format_id(task_id)
    return any(ezra.call("XRANGE", key, text, text, "COUNT", 1) for key in (queue, queue + DEAD_SUFFIX))


def dependencies_line(queue: bytes, counts, exported: bool) -> str:
    """The summary's line on waiting tasks, if any moved."""
    if exported:
        n = counts["waiting with dependencies"]
        return "" if not n else (
            f"\n{shown(queue)}: {n} waiting task(s), their dependencies kept in {shown(queue + AFTER_SUFFIX)}; "
            "Redis has no dependencies and delivers them at once; `ezra import` restores them waiting")
    n = counts["waiting"]
    return "" if not n else (
        f"\n{shown(queue)}: {n} task(s) pushed with XADD AFTER from {shown(queue + AFTER_SUFFIX)}; "
        f"{counts['dependencies not in EZRA']} named task(s) not in EZRA (done in Redis, or in a queue not "
        "imported yet) counted as done")
