"""The TCP front: a gevent StreamServer, one greenlet per connection (connection.py).

EzraServer listens, accepts (or refuses, with Redis's errors: too many clients,
protected mode), does the TLS handshake, and builds a Connection per client,
served in a greenlet of its own; it closes the unauthenticated
connections gate.py gives up on (a host's oldest, to make room for a new one;
those past --auth-timeout); at shutdown it stops listening, lets busy
connections finish and closes the rest (app.py calls these in order). It also
raises the open-files limit so --max-clients fit, as Redis does.

A connection that waits for its next command for PARK_AFTER seconds or more
is parked: its greenlet ends and an I/O watcher on its socket spawns a new one
when the client sends again. A parked greenlet's stacks were most of an idle
connection's memory (8.5 of 10.9 KB); workers that keep a connection open and
quiet are the common case. The sweep that finds them and the watcher that
resumes them are here; the connection's side of it is in connection.py.

A connection's greenlet is a bare one (greenlet.greenlet, its parent the hub),
not gevent's Greenlet from a Pool, which cost about 1 KB more per connection:
the Greenlet's fields, its start callback, the Pool's link and set entry. That
counts even once the connection is parked. What the open connections held at
their peak stays with Python's allocator, whose 1 MiB arenas go back to the
system only when empty, and the few objects each parked connection keeps are
spread over all of them. So server.py counts its greenlets itself, to wait for
them at shutdown.
"""

from __future__ import annotations

import functools
import resource
import socket
import time

import gevent
from gevent import get_hub, getcurrent
from gevent.event import Event
from gevent.server import StreamServer
from greenlet import greenlet as BareGreenlet
from loguru import logger

from .. import errors
from .connection import Connection
from .gate import Gate
from ..protocol.resp import encode
from .session import ServerState

FD_RESERVE = 32  # descriptors beyond the clients': database, WAL, listener, logs (Redis keeps 32 too)
HTTP_CONNECTIONS = 1024  # --http-port: connections served at once (web/server.py); their descriptors are reserved too
REFUSAL_LINGER = 1.0  # seconds a refused client's bytes are read and dropped before its socket closes
READ_WHILE_LINGERING = 4096
PARK_AFTER = 1.0  # seconds between sweeps: a connection idle through a whole sweep interval is parked
TRIM_AFTER_PARKING = 100  # parked at once: hand the freed stacks back to the system (see trim_freed_memory)
TRIM_AFTER_BYTES = 1024 * 1024  # or parked connections' readers freed this much since the last trim


def trim_freed_memory() -> None:
    """Give the heap pages that ended greenlets freed back to the system.

    glibc keeps freed memory for reuse: without this, the RSS stays at its peak
    after thousands of connections are parked (measured: 8.3 KB per parked
    connection instead of 2.7).
    """
    malloc_trim = _malloc_trim()
    if malloc_trim is not None:
        malloc_trim(0)


@functools.cache
def _malloc_trim():
    try:
        import ctypes  # here: only a server that parks many connections at once needs it
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (ImportError, OSError, AttributeError) as exc:  # not glibc (musl, macOS)
        logger.info("freed memory stays with the allocator (no glibc malloc_trim here): {}", exc)
        return None


def keep_alive(sock, seconds: int) -> None:
    """TCP keepalive as Redis sets it: probes after `seconds` of silence, then every third of it, 3 times.

    A client whose machine died or whose network went away sends no FIN: without
    probes its connection (a blocked worker's, say) would stay open for ever.
    """
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", seconds), ("TCP_KEEPINTVL", max(seconds // 3, 1)), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, option):  # Linux has all three; elsewhere the system's defaults apply
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def client_limit(max_clients: int, reserve: int = FD_RESERVE) -> int:
    """Raise the descriptor limit so `max_clients` connections fit, as Redis does; the clients that fit.

    Below it, accept() fails with EMFILE: gevent logs a traceback per attempt and
    the client waits in the backlog with no answer, instead of Redis's error.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max_clients + reserve
    if soft == resource.RLIM_INFINITY or soft >= need:
        return max_clients
    raised = need if hard == resource.RLIM_INFINITY else min(need, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
        soft = raised
    except (ValueError, OSError) as exc:
        logger.warning("cannot raise the open files limit from {} to {}: {}", soft, raised, exc)
    if soft >= need:
        return max_clients
    fitting = max(soft - reserve, 1)
    logger.warning("--max-clients {} needs {} open files but the limit is {} (ulimit -n): at most {} clients "
                   "are served, the next get 'max number of clients reached'", max_clients, need, soft, fitting)
    return fitting


def refuse(sock, error) -> None:
    """Answer a connection that is not served with `error`, then close it (as Redis: before any command).

    The close lingers: what the client sends meanwhile (its HELLO, a command) is read and dropped
    until it closes its end, for up to REFUSAL_LINGER. Closing a socket with unread bytes answers
    them with a reset, and a reset can reach the client before it reads the error: redis-py then
    reported "Broken pipe" instead of "max number of clients reached" (tests/test_server.py, about
    one run in ten on a loaded machine)."""
    try:
        sock.sendall(encode(error, 2))
        sock.shutdown(socket.SHUT_WR)  # the error, then end of stream, even if the client sent a command
        with gevent.Timeout(REFUSAL_LINGER, False):
            while sock.recv(READ_WHILE_LINGERING):
                pass
    except OSError:
        pass  # the refused client is gone already
    sock.close()


def tls_context(settings):
    """The server's TLS context, or None without --tls-cert-file (errors name the file at start)."""
    if not settings.tls_cert_file:
        return None
    try:
        from gevent import ssl  # here: a build without ssl (a custom one) can still serve plain text
    except ImportError as exc:
        raise OSError(f"TLS is not available in this build ({exc}): run EZRA from Python for TLS") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    if settings.tls_ca_cert_file:
        context.load_verify_locations(settings.tls_ca_cert_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class ConnectionServer(StreamServer):
    """A StreamServer that hands each accepted socket to `start(handle, sock, addr)`, which serves it
    in a greenlet of its own, and leaves the socket open when the handler returns: a parked connection
    lives on. EzraServer._handle closes every socket it does not keep."""

    def __init__(self, address, handle, start):
        super().__init__(address, handle, backlog=1024)
        self._start = start

    def do_handle(self, sock, address) -> None:
        # "host:port", which the Session keeps, instead of the address: a greenlet holds its
        # arguments until it ends, and the tuple, host and port cost 146 bytes per connection.
        self._start(self._handle, sock, f"{address[0]}:{address[1]}")


class EzraServer:
    """Listens, spawns a Connection per client, and stops in order."""

    def __init__(self, state: ServerState):
        self.state = state
        settings = state.settings
        self.hub = get_hub()
        self.serving = 0  # greenlets started for connections that have not ended (see _start_greenlet)
        self._none_serving: Event | None = None  # set when serving drops to 0, while close_connections waits
        self.connections: set[Connection] = set()
        self.gate = Gate(settings)  # protected mode; connections that have not authenticated; guessing
        self.auth_throttle = self.gate.guesses  # the HTTP listener's Basic auth shares the RESP port's bound
        self.tls = tls_context(settings)
        self.max_clients = state.max_clients = client_limit(
            settings.max_clients, FD_RESERVE + (HTTP_CONNECTIONS if settings.http_port is not None else 0))
        self.stream_server = ConnectionServer((settings.bind, settings.port), self._handle, self._start_greenlet)
        self._sweeper = None
        self._freed_since_trim = 0  # bytes of readers that parked connections dropped (Connection.shed)

    def start(self) -> None:
        self.stream_server.start()
        self.state.port = self.stream_server.server_port
        self._sweeper = gevent.spawn(self._park_idle_connections)

    @property
    def port(self) -> int:
        return self.stream_server.server_port

    def stop_listening(self) -> None:
        self.stream_server.close()

    def close_connections(self, timeout: float) -> None:
        """Let connections finish what they are answering, then close the rest."""
        if self._sweeper is not None:
            self._sweeper.kill()
        for connection in list(self.connections):
            if connection.parked is not None:
                self._close(connection)
            elif connection.answer_held:  # its answer is a WRONGPASS: nothing to finish
                gevent.kill(connection.greenlet)
            else:
                connection.hang_up_if_idle()
        self._wait_for_greenlets(timeout)
        for connection in list(self.connections):
            if connection.greenlet is not None:
                gevent.kill(connection.greenlet)
        self._wait_for_greenlets(1)

    def _start_greenlet(self, run, *args) -> None:
        """Run `run(*args)` in a new bare greenlet (see the module doc), counted until it ends."""
        self.serving += 1
        self.hub.loop.run_callback(BareGreenlet(run, self.hub).switch, *args)

    def _greenlet_ended(self) -> None:
        self.serving -= 1
        if not self.serving and self._none_serving is not None:
            self._none_serving.set()

    def _wait_for_greenlets(self, timeout: float) -> None:
        """Wait until every connection's greenlet has ended, or for `timeout` seconds."""
        if self.serving:
            self._none_serving = Event()
            self._none_serving.wait(timeout)

    def _tls_handshake(self, sock, addr: str):
        """The TLS socket, or None (closed, logged) if the handshake failed or stalled."""
        timeout = self.state.settings.client_frame_timeout or None
        try:
            sock.settimeout(timeout)
            tls_sock = self.tls.wrap_socket(sock, server_side=True)
            tls_sock.settimeout(None)
            return tls_sock
        except (OSError, ValueError) as exc:  # ssl.SSLError, a timeout, a reset
            logger.info("TLS handshake with {} failed: {}", addr, exc)
            sock.close()
            return None

    def _handle(self, sock, addr: str) -> None:
        """A new client (its "host:port"), in its own greenlet: accept it, then serve it."""
        try:
            connection = self._accept(sock, addr)
        except BaseException:
            sock.close()  # ConnectionServer leaves that to us
            self._greenlet_ended()
            raise
        if connection is None:
            self._greenlet_ended()
        else:
            self._serve(connection)

    def _accept(self, sock, addr: str) -> Connection | None:
        """The new client's Connection, or None (socket closed) if refused or the TLS handshake failed."""
        if self.tls is not None:
            sock = self._tls_handshake(sock, addr)
            if sock is None:
                return None
        state = self.state
        if len(state.sessions) >= self.max_clients:
            state.rejected_connections += 1
            refuse(sock, errors.MAX_CLIENTS())
            return None
        refusal = self.gate.refusal(addr.rpartition(":")[0])
        if refusal is not None:
            refuse(sock, refusal)
            state.rejected_connections += 1
            return None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if state.settings.tcp_keepalive:
            keep_alive(sock, state.settings.tcp_keepalive)
        connection = Connection(state, sock, addr, self.gate, self.tls is not None)
        to_close = self.gate.admitted(connection, time.monotonic())
        state.sessions[connection.session.id] = connection.session
        self.connections.add(connection)
        state.total_connections += 1
        if to_close is not None:
            self._close_unauthenticated(to_close, errors.too_many_unauthenticated(
                to_close.host, self.gate.max_unauthenticated))
        return connection

    def _close_unauthenticated(self, connection: Connection, error) -> None:
        """Close a connection that has not authenticated (too old, or making room), telling it why."""
        connection.tell_before_close(error)
        if connection.parked is not None:
            self._close(connection)
            return
        connection.session.closing = True  # if its greenlet has not started yet (just resumed)
        try:
            connection.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # the client closed it already
        if connection.greenlet is not None:
            gevent.kill(connection.greenlet)  # even while its wrong password's answer waits

    def _serve(self, connection: Connection) -> None:
        """Run in the connection's greenlet until it is parked or closed."""
        connection.greenlet = getcurrent()
        parked = False
        try:
            parked = connection.serve()
        except Exception as exc:
            logger.opt(exception=exc).error("connection {} failed: {}", connection.session.addr, exc)
        finally:
            connection.greenlet = None
            if parked:
                self._freed_since_trim += connection.shed()
                # The socket's own read watcher, which nothing waits on while it is parked: a
                # watcher of its own cost each parked connection 294 bytes more (tracemalloc).
                connection.parked = connection.sock._read_event
                connection.parked.start(self._resume, connection)
                self.state.parked_clients += 1
            else:
                self._close(connection)
            self._greenlet_ended()

    def _resume(self, connection: Connection) -> None:
        """On the hub: a parked client sent something (or hung up): serve it in a new greenlet."""
        self._unpark(connection)
        connection.restore()
        self._start_greenlet(self._serve, connection)

    def _unpark(self, connection: Connection) -> None:
        connection.parked.stop()  # the socket's: it closes it with itself
        connection.parked = None
        self.state.parked_clients -= 1

    def _close(self, connection: Connection) -> None:
        if connection.parked is not None:
            self._unpark(connection)
        session = connection.session
        self.state.sessions.pop(session.id, None)
        self.connections.discard(connection)
        self.gate.forget(connection)
        connection.sock.close()
        session.close()  # release on disconnect: the worker names it used may be gone
        # Session and Connection point at each other (front): break the cycle so their
        # memory, a half-read frame of up to --max-task-size included, is freed now, not at
        # the next full collection (which may be long: a 60 MB buffer outlived its client).
        session.front = None
        connection.reader = None

    def _park_idle_connections(self) -> None:
        """Every PARK_AFTER seconds: park the connections that awaited a command since the last sweep,
        and close those that did not authenticate within --auth-timeout."""
        loop = get_hub().loop
        while True:
            gevent.sleep(PARK_AFTER)
            for connection in self.gate.overdue(time.monotonic()):
                self._close_unauthenticated(connection, errors.auth_timeout(self.gate.auth_timeout))
            to_park = []
            for connection in self.connections:
                if connection.awaiting_command:
                    if connection.quiet:
                        to_park.append(connection)
                    connection.quiet = True
            for connection in to_park:
                # Each on its own hub callback: the hub serves I/O between them if parking
                # thousands takes longer than a switch interval.
                loop.run_callback(connection.park_if_quiet)
            if to_park:
                loop.run_callback(self._trim_after_parking, len(to_park))  # after their park_if_quiet

    def _trim_after_parking(self, parked: int) -> None:
        """Many stacks ended, or large request buffers were dropped (a producer's last task):
        without a trim glibc keeps that memory (see trim_freed_memory)."""
        if parked >= TRIM_AFTER_PARKING or self._freed_since_trim >= TRIM_AFTER_BYTES:
            self._freed_since_trim = 0
            trim_freed_memory()
