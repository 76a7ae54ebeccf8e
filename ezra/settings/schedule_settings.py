"""What XSCHEDULE SET and the config file's `schedule` lines accept, parsed once (as queue_settings.py
is for XCFGSET and `queue` lines):

    <name> <queue> <cron> [TZ zone] [SKIP-IF-UNFINISHED] [SLOT-FIELD field] FIELDS field value [field value ...]

    TZ zone               the IANA zone the expression is read in (default UTC)
    SKIP-IF-UNFINISHED    a slot passes without a push while the last task pushed is unfinished
                          (available, delayed or in flight)
    SLOT-FIELD field      each task gets this field too: its slot's time, ISO 8601 in the zone
                          ('2026-12-01T09:00:00+01:00'), e.g. for a worker to tell runs apart

A config line is split as a shell would (shlex), so the expression is quoted:
`nightly reports "0 2 * * *" TZ Europe/Paris FIELDS job nightly`.
"""

from __future__ import annotations

import shlex

from .. import errors
from .cron import Cron, CronError
from .options import Flag, Options, Stop, Value, parse_options

MAX_NAME = 256  # bytes: a schedule's name is a /metrics label and a dashboard row
SLOT_TEXT = 25  # bytes of the slot's time SLOT-FIELD adds ('2026-12-01T09:00:00+01:00')


OPTIONS = Options({"SKIP-IF-UNFINISHED": Flag(), "SLOT-FIELD": Value(bytes)}, TZ=Value(bytes), FIELDS=Stop(need=1),
                  unknown=errors.unknown_schedule_option)


class Definition:
    """A checked schedule definition."""

    __slots__ = ("name", "queue", "cron", "fields", "skip_unfinished", "slot_field")

    def __init__(self, name: bytes, queue: bytes, cron: Cron, fields: list[bytes], skip_unfinished: bool = False,
                 slot_field: bytes | None = None):
        self.name, self.queue, self.cron, self.fields = name, queue, cron, fields
        self.skip_unfinished, self.slot_field = skip_unfinished, slot_field

    def same_as(self, row) -> bool:
        """Does the stored row (storage.schedules.ScheduleRow) hold this very definition?"""
        return (row.queue, row.cron, row.zone, row.fields, row.skip_unfinished, row.slot_field) == (
            self.queue, self.cron.text, self.cron.zone_name, self.fields, self.skip_unfinished, self.slot_field)


def parse(args: list[bytes], max_task_size: int) -> Definition:
    """XSCHEDULE SET's arguments after SET -> a Definition; a CommandError says what is wrong."""
    if len(args) < 3:
        raise errors.SCHEDULE_USAGE
    name, queue, cron_text = args[:3]
    (skip, slot_field, zone), i = parse_options(args, 3, OPTIONS)
    if i >= len(args) or args[i].upper() != b"FIELDS":
        raise errors.SCHEDULE_FIELDS_MISSING
    fields = args[i + 1:]
    if not name or len(name) > MAX_NAME:
        raise errors.schedule_name_length(MAX_NAME, len(name))
    if not queue:
        raise errors.SCHEDULE_QUEUE_EMPTY
    if not fields or len(fields) % 2:
        raise errors.SCHEDULE_FIELDS_NOT_PAIRS
    size = sum(map(len, fields)) + (0 if slot_field is None else len(slot_field) + SLOT_TEXT)
    if size > max_task_size:
        raise errors.task_too_large(size, max_task_size)
    try:
        cron = Cron(cron_text.decode(), "UTC" if zone is None else zone.decode())
    except UnicodeDecodeError:
        raise errors.CRON_NOT_TEXT from None
    except CronError as exc:
        raise errors.cron_invalid(str(exc)) from None
    return Definition(name, queue, cron, fields, skip, slot_field)


def parse_line(line: str, max_task_size: int) -> Definition:
    """A config-file / --schedule line -> a Definition; ValueError says what is wrong."""
    try:
        words = shlex.split(line)
    except ValueError as exc:  # an unclosed quote
        raise ValueError(f"{line!r}: {exc}") from None
    try:
        return parse([word.encode() for word in words], max_task_size)
    except errors.CommandError as exc:
        raise ValueError(f"{line!r}: {exc.message.removeprefix('ERR ')}") from None
