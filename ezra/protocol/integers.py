"""Integers in command arguments, read exactly as Redis reads them (util.c).

`to_int64` is Redis's string2ll, which every count, option and setting goes through
(getLongLongFromObject): an optional '-', then "0" alone or digits without a leading
zero; no '+', no spaces, no '_', nothing after; within signed 64 bits. Python's int()
reads "+5", " 5", "1_0" and "05" too, and Redis refuses each of them.

`to_uint64` is Redis's string2ull, which reads each part of a stream id
(streamGenericParseIDOrReply): string2ll first, refusing what is negative; failing
that, C's strtoull in base 10, which skips leading spaces, takes a '+' or a '-' (a
'-' wraps around 2**64, as C does) and leading zeros, and must reach the end of the
text. So an id part may be "05", "+5" or " 5" where a count may not: Redis's own
inconsistency, kept so both servers answer alike.

Both raise ValueError on a refused text. `to_int` is the one reader of the commands' counts,
options and settings (commands/, options.py's values, trimming.py, queue_settings.py): to_int64,
a refused text answered with the command's error (Redis's "not an integer" unless it says another).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from .. import errors

INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1
UINT64_MAX = 2 ** 64 - 1

_STRING2LL = re.compile(rb"0|-?[1-9][0-9]{0,18}").fullmatch  # 19 digits at most: above is out of range
_STRTOULL = re.compile(rb"[ \t\n\v\f\r]*([+-]?)([0-9]+)").fullmatch


def to_int64(text: bytes) -> int:
    """A signed 64-bit integer by Redis's string2ll rules, else ValueError."""
    if text.isdigit() and len(text) < 19 and (text[0] != 48 or len(text) == 1):  # 48: '0'
        return int(text)  # the common case: up to 18 digits, no leading zero (bytes' isdigit is ASCII)
    return string2ll(text)


def string2ll(text: bytes) -> int:
    """to_int64 by the rules themselves, for any text (the fast paths above give the same)."""
    if _STRING2LL(text) is None:
        raise ValueError(text)
    value = int(text)
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(text)
    return value


def to_int(arg: bytes, error: Callable[[], errors.CommandError] = errors.NOT_INTEGER) -> int:
    """A signed 64-bit integer, as Redis reads one (to_int64: no '+', '_', spaces or leading
    zeros; anything wider is out of range, and SQLite's too).

    `error`: what builds the error (a class of errors.py, or a function calling one), only when
    the argument is bad."""
    if arg.isdigit() and len(arg) < 19 and (arg[0] != 48 or len(arg) == 1):
        return int(arg)  # to_int64's common case, inlined: one call less per count (COUNT 1, BLOCK 1000)
    try:
        return to_int64(arg)
    except ValueError:
        raise error() from None


def to_uint64(text: bytes) -> int:
    """An unsigned 64-bit integer by Redis's string2ull rules (a stream id's part), else ValueError."""
    if text.isdigit() and len(text) < 20:
        return int(text)  # digits alone, under 2**64 (strtoull reads leading zeros as int() does)
    return string2ull(text)


def string2ull(text: bytes) -> int:
    """to_uint64 by the rules themselves, for any text (the fast path above gives the same)."""
    text = text.split(b"\0", 1)[0]  # Redis reads the part as a C string: it ends at a NUL
    try:
        value = string2ll(text)
    except ValueError:
        value = None
    if value is not None:
        if value < 0:
            raise ValueError(text)
        return value
    match = _STRTOULL(text)
    if match is None:
        raise ValueError(text)
    sign, digits = match.groups()
    magnitude = int(digits.lstrip(b"0") or b"0")
    if magnitude > UINT64_MAX:
        raise ValueError(text)  # strtoull's ERANGE
    return (-magnitude) % 2 ** 64 if sign == b"-" else magnitude
