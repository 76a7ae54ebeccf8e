"""`ezra ping`: is the server on this machine answering? Exit 0 if it is, 1 if not.

The Docker HEALTHCHECK runs it, and so can a monitoring script or a systemd
`ExecStartPost`. It reads the server's own options (flags, EZRA_* environment,
config file) so it finds the server where the server listens: a server bound
to 0.0.0.0 (Docker) is reached on 127.0.0.1. It sends `AUTH` when a password
is set, then `PING`, and expects `+PONG`, over TLS when the server has
--tls-cert-file (trusting that certificate). No gevent, no database: it costs a
socket and a few milliseconds.
"""

from __future__ import annotations

import sys
import time

from ..adapters.client import Client, ClientError, ReplyError, reachable_host
from ..config import build_parser

DEFAULT_TIMEOUT = 3.0


class PingError(Exception):
    """The server did not answer PONG; the message says what happened."""


def ping(host: str, port: int, password: str | None = None, timeout: float = DEFAULT_TIMEOUT,
         tls_cert_file: str | None = None) -> str:
    """PING the server at host:port (after AUTH if a password is given); returns the reply."""
    try:  # one deadline for the connection, AUTH and PING together
        with Client(host, port, timeout, tls_cert_file, deadline=time.monotonic() + timeout) as client:
            auth_error = None
            if password:
                try:
                    client.call("AUTH", password)
                except ReplyError as exc:
                    # It matters only if PING is refused too (a server without a password
                    # answers AUTH with an error and PING with PONG).
                    auth_error = exc
            try:
                answer = client.call("PING")
            except ReplyError as exc:
                detail = "; ".join(str(error) for error in (auth_error, exc) if error is not None)
                raise PingError(f"{host}:{port} answered {detail}") from None
    except ClientError as exc:
        raise PingError(str(exc)) from exc
    if answer != b"PONG":
        raise PingError(f"{host}:{port} answered {answer!r}")
    return "PONG"


def build_ping_parser():
    """The server's parser (same flags, environment and config file) plus --timeout."""
    parser = build_parser()
    parser.prog = "ezra ping"
    parser.usage = "ezra ping [--port N] [--bind ADDRESS] [--password P] [--timeout S] [OPTION ...]"
    parser.epilog = None
    parser.description = ("Check that the EZRA server configured by these options answers PING: "
                          "exit 0 if it does, 1 if not. Options not about reaching the server are ignored.")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help="seconds to wait for the connection and the reply")
    return parser


def main(argv: list[str] | None = None) -> int:
    """`ezra ping [options]`: print the outcome; 0 healthy, 1 not."""
    options = build_ping_parser().parse_args(argv)
    if options.port == 0:
        print("ezra ping: the server's port is 0 (picked at start); give --port", file=sys.stderr)
        return 1
    host = reachable_host(options.bind)
    try:
        answer = ping(host, options.port, options.password, options.timeout, options.tls_cert_file)
    except PingError as exc:
        print(f"ezra ping: {exc}", file=sys.stderr)
        return 1
    print(f"ezra at {host}:{options.port}: {answer}")
    return 0
