"""A small blocking RESP2 client for EZRA's own command-line tools (ping, stats, ls, requeue).

No gevent and no database: these tools are short-lived programs that talk to a
running server over its port, as any Redis client would. TLS, when the server
has --tls-cert-file, trusts that certificate itself (the tools run where the
server's files are), so a self-signed one works without a CA.
"""

from __future__ import annotations

import socket

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
    def __init__(self, host: str, port: int, timeout: float = 5.0, tls_cert_file: str | None = None):
        self.address = f"{host}:{port}"
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
            if tls_cert_file:
                sock = tls_context(tls_cert_file).wrap_socket(sock, server_hostname=host)
        except OSError as exc:
            raise ClientError(f"cannot reach {self.address}: {exc.strerror or exc}") from exc
        self.sock = sock
        self.stream = sock.makefile("rb")

    def call(self, *args):
        """Send one command; its reply (bytes, int, list or None), or ReplyError."""
        try:
            self.sock.sendall(encode([arg if isinstance(arg, bytes) else str(arg).encode() for arg in args], 2))
            return self._read()
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


def tls_context(cert_file: str):
    import ssl  # here: only TLS users pay for it
    context = ssl.create_default_context(cafile=cert_file)
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # the server's own certificate is the anchor
    context.check_hostname = False  # pinned to that certificate; the address may be 127.0.0.1
    return context
