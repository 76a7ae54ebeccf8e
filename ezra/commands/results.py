"""A task as its producer sees it (EZRA's): XRESULT and XPROGRESS. XACK's RESULT is XACK's
(queue.py); the broker's side is broker/results.py.

    XRESULT queue id [BLOCK ms]   a map: state, result, progress, attempts, failure-reason;
                                  BLOCK waits until the task is done or dead (or the time is up)
    XRESULT queue NAME name [BLOCK ms]   the same, for the task pushed with XADD ... NAME name
    XPROGRESS queue id value      OK: progress of a task in flight, and a heartbeat of its lease
"""

from __future__ import annotations

from .. import errors, lifecycle
from ..protocol import stream_ids
from ..protocol.resp import OK
from ..storage import decode_failure, name_bytes
from .args import block_timeout, broker_of, live_queue
from .table import Block, Deferred, command

ENDED = (lifecycle.DONE, lifecycle.DEAD)  # what XRESULT BLOCK waits for


@command("XRESULT", -3, blocks=True)
def xresult(session, args):
    """XRESULT queue <id | NAME name> [BLOCK ms]: the task's state, result, progress, attempts and last
    failure's reason; with BLOCK, once it is done or dead, or the time is up (BLOCK 0: for ever).
    A name is read as the task's id once, here: the wait is the id's."""
    queue, results = live_queue(args[1]), broker_of(session).results
    if args[2].upper() == b"NAME":  # (an id is digits: never the word)
        if len(args) not in (4, 6):
            raise errors.SYNTAX
        task_id = results.named(queue, args[3]).result  # in this turn's batch: its result is there at once
        args = args[:2] + args[3:]
    else:
        task_id = stream_ids.parse_id(args[2])
    if len(args) == 3:
        return Deferred(results.outcome(queue, task_id), outcome_reply)
    if len(args) != 5 or args[3].upper() != b"BLOCK":
        raise errors.SYNTAX
    block_ms = block_timeout(args[4])
    # The first look, in this turn's batch (its result is there at once, as a claim's): a task that
    # has ended is answered with the pipeline's other replies after their commit, so a pipeline of
    # XRESULT BLOCKs shares one (measured: one batch each cost 88 µs of CPU a task in bench.py's
    # results row). One not ended yet is waited for: OutcomeWait looks again once it is watched.
    looked = results.outcome(queue, task_id)
    if looked.result[0] in ENDED:
        return Deferred(looked, outcome_reply)
    return OutcomeWait(results, queue, task_id, block_ms)


class OutcomeWait(Block):
    """XRESULT BLOCK: an Observer of the task (broker/observers.py), registered before the first look, woken after the
    commit of the batch that ends it; whatever the wait's end, the answer is the task as it is then."""

    __slots__ = ("results", "queue", "task_id", "observer", "event")

    def __init__(self, results, queue: bytes, task_id: tuple, block_ms: int):
        super().__init__(block_ms)
        self.results, self.queue, self.task_id = results, queue, task_id
        self.observer = None

    def without_waiting(self):
        return Deferred(self.results.outcome(self.queue, self.task_id), outcome_reply)

    def start(self):
        self.observer = self.results.watch(self.queue, self.task_id)
        self.event = self.observer.event
        return self.look(ended_only=True)

    def woken(self, outcome):
        if outcome and not self.observer.cancelled:
            self.event.clear()  # before the look: a commit after this sets it again
            return self.look(ended_only=True)  # None: a rolled-back end, wait again
        return self.look(ended_only=False)  # timed out, hung up, or the server is stopping

    def look(self, ended_only: bool):
        found = self.results.outcome(self.queue, self.task_id).wait()
        return outcome_reply(found) if not ended_only or found[0] in ENDED else None

    def end(self):
        if self.observer is not None:
            self.results.unwatch(self.observer)


def outcome_reply(found: tuple) -> dict:
    """XRESULT's map (a flat list of names and values in RESP2); states as XINFO TASKS' words. A task
    pushed with XADD ... NAME has its `name` last (a task without one: the map as it was before names)."""
    state, attempts, failure, result, progress, name = found
    failure = decode_failure(failure)
    reply = {"state": state.replace("_", "-"),
             "result": None if result is None else bytes(result),
             "progress": None if progress is None else bytes(progress),
             "attempts": attempts,
             "failure-reason": None if failure is None else failure.get("reason")}
    if name is not None:
        reply["name"] = name_bytes(name)
    return reply


@command("XPROGRESS", 4)
def xprogress(session, args):
    """XPROGRESS queue id value: records progress (at most 8 KB) of a task in flight, and renews its
    lease as its owner's XCLAIM does (a heartbeat); an error for a task not in flight."""
    queue, task_id, progress = live_queue(args[1]), stream_ids.parse_id(args[2]), args[3]
    if len(progress) > errors.MAX_PROGRESS_BYTES:
        raise errors.progress_too_large(len(progress))
    return Deferred(broker_of(session).results.report_progress(queue, task_id, progress), lambda _: OK)
