"""Every error EZRA answers, with Redis's prefixes and wording.

Clients map the first word to an exception class (redis-py's
`EXCEPTION_CLASSES`), so prefixes are API: keep them as Redis has them.
The UPPER_CASE errors are classes (`raise errors.SYNTAX` builds a fresh one);
the functions build theirs from their arguments.
"""

from .resp import ErrorReply

class CommandError(ErrorReply):
    """A command's own error: the client gets it, the connection stays."""


def err(message: str) -> CommandError:
    return CommandError("ERR " + message)


def _fixed(message: str) -> type[CommandError]:
    """An error whose message never changes, as a class: each `raise` builds a fresh instance.

    A shared instance raised again and again gains a traceback entry per raise, which
    keeps every raising frame and its arguments alive: 100 XADDs refused with a 1 MB
    field each held ~100 MB for good.
    """
    class FixedError(CommandError):
        def __init__(self):
            super().__init__(message)

    FixedError.message = message  # readable without an instance (tests, docs)
    FixedError.__qualname__ = FixedError.__name__ = message.split(" ", 1)[0].title() + "Error"
    return FixedError


def wrong_arity(name: str) -> CommandError:
    return err(f"wrong number of arguments for '{name.lower()}' command")


# Redis's commands for what a streams-only task queue does not have. Libraries built on them
# (BullMQ, Celery, RQ, dramatiq, huey, arq, saq, bee-queue...) cannot run on EZRA, and their
# users see nothing but this error: it says so, not only that the command is unknown.
OUTSIDE_A_QUEUE = {
    "Lua scripts": "EVAL EVALSHA EVAL_RO EVALSHA_RO SCRIPT FUNCTION FCALL FCALL_RO",
    "Lists": "LPUSH RPUSH LPUSHX RPUSHX LPOP RPOP BLPOP BRPOP LMOVE BLMOVE RPOPLPUSH BRPOPLPUSH "
             "LMPOP BLMPOP LLEN LRANGE LINDEX LSET LINSERT LREM LTRIM LPOS",
    "Pub/sub channels": "SUBSCRIBE PSUBSCRIBE SSUBSCRIBE UNSUBSCRIBE PUNSUBSCRIBE SUNSUBSCRIBE "
                        "PUBLISH SPUBLISH PUBSUB",
    "Keys other than queues (strings, hashes, sets, sorted sets)":
        "SET SETNX SETEX PSETEX GET GETSET GETDEL GETEX MGET MSET INCR INCRBY DECR DECRBY "
        "DEL UNLINK EXPIRE PEXPIRE EXPIREAT PEXPIREAT TTL PTTL PERSIST KEYS SCAN DBSIZE RENAME "
        "WATCH UNWATCH HSET HSETNX HGET HMSET HMGET HGETALL HDEL HINCRBY HEXISTS HLEN HKEYS HVALS "
        "SADD SREM SMEMBERS SISMEMBER SCARD SPOP ZADD ZREM ZRANGE ZRANGEBYSCORE ZREVRANGE "
        "ZREVRANGEBYSCORE ZCARD ZSCORE ZINCRBY ZPOPMIN ZPOPMAX BZPOPMIN BZPOPMAX ZREMRANGEBYSCORE",
}
_OUTSIDE = {command: what for what, commands in OUTSIDE_A_QUEUE.items() for command in commands.split()}


def unknown_command(name, args: list[bytes], supported: str) -> CommandError:
    # Redis's wording first (clients and people recognise it), then the hint.
    shown = "".join(f"'{_printable(a)}' " for a in args[:20])
    what = _OUTSIDE.get(_printable(name).upper())
    why = f". {what} are outside a streams-only queue: a library built on them cannot run on EZRA" if what else ""
    return err(
        f"unknown command '{_printable(name)}', with args beginning with: {shown}"
        f"(EZRA is a task queue; supported: {supported}{why})"
    )


def unknown_subcommand(sub: str, command: str) -> CommandError:
    return err(f"unknown subcommand '{_printable(sub)}'. Try {command.upper()} HELP.")


def _printable(value) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return text[:128]


NOT_INTEGER = _fixed("ERR value is not an integer or out of range")
EXECABORT = _fixed("EXECABORT Transaction discarded because of previous errors.")
INVALID_ID = _fixed("ERR Invalid stream ID specified as stream command argument")
SYNTAX = _fixed("ERR syntax error")
ID_TOO_SMALL = _fixed("ERR The ID specified in XADD is equal or smaller than the target stream top item")
ID_ZERO = _fixed("ERR The ID specified in XADD must be greater than 0-0")
TIMEOUT_NEGATIVE = _fixed("ERR timeout is negative")
DOLLAR_IN_XREADGROUP = _fixed(
    "ERR The $ ID is meaningless in the context of XREADGROUP: you want to read the history of this "
    "consumer by specifying a proper ID, or use the > ID to get new messages. The $ ID would just "
    "return an empty result set."
)
UNBALANCED_STREAMS = _fixed(
    "ERR Unbalanced XREAD list of streams: for each stream key an ID or '$' must be specified."
)
GROUP_IN_XREAD = _fixed("ERR The GROUP option is only supported by XREADGROUP. You called XREAD instead.")
NOACK_IN_XREAD = _fixed("ERR The NOACK option is only supported by XREADGROUP. You called XREAD instead.")
GT_IN_XREAD = _fixed(
    "ERR The > ID can be specified only when calling XREADGROUP using the GROUP <group> <consumer> option.")
NO_SUCH_KEY = _fixed("ERR no such key")
XGROUP_NEEDS_KEY = _fixed(
    "ERR The XGROUP subcommand requires the key to exist. Note that for CREATE you may want to use "
    "the MKSTREAM option to create an empty stream automatically."
)
DB_OUT_OF_RANGE = _fixed("ERR DB index is out of range")
SELECT_ONLY_ZERO = _fixed("ERR EZRA has one database: only SELECT 0 is allowed")
# Trimming (trimming.py): Redis 7's syntax errors, word for word, then EZRA's one refusal.
TRIM_STRATEGIES_BOTH = _fixed("ERR syntax error, MAXLEN and MINID options at the same time are not compatible")
MAXLEN_NEGATIVE = _fixed("ERR The MAXLEN argument must be >= 0.")
LIMIT_NEGATIVE = _fixed("ERR The LIMIT argument must be >= 0.")
LIMIT_WITHOUT_STRATEGY = _fixed("ERR syntax error, LIMIT cannot be used without specifying a trimming strategy")
LIMIT_WITHOUT_TILDE = _fixed("ERR syntax error, LIMIT cannot be used without the special ~ option")
XTRIM_WITHOUT_STRATEGY = _fixed("ERR syntax error, XTRIM must be called with a trimming strategy")
EXACT_TRIM_REFUSED = _fixed(
    "ERR exact trimming is refused: EZRA never drops unfinished tasks, which MAXLEN n, MAXLEN = n, "
    "MINID id and MINID = id could do. Use MAXLEN ~ n or MINID ~ id: approximate trimming removes "
    "done tasks only, oldest first (XADD and XTRIM alike)")
INTERNAL = _fixed("ERR internal error (logged on the server)")
NOAUTH = _fixed("NOAUTH Authentication required.")
WRONGPASS = _fixed("WRONGPASS invalid username-password pair or user is disabled.")
AUTH_NOT_CONFIGURED = _fixed(
    "ERR AUTH <password> called without any password configured for the default user. "
    "Are you sure your configuration is correct?"
)
NOPROTO = _fixed("NOPROTO unsupported protocol version")
MAX_CLIENTS = _fixed("ERR max number of clients reached")


def task_too_large(size: int, limit: int) -> CommandError:
    return err(f"task too large: {size} bytes in fields, the limit is {limit} (--max-task-size)")


def argument_too_large(size: int, limit: int, closing_above: int | None = None) -> CommandError:
    """An argument over --max-task-size (+64 KiB), read past; `closing_above`: too large even for that."""
    if closing_above is None:
        return err(f"task too large: an argument of {size} bytes, the limit is {limit} (--max-task-size)")
    return err(f"task too large: an argument of {size} bytes, the limit is {limit} (--max-task-size); "
               f"above {closing_above} bytes the connection is closed")


def backup_refused(reason: str) -> CommandError:
    return err(f"BACKUP refused: {reason}")


def storage_failed(reason: str) -> CommandError:
    return err(f"storage error, nothing was changed: {reason}")


DISK_FULL = _fixed(
    "ERR storage error, nothing was changed: disk full: no room for new tasks on the database's file "
    "system (acks, claims and reads still work; pushes resume by themselves once space is freed)")


def denied_protected_mode() -> CommandError:
    """Redis's protected-mode refusal (networking.c), naming EZRA's options instead of CONFIG SET."""
    return CommandError(
        "DENIED EZRA is running in protected mode because protected mode is enabled and no password is set "
        "for the default user. In this mode connections are only accepted from the loopback interface. If you "
        "want to connect from external computers to EZRA you may adopt one of the following solutions: "
        "1) Set up an authentication password for the default user: restart EZRA with '--password <password>' "
        "(or EZRA_PASSWORD, or 'password = <password>' in its config file); clients then send AUTH. "
        "2) Alternatively you can just disable the protected mode by setting EZRA_PROTECTED_MODE=no (or "
        "'protected-mode = no' in the config file) and then restarting the server, however MAKE SURE EZRA is "
        "not publicly accessible from internet if you do so. "
        "3) If you started the server manually just for testing, restart it with the '--protected-mode no' "
        "option. NOTE: You only need to do one of the above things in order for the server to start "
        "accepting connections from the outside.")


def too_many_unauthenticated(host: str, limit: int) -> CommandError:
    return err(f"closed to make room: {host} has more than {limit} connections that have not authenticated "
               f"yet (--max-unauthenticated-per-host) and this was the oldest; authenticate (AUTH) right "
               f"after connecting")


def auth_timeout(seconds: float) -> CommandError:
    return err(f"closed: not authenticated within {seconds:g}s of connecting (--auth-timeout)")


def database_corrupt(reason: str) -> CommandError:
    """A write refused because ezra.db was found corrupt (storage/integrity.py)."""
    return err(f"database corrupt, EZRA has stopped writing to it (reads of the pages still whole work): "
               f"{reason}; stop EZRA and restore ezra.db from a backup")
