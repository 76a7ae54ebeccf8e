"""One client's connection: read its commands, dispatch them, send the replies.

Each connection reads what the client sent, runs every complete command in
it, then sends all the replies in one write. Replies that wait for the writer
(Deferred) are resolved in order at that point, so a pipeline of XADDs costs
one commit, not one per command; a run of plain XADDs to one queue is one
request too, and so is a run of single-id XACKs, their replies written
together (commands/runs.py). No client holds the others long: after a slice of SLICE seconds
running its commands or writing its replies, the connection lets the loop serve every other
ready client first (let_others_in), and a long reply is made and sent in pieces, the slice
looked at between two. Large reads are sent in pieces; a client that
reads none of its replies, or stalls half-way through a command, is closed;
the answer to a wrong password is held back (gate.GuessThrottle); a command
that looks like HTTP closes the connection (cross-protocol scripting).

A connection that waits for its next command may be parked by server.py's
sweep: `Park` is thrown into its greenlet, `serve` returns True and the socket
stays open without a greenlet until the client sends again. A blocked
XREADGROUP (or XREAD) is waiting for a task, not for a command: it keeps its
greenlet.

The Session (session.py) is what the commands see of the connection; this
module is the part that touches the socket. server.py accepts connections and
builds one Connection per client.
"""

from __future__ import annotations

import itertools
import socket
import struct
import time
from time import perf_counter

import gevent
from gevent import get_hub, getcurrent
from loguru import logger

from .. import errors
from ..commands import Deferred, dispatch
from ..commands.runs import RUNS
from .gate import Gate
from ..protocol.resp import (BULK_REPLY, INTEGER_REPLY, ErrorReply, Mapped, Replies, WrittenMap, encode,
                             encode_in_pieces, is_long)
from ..protocol.request_reader import BulkTooLarge, ProtocolError, RequestReader
from .session import ServerState, Session

READ_SIZE = 64 * 1024
MAX_PIPELINE = 1024  # replies held before they are sent, even if more commands are buffered
# Reads (XRANGE, XINFO, XPENDING...) may each be megabytes: at most this many are computed before
# they are sent, and a flush sends its encoded replies in pieces of about SEND_CHUNK bytes. Without
# these, 200 pipelined XRANGEs of a 10 MB queue (an 8 KB request) held 6 GB at once.
READS_PER_FLUSH = 8
# A claim's reply is as large as its tasks, known when it is made (Deferred.size_of): it counts as that
# share of READ_BYTES, so pipelined claims of small tasks share one commit and one send (they flushed
# every 8, each flush a commit: 7 commits for 50 claims), and claims of megabyte tasks still every 8.
READ_BYTES = 1024 * 1024
SEND_CHUNK = 1024 * 1024
BULK_SLACK = 64 * 1024  # a bulk may exceed the task limit a little (names, options)
# A larger argument is read past without keeping its bytes and refused with the task limit's error,
# the connection kept (beanstalkd's JOB_TOO_BIG); one above this is refused and the connection closed
# (Redis's own proto-max-bulk-len: reading more would only let a client make the server read for it).
DISCARD_LIMIT = 512 * 1024 * 1024
# A connection that has run commands (or written replies) this long lets the loop serve the others
# before it goes on: 64 pipelined XPENDINGs of 10,000 entries each held every other client 4.9-6.5 s.
SLICE = 0.003  # seconds
PIECE_ITEMS = 500  # a reply longer than this (XRANGE, XPENDING...) is encoded this many items at a time
WRONGPASS = errors.WRONGPASS  # compared by type after each command: a global is the cheapest lookup
AUTH_FAILURES_PER_CONNECTION = 10  # then the connection is closed
# Before AUTH, as Redis (CVE-2021-32675): what a client that knows no password may make the server hold.
UNAUTHENTICATED_MAX_ARGS = 10
UNAUTHENTICATED_MAX_BULK = 16 * 1024
# A command named like an HTTP request line or header is a web page talking to us (cross-protocol
# scripting, as Redis calls it): the connection is closed before anything after it runs.
HTTP_WORDS = (b"POST", b"HOST:")
ATTACK_LOG_GAP = 60.0  # seconds between two log lines about it, as Redis


def spellings(word: bytes) -> set[bytes]:
    """Every way to write `word` in upper and lower case (POST, post, pOsT...)."""
    return {bytes(letters) for letters in itertools.product(*({c, ord(chr(c).lower())} for c in word))}


# Compared with each command's name as sent: one set lookup, no upper-cased copy per command.
HTTP_NAMES = frozenset().union(*map(spellings, HTTP_WORDS))
_attack_logged_at = -ATTACK_LOG_GAP


def log_cross_protocol_attack(addr: str) -> None:
    """Log the attack at most once a minute: a page can make a browser repeat it for ever."""
    global _attack_logged_at
    now = time.monotonic()
    if now - _attack_logged_at >= ATTACK_LOG_GAP:
        _attack_logged_at = now
        logger.warning("Possible SECURITY ATTACK detected from {}: it sent POST or Host: as a command, as a "
                       "web page does when it makes a browser send HTTP to EZRA's port (cross-protocol "
                       "scripting). Connection aborted.", addr)


class Park(Exception):
    """Thrown into a connection's greenlet while it waits for a command: `serve` returns, the socket stays."""


class Connection:
    """One client: read commands, dispatch, write replies."""

    __slots__ = ("sock", "state", "gate", "auth_failures", "answer_held", "session", "reader", "replies",
                 "reads", "busy", "send_timeout", "frame_timeout", "_raw", "greenlet", "awaiting_command",
                 "quiet", "parked", "limited", "slice_start")  # an idle connection's memory: see the module doc

    def __init__(self, state: ServerState, sock, addr: str, gate: Gate, tls: bool = False):
        """`addr`: the client's "host:port"."""
        self.sock = sock
        self.state = state
        self.gate = gate  # told when it authenticates; its GuessThrottle holds wrong-password answers back
        self.auth_failures = 0
        self.answer_held = False  # a wrong password's answer is being held back (see gate.Gate._oldest)
        self.session = Session(state, addr, self)
        # Until the client authenticates, its frames are capped far lower (see `lift_limits`).
        self.limited = not self.session.authenticated
        self.reader = self._new_reader()
        self.replies: list[tuple[int, object]] = []
        self.reads = 0  # replies in self.replies that may be large (see READS_PER_FLUSH, READ_BYTES)
        self.busy = False  # between reading a request and sending its replies
        self.greenlet = None  # the greenlet serving it; None while parked
        self.awaiting_command = False  # blocked in recv with no command begun: it may be parked
        self.quiet = False  # the last sweep found it awaiting a command; the next one parks it
        self.parked = None  # the I/O watcher that resumes it
        self.slice_start = 0.0  # when it last took the loop (see SLICE)
        settings = state.settings
        self.send_timeout = settings.client_send_timeout or None
        self.frame_timeout = settings.client_frame_timeout or None
        # Sends try the socket once without waiting (nearly always enough);
        # only a client that does not read its replies gets a timer. A TLS
        # socket must encrypt: it always takes the gevent path. (The raw
        # socket's methods are looked up at each call: as fast as calling
        # bound methods kept here, which cost 144 bytes per connection.)
        self._raw = None if tls else sock._sock

    @property
    def host(self) -> str:
        """The client's address without the port (gate.py counts connections and guesses by it)."""
        return self.session.addr.rpartition(":")[0]

    def _new_reader(self) -> RequestReader:
        if self.limited:
            return RequestReader(max_bulk_len=UNAUTHENTICATED_MAX_BULK, max_args=UNAUTHENTICATED_MAX_ARGS,
                                 unauthenticated=True)
        return RequestReader(max_bulk_len=self.state.settings.max_task_size + BULK_SLACK,
                             discard_limit=DISCARD_LIMIT)

    def shed(self) -> int:
        """Parked: keep the socket and the session's state, drop what serving rebuilds.

        A parked connection awaited a command, so its reader holds only bytes it has
        parsed already: the last request, which may have been a task of up to
        --max-task-size (a producer that pushed a 1 MB task and went quiet kept the
        megabyte). The rest are a few hundred bytes per idle connection. Returns the
        bytes the reader's buffer held.
        """
        held = self.reader.held()
        self.reader = None
        self.replies = None
        self.session.last_claim = None  # a worker's last XREADGROUP, read again on its next one
        return held

    def restore(self) -> None:
        """Resumed: rebuild what `shed` dropped, before `serve` runs again."""
        self.reader = self._new_reader()  # with the caps it had: lift_limits set self.limited
        self.replies = []

    def serve(self) -> bool:
        """Serve commands until the client leaves (False) or the connection is parked (True)."""
        session = self.session
        reader = self.reader
        while not session.closing:
            try:
                if reader.mid_frame():
                    data = self._recv_rest_of_frame()
                else:
                    self.awaiting_command = True
                    try:
                        data = self._recv_command()
                    finally:
                        self.awaiting_command = False
            except Park:
                return True
            except OSError:
                return False  # reset by the peer: nothing to answer
            if not data:
                return False
            self.quiet = False
            self.busy = True
            self.slice_start = perf_counter()
            try:
                self._run_buffered_commands(data)
            except BulkTooLarge as exc:
                logger.warning("closing client {}: an argument of {} bytes, over the {} bytes EZRA reads past "
                               "(--max-task-size {})", session.addr, exc.size, DISCARD_LIMIT,
                               self.state.settings.max_task_size)
                self.replies.append((session.proto, errors.argument_too_large(
                    exc.size, self.state.settings.max_task_size, DISCARD_LIMIT).as_reply()))
                self.flush()
                return False
            except ProtocolError as exc:
                self.replies.append((session.proto, errors.protocol_error(str(exc))))
                self.flush()
                logger.debug("closing {} after a protocol error: {}", session.addr, exc)
                return False
            self.flush()
            self.busy = False
            data = None  # not held while the next command is awaited: an open connection's memory
        return False

    def _recv_command(self) -> bytes:
        """The next bytes from the client: wait until the socket is readable, then one recv.

        After its replies the client is nearly always still reading them, so a
        recv tried first would fail with EAGAIN: a system call per command for
        nothing (gevent's recv tries first). TLS keeps gevent's recv: the TLS
        layer may hold decrypted bytes the socket no longer shows.

        The wait is gevent's hub.wait without its Waiter: the socket's reusable
        read watcher switches straight back to this greenlet. A Waiter, its bound
        switch and their tuple were 200 bytes held by each open connection (which
        a parked one pays too: see server.py), and a round trip takes 0.5 µs less.
        Closing the socket from elsewhere throws into the greenlet, as with a Waiter.
        """
        raw = self._raw
        if raw is None:
            return self.sock.recv(READ_SIZE)
        sock = self.sock
        watcher, hub = sock._read_event, sock.hub
        while True:
            watcher.start(getcurrent().switch)
            try:
                hub.switch()
            finally:
                watcher.stop()
            try:
                return raw.recv(READ_SIZE)
            except BlockingIOError:
                continue  # woken without data (or by a stray switch): wait again

    def park_if_quiet(self) -> None:
        """A sweep's call, on the hub: park it if it still awaits a command (it may have woken since)."""
        if self.awaiting_command and self.quiet:
            self.greenlet.throw(Park)  # runs it: recv stops waiting, serve returns True

    def _recv_rest_of_frame(self) -> bytes:
        """recv while a frame is incomplete: a client that stalls mid-frame is closed (slowloris)."""
        if self.frame_timeout is None:
            return self.sock.recv(READ_SIZE)
        self.sock.settimeout(self.frame_timeout)
        try:
            return self.sock.recv(READ_SIZE)
        except socket.timeout:
            logger.warning("closing client {}: half a command ({} bytes) and nothing more for {}s "
                           "(--client-frame-timeout)", self.session.addr, self.reader.buffered(),
                           self.frame_timeout)
            return b""
        finally:
            self.sock.settimeout(None)

    def hang_up_if_idle(self) -> None:
        """At shutdown: an idle connection is closed now; a busy one finishes first."""
        self.session.closing = True
        if not self.busy:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the client

    def _run_buffered_commands(self, data: bytes) -> None:
        """Run every complete command in what was buffered and `data`: a pipeline's parsed frames
        come in one list (one parser call per read, not per command), and are run in order until
        one closes the session."""
        session = self.session
        reader = self.reader
        while not session.closing:
            try:
                if data is None:
                    commands = reader.next_commands()
                else:
                    fresh, data = data, None  # taken once, should it raise
                    commands = reader.take(fresh)
            except BulkTooLarge as exc:
                if exc.fatal:
                    raise
                self.replies.append((session.proto, self._refuse_read_past(exc)))
                continue
            if not commands:
                return
            i, count = 0, len(commands)
            while i < count:
                args = commands[i]
                i += 1
                if session.closing:
                    return  # QUIT, too many failed AUTHs, shutdown: nothing after it runs
                if args[0] in HTTP_NAMES:
                    log_cross_protocol_attack(session.addr)
                    session.closing = True  # no reply, nothing after it runs
                    return
                run = None
                if args[0] in RUNS and i < count and commands[i][0] in RUNS:
                    run = RUNS[args[0]](session, commands, i - 1)  # pipelined pushes or acks: one request
                if run is not None:
                    reply, i = run
                else:
                    reply = dispatch(session, args)  # first: HELLO 3 answers in RESP3 already
                kind = type(reply)
                if kind is Deferred and count == 1 and not self.replies:
                    # The read's one command, nothing held before it (a client that awaits each
                    # reply, as most do): its reply goes out now, not through the list and flush.
                    answer = self._written(session.proto, reply, kind)  # (not `data`: the bytes read)
                    if type(answer) is bytes:
                        self._send(answer)
                    else:  # a long read's pieces
                        self._send_pieces(answer)
                    if type(commands) is tuple:
                        return  # take's one frame: nothing is buffered, no next_commands to ask
                    continue
                if kind is WRONGPASS:
                    self._failed_auth()
                elif self.limited and session.authenticated:
                    self.lift_limits()
                replies = self.replies  # after dispatch: a command that blocks flushes first
                replies.append((session.proto, reply))
                # A read's reply may be megabytes (see LARGE): at most READS_PER_FLUSH are held
                # (a durable request is a push's or an ack's: ids or counts)
                if (not getattr(reply.request, "durable", False)) if kind is Deferred else isinstance(reply, LARGE):
                    self.reads += 1 if kind is not Deferred or reply.size_of is None else (
                        reply.size_of(reply.request.result) / READ_BYTES)
                    if self.reads >= READS_PER_FLUSH:
                        self.flush()
                        continue
                if len(replies) >= MAX_PIPELINE:
                    self.flush()
                elif i < count and perf_counter() - self.slice_start >= SLICE:
                    self.let_others_in()

    def _refuse_read_past(self, exc: BulkTooLarge) -> ErrorReply:
        """A command with an argument over the cap, read past: the task limit's error, and a log line."""
        limit = self.state.settings.max_task_size
        logger.warning("refused a command from {}: an argument of {} bytes, over --max-task-size {} "
                       "(read past and discarded)", self.session.addr, exc.size, limit)
        if self.session.queued is not None:
            self.session.queue_failed = True  # as any refused command after MULTI: EXEC aborts
        return errors.argument_too_large(exc.size, limit).as_reply()

    def lift_limits(self) -> None:
        """The client authenticated: the frame caps become the task limit's."""
        self.limited = False
        self.gate.forget(self)  # no longer counted among its host's unauthenticated connections
        self.reader.lift_caps(self.state.settings.max_task_size + BULK_SLACK, RequestReader.MAX_ARGS,
                              DISCARD_LIMIT)

    def _failed_auth(self) -> None:
        """Slow down password guessing: the WRONGPASS reply waits its turn, and many close the connection."""
        self.auth_failures += 1
        delay = self.gate.guesses.failed(self.host, self.session.addr, self.auth_failures, time.monotonic())
        if self.auth_failures >= AUTH_FAILURES_PER_CONNECTION:
            logger.warning("closing client {} after {} failed AUTH attempts", self.session.addr,
                           self.auth_failures)
            self.session.closing = True  # once this WRONGPASS is sent
        self.flush()  # the replies before the failure are not held back
        self.answer_held = True
        try:
            gevent.sleep(delay)
        finally:
            self.answer_held = False

    def tell_before_close(self, error) -> None:
        """Best effort, without waiting: why it is being closed (a TLS socket is closed without a word)."""
        if self._raw is None:
            return
        try:
            self._raw.send(encode(error, self.session.proto))
        except OSError as exc:  # its buffers are full, or it is gone: it is closed all the same
            logger.debug("could not tell {} why it is closed: {}", self.session.addr, exc)

    def flush(self) -> None:
        """Send every reply computed so far, waiting for the writer where needed, in pieces."""
        if not self.replies:
            return
        replies, self.replies, self.reads = self.replies, [], 0
        self._send_pieces(self._written_all(replies))

    def _written_all(self, replies: list):
        """The replies' bytes, one by one (a long one in its pieces), the slice looked at after each."""
        written = self._written
        for proto, reply in replies:
            data = written(proto, reply, type(reply))
            if type(data) is bytes:
                yield data
            else:
                yield from data
            if perf_counter() - self.slice_start >= SLICE:
                self.let_others_in()

    def _send_pieces(self, pieces) -> None:
        """Send the pieces joined about SEND_CHUNK bytes at a time, as they come (a long reply is
        never joined whole); stop if the client is gone."""
        out, size = [], 0
        append = out.append
        for piece in pieces:
            append(piece)
            size += len(piece)
            if size >= SEND_CHUNK:
                if not self._send(b"".join(out)):
                    return
                out, size = [], 0
                append = out.append
        if out:
            self._send(out[0] if len(out) == 1 else b"".join(out))

    def let_others_in(self) -> None:
        """Its time slice is used: the loop serves every other client that is ready, then this
        one goes on with its pipeline (no client holds the others longer than SLICE, bar one
        command's own work)."""
        self.state.slice_yields += 1
        gevent.idle()
        self.slice_start = perf_counter()

    def _written(self, proto: int, reply, kind):
        """A reply's bytes, once the writer answered it (a Deferred waits for it); a
        long reply's, an iterator of its pieces."""
        if kind is Deferred:
            try:  # Deferred.resolve, inlined: a call less per reply
                transform, reply = reply.transform, reply.request.wait()
                if transform is not None:
                    reply = transform(reply)
            except ErrorReply as exc:
                reply = exc.as_reply() if reply.replies == 1 else Replies((exc.as_reply(),) * reply.replies)
            kind = type(reply)
        # A push's id and an ack's count, the most common replies, in resp's frames: no call
        if kind is bytes:
            return BULK_REPLY % (len(reply), reply)
        if kind is int:
            return INTEGER_REPLY % reply
        if (kind is list or kind is Mapped or kind is dict) and is_long(reply, PIECE_ITEMS):  # others come in between
            return self._encoded_in_pieces(reply, proto)
        return encode(reply, proto)

    def _encoded_in_pieces(self, reply, proto: int):
        """A long reply's bytes, made a piece at a time as they are sent: the slice is looked at
        between two, and the reply is never joined whole (300 MB of XSCHEDULE LIST, copied again)."""
        for piece in encode_in_pieces(reply, proto, PIECE_ITEMS):
            yield piece
            if perf_counter() - self.slice_start >= SLICE:
                self.let_others_in()

    def _send(self, data: bytes) -> bool:
        """Send data; False if the client is gone or reads nothing (then the connection is closing)."""
        try:
            if self._raw is None:
                return self._send_slowly(data)
            try:
                sent = self._raw.send(data)
            except BlockingIOError:
                sent = 0
            return sent == len(data) or self._send_slowly(memoryview(data)[sent:])
        except OSError as exc:
            self.session.closing = True
            logger.debug("client {} went away before its replies: {}", self.session.addr, exc)
            return False

    def _send_slowly(self, rest) -> bool:
        """The client's buffers are full: wait for it to read, up to --client-send-timeout."""
        self.sock.settimeout(self.send_timeout)
        try:
            self.sock.sendall(rest)
            return True
        except socket.timeout:
            self.session.closing = True
            logger.warning("closing client {}: it read none of its replies for {}s, {} bytes pending "
                           "(--client-send-timeout)", self.session.addr, self.send_timeout, len(rest))
            self._abort()
            return False
        finally:
            self.sock.settimeout(None)

    def _abort(self) -> None:
        """Close at once, dropping unsent replies (RST): the kernel buffers are not kept for it."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already gone

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


# A read's reply (megabytes, perhaps), not a push's or an ack's small durable answer: a list or a
# dict, or a Deferred whose request is not durable (EXEC's are all-replies: counted).
LARGE = (list, dict, WrittenMap, Mapped)  # (a blocked XREADGROUP's claims come written: counted as before)
