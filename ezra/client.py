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
from urllib.parse import unquote, urlsplit

from .resp import encode

MAX_LINE = 64 * 1024
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
                 tls=None):
        """`tls_cert_file`: trust that one certificate (EZRA's own); `tls`: an ssl.SSLContext."""
        self.address = f"{host}:{port}"
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
            if tls_cert_file:
                tls = tls_context(tls_cert_file)
            if tls is not None:
                sock = tls.wrap_socket(sock, server_hostname=host)
        except OSError as exc:
            raise ClientError(f"cannot reach {self.address}: {exc.strerror or exc}") from exc
        self.sock = sock
        self.stream = sock.makefile("rb")

    def call(self, *args):
        """Send one command; its reply (bytes, int, list or None), or ReplyError."""
        try:
            self.sock.sendall(encode_command(args))
            return self._read()
        except OSError as exc:
            raise ClientError(f"{self.address}: {exc.strerror or exc}") from exc

    def pipeline(self, commands: list) -> list:
        """Send several commands at once, then read their replies: a ReplyError is returned in
        its command's place, not raised, so the caller sees which of them failed."""
        try:
            self.sock.sendall(b"".join(encode_command(args) for args in commands))
            replies = []
            for _ in commands:
                try:
                    replies.append(self._read())
                except ReplyError as exc:
                    replies.append(exc)
            return replies
        except OSError as exc:
            raise ClientError(f"{self.address}: {exc.strerror or exc}") from exc

    def _read(self):
        line = self.stream.readline(MAX_LINE)
        if not line.endswith(b"\r\n"):
            raise ClientError(f"{self.address} closed the connection" if not line else
                              f"{self.address} sent an unreadable reply: {line[:80]!r}")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest
        if kind == b"-":
            raise ReplyError(rest.decode("utf-8", "replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            length = int(rest)
            if length < 0:
                return None
            data = self.stream.read(length + 2)
            return data[:-2]
        if kind == b"*":
            length = int(rest)
            return None if length < 0 else [self._read() for _ in range(length)]
        raise ClientError(f"{self.address} sent an unexpected reply: {line[:80]!r}")

    def close(self) -> None:
        self.stream.close()
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
