"""Cron expressions in a time zone: when a schedule (XSCHEDULE) runs next. Pure: takes times in.

The dialect: cron's five fields (minute hour day-of-month month day-of-week), with
names (MON, JAN), ranges, lists, steps, `L` and `#` as Debian cron and cronsim read
them; six fields put seconds first (an EZRA extension: `*/5 * * * * *`); and the
names @yearly (@annually), @monthly, @weekly, @daily (@midnight) and @hourly.
Times are in the schedule's zone (IANA names, `Europe/Paris`), UTC when none is given.

The expressions are evaluated by cronsim (Healthchecks.io's evaluator: small, pure
Python, no dependencies, follows Debian cron on daylight saving). It is imported
only when a schedule needs a time computed, so a server without schedules never
loads it (idle memory).

Daylight saving, as Debian cron (and cronsim) do it: an expression with a fixed
minute and hour (`30 2 * * *`) follows the wall clock, so a time the clock skips
runs once, just after the gap, and a time it repeats runs once, the first time.
An expression that runs every hour or more often (`0 * * * *`, `*/15 * * * *`)
follows elapsed time: it runs in both passes of a repeated hour.
"""

from __future__ import annotations

from datetime import datetime, timezone

MAX_EXPRESSION = 256  # characters
ALIASES = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}


class CronError(ValueError):
    """A cron expression or time zone that cannot be used; the message says why."""


def zone_of(name: str):
    """The tzinfo of an IANA zone name ('UTC' is datetime's own)."""
    if name.upper() == "UTC":
        return timezone.utc
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # stdlib; the data: the system's, else tzdata
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise CronError(f"unknown time zone {name[:64]!r} (an IANA name such as Europe/Paris, "
                        "America/New_York or UTC)") from None


class Cron:
    """One cron expression in one zone, checked when made."""

    __slots__ = ("text", "zone_name", "_expression", "_zone")

    def __init__(self, text: str, zone_name: str = "UTC", now_ms: int | None = None):
        if len(text) > MAX_EXPRESSION:
            raise CronError(f"cron expression is {len(text)} characters long; at most {MAX_EXPRESSION}")
        self.text = text
        self.zone_name = zone_name
        self._expression = ALIASES.get(text.strip().lower(), text)
        if self._expression.startswith("@"):
            raise CronError(f"unknown cron name {text[:32]!r}: one of {', '.join(ALIASES)}")
        if len(self._expression.split()) not in (5, 6):
            raise CronError(f"cron expression {text[:64]!r} has {len(self._expression.split())} fields; it takes "
                            "5 (minute hour day-of-month month day-of-week), or 6 with seconds first")
        self._zone = zone_of(zone_name)
        if self.next_after(0 if now_ms is None else now_ms) is None:
            raise CronError(f"cron expression {text[:64]!r} never runs")

    def next_after(self, ms: int) -> int | None:
        """The first run strictly after `ms` (ms since the epoch), in ms; None: never (50 years)."""
        from cronsim import CronSim, CronSimError
        start = datetime.fromtimestamp(ms / 1000, self._zone)
        try:
            runs = CronSim(self._expression, start)
            for run in runs:  # a repeated hour can give a wall-clock time before `ms`: skip it
                at = int(run.timestamp() * 1000)
                if at > ms:
                    return at
        except CronSimError as exc:
            raise CronError(f"bad cron expression {self.text[:64]!r}: {exc}") from None
        return None  # cronsim found nothing within 50 years

    def local(self, ms: int) -> str:
        """A time as people in the zone read it: '2026-03-29T03:00:00+02:00'."""
        return datetime.fromtimestamp(ms / 1000, self._zone).isoformat(timespec="seconds")


def local_time(ms: int, zone_name: str) -> str:
    """`ms` in the zone, ISO 8601 with its offset (without loading the cron library)."""
    return datetime.fromtimestamp(ms / 1000, zone_of(zone_name)).isoformat(timespec="seconds")
