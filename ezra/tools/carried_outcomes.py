"""Results and progress across `ezra export` and `ezra import` (move.py does the rest).

    EZRA queue q                          Redis
    a task's progress (XPROGRESS)    ->   hash q::ezra-progress: id -> value (every task that has one)
    a done task with a result        ->   entry of stream q::ezra-done (its id and fields) and
                                          hash q::ezra-results: id -> result (XACK ... RESULT's)

Redis does nothing with them: no worker reads q::ezra-done (it has no group), and a Redis worker
neither reports progress nor keeps results. `ezra import` brings them back: each task whose id is
in q::ezra-progress is pushed with XADD ... PROGRESS, and each entry of q::ezra-done that has a
result as a done task with it (XADD ... RESULT), in id order among the queue's other tasks. The
summary lines count both.
"""

from __future__ import annotations

import heapq
from collections import Counter

from ..adapters.client import Client, ReplyError
from ..protocol.task_fields import listed
from ..storage import name_bytes
from .stream_copy import (PAGE, ZERO, CheckedPipeline, Task, format_id, pairs, shown, side_hash, stream_entries,
                          stream_facts)

PROGRESS_SUFFIX = b"::ezra-progress"
RESULTS_SUFFIX = b"::ezra-results"
DONE_SUFFIX = b"::ezra-done"
DEAD_SUFFIX = b"::dead"


# ---------------------------------------------------------------- export: EZRA -> Redis

def export_outcomes(source, redis: Client, queue: bytes, dry_run: bool, names_key: bytes) -> Counter:
    """Copy the queue's progress values and done tasks' results (and those tasks' names, XADD NAME's, to
    `names_key`: move.py carries the other tasks'); counts of "progress" and "results"."""
    done_key, results_key, progress_key = queue + DONE_SUFFIX, queue + RESULTS_SUFFIX, queue + PROGRESS_SUFFIX
    last_done = stream_facts(redis, done_key)[1]
    for key in (results_key, progress_key):
        stream_facts(redis, key, kinds=(b"hash",))
    pipeline, counts = CheckedPipeline(None if dry_run else redis), Counter()
    for page in outcome_pages(source, queue):
        for task_id, state, fields, result, progress, name in page:
            if progress is not None:
                counts["progress"] += 1
                pipeline.add([b"HSET", progress_key, format_id(task_id), progress])
            if state == "done" and result is not None:
                counts["results"] += 1
                if task_id > last_done:  # explicit ids: Redis has it from an earlier run
                    pipeline.add([b"HSET", results_key, format_id(task_id), result])  # before its entry
                    if name is not None:
                        pipeline.add([b"HSET", names_key, format_id(task_id), name])
                    pipeline.add([b"XADD", done_key, format_id(task_id), *fields], expected=format_id(task_id))
        pipeline.flush()
    return counts


def outcome_pages(source, queue: bytes):
    """Pages of (id, state, fields, result, progress, name) of the queue's tasks that have a result or a
    progress: from the file (FileSource: one query a page), or through the port (PortSource:
    XRANGE of the queue and of its dead view, an XRESULT of each entry, pipelined)."""
    snapshot = getattr(source, "snapshot", None)
    if snapshot is not None:
        after = ZERO
        while True:
            rows = snapshot.outcomes_after(queue, PAGE, after)
            yield [((ms, seq), state, listed(fields), result, progress, None if name is None else name_bytes(name))
                   for ms, seq, state, fields, result, progress, name in rows]
            if len(rows) < PAGE:
                return
            after = rows[-1][:2]
    client, page = source.client, []
    for key in (queue, queue + DEAD_SUFFIX):
        for task_id, fields in stream_entries(client, key):
            page.append((task_id, fields))
            if len(page) == PAGE:
                yield with_outcome(client, queue, page)
                page = []
    yield with_outcome(client, queue, page)


def with_outcome(client: Client, queue: bytes, entries: list) -> list:
    """Those of the (id, fields) entries that have a result or a progress, as outcome_pages gives them."""
    if not entries:
        return []
    replies = client.pipeline([[b"XRESULT", queue, format_id(task_id)] for task_id, _ in entries])
    found = []
    for (task_id, fields), reply in zip(entries, replies):
        if isinstance(reply, ReplyError):  # removed since the XRANGE (retention, TTL): nothing to carry
            continue
        outcome = pairs(reply)
        if outcome[b"result"] is not None or outcome[b"progress"] is not None:
            state = outcome[b"state"].decode().replace("-", "_")
            found.append((task_id, state, fields, outcome[b"result"], outcome[b"progress"], outcome.get(b"name")))
    return found


# ---------------------------------------------------------------- import: Redis -> EZRA

def with_outcomes(redis: Client, queue: bytes, tasks, counts: Counter, names: dict | None = None):
    """The queue's tasks (move.redis_tasks, in id order) with their progress from q::ezra-progress, and
    the done tasks of q::ezra-done that have a result in q::ezra-results merged in by id (state
    "result": pushed done, with it, and its name from `names`, q::ezra-names). `counts` gets "progress" and
    "results"."""
    progress, results = (side_hash(redis, queue + suffix, bytes)
                         if stream_facts(redis, queue + suffix, kinds=(b"hash",))[0] == b"hash" else {}
                         for suffix in (PROGRESS_SUFFIX, RESULTS_SUFFIX))
    stream_facts(redis, queue + DONE_SUFFIX)
    names = names or {}
    done = (Task(task_id, "result", 0, fields, result=results[task_id], name=names.get(task_id))
            for task_id, fields in stream_entries(redis, queue + DONE_SUFFIX) if task_id in results)
    for task in heapq.merge(tasks, done, key=lambda task: task.id):
        if task.id in progress and task.state != "done":  # done in Redis: not copied
            task = task._replace(progress=progress[task.id])
            counts["progress"] += 1
        counts["results"] += task.state == "result"
        yield task


def carried_options(task: Task) -> list:
    """XADD's options for a task's progress and result (a done task), if it has them."""
    options = [] if task.progress is None else [b"PROGRESS", task.progress]
    return options if task.result is None else options + [b"RESULT", task.result]


def outcomes_line(queue: bytes, counts: Counter, verb: str, where: str) -> str:
    """The summary's line on the results and progress values carried, if any."""
    if not counts["results"] and not counts["progress"]:
        return ""
    return (f"\n{shown(queue)}: {counts['results']} done task(s) with a result and {counts['progress']} "
            f"progress value(s) {verb} {where}")
