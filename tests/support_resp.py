"""RESP on the wire, for the tests that read bytes rather than a client's objects (the
vector harness's reader): a reply parser, a raw TCP connection, and the commands' encoding."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass


def raw(text: str) -> bytes:
    """Vector text (latin-1) to the bytes on the wire."""
    return text.encode("latin-1")


class Incomplete(Exception):
    """The buffer ends before the reply does: read more."""


@dataclass(frozen=True)
class Reply:
    """One parsed RESP2/RESP3 reply.

    `kind` is the type byte ('+', '$', '*', '%', ...); `value` is the line or blob
    (bytes), None for any null, a tuple of Reply for arrays, sets and pushes, and
    a tuple of (key, value) pairs for maps.
    """

    kind: str
    value: object


LINE_TYPES = "+-:_,#("
BLOB_TYPES = "$=!"
AGGREGATE_TYPES = "*~>"


def parse_reply(buf: bytes, pos: int = 0) -> tuple[Reply, int]:
    """The reply starting at `pos` and the position after it; Incomplete if cut short."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise Incomplete
    kind, line, pos = chr(buf[pos]), buf[pos + 1:end], end + 2
    if kind in LINE_TYPES:
        return Reply(kind, None if kind == "_" else line), pos
    if kind in BLOB_TYPES:
        size = int(line)
        if size < 0:
            return Reply(kind, None), pos
        if len(buf) < pos + size + 2:
            raise Incomplete
        if buf[pos + size:pos + size + 2] != b"\r\n":
            raise ValueError(f"blob not terminated by CRLF in {buf!r}")
        return Reply(kind, buf[pos:pos + size]), pos + size + 2
    if kind in AGGREGATE_TYPES or kind == "%":
        count = int(line)
        if count < 0:
            return Reply(kind, None), pos
        items = []
        for _ in range(2 * count if kind == "%" else count):
            item, pos = parse_reply(buf, pos)
            items.append(item)
        if kind == "%":
            items = list(zip(items[::2], items[1::2]))
        return Reply(kind, tuple(items)), pos
    raise ValueError(f"not a RESP reply type {kind!r} in {buf!r}")


class RespConnection:
    """A raw TCP client: send bytes, read one complete reply at a time (as bytes)."""

    def __init__(self, port: int, timeout: float = 10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buffer = b""

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
