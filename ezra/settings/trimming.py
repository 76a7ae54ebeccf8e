"""XADD's and XTRIM's trimming arguments, `MAXLEN|MINID [~|=] threshold [LIMIT count]`.

Parsed as Redis 7 parses them (t_stream.c: the same words, order and error texts), then
EZRA's rule: trimming removes DONE tasks only, lowest ids first, never an available,
delayed, in-flight or dead one (that is reaper.Reaper.trim_done).

- Approximate (`~`) trimming promises only that at least `threshold` entries stay
  (MAXLEN) or that entries below the id may stay (MINID), so removing finished work only
  keeps that promise. The entries counted by MAXLEN are the queue's stream entries as
  XRANGE shows them: available, delayed, in-flight and done tasks (dead ones live in
  `q::dead`). Like Redis's (which frees whole nodes of 100 entries), MAXLEN ~ n lets a
  queue run a little over n (`slack`) and then trims it back to n in one go.
- Exact trimming (`MAXLEN n`, `MAXLEN = n`, `MINID id`, `MINID = id`) promises that
  nothing above the threshold stays, which would mean dropping unfinished work. It is
  refused, by XADD and XTRIM alike, with one error that says to use `~`; no library
  sends it by default (docs/usage.md lists what they send).
- LIMIT caps the tasks one call removes. Without it, one call removes at most
  DEFAULT_LIMIT (as the reaper's purge batch); LIMIT 0 (Redis: no cap) and larger
  LIMITs are held to MAX_LIMIT (Redis's own cap of its default), so one XADD never does
  unbounded work. XTRIM's reply says how many went: call it again for more.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import errors
from ..protocol.integers import to_int
from ..protocol.stream_ids import MAX_ID_PART, StreamId, parse_id_parts
from .options import Custom, Flag

MAXLEN = "MAXLEN"
MINID = "MINID"
DEFAULT_LIMIT = 1000
MAX_LIMIT = 10000
NODE_ENTRIES = 100  # Redis's stream-node-max-entries: how far over n its approximate trims leave a stream


@dataclass(frozen=True)
class Trim:
    """An approximate trim: remove done tasks while MAXLEN's count is above `threshold`,
    or those with ids below it (MINID); at most `limit` of them."""

    strategy: str
    threshold: int | StreamId
    limit: int


class TrimArgs:
    """Collects the trimming words of one XADD or XTRIM, in any order among its options."""

    def __init__(self, command: str):
        self.command = command  # "xadd" or "xtrim": XTRIM must name a strategy
        self.strategy: str | None = None
        self.approximate = False
        self.threshold: int | StreamId | None = None
        self.limit: int | None = None

    def take(self, args: list[bytes], i: int) -> int | None:
        """Parse the trimming option at args[i] (one value at least follows it); the index after
        it, or None if args[i] is not one."""
        option = args[i].upper()
        if option in (b"MAXLEN", b"MINID"):
            if self.strategy is not None:
                raise errors.TRIM_STRATEGIES_BOTH
            i += 1
            self.approximate = False
            if i + 1 < len(args) and args[i] in (b"~", b"="):  # a modifier only if a value follows
                self.approximate, i = args[i] == b"~", i + 1
            if option == b"MAXLEN":
                self.strategy, self.threshold = MAXLEN, _maxlen(args[i])
            else:
                self.strategy, self.threshold = MINID, _min_id(args[i])
            return i + 1
        if option == b"LIMIT":
            self.limit = _count(args[i + 1], errors.LIMIT_NEGATIVE)
            return i + 2
        return None

    def check(self) -> None:
        """Redis's checks once every option is read: LIMIT needs a strategy and `~`."""
        if self.limit and self.strategy is None:
            raise errors.LIMIT_WITHOUT_STRATEGY
        if self.command == "xtrim" and self.strategy is None:
            raise errors.XTRIM_WITHOUT_STRATEGY
        if self.limit is not None and not self.approximate:
            raise errors.LIMIT_WITHOUT_TILDE

    def trim(self) -> Trim | None:
        """The approximate trim to run (None without MAXLEN/MINID); exact trimming is refused."""
        if self.strategy is None:
            return None
        if not self.approximate:
            raise errors.EXACT_TRIM_REFUSED
        limit = DEFAULT_LIMIT if self.limit is None else min(self.limit or MAX_LIMIT, MAX_LIMIT)
        return Trim(self.strategy, self.threshold, limit)


def slack(maxlen: int) -> int:
    """How far over MAXLEN ~ n a queue may be before a trim runs: a tenth of n, at most
    NODE_ENTRIES. Redis trims whole nodes of 100 entries, so its streams hover between n and
    n + 100; here one statement then removes many done tasks instead of one per push (which
    cost a producer sending MAXLEN ~ on every push about half again its time per push)."""
    return min(maxlen // 10, NODE_ENTRIES)


def _count(arg: bytes, negative) -> int:
    """A signed 64-bit integer as Redis reads one (integers.to_int), that must not be negative."""
    value = to_int(arg)
    if value < 0:
        raise negative
    return value


def _maxlen(arg: bytes) -> int:
    return _count(arg, errors.MAXLEN_NEGATIVE)


def _min_id(arg: bytes) -> StreamId:
    """MINID's id, strict as Redis reads it ('5' is 5-0; no '-', '+' or '5-*'). Parts above what
    SQLite holds are clamped: every id EZRA can store is below them."""
    if arg in (b"-", b"+"):
        raise errors.INVALID_ID
    ms, seq = parse_id_parts(arg, 0)
    return min(ms, MAX_ID_PART), min(seq, MAX_ID_PART)


# The option parser's side (options.py): XADD's and XTRIM's trimming words.

def take_trimming(command: str):
    """MAXLEN, MINID and LIMIT fill one TrimArgs (trimming.py), made at the first of them."""
    def take(args: list[bytes], i: int, trimming: TrimArgs | None):
        if trimming is None:
            trimming = TrimArgs(command)
        return trimming, trimming.take(args, i)
    return Custom(take)


# Redis 8.2's reference policies for trimming: EZRA trims only acked (done) tasks, which is
# what ACKED asks, and a done task has no pending reference to keep or drop.
REFERENCES = Flag()
