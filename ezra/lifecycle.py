"""The task state machine: states, transitions, the attempts rule, backoff. No I/O (ids: stream_ids.py).

    [push] -> available -> in_flight (claim) -> done (ack)
    [push DELAY] -> delayed -> available    (due)
    [push AFTER] -> waiting -> available | delayed   (its last dependency done) ; -> dead (one died or went)
                           in_flight -> available | delayed   (nack, timeout, worker gone: attempts left;
                                                               delayed while the queue's backoff runs)
                           in_flight -> dead        (nack or timeout: no attempts left)
              dead -> available (requeue) ; done/dead -> purged (retention / TTL; done: trimming)
              available/delayed -> cancelled (XDEL: deleted, nobody held it)

    transition   from                 to                                  attempts
    push         -                    available | delayed | dead | done | waiting (dead: q::dead; done: RESULT; ezra import; waiting: AFTER)   0
    release      waiting              available | delayed (its last dependency done; delayed: its DELAY)   =
    orphan       waiting              dead (a dependency went dead or was deleted: the reason names it)   =
    promote      delayed              available (its time came)           =
    claim        available            in_flight | done (NOACK)            +1 (every delivery counts)
    claim own    in_flight            in_flight (lease renewed)           +1 (as Redis counts re-reads with id 0)
    renew        in_flight            in_flight (XCLAIM by the owner: a heartbeat)   =
    take over    in_flight | available  in_flight (XCLAIM/XAUTOCLAIM/CLAIM by another; XCLAIM FORCE)  +1
    ack          in_flight            done | - (deleted: retention 0, XACKDEL)   =
    fail         in_flight            available | delayed | dead          = (dead once attempts >= max)
    silent       in_flight            available                           -1 (the attempt is given back; no backoff)
    fatal        in_flight            dead                                =
    nack FORCE   available | delayed  available | delayed | dead (XNACK FORCE of a task nobody holds)   as fail
    expire       in_flight            = fail (a timeout is a failure nobody reported)
    release      in_flight            = fail (the worker's last connection closed)
    recover      in_flight            available (server restart, never dead)   =
    requeue      dead                 available | waiting (waiting: an orphan whose dependency is not done)   0
    cancel       available | delayed | waiting  - (XDEL, the dashboard's delete: nobody holds it)   -
    purge        done | dead          - (retention, TTL; done: trimming, XACKDEL; dead: XDEL on q::dead)

Every failure (fail, fatal, expire, release; XDEL of a task in flight and XGROUP DELCONSUMER
fail too) records why on the task, replacing the record before: `failure_record`'s cause,
reason, worker and time. A silent nack records only the REASON it is given. Push and ack never write it.

A paused queue (XCFGSET PAUSED 1) makes no claim and no take over; its other
transitions go on (push, promote, renew, ack, fail, expire, release, requeue, cancel).

A task's priority (XADD PRIORITY, 0 to 9) and partition (XADD PARTITION key) are set by its
push and never changed by a transition: a task keeps both through every move above (its row
keeps them: tasks.priority, tasks.partition_key).

Times are integer milliseconds since the epoch and always passed in (`now`),
so tests move time instead of waiting.
"""

from __future__ import annotations

AVAILABLE = "available"
DELAYED = "delayed"  # waits for its time (XADD DELAY, retry backoff), then becomes available
IN_FLIGHT = "in_flight"
DONE = "done"
DEAD = "dead"
# XADD AFTER: waits until every task it names is done (broker/dependencies.py); not claimable,
# in no available order. A state apart from STATES: replies that list the five states by name
# (XINFO QUEUES, INFO's counts) keep their shape; those that show it add it only when non-zero.
WAITING = "waiting"
STATES = (AVAILABLE, DELAYED, IN_FLIGHT, DONE, DEAD)
COUNTED = (*STATES, WAITING)  # every state a queue counts (QueueState.counts)
UNFINISHED = (AVAILABLE, DELAYED, IN_FLIGHT, WAITING)  # not done yet: what XLEN counts
GONE = None  # outside the queue: before its push, after its delete or purge

# The table above, executable: every change of a queue's state counts is one of these moves
# (QueueState.move, the one place counts change, refuses any other as a bug), and
# tests/test_house_shapes.py holds this to the drawing. A move within one state (a failure that
# leaves a forced task available) changes no count but is still one the machine knows.
MOVES = {
    (GONE, AVAILABLE): "push",
    (GONE, DELAYED): "push DELAY",
    (GONE, DEAD): "push to q::dead (ezra import)",
    (GONE, DONE): "push with RESULT (ezra import)",
    (DELAYED, AVAILABLE): "promote; nack FORCE",
    (AVAILABLE, IN_FLIGHT): "claim; take over (XCLAIM FORCE)",
    (AVAILABLE, DONE): "claim NOACK",
    (IN_FLIGHT, DONE): "ack",
    (IN_FLIGHT, GONE): "ack with retention 0; XACKDEL",
    (IN_FLIGHT, AVAILABLE): "fail; silent; expire; release; recover",
    (IN_FLIGHT, DELAYED): "fail (backoff)",
    (IN_FLIGHT, DEAD): "fail (no attempts left); fatal",
    (AVAILABLE, AVAILABLE): "nack FORCE",
    (AVAILABLE, DELAYED): "nack FORCE",
    (AVAILABLE, DEAD): "nack FORCE",
    (DELAYED, DELAYED): "nack FORCE",
    (DELAYED, DEAD): "nack FORCE",
    (DEAD, AVAILABLE): "requeue",
    (GONE, WAITING): "push AFTER",
    (WAITING, AVAILABLE): "release (its last dependency done)",
    (WAITING, DELAYED): "release (its DELAY not over)",
    (WAITING, DEAD): "orphan (a dependency dead or deleted)",
    (WAITING, GONE): "cancel (XDEL)",
    (DEAD, WAITING): "requeue (an orphan whose dependency is not done)",
    (AVAILABLE, GONE): "cancel (XDEL)",
    (DELAYED, GONE): "cancel (XDEL)",
    (DONE, GONE): "purge (retention, TTL); trim; XACKDEL",
    (DEAD, GONE): "purge (retention, TTL); XDEL on q::dead",
}

# XNACK modes (Redis 8.8 syntax): how a reported failure treats the attempt.
FAIL = "FAIL"
SILENT = "SILENT"
FATAL = "FATAL"
NACK_MODES = (FAIL, SILENT, FATAL)

# XADD PRIORITY p: p from PRIORITIES; a push without it has DEFAULT_PRIORITY (tasks.priority NULL),
# a middle value, so that callers can go either way.
PRIORITIES = range(10)
DEFAULT_PRIORITY = 5
MAX_PARTITION_KEY = 256  # bytes of an XADD PARTITION key: bounded as UNIQUE's and queue names are

DEAD_SUFFIX = "::dead"
_DEAD_SUFFIX = DEAD_SUFFIX.encode()  # split_queue runs on every queue command


def after_failure(attempts: int, max_attempts: int, mode: str = FAIL) -> tuple[str, int]:
    """New (state, attempts) of an in-flight task whose attempt failed."""
    if mode == FATAL:
        return DEAD, attempts
    if mode == SILENT:
        return AVAILABLE, max(attempts - 1, 0)
    return (DEAD if attempts >= max_attempts else AVAILABLE), attempts


# What made a task fail (the `cause` of its failure record).
NACKED = "nack"                 # XNACK
XDEL_REPORT = "xdel"            # XDEL on a live queue: EZRA's failure report
LEASE_EXPIRED = "lease expired"  # its visibility timeout ran out (the reaper)
WORKER_GONE = "worker gone"     # release on disconnect
CONSUMER_DELETED = "consumer deleted"  # XGROUP DELCONSUMER
MAX_REASON_BYTES = 8192  # a reason is kept up to this (UTF-8, the cut marker included)


def bound_reason(reason: bytes) -> str:
    """A reason as text of at most MAX_REASON_BYTES; a longer one is cut with a marker saying
    how long it was. Bytes that are not UTF-8 read as U+FFFD."""
    text = reason.decode("utf-8", "replace")
    encoded = text.encode()
    if len(encoded) <= MAX_REASON_BYTES:
        return text
    marker = f" … [cut, {len(reason)} bytes]"
    keep = encoded[:MAX_REASON_BYTES - len(marker.encode())]
    return keep.decode("utf-8", "ignore") + marker  # "ignore" drops only a character cut in two


def failure_record(cause: str, reason: str | None, worker: str | None, now: int) -> dict:
    """What a task keeps of its last failure (tasks.failure, XINFO TASKS' failure-* fields)."""
    return {"cause": cause, "reason": reason, "worker": worker, "at": now}


def retry_state(state: str, attempts: int, mode: str, backoff, now: int) -> tuple[str, int]:
    """(state, available_at) of a failed task after `after_failure`: a counted failure with
    attempts left waits out the queue's backoff (delayed), anything else is as decided."""
    if state != AVAILABLE or mode == SILENT:
        return state, now
    delay = retry_delay(backoff, attempts)
    return (DELAYED, due_after(now, to_ms(delay))) if delay > 0 else (AVAILABLE, now)


def due_after(now: int, delay_ms: int) -> int:
    """When a task held back `delay_ms` from `now` comes due (DELAY, backoff). The clock
    (broker/clock.py) rounds down, so up to 1 ms of `now` is already gone: due at now + delay, the
    task could come that much early. One more ms makes the delay a lower bound."""
    return now + delay_ms + 1


# Backoff policies: ('fixed', seconds, seconds) or ('exponential', base seconds, max seconds).
FIXED = "fixed"
EXPONENTIAL = "exponential"
NO_BACKOFF = (FIXED, 0.0, 0.0)


def retry_delay(backoff, attempts: int) -> float:
    """Seconds before a task that failed its `attempts`-th delivery is offered again."""
    kind, base, cap = backoff
    if kind == FIXED:
        return base
    return min(base * 2.0 ** min(max(attempts - 1, 0), 64), cap)


def lease_deadline(now: int, visibility_timeout_s: float) -> int:
    """When an in-flight task claimed at `now` is redelivered if not acked."""
    return now + int(visibility_timeout_s * 1000)


def to_ms(seconds: float) -> int:
    return round(seconds * 1000)


def idmp_auto_iid(fields: list[bytes]) -> bytes:
    """IDMPAUTO's idempotent id: a digest of the field/value pairs, in any order (as Redis 8.6)."""
    import hashlib  # here: it loads OpenSSL (3.4 MB), which a server that never sees IDMPAUTO need not hold
    pairs = sorted(zip(fields[::2], fields[1::2]))
    digest = hashlib.blake2b(digest_size=16)
    for name, value in pairs:
        digest.update(b"%d:%s%d:%s" % (len(name), name, len(value), value))
    return digest.digest()


def split_queue(name: bytes) -> tuple[bytes, bool]:
    """('q', True) for 'q::dead', the read-only view of q's dead tasks."""
    if name.endswith(_DEAD_SUFFIX) and len(name) > len(_DEAD_SUFFIX):
        return name[: -len(_DEAD_SUFFIX)], True
    return name, False
