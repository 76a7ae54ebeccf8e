"""The command table: the registry, and dispatch.

A command is registered with `@command(NAME, arity)`; arity is declared once per
command, as Redis does (positive: exact, negative: at least), so arity errors are
uniform. `dispatch` checks the name, the arity, authentication and MULTI, then `run`
calls the handler. A handler returns a reply value (see resp.py), or a `Deferred`
when the answer comes from the writer: the connection waits for it after reading
the rest of a pipeline, so pipelined XADDs share one commit.

The session a handler gets is the connection's (ezra/session.py); this module reads
only its `authenticated`, `queued`, `queued_bytes`, `queue_failed` and
`server.total_commands`, and imports nothing of the server.
"""

from __future__ import annotations

from loguru import logger

from .. import errors
from ..resp import ErrorReply, SimpleString


class Deferred:
    """A reply that the writer will produce: `transform(result)` once it commits."""

    __slots__ = ("request", "transform")

    def __init__(self, request, transform=None):
        self.request = request
        self.transform = transform

    def resolve(self):
        result = self.request.wait()
        return result if self.transform is None else self.transform(result)


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


def command(name: str, arity: int):
    """Register the decorated handler as command `name` (arity: exact if positive, at least -arity if not)."""
    def register(fn):
        COMMANDS[name.encode()] = (fn, arity, name.lower())
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
