"""Who may connect at all, decided when a connection is accepted, before it sends anything.

Protected mode (as Redis's): without a password, only clients from 127.0.0.1
and ::1 are served, unless the operator turned it off (--protected-mode no);
the others get Redis's DENIED explanation and are closed. As in Redis 7, only
those two addresses count as local, not the rest of 127.0.0.0/8.

Unauthenticated connections per host: with a password, AUTH failures are
throttled per connection and per host (connection.AuthThrottle), but a reply's
delay only slows one connection, so 2,000 connections still tried 1,644
passwords a second. A host may hold at most --max-unauthenticated-per-host
connections that have not authenticated yet; the next are refused with an
error and closed, which bounds one host's guessing to about that many
guesses per AUTH_MAX_DELAY (measured: 101 a second with the default 100).
"""

from __future__ import annotations

from loguru import logger

from . import errors

LOCAL_PEERS = frozenset({"127.0.0.1", "::1", "::ffff:127.0.0.1"})  # the last: IPv4 loopback on a '::' socket
LOGGED_HOSTS = 10_000  # hosts whose refusal was logged, remembered to log each once; then forgotten


class Gate:
    """Admits or refuses new connections; tracks each host's connections that have not authenticated yet."""

    def __init__(self, settings):
        self.protected = settings.protected_mode and not settings.password
        self.max_unauthenticated = settings.max_unauthenticated_per_host if settings.password else 0
        self.unauthenticated: dict[str, set] = {}  # host -> its open connections not authenticated yet
        self.logged: set[tuple[str, str]] = set()  # (host, reason) refusals logged once

    def refusal(self, host: str) -> errors.CommandError | None:
        """The error to answer a new connection from `host` with before closing it, or None to serve it."""
        if self.protected and host not in LOCAL_PEERS:
            self._log_once(host, "protected mode", "refused a client from {}: protected mode (no --password, "
                           "so only 127.0.0.1 and ::1 are served); further refusals from this host are counted "
                           "in INFO rejected_connections, not logged", host)
            return errors.denied_protected_mode()
        if self.max_unauthenticated and self._waiting(host) >= self.max_unauthenticated:
            self._log_once(host, "unauthenticated", "refused a client from {}: it has {} connections that have "
                           "not authenticated yet (--max-unauthenticated-per-host); further refusals from "
                           "this host are counted in INFO rejected_connections, not logged",
                           host, self.max_unauthenticated)
            return errors.too_many_unauthenticated(host, self.max_unauthenticated)
        return None

    def admitted(self, connection) -> None:
        """A connection was accepted: count it against its host until it authenticates or closes."""
        if self.max_unauthenticated and not connection.session.authenticated:
            self.unauthenticated.setdefault(connection.host, set()).add(connection)

    def closed(self, connection) -> None:
        waiting = self.unauthenticated.get(connection.host)
        if waiting is not None:
            waiting.discard(connection)
            if not waiting:
                del self.unauthenticated[connection.host]

    def _waiting(self, host: str) -> int:
        """How many of `host`'s connections have not authenticated yet (those that have are dropped here)."""
        waiting = self.unauthenticated.get(host)
        if not waiting:
            return 0
        for connection in [c for c in waiting if c.session.authenticated]:
            waiting.discard(connection)
        return len(waiting)

    def _log_once(self, host: str, reason: str, message: str, *args) -> None:
        if (host, reason) in self.logged:
            return
        if len(self.logged) >= LOGGED_HOSTS:
            self.logged.clear()
        self.logged.add((host, reason))
        logger.warning(message, *args)
