"""`ezra ping`: is the server on this machine answering? Exit 0 if it is, 1 if not.

The Docker HEALTHCHECK runs it, and so can a monitoring script or a systemd
`ExecStartPost`. It reads the server's own options (flags, EZRA_* environment,
config file) so it finds the server where the server listens: a server bound
to 0.0.0.0 (Docker) is reached on 127.0.0.1. It sends `AUTH` when a password
is set, then `PING`, and expects `+PONG`. No gevent, no database: it costs a
socket and a few milliseconds.
"""

from __future__ import annotations

import socket
import sys

from .config import build_parser
from .resp import encode

DEFAULT_TIMEOUT = 3.0
WILDCARD_TO_LOOPBACK = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}
MAX_REPLY_LINE = 4096


class PingError(Exception):
    """The server did not answer PONG; the message says what happened."""


def ping(host: str, port: int, password: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> str:
    """PING the server at host:port (after AUTH if a password is given); returns the reply."""
    commands = [[b"AUTH", password.encode()]] if password else []
    commands.append([b"PING"])
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"".join(encode(command, 2) for command in commands))
            with sock.makefile("rb") as stream:
                replies = [stream.readline(MAX_REPLY_LINE).rstrip(b"\r\n") for _ in commands]
    except OSError as exc:
        raise PingError(f"cannot reach {host}:{port}: {exc.strerror or exc}") from exc
    answer = replies[-1]
    if answer == b"+PONG":
        return "PONG"
    # An AUTH error matters only when PING was refused too (a server without a
    # password answers AUTH with an error and PING with PONG).
    detail = "; ".join(reply[1:].decode(errors="replace") for reply in replies if reply.startswith(b"-"))
    raise PingError(f"{host}:{port} answered {detail or repr(answer)}")


def build_ping_parser():
    """The server's parser (same flags, environment and config file) plus --timeout."""
    parser = build_parser()
    parser.prog = "ezra ping"
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
    host = WILDCARD_TO_LOOPBACK.get(options.bind, options.bind)
    try:
        answer = ping(host, options.port, options.password, options.timeout)
    except PingError as exc:
        print(f"ezra ping: {exc}", file=sys.stderr)
        return 1
    print(f"ezra at {host}:{options.port}: {answer}")
    return 0
