"""The TCP front: a gevent StreamServer, one greenlet per connection.

Each connection reads what the client sent, runs every complete command in
it, then sends all the replies in one write. Replies that wait for the writer
(Deferred) are resolved in order at that point, so a pipeline of XADDs costs
one commit, not one per command.
"""

from __future__ import annotations

import socket

from gevent import get_hub
from gevent.pool import Pool
from gevent.server import StreamServer
from loguru import logger

from . import errors
from .commands import Deferred, ServerState, Session, dispatch
from .resp import ErrorReply, ProtocolError, RequestReader, encode

READ_SIZE = 64 * 1024
MAX_PIPELINE = 1024  # replies held before they are sent, even if more commands are buffered
BULK_SLACK = 64 * 1024  # a bulk may exceed the task limit a little (names, options)


class Connection:
    """One client: read commands, dispatch, write replies."""

    def __init__(self, state: ServerState, sock, address):
        self.sock = sock
        self.state = state
        host, port = address[:2]
        self.session = Session(state, f"{host}:{port}", self.wait, self.flush)
        self.reader = RequestReader(max_bulk_len=state.settings.max_task_size + BULK_SLACK)
        self.replies: list[tuple[int, object]] = []
        self.busy = False  # between reading a request and sending its replies

    def serve(self) -> None:
        session = self.session
        while not session.closing:
            try:
                data = self.sock.recv(READ_SIZE)
            except OSError:
                return  # reset by the peer: nothing to answer
            if not data:
                return
            self.busy = True
            self.reader.feed(data)
            try:
                self._run_buffered_commands()
            except ProtocolError as exc:
                self.replies.append((session.proto, ErrorReply("ERR " + str(exc))))
                self.flush()
                logger.debug("closing {} after a protocol error: {}", session.addr, exc)
                return
            self.flush()
            self.busy = False

    def hang_up_if_idle(self) -> None:
        """At shutdown: an idle connection is closed now; a busy one finishes first."""
        self.session.closing = True
        if not self.busy:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the client

    def _run_buffered_commands(self) -> None:
        session = self.session
        while not session.closing:
            args = self.reader.next_command()
            if args is None:
                return
            reply = dispatch(session, args)  # first: HELLO 3 answers in RESP3 already
            self.replies.append((session.proto, reply))
            if len(self.replies) >= MAX_PIPELINE:
                self.flush()

    def flush(self) -> None:
        """Send every reply computed so far, waiting for the writer where needed."""
        if not self.replies:
            return
        replies, self.replies = self.replies, []
        out = []
        for proto, reply in replies:
            if type(reply) is Deferred:
                try:
                    reply = reply.resolve()
                except ErrorReply as exc:
                    reply = exc
            out.append(encode(reply, proto))
        try:
            self.sock.sendall(b"".join(out))
        except OSError as exc:
            self.session.closing = True
            logger.debug("client {} went away before its replies: {}", self.session.addr, exc)

    def wait(self, event, timeout: float | None):
        """Wait for `event` (a blocked read): True, False on timeout, None if the client hung up."""
        hung_up = False
        watcher = get_hub().loop.io(self.sock.fileno(), 1)

        def on_readable():
            nonlocal hung_up
            try:
                # Peek on the raw socket: a callback must not block the hub.
                data = self.sock._sock.recv(1, socket.MSG_PEEK)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            watcher.stop()  # data (a pipelined command) stays for after the wait
            if not data:
                hung_up = True
                event.set()

        watcher.start(on_readable)
        try:
            woken = event.wait(timeout)
        finally:
            watcher.stop()
            watcher.close()
        return None if hung_up else woken


class EzraServer:
    """Listens, spawns a Connection per client, and stops in order."""

    def __init__(self, state: ServerState):
        self.state = state
        settings = state.settings
        self.pool = Pool()
        self.connections: set[Connection] = set()
        self.stream_server = StreamServer((settings.bind, settings.port), self._handle,
                                          spawn=self.pool, backlog=1024)

    def start(self) -> None:
        self.stream_server.start()
        self.state.port = self.stream_server.server_port

    @property
    def port(self) -> int:
        return self.stream_server.server_port

    def stop_listening(self) -> None:
        self.stream_server.close()

    def close_connections(self, timeout: float) -> None:
        """Let connections finish what they are answering, then close the rest."""
        for connection in list(self.connections):
            connection.hang_up_if_idle()
        self.pool.join(timeout=timeout)
        self.pool.kill(timeout=1)

    def _handle(self, sock, address) -> None:
        state = self.state
        if len(state.sessions) >= state.settings.max_clients:
            state.rejected_connections += 1
            try:
                sock.sendall(encode(errors.MAX_CLIENTS, 2))
            except OSError:
                pass  # the refused client is gone already
            sock.close()
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = Connection(state, sock, address)
        session = connection.session
        state.sessions[session.id] = session
        self.connections.add(connection)
        state.total_connections += 1
        try:
            connection.serve()
        except Exception as exc:
            logger.opt(exception=exc).error("connection {} failed: {}", session.addr, exc)
        finally:
            state.sessions.pop(session.id, None)
            self.connections.discard(connection)
            sock.close()
            session.close()  # release on disconnect: the worker names it used may be gone
