"""The command table: the registry, and dispatch.

A command is registered with `@command(NAME, arity)`; arity is declared once per
command, as Redis does (positive: exact, negative: at least), so arity errors are
uniform. `dispatch` checks the name, the arity, authentication and MULTI, then `run`
calls the handler. A handler returns a reply value (see resp.py), or a `Deferred`
when the answer comes from the writer: the connection waits for it after reading
the rest of a pipeline, so pipelined XADDs share one commit.

A command registered with `blocks=True` may return a `Block` when it found nothing yet: the
table waits for it (`wait_out`), the same way for every such command: nothing blocks inside
EXEC (as Redis), the replies before it are sent first, then it waits until the Block answers,
its time is up or the client hangs up. Handlers never wait or flush themselves.

The session a handler gets is the connection's (ezra/front/session.py); this module reads
only its `authenticated`, `queued`, `queued_bytes`, `queue_failed` and
`server.total_commands`, and imports nothing of the server.
"""

from __future__ import annotations

import time

from loguru import logger

from .. import errors
from ..protocol.resp import ErrorReply, SimpleString


class Deferred:
    """A reply that the writer will produce: `transform(result)` once it commits.

    `size_of`: where the handler can tell them (a claim's tasks), a function of the result that
    gives the bytes it holds: the connection then counts it by them among the large replies it
    holds before sending. Asked only then: a read of one command sends its reply at once.
    `replies`: how many commands it answers (a run of pushes, runs.py): an error that fails its
    request is each one's reply."""

    __slots__ = ("request", "transform", "size_of", "replies")

    def __init__(self, request, transform=None, size_of=None, replies: int = 1):
        self.request = request
        self.transform = transform
        self.size_of = size_of
        self.replies = replies

    def resolve(self):
        result = self.request.wait()
        return result if self.transform is None else self.transform(result)


def resolved(reply):
    """A handler's reply once the writer answered it: a Deferred's (the connection's flush does
    the same inline); any other reply as it is."""
    return reply.resolve() if type(reply) is Deferred else reply


class Block:
    """What a blocking command waits for, as its handler describes it to the front (`wait_out`).

    `timeout` is in seconds (None: for ever). `start()` begins the wait once the replies before
    it are sent: a reply now, or None to wait on `event`. `woken(outcome)` follows each wait
    (True: the event was set; False: the time is up; None: the client hung up): a reply, or
    None to wait again. `end()` runs whatever the outcome. `without_waiting()` is the reply
    inside EXEC, where nothing blocks."""

    __slots__ = ("timeout",)  # and, in each kind, `event`: what start() gave to wait on

    def __init__(self, block_ms: int):
        self.timeout = None if block_ms == 0 else block_ms / 1000

    def without_waiting(self):
        raise NotImplementedError

    def start(self):
        raise NotImplementedError

    def woken(self, outcome: bool | None):
        raise NotImplementedError

    def end(self) -> None:
        """Nothing to undo, unless the command says so."""


def wait_out(session, block: Block):
    """A blocking command's wait: the front's, for every command registered with blocks=True."""
    if session.in_exec:
        return block.without_waiting()  # as Redis: inside MULTI/EXEC nothing blocks
    front = session.front
    front.flush()  # a blocked client has its earlier pipelined replies already
    left = block.timeout
    deadline = None if left is None else time.monotonic() + left
    try:
        reply = block.start()
        while reply is None:
            outcome = False if left is not None and left <= 0 else front.wait(block.event, left)
            reply = block.woken(outcome)
            if deadline is not None:  # woken with nothing to answer (XREAD): wait what is left
                left = deadline - time.monotonic()
        return reply
    finally:
        block.end()


def blocking(fn):
    """The handler of a command that may block: its Block is waited out here."""
    def run_blocking(session, args):
        reply = fn(session, args)
        return wait_out(session, reply) if isinstance(reply, Block) else reply
    run_blocking.__name__ = run_blocking.__qualname__ = fn.__name__
    run_blocking.__doc__, run_blocking.__wrapped__ = fn.__doc__, fn
    return run_blocking


COMMANDS: dict[bytes, tuple] = {}  # NAME -> (handler, arity, name in lower case)
NO_AUTH_NEEDED = {b"AUTH", b"HELLO", b"QUIT"}
RUN_INSIDE_MULTI = {b"EXEC", b"DISCARD", b"MULTI", b"QUIT"}  # the rest is queued until EXEC
# ...but not these: an EXEC is one open transaction, and they wait for a commit (BACKUP copies
# what has committed). Refused at queue time, so the EXEC answers EXECABORT.
NOT_INSIDE_MULTI = {b"BACKUP"}
QUEUED = SimpleString("QUEUED")
# What one connection may hold between MULTI and EXEC. EXEC runs its commands with no other
# client's command between them, so every other client waits for the whole EXEC: measured,
# 30,000 XADDs stalled them 1.2 s (8 s on a loaded machine), 1,000 XADDs 64 ms and 8 MB of
# pushes about 80 ms. More is refused, and the EXEC then answers EXECABORT. Bulk pushes
# belong in a pipeline without MULTI, which the server commits in batches of its own.
MAX_QUEUED_COMMANDS = 1000
MAX_QUEUED_BYTES = 8 * 1024 * 1024


def command(name: str, arity: int, blocks: bool = False):
    """Register the decorated handler as command `name` (arity: exact if positive, at least -arity
    if not). `blocks`: it may return a Block, which the table waits out (wait_out)."""
    def register(fn):
        COMMANDS[name.encode()] = (blocking(fn) if blocks else fn, arity, name.lower())
        return fn
    return register


def supported_commands() -> str:
    """Queue commands first, then the connection commands: the unknown-command hint."""
    names = sorted(name.decode() for name in COMMANDS)
    return " ".join(sorted(names, key=lambda name: not name.startswith("X")))


def dispatch(session, args: list[bytes]):
    """Run one command: a reply value, a Deferred, or an ErrorReply."""
    session.state.total_commands += 1
    name = args[0]
    entry = COMMANDS.get(name)  # clients send names in capitals nearly always: no copy then
    if entry is None:
        name = name.upper()
        entry = COMMANDS.get(name)
    if entry is not None and session.queued is None and session.authenticated:  # the common case, checked once
        fn, arity, lower = entry
        if (len(args) == arity) if arity > 0 else (len(args) >= -arity):
            try:  # run's body, inlined: one call less per command
                return fn(session, args)
            except ErrorReply as exc:
                return exc.as_reply()
            except Exception as exc:
                return internal_error(session, args, exc)
    try:
        if entry is None:
            raise errors.unknown_command(args[0], args[1:], supported_commands())
        fn, arity, lower = entry
        if (len(args) != arity) if arity > 0 else (len(args) < -arity):
            raise errors.wrong_arity(lower)
        if not session.authenticated and name not in NO_AUTH_NEEDED:
            raise errors.NOAUTH
        if session.queued is not None and name in NOT_INSIDE_MULTI:
            raise errors.not_inside_multi(lower.upper())
        if session.queued is not None and name not in RUN_INSIDE_MULTI:
            session.queued_bytes += sum(len(arg) for arg in args)
            if len(session.queued) >= MAX_QUEUED_COMMANDS or session.queued_bytes > MAX_QUEUED_BYTES:
                raise errors.too_much_queued(MAX_QUEUED_COMMANDS, MAX_QUEUED_BYTES >> 20)
    except ErrorReply as exc:
        if session.queued is not None:
            session.queue_failed = True  # as Redis: a command refused after MULTI aborts the EXEC
        return exc.as_reply()
    if session.queued is not None and name not in RUN_INSIDE_MULTI:
        session.queued.append((fn, args))
        return QUEUED
    return run(session, fn, args)


def run(session, fn, args: list[bytes]):
    """A command's reply; its error as an ErrorReply; a bug is logged and answered as one."""
    try:
        return fn(session, args)
    except ErrorReply as exc:
        return exc.as_reply()
    except Exception as exc:
        return internal_error(session, args, exc)


def internal_error(session, args: list[bytes], exc: Exception) -> ErrorReply:
    """A handler's bug: logged with its traceback, answered as an internal error (the connection goes on)."""
    logger.opt(exception=exc).error("command {!r} from {} failed: {}", args[0], session.addr, exc)
    return errors.INTERNAL()
