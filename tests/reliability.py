"""Helpers of the reliability campaign: a strict RESP reply parser, and the figures tests report.

The parser is independent of ezra/resp.py (it reads what a client reads) and
stricter than client libraries: every length, terminator and type byte is
checked, RESP3 types are refused on a RESP2 connection, and an error reply must
carry a prefix and a message.

`report(name, **figures)` writes build/reliability/<name>.json and prints one
line (shown with `pytest -s`): the README's reliability figures come from
these files, not from hand counting.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

REPORT_DIR = Path(__file__).resolve().parent.parent / "build" / "reliability"
INTEGER = re.compile(rb"-?\d+")
ERROR_TEXT = re.compile(rb"[A-Z][A-Z_]* \S")  # Redis's prefix (ERR, NOAUTH...), a space, a message
RESP3_ONLY = b"_,#(=%~|>!"
MAX_DEPTH = 64  # EZRA's deepest reply (XINFO STREAM FULL) is 6 levels


class Incomplete(Exception):
    """More bytes are needed to finish the reply."""


class Malformed(AssertionError):
    """Not a well-formed RESP reply."""


class Err:
    """An error reply."""

    __slots__ = ("message",)

    def __init__(self, message: bytes):
        self.message = message

    def __repr__(self):
        return f"Err({self.message!r})"


def _int(text: bytes, what: str) -> int:
    if not INTEGER.fullmatch(text):
        raise Malformed(f"{what} is not an integer: {text[:40]!r}")
    return int(text)


def parse_reply(buf: bytes, pos: int = 0, resp3: bool = True, depth: int = 0):
    """(value, next position) of the reply at buf[pos:]; Incomplete or Malformed otherwise."""
    if depth > MAX_DEPTH:
        raise Malformed("reply nested deeper than any EZRA reply")
    if pos >= len(buf):
        raise Incomplete()
    kind = buf[pos:pos + 1]
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise Incomplete()
    line, pos = buf[pos + 1:end], end + 2
    if kind in RESP3_ONLY and not resp3:
        raise Malformed(f"RESP3 type {kind!r} on a RESP2 connection")
    if b"\r" in line or b"\n" in line:
        raise Malformed(f"bare CR or LF in a {kind!r} line")
    if kind == b"+":
        return line, pos
    if kind == b"-":
        if not ERROR_TEXT.match(line):
            raise Malformed(f"error without a prefix and a message: {line[:80]!r}")
        return Err(line), pos
    if kind == b":":
        value = _int(line, "integer")
        if not -2 ** 63 <= value < 2 ** 63:
            raise Malformed(f"integer reply wider than 64 bits: {value}")  # clients refuse it
        return value, pos
    if kind == b"(":
        return _int(line, "big number"), pos
    if kind == b"_":
        if line:
            raise Malformed(f"null with content {line!r}")
        return None, pos
    if kind == b"#":
        if line not in (b"t", b"f"):
            raise Malformed(f"boolean {line!r}")
        return line == b"t", pos
    if kind == b",":
        try:
            return float(line), pos
        except ValueError:
            raise Malformed(f"double {line!r}") from None
    if kind in (b"$", b"=", b"!"):
        size = _int(line, "bulk length")
        if size == -1 and kind == b"$":
            return None, pos
        if size < 0:
            raise Malformed(f"negative bulk length {size}")
        if len(buf) < pos + size + 2:
            raise Incomplete()
        if buf[pos + size:pos + size + 2] != b"\r\n":
            raise Malformed("bulk string not terminated by CRLF")
        data = buf[pos:pos + size]
        if kind == b"=" and data[3:4] != b":":
            raise Malformed(f"verbatim string without its format: {data[:8]!r}")
        if kind == b"!":
            return Err(data), pos + size + 2
        return data, pos + size + 2
    if kind in (b"*", b"~", b">", b"%", b"|"):
        count = _int(line, "aggregate length")
        if count == -1 and kind == b"*":
            return None, pos
        if count < 0:
            raise Malformed(f"negative aggregate length {count}")
        items = []
        for _ in range(count * 2 if kind in b"%|" else count):
            item, pos = parse_reply(buf, pos, resp3, depth + 1)
            items.append(item)
        if kind in b"%|":
            return list(zip(items[::2], items[1::2])), pos
        return items, pos
    raise Malformed(f"unknown reply type {kind!r}")


def parse_all(buf: bytes, resp3: bool = False) -> tuple[list, bytes]:
    """Every complete reply in buf, and the bytes left over (an unfinished reply)."""
    replies, pos = [], 0
    while pos < len(buf):
        try:
            reply, pos = parse_reply(buf, pos, resp3)
        except Incomplete:
            break
        replies.append(reply)
    return replies, buf[pos:]


def errors_in(value) -> list[Err]:
    """Every error reply in value, nested ones included."""
    if isinstance(value, Err):
        return [value]
    if isinstance(value, (list, tuple)):
        return [e for item in value for e in errors_in(item)]
    return []


def report(name: str, **figures) -> None:
    """Record a test's figures in build/reliability/<name>.json and print them on one line."""
    REPORT_DIR.mkdir(parents=True, exist_ok=True)
    figures = {"test": name, "finished": time.strftime("%Y-%m-%d %H:%M:%S"), **figures}
    (REPORT_DIR / f"{name}.json").write_text(json.dumps(figures, indent=1) + "\n")
    print(f"\nreliability {name}: " + ", ".join(f"{k}={v}" for k, v in figures.items() if k != "test"))
