"""The stream-id grammar: parse, format, compare and step ids, as Redis reads them. No I/O.

    ms-seq    an id: two unsigned parts (Redis: 64-bit; EZRA stores up to 2**63-1, SQLite's integers)
    ms        the same as ms-0 (a range end: ms-<highest>)
    *  ms-*   XADD: a new id, above the queue's last one (new_id)
    - +       XRANGE's lowest and highest; (id an exclusive bound (parse_range_bound)
    $         XREAD: entries added after the call (SINCE_NOW); + the newest entry (LAST_ONE)
    >         XREADGROUP: tasks never delivered (NEW_TASKS)

lifecycle.py is the state machine; what an id means to a queue (its last id, the next one
to deliver) is the broker's.
"""

from __future__ import annotations

import re

from .. import errors
from .integers import to_uint64

MAX_ID_PART = 2 ** 63 - 1  # SQLite integers are signed 64-bit; Redis allows 2**64-1
TOP = (MAX_ID_PART, MAX_ID_PART)  # the largest id EZRA stores: ranges "to the end" end there
REDIS_MAX_ID_PART = 2 ** 64 - 1
ABOVE_ALL = (MAX_ID_PART + 1, 0)  # a range start above every id EZRA can store: the range is empty
MAX_ID_TEXT = 127  # Redis copies an id into a 128-byte buffer: a longer text is no id

StreamId = tuple  # (ms, seq)
# XREAD's special ids, resolved per queue in the transaction of its first look (broker/observers.py).
SINCE_NOW = "$"  # entries added after the call: above the queue's last id
LAST_ONE = "+"   # the view's newest entry, then what comes after it (Redis 7.4)
NEW_TASKS = None  # XREADGROUP's '>': tasks never delivered (else its id: the worker's own after it)


def group_start_id(arg: bytes):
    """XGROUP CREATE's and SETID's id: '$' (SINCE_NOW) or an id in Redis's 64-bit space (checked:
    EZRA's one implicit group starts nowhere else than at its queue's tasks)."""
    return SINCE_NOW if arg == b"$" else parse_id_parts(arg, 0)


def xread_id(arg: bytes):
    """XREAD's id: '$' (entries added after the call), '+' (the last entry, Redis 7.4), an id."""
    if arg == b"$":
        return SINCE_NOW
    if arg == b"+":
        return LAST_ONE
    if arg == b">":
        raise errors.GT_IN_XREAD
    return parse_after_id(arg)


def xreadgroup_id(arg: bytes):
    """XREADGROUP's id: NEW_TASKS for '>', else the id after which to re-read the worker's own."""
    if arg == b">":
        return NEW_TASKS
    if arg == b"$":
        raise errors.DOLLAR_IN_XREADGROUP
    return parse_id(arg)


def format_id(stream_id: StreamId) -> bytes:
    return b"%d-%d" % stream_id


def parse_id(arg: bytes, missing_seq: int = 0) -> StreamId:
    """'5-3' -> (5, 3); '5' -> (5, missing_seq). Raises the Redis id error, also for parts
    Redis accepts but EZRA cannot store (above 2**63-1: SQLite's integers are signed)."""
    ms, sep, seq = arg.partition(b"-")
    # The ids clients send back (XACK's): digits, each part under 19 of them, so below 2**63 and
    # read by strtoull as int() reads them; anything else takes Redis's rules below. Under 20
    # bytes in all, both parts are (the usual id, `1796319258949-0`: no length taken of each).
    if sep and len(arg) < 20 and ms.isdigit() and seq.isdigit():
        return int(ms), int(seq)
    if ms.isdigit() and len(ms) < 19 and (not sep or (seq.isdigit() and len(seq) < 19)):
        return int(ms), int(seq) if sep else missing_seq
    stream_id = parse_id_parts(arg, missing_seq)
    if stream_id[0] > MAX_ID_PART or stream_id[1] > MAX_ID_PART:
        raise errors.INVALID_ID
    return stream_id


def parse_ids(args: list[bytes]) -> list[StreamId]:
    """[parse_id(arg) for arg in args]; the ids of an XACK of many (as workers ack a batch), when
    each is as clients send them back, checked by one match and read in C: no step per id."""
    if len(args) > 2:
        joined = b" ".join(args)
        if _PLAIN_IDS(joined) is not None:
            parts = list(map(int, joined.replace(b"-", b" ").split()))
            if len(parts) == 2 * len(args):  # no argument held a space of its own
                return list(zip(parts[::2], parts[1::2]))
    return [parse_id(arg) for arg in args]


# ids parse_id's fast path reads (two parts of digits, each under 19 of them), space-separated
_PLAIN_IDS = re.compile(rb"[0-9]{1,18}-[0-9]{1,18}(?: [0-9]{1,18}-[0-9]{1,18})*").fullmatch


def parse_id_parts(arg: bytes, missing_seq: int) -> StreamId:
    """An id's two parts as Redis reads them (streamGenericParseIDOrReply): at most 127 bytes,
    split at the first '-', each part by string2ull's rules (integers.to_uint64, up to 2**64-1)."""
    ms, sep, seq = arg.partition(b"-")
    try:
        if len(arg) > MAX_ID_TEXT:
            raise ValueError(arg)
        return to_uint64(ms), to_uint64(seq) if sep else missing_seq
    except ValueError:
        raise errors.INVALID_ID from None


def parse_after_id(arg: bytes) -> StreamId:
    """An id to read after (XREAD): as parse_id, but ids beyond EZRA's 63-bit parts, up to
    Redis's 2**64-1, read as the highest EZRA has: no task is above either."""
    return last_stored_at_or_below(parse_id_parts(arg, 0))


def parse_range_bound(arg: bytes, is_start: bool) -> StreamId:
    """An XRANGE bound: '-', '+', an id, or '(id' (exclusive), as an inclusive id EZRA can store.

    The bound is read and moved past (exclusive) in Redis's 64-bit id space, so every id
    Redis takes is taken (18446744073709551615-18446744073709551615 too), then brought into
    EZRA's: a start to the first id at or above it that EZRA can hold (ABOVE_ALL if none:
    the range is empty), an end to the last at or below it."""
    if arg == b"-":
        return (0, 0)
    if arg == b"+":
        return (MAX_ID_PART, MAX_ID_PART)
    exclusive = len(arg) > 1 and arg.startswith(b"(")
    if exclusive:
        arg = arg[1:]  # '(-' and '(+' are refused as parse_id_parts reads them: no digits
    stream_id = parse_id_parts(arg, 0 if is_start else REDIS_MAX_ID_PART)
    if exclusive:
        stream_id = _next_id(stream_id) if is_start else _previous_id(stream_id, REDIS_MAX_ID_PART)
    return first_stored_at_or_above(stream_id) if is_start else last_stored_at_or_below(stream_id)


def first_stored_at_or_above(stream_id: StreamId) -> StreamId:
    ms, seq = stream_id
    if seq > MAX_ID_PART:
        ms, seq = ms + 1, 0
    return (ms, seq) if ms <= MAX_ID_PART else ABOVE_ALL


def last_stored_at_or_below(stream_id: StreamId) -> StreamId:
    ms, seq = stream_id
    if ms > MAX_ID_PART:
        return (MAX_ID_PART, MAX_ID_PART)
    return ms, min(seq, MAX_ID_PART)


def _next_id(stream_id: StreamId, limit: int = REDIS_MAX_ID_PART) -> StreamId:
    ms, seq = stream_id
    if seq < limit:
        return (ms, seq + 1)
    if ms < limit:
        return (ms + 1, 0)
    raise errors.START_ID_INVALID


def previous_id(stream_id: StreamId) -> StreamId:
    """The id just below `stream_id` among those EZRA stores; 0-0 has none."""
    return _previous_id(stream_id, MAX_ID_PART)


def _previous_id(stream_id: StreamId, limit: int) -> StreamId:
    ms, seq = stream_id
    if seq > 0:
        return (ms, seq - 1)
    if ms > 0:
        return (ms - 1, limit)
    raise errors.END_ID_INVALID


def push_id(arg: bytes) -> tuple | None:
    """XADD's id, read once, as the push's Push holds it: None for '*' (a new id), (ms, None) for
    'ms-*', (ms, seq) for an explicit id ('ms' is ms-0); Redis's id error when malformed."""
    if arg == b"*":
        return None
    ms_part, sep, seq_part = arg.partition(b"-")
    if sep and seq_part == b"*":
        return parse_id(ms_part)[0], None
    return parse_id(arg)


def new_id(requested: tuple | None, last: StreamId, now: int) -> StreamId:
    """The id of a pushed task, strictly above `last`: a new one (None), or as push_id read it."""
    if requested is None:
        if now > last[0]:
            return (now, 0)
        return _next_id_or_error(last)
    ms, seq = requested
    if seq is None:  # 'ms-*'
        if ms > last[0]:
            return (ms, 0)
        if ms < last[0]:
            raise errors.ID_TOO_SMALL
        return _next_id_or_error(last)
    if requested == (0, 0):
        raise errors.ID_ZERO
    if requested <= last:
        raise errors.ID_TOO_SMALL
    return requested


def new_ids(n: int, last: StreamId, now: int) -> tuple[int, range] | None:
    """The ids of `n` pushes of '*' after `last`, as n calls of new_id give them when they share
    one ms: (that ms, their seqs), at once; None when the seqs would run past their largest."""
    ms, seq = (now, -1) if now > last[0] else last
    if seq + n > MAX_ID_PART:
        return None
    return ms, range(seq + 1, seq + 1 + n)


def _next_id_or_error(last: StreamId) -> StreamId:
    try:
        return _next_id(last, MAX_ID_PART)
    except errors.CommandError:
        raise errors.IDS_EXHAUSTED from None
