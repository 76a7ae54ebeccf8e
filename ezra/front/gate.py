"""Who may connect, how long a connection may stay unauthenticated, and how fast wrong passwords are answered.

Protected mode (as Redis's): without a password, only clients from 127.0.0.1
and ::1 are served, unless the operator turned it off (--protected-mode no);
the others get Redis's DENIED explanation and are closed. As in Redis 7, only
those two addresses count as local, not the rest of 127.0.0.0/8.

Unauthenticated connections (with a password): a connection that has not
authenticated within --auth-timeout seconds is closed, and one address holds
at most --max-unauthenticated-per-host of them: a new one is always served,
and the OLDEST is closed to make room (one whose wrong-password answer is
being held back only if all are). Refusing the newcomer instead, as before,
let 150 idle sockets lock the right password out of everything behind their
address (NAT, a container bridge, sidecars).

Password guessing (GuessThrottle) is bounded on failed attempts, not on
connections: one budget shared by the RESP port and the HTTP listener, per
network, an IPv4 address's /24 or an IPv6 address's /64 (a remote attacker
holds a whole /64 as easily as one address), so every address of the network
shares it. The answer to a wrong password is held back until the network's
next slot: at most GUESSES_PER_SECOND such answers a second, however many
connections and addresses guess. The password is checked first and a right
one answered at once: a flood from the same network never slows it.
"""

from __future__ import annotations

from loguru import logger

from .. import errors

LOCAL_PEERS = frozenset({"127.0.0.1", "::1", "::ffff:127.0.0.1"})  # the last: IPv4 loopback on a '::' socket
LOGGED_HOSTS = 10_000  # hosts whose refusal was logged, remembered to log each once; then forgotten
GUESSES_PER_SECOND = 10  # wrong-password answers per network (/24, /64), RESP and HTTP together
FIRST_DELAY = 0.05  # seconds a connection's first wrong-password answer waits; doubles with each one...
MAX_DELAY = 1.0  # ...up to this (one connection guessing alone is slowed too)
BURST_GAP = 60.0  # seconds without wrong passwords from a network that end its burst (one log line each)
REMEMBERED_NETWORKS = 10_000  # then networks whose burst ended are forgotten


def network_of(host: str) -> str:
    """The network a client address is counted in: its /24 (IPv4, IPv4-mapped IPv6) or /64 (IPv6)."""
    import ipaddress  # here: only a wrong password needs it
    try:
        address = ipaddress.ip_address(host.partition("%")[0])  # without an IPv6 zone (fe80::1%eth0)
    except ValueError:
        return host  # not an IP address: counted alone
    if address.version == 6 and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # a '::' socket's IPv4 client: the same network as on 0.0.0.0
    prefix = 24 if address.version == 4 else 64
    return str(ipaddress.ip_network(f"{address}/{prefix}", strict=False))


class GuessThrottle:
    """Wrong passwords per network: when each answer may be sent; one log line per burst."""

    def __init__(self, per_second: float = GUESSES_PER_SECOND):
        self.gap = 1.0 / per_second
        self.networks: dict[str, list] = {}  # network -> [next answer's earliest time (monotonic), failures]

    def failed(self, host: str, addr: str, on_connection: int, now: float) -> float:
        """Record a wrong password from `host` (its connection's `on_connection`th): seconds its answer waits."""
        network = network_of(host)
        burst = self.networks.get(network)
        if burst is None or now - burst[0] > BURST_GAP:
            if burst is not None:
                logger.warning("{} wrong passwords from {} in the previous burst", burst[1], network)
            elif len(self.networks) >= REMEMBERED_NETWORKS:
                self._forget_old(now)
            burst = self.networks[network] = [now, 0]
            logger.warning("failed AUTH from {}; answers to wrong passwords from {} are held back (at most {:g} "
                           "a second for that network, RESP and HTTP together); they are counted, not logged "
                           "one by one", addr, network, 1 / self.gap)
        burst[1] += 1
        backoff = min(FIRST_DELAY * 2 ** (on_connection - 1), MAX_DELAY)
        answer_at = max(now + backoff, burst[0])
        burst[0] = answer_at + self.gap
        return answer_at - now

    def _forget_old(self, now: float) -> None:
        for network, (next_answer, _) in list(self.networks.items()):
            if now - next_answer > BURST_GAP:
                del self.networks[network]


class Gate:
    """Admits or refuses new connections; tracks those that have not authenticated yet, oldest first."""

    def __init__(self, settings):
        self.protected = settings.protected_mode and not settings.password
        self.password = bool(settings.password)
        self.max_unauthenticated = settings.max_unauthenticated_per_host
        self.auth_timeout = settings.auth_timeout
        self.waiting: dict = {}  # connection -> accepted at (monotonic), oldest first: not authenticated yet
        self.by_host: dict[str, dict] = {}  # host -> {connection: None}, oldest first: the same, per address
        self.guesses = GuessThrottle()
        self.logged: set[tuple[str, str]] = set()  # (host, reason) logged once

    def refusal(self, host: str) -> errors.CommandError | None:
        """The error to answer a new connection from `host` with before closing it, or None to serve it."""
        if self.protected and host not in LOCAL_PEERS:
            self._log_once(host, "protected mode", "refused a client from {}: protected mode (no --password, "
                           "so only 127.0.0.1 and ::1 are served); further refusals from this host are counted "
                           "in INFO rejected_connections, not logged", host)
            return errors.denied_protected_mode()
        return None

    def admitted(self, connection, now: float):
        """A connection was accepted: count it until it authenticates; the one to close to make room, or None."""
        if not self.password or connection.session.authenticated:
            return None
        self.waiting[connection] = now
        same_host = self.by_host.setdefault(connection.host, {})
        same_host[connection] = None
        if not self.max_unauthenticated or len(same_host) <= self.max_unauthenticated:
            return None
        oldest = self._oldest(same_host, connection)
        self._log_once(connection.host, "unauthenticated", "{} has more than {} connections that have not "
                       "authenticated yet (--max-unauthenticated-per-host): the oldest is closed for each new "
                       "one; further ones from this host are not logged", connection.host,
                       self.max_unauthenticated)
        self.forget(oldest)
        return oldest

    def _oldest(self, same_host: dict, newcomer):
        """The oldest that is not waiting for a wrong password's answer (closing it would answer early)."""
        for connection in same_host:
            if connection is not newcomer and not connection.answer_held:
                return connection
        return next(iter(same_host))  # all are (the newcomer, youngest, is never the first)

    def overdue(self, now: float) -> list:
        """The connections that did not authenticate within --auth-timeout, forgotten here: to be closed."""
        if not self.password or not self.auth_timeout:
            return []
        late = []
        for connection, accepted_at in self.waiting.items():
            if now - accepted_at < self.auth_timeout:
                break  # the rest are younger
            if not connection.answer_held:  # its answer first; a later sweep closes it
                late.append(connection)
        for connection in late:
            self.forget(connection)
            self._log_once(connection.host, "auth timeout", "closed a connection from {}: not authenticated "
                           "within {:g}s (--auth-timeout); further ones from this host are not logged",
                           connection.host, self.auth_timeout)
        return late

    def forget(self, connection) -> None:
        """It authenticated, closed, or is being closed: it no longer counts."""
        if self.waiting.pop(connection, None) is None:
            return
        same_host = self.by_host[connection.host]
        del same_host[connection]
        if not same_host:
            del self.by_host[connection.host]

    def _log_once(self, host: str, reason: str, message: str, *args) -> None:
        if (host, reason) in self.logged:
            return
        if len(self.logged) >= LOGGED_HOSTS:
            self.logged.clear()
        self.logged.add((host, reason))
        logger.warning(message, *args)
