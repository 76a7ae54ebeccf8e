"""Every error EZRA answers, with Redis's prefixes and wording: the one place its texts are written.

Clients map the first word to an exception class (redis-py's
`EXCEPTION_CLASSES`), so prefixes are API: keep them as Redis has them.
The UPPER_CASE errors are classes (`raise errors.SYNTAX` builds a fresh one);
the functions build theirs from their arguments. Redis's own texts come first,
then EZRA's by family, then the HTTP listener's (statuses instead of prefixes).
tests/test_error_catalogue.py fails if code elsewhere writes an error's text inline.
"""

from .protocol.resp import ErrorReply

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
ENTRIESREAD_INVALID = _fixed("ERR value for ENTRIESREAD must be positive or -1")


def subcommand_syntax(sub: bytes, command: str) -> CommandError:
    """Redis's addReplySubcommandSyntaxError: a known subcommand with words it does not take."""
    return err(f"unknown subcommand or wrong number of arguments for '{_printable(sub)}'. "
               f"Try {command.upper()} HELP.")
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


# ---------------------------------------------------------------- EZRA's own texts, by family
# Below: the texts that were written where they are raised. Redis's wording where Redis has the
# case, EZRA's otherwise; each says what to do instead. Variable parts are a function's arguments.

def _text(value: bytes, most: int | None = None) -> str:
    """A client's bytes shown in an error: decoded as the raising code did, cut at `most`."""
    return value[:most].decode("utf-8", "replace")


def wrong_subcommand_arity(command: str, sub: bytes) -> CommandError:
    """Redis's arity error for a container command's subcommand: 'xgroup|create'."""
    return wrong_arity(f"{command}|{sub.decode()}")


def protocol_error(reason: str) -> CommandError:
    """request_reader.py's ProtocolError ('Protocol error: ...'), sent before the connection closes.
    Its texts stay in request_reader.py (the wire format): it imports nothing of errors.py."""
    return err(reason)


# Transactions (MULTI/EXEC) and the writer that runs them.
MULTI_NESTED = _fixed("ERR MULTI calls can not be nested")
EXEC_WITHOUT_MULTI = _fixed("ERR EXEC without MULTI")
DISCARD_WITHOUT_MULTI = _fixed("ERR DISCARD without MULTI")
SHUTTING_DOWN = _fixed("ERR server is shutting down")
EXEC_INSIDE_EXEC = _fixed("ERR EXEC inside EXEC")  # a bug: the command table never nests them
COMMIT_WAIT_INSIDE_EXEC = _fixed("ERR cannot wait for a commit inside EXEC")  # it would wait for itself


def not_inside_multi(command: str) -> CommandError:
    return err(f"{command} is not allowed inside MULTI: an EXEC is one transaction and "
               f"{command} waits for a commit; send it on its own, after the EXEC")


def too_much_queued(max_commands: int, max_megabytes: int) -> CommandError:
    return err(f"too much queued between MULTI and EXEC (at most {max_commands} "
               f"commands, {max_megabytes} MB; an EXEC holds every other client "
               f"until it ends): send EXEC sooner, or pipeline without MULTI "
               f"(redis-py: pipeline(transaction=False))")


# The connection's commands: HELLO, CLIENT.
BAD_CLIENT_NAME = _fixed("ERR Client names cannot contain spaces, newlines or special characters.")
PROTOCOL_NOT_INTEGER = _fixed("ERR Protocol version is not an integer or out of range")
HELLO_NOT_AUTHENTICATED = _fixed(
    "NOAUTH HELLO must be called with the client already authenticated, otherwise "
    "the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the "
    "client and select the RESP protocol version at the same time")


def unknown_hello_option(word: bytes) -> CommandError:
    return err(f"Syntax error in HELLO option '{_text(word)}'")


def unrecognized_option(word: bytes) -> CommandError:
    return err(f"Unrecognized option '{_text(word)}'")


# Names: queues, their dead-letter views, workers (consumers).
def queue_name_too_long(size: int, limit: int) -> CommandError:
    return err(f"queue name is {size} bytes long; a new queue's name is at most {limit} bytes")


def too_many_queues(most: int) -> CommandError:
    return err(f"this database holds the most queues it can ({most:,}); no new queue can be made")


def queue_rows_used(rows: int) -> CommandError:
    return err(f"this queue has used all of its {rows:,} row ids; push to a new queue")


def worker_name_too_long(size: int, limit: int) -> CommandError:
    return err(f"consumer name is {size} bytes long; EZRA takes at most {limit} "
               "(it is stored with every task the consumer holds)")


def dead_view_is_read_only(name: bytes, queue: bytes) -> CommandError:
    return err(f"'{_text(name)}' is the read-only dead-letter view of "
               f"'{_text(queue)}': use XRANGE, XLEN, XDEL or XREQUEUE on it")


# Stream ids (lifecycle.py): Redis's words.
START_ID_INVALID = _fixed("ERR invalid start ID for the interval")
END_ID_INVALID = _fixed("ERR invalid end ID for the interval")
IDS_EXHAUSTED = _fixed("ERR The stream has exhausted the last possible ID, unable to add more items")

# XADD's options: Redis 8.2's IDMP words, then EZRA's DELAY, ATTEMPTS, UNIQUE, FAILURE, PRIORITY, PARTITION.
IDMP_TWICE = _fixed("ERR IDMP/IDMPAUTO specified multiple times")
IDMP_IID_EMPTY = _fixed("ERR IDMP requires a non-empty idempotent ID")
IDMP_NEEDS_AUTO_ID = _fixed("ERR IDMP/IDMPAUTO can be used only with auto-generated IDs")
ATTEMPTS_OUT_OF_RANGE = _fixed("ERR ATTEMPTS must be an integer from 0 to 2147483647")
UNIQUE_TWICE = _fixed("ERR UNIQUE specified multiple times")
UNIQUE_KEY_EMPTY = _fixed("ERR UNIQUE requires a non-empty key")
FAILURE_NOT_A_RECORD = _fixed(
    'ERR FAILURE must be a JSON object {"cause": text, "reason": text or null, "worker": text or null, '
    '"at": ms or null}, as ezra export writes it')
DELAY_ON_DEAD_TASK = _fixed(
    "ERR DELAY does not apply to a dead task (XADD on a ::dead queue): it is never delivered")
UNIQUE_ON_DEAD_TASK = _fixed(
    "ERR UNIQUE does not apply to a dead task (XADD on a ::dead queue): a dead task holds no key")
PRIORITY_OUT_OF_RANGE = _fixed("ERR PRIORITY must be an integer from 0 to 9")
PRIORITY_TWICE = _fixed("ERR PRIORITY specified multiple times")
PARTITION_TWICE = _fixed("ERR PARTITION specified multiple times")
PARTITION_KEY_EMPTY = _fixed("ERR PARTITION requires a non-empty key")
TRIM_ON_DEAD_TASK = _fixed(
    "ERR MAXLEN/MINID trim a live queue's done tasks: they do not apply to a dead task (XADD on a ::dead queue)")


def idmp_producer_empty(option: str) -> CommandError:
    return err(f"{option} requires a non-empty producer ID")


def unique_key_too_long(size: int, limit: int) -> CommandError:
    return err(f"UNIQUE key is {size} bytes long; at most {limit} bytes")


def partition_key_too_long(size: int, limit: int) -> CommandError:
    return err(f"PARTITION key is {size} bytes long; at most {limit} bytes")


# XADD NAME name (a task's own name in its queue, an EZRA extension), XRESULT queue NAME name.
NAME_TWICE = _fixed("ERR NAME specified multiple times")
NAME_EMPTY = _fixed("ERR NAME requires a non-empty name")


def task_name_too_long(size: int, limit: int) -> CommandError:
    return err(f"NAME is {size} bytes long; at most {limit} bytes")


def no_such_name(queue: bytes, name: bytes) -> CommandError:
    return err(f"no task named '{_text(name, 256)}' in queue '{_text(queue, 256)}' "
               "(never pushed, or removed: retention, TTL, XTRIM, XDEL)")


# Results and progress (EZRA's XACK ... RESULT, XRESULT, XPROGRESS).
RESULT_SYNTAX = _fixed("ERR XACK with RESULT takes one id and one value: XACK queue group id RESULT value")
RESULT_PUSH_CONFLICT = _fixed(
    "ERR XADD ... RESULT pushes a done task with its result (ezra import): DELAY, UNIQUE, AFTER and a ::dead queue "
    "do not apply to it")
MAX_PROGRESS_BYTES = 8 * 1024  # XPROGRESS's value: a short report, not a second result


def result_too_large(size: int, limit: int) -> CommandError:
    return err(f"RESULT too large: {size} bytes, the limit is {limit} (--max-task-size); nothing was acked")


def progress_too_large(size: int) -> CommandError:
    return err(f"progress too large: {size} bytes, the limit is {MAX_PROGRESS_BYTES} (8 KB); nothing was recorded")


def no_such_queue(queue: bytes) -> CommandError:
    return err(f"no such queue '{_text(queue, 256)}'")


def no_such_task(queue: bytes, task_id: tuple) -> CommandError:
    return err(f"no such task {task_id[0]}-{task_id[1]} in queue '{_text(queue, 256)}' "
               "(never pushed, or removed: retention, TTL, XTRIM, XDEL)")


def progress_not_in_flight(task_id: tuple, state: str) -> CommandError:
    return err(f"task {task_id[0]}-{task_id[1]} is {state.replace('_', '-')}, not in flight: "
               "XPROGRESS reports the progress of a task a worker holds")
# XADD AFTER n queue id ... (dependencies, an EZRA extension)
AFTER_TWICE = _fixed("ERR AFTER specified multiple times")
AFTER_ON_DEAD_TASK = _fixed(
    "ERR AFTER does not apply to a dead task (XADD on a ::dead queue): it never runs")
AFTER_WITH_UNIQUE = _fixed(
    "ERR AFTER and UNIQUE cannot be combined: a waiting task holds no unique key")


def after_count_out_of_range(most: int) -> CommandError:
    return err(f"AFTER needs a number of tasks from 1 to {most}, then that many queue and id pairs")


def after_pairs_missing(n: int) -> CommandError:
    return err(f"AFTER {n} needs {n} queue and id pairs, then the task's id and its fields")


def dependency_unknown(queue: bytes, task_id: bytes) -> CommandError:
    return err(f"AFTER names a task that does not exist: queue '{queue.decode('utf-8', 'replace')}' id "
               f"{task_id.decode('utf-8', 'replace')} (a task named must exist; a done one counts at once); "
               "nothing was stored")


# Reads, nacks and take-overs (XREADGROUP, XNACK, XCLAIM, XAUTOCLAIM): Redis's words where it has them.
BLOCK_NOT_INTEGER = _fixed("ERR timeout is not an integer or out of range")
MIN_IDLE_NOT_INTEGER = _fixed("ERR min-idle-time is not an integer")
XCLAIM_MIN_IDLE_INVALID = _fixed("ERR Invalid min-idle-time argument for XCLAIM")
XAUTOCLAIM_MIN_IDLE_INVALID = _fixed("ERR Invalid min-idle-time argument for XAUTOCLAIM")
AUTOCLAIM_COUNT_INVALID = _fixed("ERR COUNT must be > 0")
RETRYCOUNT_NEGATIVE = _fixed("ERR RETRYCOUNT must be zero or positive")
REASON_NEEDS_LONG_FORM = _fixed(
    "ERR REASON needs XNACK's long form: XNACK queue group FAIL IDS numids id... REASON text")
NACK_NUMIDS_INVALID = _fixed("ERR numids must be a positive integer matching the ids given")
NUMIDS_NOT_POSITIVE = _fixed("ERR Number of IDs must be a positive integer")
NUMIDS_NOT_MATCHING = _fixed("ERR The `numids` parameter must match the number of arguments")


def xclaim_option_invalid(word: str) -> CommandError:
    return err(f"Invalid {word} option argument for XCLAIM")


def unknown_xclaim_option(word: bytes) -> CommandError:
    return err(f"Unrecognized XCLAIM option '{_text(word)[:128]}'")


# Listings (XINFO TASKS, XINFO QUEUES) and BACKUP.
TASK_STATE_UNKNOWN = _fixed(
    "ERR state must be one of available, delayed, in_flight, done, dead, waiting, unfinished")


def count_out_of_range(most: int) -> CommandError:
    return err(f"COUNT must be 1..{most}")


def backup_failed(reason) -> CommandError:
    return err(f"BACKUP failed: {reason}")


# Queue settings (XCFGSET, the config file's `queue` lines; queue_settings.py).
BACKOFF_EXPONENTIAL_ORDER = _fixed("ERR BACKOFF EXPONENTIAL needs 0 < base <= max seconds")
BACKOFF_USAGE = _fixed("ERR BACKOFF takes FIXED <seconds> or EXPONENTIAL <base seconds> <max seconds>")
SECONDS_INVALID = _fixed("ERR value is not a valid number of seconds")
RATE_LIMIT_USAGE = _fixed("ERR RATE-LIMIT takes <n> <seconds> (at most n tasks handed out in any window of that "
                          "many seconds) or DEFAULT")


def settings_required(names: list[str]) -> CommandError:
    return err("At least one setting is required: " + ", ".join(names))


def seconds_out_of_range(positive: bool, most: float, got: bytes) -> CommandError:
    return err(f"seconds must be {'above' if positive else 'at least'} 0 and at most {most:.0f}, got {_text(got)}")


def setting_out_of_range(setting: str, low: int, high: int, unit: str, got: bytes) -> CommandError:
    """`unit`: what the numbers count, with its leading space (' seconds'), or ''."""
    return err(f"{setting} must be between {low} and {high}{unit}, got {got[:40].decode('ascii', 'replace')}")


def visibility_timeout_too_short(least: float, got: bytes) -> CommandError:
    return err(f"VISIBILITY-TIMEOUT must be at least {least} seconds (1 ms), got {_text(got, 40)}")


def paused_invalid(got: bytes) -> CommandError:
    return err(f"PAUSED must be 1 (pause) or 0 (resume), got {_text(got, 40)}")


# Schedules (XSCHEDULE; schedule_settings.py, broker/schedules.py).
SCHEDULES_NOT_SERVED = _fixed("ERR schedules are not served by this server")
SCHEDULE_USAGE = _fixed(
    "ERR a schedule is: name queue cron [TZ zone] [SKIP-IF-UNFINISHED] [SLOT-FIELD field] FIELDS field value ...")
SCHEDULE_FIELDS_MISSING = _fixed("ERR FIELDS field value [field value ...] must follow the schedule's options")
SCHEDULE_QUEUE_EMPTY = _fixed("ERR queue name must not be empty")
SCHEDULE_FIELDS_NOT_PAIRS = _fixed(
    "ERR FIELDS takes field value pairs: at least one field, and a value for each")
CRON_NOT_TEXT = _fixed("ERR the cron expression and TZ must be text (UTF-8)")


def unknown_schedule_option(word: bytes) -> CommandError:
    return err(f"unknown schedule option {_text(word, 40)!r}: after the cron expression "
               "come TZ zone, SKIP-IF-UNFINISHED, SLOT-FIELD field, then FIELDS field value ...")


def schedule_name_length(most: int, got: int) -> CommandError:
    return err(f"schedule name must be 1 to {most} bytes long, got {got}")


def cron_invalid(reason: str) -> CommandError:
    """cron.py's CronError says what is wrong with the expression or the zone."""
    return err(reason)


def too_many_schedules(most: int) -> CommandError:
    return err(f"too many schedules (at most {most}): XSCHEDULE DEL some first")


def schedule_queue_refused(queue: bytes, why: str) -> CommandError:
    """XSCHEDULE SET into a queue that a push would be refused now: `why`, the push's error."""
    return err(f"schedule not set: a push to its queue {_text(queue, 60)!r} is refused: {why.removeprefix('ERR ')}")


# ---------------------------------------------------------------- the HTTP listener (web/server.py)
# Its refusals carry an HTTP status instead of a Redis prefix; the dashboard's error page shows
# the text. Fixed ones are classes too (`raise errors.HTTP_NO_SUCH_QUEUE`), for the same reason.

class HttpError(Exception):
    """A request refused: the status line, the text the error page shows, any extra headers."""

    def __init__(self, status: str, message: str, headers: list | None = None):
        super().__init__(message)
        self.status = status
        self.headers = headers or []


def _fixed_http(status: str, message: str, headers: list | None = None) -> type[HttpError]:
    class FixedHttpError(HttpError):
        def __init__(self):
            super().__init__(status, message, headers)

    FixedHttpError.status_line, FixedHttpError.message = status, message  # readable without an instance
    return FixedHttpError


HTTP_PROTECTED_MODE = _fixed_http(
    "403 Forbidden", "EZRA is running in protected mode: it has no password, so only clients on its own "
    "machine (127.0.0.1, ::1) are served. Set --password (then log in with any user name and that password), "
    "or --protected-mode no on a network you trust.")
HTTP_PASSWORD_NEEDED = _fixed_http("401 Unauthorized", "this server needs its password (any user name)",
                                   [("WWW-Authenticate", 'Basic realm="ezra", charset="UTF-8"')])
HTTP_CROSS_SITE_ORIGIN = _fixed_http("403 Forbidden", "cross-site request refused (Origin is another site)")
HTTP_CROSS_SITE_FETCH = _fixed_http("403 Forbidden", "cross-site request refused (Sec-Fetch-Site)")
HTTP_STALE_FORM_TOKEN = _fixed_http("403 Forbidden", "missing or stale form token: reload the page and try again")
HTTP_BAD_CONTENT_LENGTH = _fixed_http("400 Bad Request", "bad Content-Length")
HTTP_FORM_TOO_LARGE = _fixed_http("413 Content Too Large", "form too large")
HTTP_PAGE_NOT_A_NUMBER = _fixed_http("400 Bad Request", "page must be a number")
HTTP_PAGES_START_AT_1 = _fixed_http("400 Bad Request", "pages start at 1")
HTTP_PAUSED_INVALID = _fixed_http("400 Bad Request", "paused must be 1 or 0")
HTTP_BAD_TASK_ID = _fixed_http("400 Bad Request", "bad task id")
HTTP_NO_SUCH_QUEUE = _fixed_http("404 Not Found", "no such queue")
HTTP_NO_SUCH_FILE = _fixed_http("404 Not Found", "no such file")
HTTP_FAILED = "the server failed to answer this page; see its log"  # a 500's page: the log has the error
# /healthz's 503 bodies (text/plain)
HEALTH_CORRUPT = b"down: the database is corrupt, writes are refused (see the log, or INFO persistence)\n"
HEALTH_WRITER_STUCK = b"down: the writer is stuck\n"


def health_down(reason) -> bytes:
    return f"down: {reason}\n".encode()


def http_method_not_allowed(method: str, path: str) -> HttpError:
    return HttpError("405 Method Not Allowed", f"{method} is not allowed on {path}")


def http_nothing_at(path: str) -> HttpError:
    return HttpError("404 Not Found", f"nothing at {path}")


def http_misdirected(hostname: str, host: str) -> HttpError:
    return HttpError("421 Misdirected Request",
                     f"this server has no password, so it answers only to its IP address, localhost "
                     f"or {hostname}, not {host!r} (set --password to use other names)")


def http_missing(key: str) -> HttpError:
    return HttpError("400 Bad Request", f"missing {key}")


def http_no_such_task(task_id: tuple) -> HttpError:
    return HttpError("404 Not Found", f"no task {task_id[0]}-{task_id[1]} in this queue: it was never "
                                      "pushed, or it was acked and deleted, trimmed or purged")


def http_body_cut_short(reason) -> str:
    """web/server.py's ClientInputError text: a 400 page, the connection closed."""
    return f"the request body ended early or came too slowly: {reason}"


# ---------------------------------------------------------------- a broken invariant (a bug)

class StateGuardFailed(RuntimeError):
    """A guarded UPDATE did not find the task in a state its caller's SELECT had just read.
    Not a CommandError on purpose: the writer rolls the whole batch back and logs it, and
    the clients in it get a storage error."""


def move_not_drawn(from_state, to_state) -> StateGuardFailed:
    """QueueState.move was asked for a change of counts lifecycle.MOVES does not have."""
    return StateGuardFailed(f"counts moved {from_state} -> {to_state}: not a move of lifecycle.MOVES")


def guard_failed(move: str, rowid: int, state: str) -> StateGuardFailed:
    return StateGuardFailed(f"{move}: task rowid {rowid}, read as {state}, is not in a state this move starts from")
