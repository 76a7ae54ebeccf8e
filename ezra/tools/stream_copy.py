"""Streams over RESP for `ezra export` / `ezra import`: ids, pages, pipelined XADDs, verification.

Both directions use the same pieces on either end (EZRA and Redis answer these commands
alike): `stream_facts` and `stream_entries` read a stream, `CheckedPipeline` sends XADDs in
pipelines and checks every reply, `verify` walks the destination and counts the source's ids
in it, holding only those ids (`Ids`, 16 bytes each).
"""

from __future__ import annotations

import heapq
import json
from array import array
from typing import NamedTuple

from ..adapters.client import Client, ReplyError
from .inspector import printable
from ..lifecycle import DEFAULT_PRIORITY
from ..protocol.stream_ids import format_id  # noqa: F401  (move.py takes it from here too)

PAGE = 1000              # entries per read (XINFO TASKS, XRANGE, XPENDING, HSCAN)
BATCH = 500              # XADDs per pipeline...
BATCH_BYTES = 4 << 20    # ...or this many bytes of fields, whichever comes first
ZERO = (0, 0)


FAILURE_FIELDS = ((b"failure-cause", "cause"), (b"failure-reason", "reason"), (b"failure-worker", "worker"),
                  (b"failed-at", "at"))


class MoveError(Exception):
    """One queue cannot be moved (or did not verify); the others go on."""


class Task(NamedTuple):
    id: tuple       # (ms, seq)
    state: str      # EZRA's: available, delayed, in_flight, dead (import: also pending, done)
    attempts: int
    fields: list
    unique_key: bytes | None = None  # XADD UNIQUE's key (unfinished tasks only: a dead task holds none)
    failure: bytes | None = None  # its last failure, JSON as tasks.failure holds it (None: never failed)
    priority: int | None = None  # XADD PRIORITY's (None: pushed without one, the default)
    partition: bytes | None = None  # XADD PARTITION's key (None: none)
    progress: bytes | None = None  # XPROGRESS's last value (import: XADD PROGRESS; carried_outcomes.py)
    result: bytes | None = None  # a done task's result (import: XADD RESULT, a done task; carried_outcomes.py)
    after: list | None = None  # a waiting task's [(queue, id)] not done yet (XADD AFTER; None: none)
    name: bytes | None = None  # XADD NAME's (any state; import: XADD NAME, from q::ezra-names)


def parse_id(text: bytes) -> tuple:
    """A stream id as a pair of ints (Redis allows 64-bit parts; EZRA refuses what it cannot keep)."""
    ms, _, seq = text.partition(b"-")
    return int(ms), int(seq or 0)


def next_id(raw_id: bytes) -> bytes:
    """The id just after this one: the next page's inclusive start (Redis before 6.2 has no '(')."""
    ms, seq = parse_id(raw_id)
    return format_id((ms, seq + 1) if seq < 2 ** 64 - 1 else (ms + 1, 0))


def shown(name: bytes) -> str:
    return printable(name.decode("utf-8", "replace"))


def pairs(flat: list) -> dict:
    """A RESP2 flat map [k, v, k, v...] as a dict."""
    return dict(zip(flat[::2], flat[1::2]))


class Ids:
    """Stream ids in ascending order, 16 bytes each: what the verification looks for."""

    def __init__(self):
        self.ms, self.seq = array("Q"), array("Q")

    def add(self, stream_id: tuple) -> None:
        self.ms.append(stream_id[0])
        self.seq.append(stream_id[1])

    def __len__(self) -> int:
        return len(self.ms)

    def __iter__(self):
        return zip(self.ms, self.seq)


def stream_facts(client: Client, key: bytes, kinds: tuple = (b"stream",)) -> tuple[bytes, tuple]:
    """(TYPE of key, its last-generated id or 0-0); a key of another type is refused."""
    kind = client.call("TYPE", key)
    if kind not in (b"none", *kinds):
        raise MoveError(f"{shown(key)} is a {kind.decode()} at {client.address}, not a "
                        f"{' or '.join(k.decode() for k in kinds)}: not touching it")
    if kind != b"stream":
        return kind, ZERO
    return kind, parse_id(pairs(client.call("XINFO", "STREAM", key))[b"last-generated-id"])


def side_hash(redis: Client, key: bytes, value=int) -> dict:
    """{id: value} from an export's q::ezra-attempts (int), q::ezra-unique, q::ezra-names (bytes) or other hash
    (HSCAN: never one huge reply)."""
    found, cursor = {}, b"0"
    while True:
        cursor, flat = redis.call("HSCAN", key, cursor, "COUNT", PAGE)
        for raw_id, raw in pairs(flat).items():
            found[parse_id(raw_id)] = value(raw)
        if cursor == b"0":
            return found


def stream_entries(client: Client, key: bytes, low: tuple = ZERO, high: bytes = b"+"):
    """(id, fields) of a stream from `low` on, page by page (XRANGE, exclusive cursor)."""
    start = format_id(low)
    while True:
        page = client.call("XRANGE", key, start, high, "COUNT", PAGE)
        for raw_id, fields in page:
            yield parse_id(raw_id), fields
        if len(page) < PAGE:
            return
        start = next_id(page[-1][0])


def verify(client: Client, keys: list[bytes], expected: list[Ids]) -> tuple[int, int]:
    """(how many of the expected ids the destination streams hold, how many were expected).

    Both sides are walked in id order and matched like a merge, so memory holds only the
    expected ids (16 bytes each), never the destination's entries."""
    wanted = heapq.merge(*expected)
    total = sum(map(len, expected))
    if not total:
        return 0, 0
    low, high = min(next(iter(ids)) for ids in expected if len(ids)), max(
        (ids.ms[-1], ids.seq[-1]) for ids in expected if len(ids))
    there = heapq.merge(*((stream_id for stream_id, _ in stream_entries(client, key, low, format_id(high)))
                          for key in keys))
    found, want, have = 0, next(wanted, None), next(there, None)
    while want is not None and have is not None:
        if want == have:
            found, want, have = found + 1, next(wanted, None), next(there, None)
        elif want < have:
            want = next(wanted, None)
        else:
            have = next(there, None)
    return found, total


class CheckedPipeline:
    """XADDs (and their companion commands) sent in pipelines; every reply is checked."""

    def __init__(self, client: Client | None):
        self.client = client  # None: a dry run, nothing is sent
        self.commands, self.expected, self.size = [], [], 0

    def add(self, command: list, expected=None) -> None:
        """`expected`: the reply it must give (an XADD's id); None: any reply but an error."""
        if self.client is None:
            return
        self.commands.append(command)
        self.expected.append(expected)
        self.size += sum(len(arg) for arg in command if isinstance(arg, bytes))
        if len(self.commands) >= BATCH or self.size >= BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        commands, expected = self.commands, self.expected
        self.commands, self.expected, self.size = [], [], 0
        if not commands:
            return
        for command, want, reply in zip(commands, expected, self.client.pipeline(commands)):
            if isinstance(reply, ReplyError) or (want is not None and reply != want):
                what = " ".join(shown(arg) if isinstance(arg, bytes) else str(arg) for arg in command[:4])
                raise MoveError(f"{self.client.address} answered {what} ... with {reply}")


def report_verified(found: int, total: int, present: int, where: str) -> str:
    """'verified n of n in Redis', or MoveError saying what is missing and the likely reason."""
    if found == total:
        return f"verified {found} of {total} in {where}"
    hint = (f" ({present} were taken as already there, their ids being at or below the last id the stream "
            f"had: it holds entries that are not from this move, or they were deleted there since)"
            if present else "")
    raise MoveError(f"verification failed: {total - found} of {total} tasks are not in {where}{hint}")


def own_priority(priority: int | None) -> int | None:
    """XINFO TASKS shows the default priority of a task pushed without one: carried as none (None),
    so that it keeps the default where it goes."""
    return None if priority == DEFAULT_PRIORITY else priority


def failure_json(task: dict) -> bytes | None:
    """An XINFO TASKS task's failure-* fields as the JSON text tasks.failure holds (None: never failed)."""
    if task.get(b"failure-cause") is None:  # a server older than REASON has no such fields
        return None
    record = {key: task[field] for field, key in FAILURE_FIELDS}
    record = {key: value.decode("utf-8", "replace") if isinstance(value, bytes) else value
              for key, value in record.items()}
    return json.dumps(record, ensure_ascii=False).encode()
