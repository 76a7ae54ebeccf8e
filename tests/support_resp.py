"""RESP on the wire, for the tests that read bytes rather than a client's objects: the one
reply parser of the suite, a raw TCP connection, and the commands' encoding.

The parser is independent of ezra/protocol/resp.py (it reads what a client reads) and stricter than
client libraries: every length, terminator and type byte is checked, RESP3 types are refused
on a RESP2 connection when asked, and an error reply must carry a prefix and a message.
`parse_reply` keeps each reply's type byte (the vector harness compares shapes with Redis's);
`parse_value` gives the plain values a client sees (the fuzzers check those).
"""

from __future__ import annotations

import re
import socket
from typing import NamedTuple

INTEGER = re.compile(rb"-?\d+")
ERROR_TEXT = re.compile(rb"[A-Z][A-Z_]* \S")  # Redis's prefix (ERR, NOAUTH...), a space, a message
LINE_TYPES = "+-:_,#("
BLOB_TYPES = "$=!"
AGGREGATE_TYPES = "*~>"
MAP_TYPES = "%|"  # a map, and an attribute (a map of metadata before a reply)
RESP3_ONLY = "_,#(=%~|>!"
MAX_DEPTH = 64  # EZRA's deepest reply (XINFO STREAM FULL) is 6 levels


def raw(text: str) -> bytes:
    """Vector text (latin-1) to the bytes on the wire."""
    return text.encode("latin-1")


class Incomplete(Exception):
    """The buffer ends before the reply does: read more."""


class Malformed(AssertionError):
    """Not a well-formed RESP reply."""


class Reply(NamedTuple):
    """One parsed RESP2/RESP3 reply.

    `kind` is the type byte ('+', '$', '*', '%', ...); `value` is the line or blob
    (bytes), None for any null, a tuple of Reply for arrays, sets and pushes, and
    a tuple of (key, value) pairs for maps and attributes.
    """

    kind: str
    value: object


class Err:
    """An error reply, as a plain value."""

    __slots__ = ("message",)

    def __init__(self, message: bytes):
        self.message = message

    def __repr__(self):
        return f"Err({self.message!r})"


def _int(text: bytes, what: str) -> int:
    if not INTEGER.fullmatch(text):
        raise Malformed(f"{what} is not an integer: {text[:40]!r}")
    return int(text)


def _check_line(kind: str, line: bytes) -> None:
    if b"\r" in line or b"\n" in line:
        raise Malformed(f"bare CR or LF in a {kind!r} line")
    if kind == "-" and not ERROR_TEXT.match(line):
        raise Malformed(f"error without a prefix and a message: {line[:80]!r}")
    if kind == ":" and not -2 ** 63 <= _int(line, "integer") < 2 ** 63:
        raise Malformed(f"integer reply wider than 64 bits: {line!r}")  # clients refuse it
    if kind == "(":
        _int(line, "big number")
    if kind == "_" and line:
        raise Malformed(f"null with content {line!r}")
    if kind == "#" and line not in (b"t", b"f"):
        raise Malformed(f"boolean {line!r}")
    if kind == ",":
        try:
            float(line)
        except ValueError:
            raise Malformed(f"double {line!r}") from None


def parse_reply(buf: bytes, pos: int = 0, resp3: bool = True, depth: int = 0) -> tuple[Reply, int]:
    """The reply starting at `pos` and the position after it; Incomplete if cut short,
    Malformed if it is not RESP (or is RESP3 and `resp3` is false)."""
    if depth > MAX_DEPTH:
        raise Malformed("reply nested deeper than any EZRA reply")
    if pos >= len(buf):
        raise Incomplete
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise Incomplete
    kind, line, pos = chr(buf[pos]), buf[pos + 1:end], end + 2
    if kind in RESP3_ONLY and not resp3:
        raise Malformed(f"RESP3 type {kind!r} on a RESP2 connection")
    if kind in LINE_TYPES:
        _check_line(kind, line)
        return Reply(kind, None if kind == "_" else line), pos
    if kind in BLOB_TYPES:
        size = _int(line, "bulk length")
        if size == -1 and kind == "$":
            return Reply(kind, None), pos
        if size < 0:
            raise Malformed(f"negative bulk length {size}")
        if len(buf) < pos + size + 2:
            raise Incomplete
        if buf[pos + size:pos + size + 2] != b"\r\n":
            raise Malformed(f"blob not terminated by CRLF in {buf[:200]!r}")
        data = buf[pos:pos + size]
        if kind == "=" and data[3:4] != b":":
            raise Malformed(f"verbatim string without its format: {data[:8]!r}")
        return Reply(kind, data), pos + size + 2
    if kind in AGGREGATE_TYPES or kind in MAP_TYPES:
        count = _int(line, "aggregate length")
        if count == -1 and kind == "*":
            return Reply(kind, None), pos
        if count < 0:
            raise Malformed(f"negative aggregate length {count}")
        items = []
        for _ in range(2 * count if kind in MAP_TYPES else count):
            item, pos = parse_reply(buf, pos, resp3, depth + 1)
            items.append(item)
        if kind in MAP_TYPES:
            items = zip(items[::2], items[1::2])
        return Reply(kind, tuple(items)), pos
    raise Malformed(f"not a RESP reply type {kind!r} in {buf[:200]!r}")


def plain(reply: Reply):
    """The value a client sees: bytes, int, float, bool or None; Err for an error; a list for
    an array, set or push; a list of (key, value) pairs for a map or attribute."""
    kind, value = reply
    if value is None:
        return None
    if kind in "-!":
        return Err(value)
    if kind in ":(":
        return int(value)
    if kind == "#":
        return value == b"t"
    if kind == ",":
        return float(value)
    if kind in AGGREGATE_TYPES:
        return [plain(item) for item in value]
    if kind in MAP_TYPES:
        return [(plain(key), plain(item)) for key, item in value]
    return value


def parse_value(buf: bytes, pos: int = 0, resp3: bool = True) -> tuple[object, int]:
    """(plain value, next position) of the reply at buf[pos:], as parse_reply checks it."""
    reply, pos = parse_reply(buf, pos, resp3)
    return plain(reply), pos


def parse_all(buf: bytes, resp3: bool = False) -> tuple[list, bytes]:
    """Every complete reply in buf as plain values, and the bytes left over (an unfinished reply)."""
    replies, pos = [], 0
    while pos < len(buf):
        try:
            reply, pos = parse_value(buf, pos, resp3)
        except Incomplete:
            break
        replies.append(reply)
    return replies, buf[pos:]


def errors_in(value) -> list[Err]:
    """Every error reply in a plain value, nested ones included."""
    if isinstance(value, Err):
        return [value]
    if isinstance(value, (list, tuple)):
        return [e for item in value for e in errors_in(item)]
    return []


class RespConnection:
    """A raw TCP client: send bytes, read one complete reply at a time (as bytes)."""

    def __init__(self, port: int, timeout: float = 10.0, protocol: int = 2):
        """`protocol` 3: HELLO 3 first (its reply, a map, read and checked)."""
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buffer = b""
        if protocol == 3:
            assert self.call(["HELLO", "3"]).startswith(b"%")

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_reply(self) -> bytes:
        while True:
            if self.buffer:
                try:
                    _, end = parse_reply(self.buffer)
                except Incomplete:
                    pass
                else:
                    reply, self.buffer = self.buffer[:end], self.buffer[end:]
                    return reply
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError(f"closed by the server; partial reply {self.buffer!r}")
            self.buffer += data

    def call(self, args: list[str]) -> bytes:
        self.send(encode_command(args))
        return self.read_reply()

    def closed_by_server(self) -> bool:
        """True once the server closes: recv blocks until EOF (or the timeout)."""
        try:
            return not self.buffer and self.sock.recv(1) == b""
        except TimeoutError:
            return False


def encode_command(args: list[str]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = raw(arg)
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def blocked_clients(conn: RespConnection) -> int:
    info = parse_reply(conn.call(["INFO", "clients"]))[0].value
    return int(re.search(rb"blocked_clients:(\d+)", info).group(1))
