"""Per-queue settings: what XCFGSET and the config file's `queue` lines accept, parsed once.

    XCFGSET queue <setting value> [<setting value> ...]

    VISIBILITY-TIMEOUT <seconds>                    lease of a delivered task
    MAX-ATTEMPTS <n>                                deliveries before a failing task is dead
    RETENTION <seconds> | FOREVER                   how long done tasks are kept (0: deleted on ack)
    BACKOFF FIXED <seconds>                         delay before a failed task is offered again
    BACKOFF EXPONENTIAL <base seconds> <max seconds>   base, 2 x base, 4 x base ... up to max
    RELEASE-ON-DISCONNECT <grace seconds> | OFF     a worker's tasks go back when its last connection closes
    IDMP-DURATION <seconds>                         idempotent producers (Redis 8.6): 1..86400, default 100
    IDMP-MAXSIZE <n>                                iids kept per producer: 1..10000, default 100
    PAUSED 1 | 0                                    1: pushes land, claims and take-overs hand out nothing
    MAX-IN-FLIGHT <n>                               at most n tasks leased at once, all workers together
    RATE-LIMIT <n> <seconds>                        at most n handed out in any window of that many seconds
    PARTITION-LIMIT <n>                             at most n tasks of one partition leased at once (default 1)

Every value may also be DEFAULT: the server's flag applies again (PAUSED: 0; MAX-IN-FLIGHT and
RATE-LIMIT: no limit, broker/flow.py; PARTITION-LIMIT: 1, broker/lanes.py). A parsed
setting is {column: value}; the column is the `queues` table's, the value is
what that column stores (None: the server's default; -1: FOREVER / OFF).
"""

from __future__ import annotations

import math

from .. import errors
from ..protocol.integers import to_int
from ..lifecycle import EXPONENTIAL, FIXED
from .options import Custom, Options, Value, parse_options

FOREVER = -1.0  # RETENTION FOREVER, stored as -1
OFF = -1.0      # RELEASE-ON-DISCONNECT OFF, stored as -1
IDMP_DURATION_DEFAULT = 100
IDMP_MAXSIZE_DEFAULT = 100
MAX_SECONDS = 10 * 365 * 86400.0  # nothing EZRA waits for is longer than ten years
MIN_VISIBILITY_TIMEOUT = 0.001  # leases are kept in whole milliseconds: less would be a lease of 0 ms
MAX_ATTEMPTS = 2 ** 31 - 1
MAX_LIMIT = 2 ** 31 - 1  # MAX-IN-FLIGHT's and RATE-LIMIT's n

COLUMNS = {  # XCFGSET token -> queues column
    b"VISIBILITY-TIMEOUT": "visibility_timeout",
    b"MAX-ATTEMPTS": "max_attempts",
    b"RETENTION": "retention_seconds",
    b"BACKOFF": "backoff",
    b"RELEASE-ON-DISCONNECT": "release_on_disconnect",
    b"IDMP-DURATION": "idmp_duration",
    b"IDMP-MAXSIZE": "idmp_maxsize",
    b"PAUSED": "paused",
    b"MAX-IN-FLIGHT": "max_in_flight",
    b"RATE-LIMIT": "rate_limit",  # two columns: rate_limit_count, rate_limit_seconds (RATE_COLUMNS)
    b"PARTITION-LIMIT": "partition_limit",
}
RATE_COLUMNS = ("rate_limit_count", "rate_limit_seconds")
IDMP_COLUMNS = ("idmp_duration", "idmp_maxsize")


def parse(args: list[bytes]) -> dict[str, object]:
    """XCFGSET's arguments after the queue name -> {column: stored value}. Raises CommandError."""
    if not args:
        raise errors.settings_required([t.decode() for t in COLUMNS])
    values, _ = parse_options(args, 0, SETTINGS)
    changes = {column: value for column, value in zip(COLUMNS.values(), values) if value is not UNSET}
    if "rate_limit" in changes:  # (n, seconds), or None for DEFAULT
        changes.update(zip(RATE_COLUMNS, changes.pop("rate_limit") or (None, None)))
    return changes


def parse_backoff(args: list[bytes]) -> tuple[str, int]:
    """BACKOFF FIXED <s> | EXPONENTIAL <base> <max> -> (stored text, arguments used)."""
    kind = args[0].upper()
    if kind == b"FIXED" and len(args) >= 2:
        return backoff_text((FIXED, seconds(args[1]), seconds(args[1]))), 2
    if kind == b"EXPONENTIAL" and len(args) >= 3:
        base, cap = seconds(args[1]), seconds(args[2])
        if base <= 0 or cap < base:
            raise errors.BACKOFF_EXPONENTIAL_ORDER
        return backoff_text((EXPONENTIAL, base, cap)), 3
    raise errors.BACKOFF_USAGE


def backoff_text(policy) -> str:
    kind, base, cap = policy
    return f"{FIXED} {number(base)}" if kind == FIXED else f"{EXPONENTIAL} {number(base)} {number(cap)}"


def backoff_policy(text: str):
    """The stored text ('fixed 5', 'exponential 1 60') as a policy tuple."""
    kind, *values = text.split()
    numbers = [float(v) for v in values]
    return (FIXED, numbers[0], numbers[0]) if kind == FIXED else (EXPONENTIAL, numbers[0], numbers[1])


def seconds(arg: bytes, positive: bool = False) -> float:
    try:
        if b"_" in arg or arg != arg.strip():  # float() reads "1_0" and " 5"; no Redis number is either
            raise ValueError(arg)
        value = float(arg)
    except ValueError:
        raise errors.SECONDS_INVALID from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0) or value > MAX_SECONDS:
        raise errors.seconds_out_of_range(positive, MAX_SECONDS, arg)
    return value


def integer(arg: bytes, low: int, high: int, setting: str, unit: str = "") -> int:
    """A setting's integer from `low` to `high`; `unit` names what it counts (' seconds'), for the error."""
    value = to_int(arg)
    if not low <= value <= high:
        raise errors.setting_out_of_range(setting, low, high, unit, arg)
    return value


def visibility_timeout(arg: bytes) -> float:
    """VISIBILITY-TIMEOUT's and --visibility-timeout's seconds: finite, at least 1 ms."""
    value = seconds(arg, positive=True)
    if value < MIN_VISIBILITY_TIMEOUT:
        raise errors.visibility_timeout_too_short(MIN_VISIBILITY_TIMEOUT, arg)
    return value


def max_attempts(arg: bytes) -> int:
    """MAX-ATTEMPTS' and --max-attempts' deliveries: 1 .. 2^31-1."""
    return integer(arg, 1, MAX_ATTEMPTS, "MAX-ATTEMPTS")


def _retention(arg: bytes) -> float:
    return FOREVER if arg.upper() == b"FOREVER" else seconds(arg)


def _release(arg: bytes) -> float:
    return OFF if arg.upper() == b"OFF" else seconds(arg)


def _idmp_duration(arg: bytes) -> int:
    return integer(arg, 1, 86400, "IDMP-DURATION", " seconds")


def _idmp_maxsize(arg: bytes) -> int:
    return integer(arg, 1, 10000, "IDMP-MAXSIZE", " entries")


def _paused(arg: bytes) -> int:
    if arg not in (b"0", b"1"):
        raise errors.paused_invalid(arg)
    return to_int(arg)


def _max_in_flight(arg: bytes) -> int:
    return integer(arg, 1, MAX_LIMIT, "MAX-IN-FLIGHT")


def _partition_limit(arg: bytes) -> int:
    return integer(arg, 1, MAX_LIMIT, "PARTITION-LIMIT")


def _take_rate_limit(args: list[bytes], i: int, _) -> tuple[tuple | None, int]:
    """RATE-LIMIT <n> <seconds> | DEFAULT -> ((n, seconds) or None, index after it)."""
    if args[i + 1].upper() == b"DEFAULT":
        return None, i + 2
    if len(args) < i + 3:
        raise errors.RATE_LIMIT_USAGE
    count = integer(args[i + 1], 1, MAX_LIMIT, "RATE-LIMIT's n")
    return (count, seconds(args[i + 2], positive=True)), i + 3


PARSERS = {
    "visibility_timeout": visibility_timeout,
    "max_attempts": max_attempts,
    "retention_seconds": _retention,
    "release_on_disconnect": _release,
    "idmp_duration": _idmp_duration,
    "idmp_maxsize": _idmp_maxsize,
    "paused": _paused,
    "max_in_flight": _max_in_flight,
    "partition_limit": _partition_limit,
}


UNSET = object()  # a setting the arguments do not name (None is DEFAULT: the server's flag)


def setting(convert) -> Value:
    """SETTING value, where the value may also be DEFAULT (None)."""
    return Value(lambda arg: None if arg.upper() == b"DEFAULT" else convert(arg), UNSET)


def _take_backoff(args: list[bytes], i: int, _) -> tuple[str | None, int]:
    if args[i + 1].upper() == b"DEFAULT":
        return None, i + 2
    text, used = parse_backoff(args[i + 1:])
    return text, i + 1 + used


# In the order of COLUMNS (parse pairs them up).
TAKERS = {"backoff": _take_backoff, "rate_limit": _take_rate_limit}  # settings of more than one value
SETTINGS = Options({token.decode(): Custom(TAKERS[column], default=UNSET) if column in TAKERS
                    else setting(PARSERS[column]) for token, column in COLUMNS.items()})


def parse_queue_line(line: str) -> tuple[bytes, dict[str, object]]:
    """A config-file / --queue line, 'emails VISIBILITY-TIMEOUT 60 MAX-ATTEMPTS 5' -> (name, changes)."""
    words = line.split()
    if len(words) < 3:
        raise ValueError(f"expected '<queue> <SETTING> <value> ...', got {line!r}")
    try:
        return words[0].encode(), parse([w.encode() for w in words[1:]])
    except errors.CommandError as exc:
        raise ValueError(f"{line!r}: {exc.message.removeprefix('ERR ')}") from None


def number(value: float) -> str:
    """Seconds as people write them: 30, 0.5."""
    return f"{value:g}"


def optional_seconds(value: float | None, none: str) -> str:
    """A setting's effective seconds as XINFO shows them; `none` (forever, off) for None."""
    return none if value is None else number(value)
