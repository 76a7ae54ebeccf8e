"""A small blocking RESP2 client for EZRA's own command-line tools (ping, stats, ls, requeue,
export, import).

No gevent and no database: these tools are short-lived programs that talk to a
running server over its port, as any Redis client would. TLS, when the server
has --tls-cert-file, trusts that certificate itself (the tools run where the
server's files are), so a self-signed one works without a CA. `from_url` reaches
a Redis server (ezra export / import): replies stay raw bytes and lists, so stream
fields keep their order, repeats and bytes.
"""

from __future__ import annotations

import socket
import time
from urllib.parse import unquote, urlsplit

from ..protocol.integers import to_int64
from ..protocol.resp import encode

MAX_LINE = 64 * 1024
# A reply is read within caps, as the server reads requests: a hostile or broken server costs
# an error, never a MemoryError or a RecursionError. No reply of EZRA's or Redis's is beyond them
# (Redis's own proto-max-bulk-len is 512 MB; XRANGE pages are 10,000 entries, nested 4 deep).
MAX_BULK = 512 * 1024 * 1024
MAX_ARRAY = 1 << 24
MAX_DEPTH = 32
READ_SIZE = 64 * 1024
WILDCARD_TO_LOOPBACK = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}


def reachable_host(bind: str) -> str:
    """Where a server bound to `bind` is reached from this machine: a wildcard means loopback."""
    return WILDCARD_TO_LOOPBACK.get(bind, bind)


class ClientError(Exception):
    """The server could not be reached, or answered something unreadable."""


class ReplyError(Exception):
    """The server answered with an error reply (the text without the leading '-')."""


class Client:
    def __init__(self, host: str, port: int, timeout: float = 5.0, tls_cert_file: str | None = None,
                 tls=None, deadline: float | None = None):
        """`tls_cert_file`: trust that one certificate (EZRA's own); `tls`: an ssl.SSLContext.

        Each call must have its whole reply within `timeout` seconds (a server that trickles
        a byte at a time does not reset it); `deadline` (time.monotonic()) bounds every call and
        the connection too: `ezra ping` has one --timeout for all it does."""
        self.address = f"{host}:{port}"
        self.timeout, self.deadline = timeout, deadline
        self._call_deadline = self._deadline_from_now()
        try:
            sock = socket.create_connection((host, port), timeout=self._remaining())
            if tls_cert_file:
                tls = tls_context(tls_cert_file)
            if tls is not None:
                sock = tls.wrap_socket(sock, server_hostname=host)
        except ClientError:
            raise
        except TimeoutError as exc:
            raise ClientError(f"cannot reach {self.address}: no answer within {self.timeout:g} s") from exc
        except OSError as exc:
            raise ClientError(f"cannot reach {self.address}: {exc.strerror or exc}") from exc
        self.sock = sock
        self._buf = bytearray()
        self._pos = 0

    def call(self, *args):
        """Send one command; its reply (bytes, int, list or None), or ReplyError."""
        return self._exchange([args])[0]

    def pipeline(self, commands: list) -> list:
        """Send several commands at once, then read their replies: a ReplyError is returned in
        its command's place, not raised, so the caller sees which of them failed."""
        return self._exchange(commands, errors_in_place=True)

    def _exchange(self, commands: list, errors_in_place: bool = False) -> list:
        self._call_deadline = self._deadline_from_now()
        try:
            self.sock.settimeout(self._remaining())
            self.sock.sendall(b"".join(encode_command(args) for args in commands))
            replies = []
            for _ in commands:
                try:
                    replies.append(self._read(0))
                except ReplyError as exc:
                    if not errors_in_place:
                        raise
                    replies.append(exc)
            return replies
        except TimeoutError as exc:
            raise self._late() from exc
        except OSError as exc:
            raise ClientError(f"{self.address}: {exc.strerror or exc}") from exc

    def _deadline_from_now(self) -> float:
        deadline = time.monotonic() + self.timeout
        return deadline if self.deadline is None else min(deadline, self.deadline)

    def _remaining(self) -> float:
        left = self._call_deadline - time.monotonic()
        if left <= 0:
            raise self._late()
        return left

    def _late(self) -> ClientError:
        return ClientError(f"{self.address} did not answer in time (--timeout {self.timeout:g} s)")

    def _fill(self) -> None:
        """Receive more bytes, within what is left of the call's time."""
        if self._pos > READ_SIZE and self._pos * 2 > len(self._buf):
            del self._buf[:self._pos]
            self._pos = 0
        self.sock.settimeout(self._remaining())
        data = self.sock.recv(READ_SIZE)
        if not data:
            raise ClientError(f"{self.address} closed the connection")
        self._buf += data

    def _line(self) -> bytes:
        while True:
            end = self._buf.find(b"\r\n", self._pos)
            if 0 <= end <= self._pos + MAX_LINE:
                line = bytes(self._buf[self._pos:end])
                self._pos = end + 2
                return line
            if end >= 0 or len(self._buf) - self._pos > MAX_LINE:
                raise self._unreadable(f"a line over {MAX_LINE} bytes", self._buf[self._pos:self._pos + 80])
            self._fill()

    def _exactly(self, size: int) -> bytes:
        while len(self._buf) - self._pos < size:
            self._fill()
        data = bytes(self._buf[self._pos:self._pos + size])
        self._pos += size
        return data

    def _read(self, depth: int):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            raise ReplyError(rest.decode("utf-8", "replace"))
        if kind == b":":
            return self._integer(rest, line)
        if kind == b"$":
            length = self._length(rest, MAX_BULK, line)
            if length < 0:
                return None
            data = self._exactly(length + 2)
            if data[-2:] != b"\r\n":
                raise self._unreadable("a bulk string not ended by CRLF", line)
            return data[:-2]
        if kind == b"*":
            length = self._length(rest, MAX_ARRAY, line)
            if length < 0:
                return None
            if depth >= MAX_DEPTH:
                raise self._unreadable(f"arrays nested over {MAX_DEPTH} deep", line)
            return [self._read(depth + 1) for _ in range(length)]
        raise ClientError(f"{self.address} sent an unexpected reply: {line[:80]!r}")

    def _integer(self, text: bytes, line: bytes) -> int:
        try:
            return to_int64(text)
        except ValueError:
            raise self._unreadable("an integer that is none", line) from None

    def _length(self, text: bytes, cap: int, line: bytes) -> int:
        length = self._integer(text, line)
        if length < -1 or length > cap:
            raise self._unreadable(f"a length outside -1..{cap}", line)
        return length

    def _unreadable(self, what: str, line) -> ClientError:
        return ClientError(f"{self.address} sent an unreadable reply ({what}): {bytes(line[:80])!r}")

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def encode_command(args) -> bytes:
    return encode([arg if isinstance(arg, bytes) else str(arg).encode() for arg in args], 2)


def from_url(url: str, timeout: float = 5.0) -> Client:
    """A client of redis://[[user]:password@]host[:port][/db] (rediss://: TLS, verified with the
    system's CAs), authenticated and on its database."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise ClientError(f"{url!r} is not a redis://host:port[/db] URL")
    try:
        port = parts.port or 6379
        db = int(parts.path.strip("/") or 0)
    except ValueError:
        raise ClientError(f"{url!r}: the port and the database must be numbers") from None
    tls = None
    if parts.scheme == "rediss":
        import ssl  # here: only TLS users pay for it
        tls = ssl.create_default_context()
    client = Client(parts.hostname, port, timeout, tls=tls)
    client.address = f"{parts.scheme}://{parts.hostname}:{port}/{db}"  # never the password
    try:
        if parts.password is not None:
            user = [unquote(parts.username)] if parts.username else []
            client.call("AUTH", *user, unquote(parts.password))
        if db:
            client.call("SELECT", db)
    except BaseException:
        client.close()
        raise
    return client


def tls_context(cert_file: str):
    import ssl  # here: only TLS users pay for it
    context = ssl.create_default_context(cafile=cert_file)
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # the server's own certificate is the anchor
    context.check_hostname = False  # pinned to that certificate; the address may be 127.0.0.1
    return context
