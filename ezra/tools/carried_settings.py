"""A queue's XCFGSET settings across `ezra export` and `ezra import` (move.py).

Export keeps each setting XINFO STREAM shows (what applies now, the server's flags included, so
the queue behaves the same on a server whose flags differ) in the hash q::ezra-settings,
setting -> the value as XCFGSET takes it; Redis enforces none of them. Import sets them again
with one XCFGSET, before any task is copied: EZRA takes all of them or none.
"""

from __future__ import annotations

import sys

from ..adapters.client import Client, ReplyError
from .stream_copy import MoveError, pairs, shown, stream_facts

SETTINGS_SUFFIX = b"::ezra-settings"
# XINFO STREAM's field -> XCFGSET's setting, for the settings export carries (in XCFGSET's order);
# MAX-IN-FLIGHT, RATE-LIMIT and PARTITION-LIMIT are listed only when set.
SETTINGS = {b"visibility-timeout": b"VISIBILITY-TIMEOUT", b"max-attempts": b"MAX-ATTEMPTS",
            b"retention": b"RETENTION", b"backoff": b"BACKOFF", b"release-on-disconnect": b"RELEASE-ON-DISCONNECT",
            b"idmp-duration": b"IDMP-DURATION", b"idmp-maxsize": b"IDMP-MAXSIZE", b"paused": b"PAUSED",
            b"max-in-flight": b"MAX-IN-FLIGHT", b"rate-limit": b"RATE-LIMIT", b"partition-limit": b"PARTITION-LIMIT"}


def settings_shown(info: dict) -> dict:
    """{XCFGSET setting: its value as XCFGSET takes it} from XINFO STREAM's fields."""
    return {setting: value if isinstance(value, bytes) else str(value).encode()
            for field, setting in SETTINGS.items() if (value := info.get(field)) is not None}


def keep_settings(redis: Client, queue: bytes, settings: dict | None, dry_run: bool) -> None:
    """Export: HSET q::ezra-settings (not in a dry run); None (export --data-dir) says why not."""
    if settings is None:
        print(f"ezra export: warning: {shown(queue)}: its settings (XCFGSET) are not carried from --data-dir: "
              f"export through the port (--port) to keep them in {shown(queue + SETTINGS_SUFFIX)}", file=sys.stderr)
    elif settings and not dry_run:
        redis.call("HSET", queue + SETTINGS_SUFFIX, *[word for pair in settings.items() for word in pair])


def restore_settings(redis: Client, ezra: Client, queue: bytes, dry_run: bool) -> dict:
    """Import: the settings of q::ezra-settings ({} without one), set on the queue (not in a dry run)."""
    if stream_facts(redis, queue + SETTINGS_SUFFIX, kinds=(b"hash",))[0] != b"hash":
        return {}
    settings = redis_settings(redis, queue)
    if settings and not dry_run:
        apply_settings(ezra, queue, settings)
    return settings


def settings_line(queue: bytes, settings: dict | None, verb: str, note: str) -> str:
    """The summary's line on the queue's settings, if any moved."""
    if not settings:
        return ""
    listed = ", ".join(f"{shown(setting)} {shown(value)}" for setting, value in settings.items())
    return f"\n{shown(queue)}: settings {verb} {shown(queue + SETTINGS_SUFFIX)}: {listed}; {note}"


def redis_settings(redis: Client, queue: bytes) -> dict:
    """{setting: value} from an export's q::ezra-settings, in XCFGSET's order; MoveError for a
    field that is no setting EZRA takes (nothing is copied then)."""
    found = pairs(redis.call("HGETALL", queue + SETTINGS_SUFFIX))
    unknown = sorted(set(found) - set(SETTINGS.values()))
    if unknown:
        raise MoveError(f"its {SETTINGS_SUFFIX.decode()} hash holds {', '.join(repr(shown(u)) for u in unknown)}: "
                        f"not a setting XCFGSET takes ({', '.join(s.decode() for s in SETTINGS.values())})")
    return {setting: found[setting] for setting in SETTINGS.values() if setting in found}


def apply_settings(ezra: Client, queue: bytes, settings: dict) -> None:
    """One XCFGSET with every setting: EZRA takes all of them or none (MoveError: nothing copied)."""
    try:
        ezra.call("XCFGSET", queue, *[word for setting, value in settings.items()
                                      for word in (setting, *value.split())])
    except ReplyError as exc:
        raise MoveError(f"XCFGSET refused its {SETTINGS_SUFFIX.decode()} hash: {exc}") from None
