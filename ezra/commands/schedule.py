"""XSCHEDULE: periodic pushes (an EZRA extension; schedule_settings.py parses a definition,
broker/schedules.py fires them, cron.py reads the times).

    XSCHEDULE SET name queue "<cron>" [TZ zone] [SKIP-IF-UNFINISHED] [SLOT-FIELD field]
              FIELDS field value [field value ...]     -> OK (replaces a schedule of that name)
    XSCHEDULE DEL name                                  -> 1 if it existed, else 0
    XSCHEDULE LIST                                      -> one map per schedule, by name

Same rules as every command (table.py): parse, call the scheduler, return a reply value.
"""

from __future__ import annotations

from .. import errors
from ..settings import schedule_settings
from ..protocol import stream_ids
from ..storage.schedules import NEVER
from ..settings.cron import local_time
from ..protocol.resp import OK, Mapped, SimpleString
from .args import live_queue
from .table import Deferred, command


HELP = [
    "XSCHEDULE <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "SET <name> <queue> <cron> [TZ <zone>] [SKIP-IF-UNFINISHED] [SLOT-FIELD <field>] FIELDS <field> <value> ...",
    "    Push a task to <queue> at the times of <cron> (5 fields, 6 with seconds first, or @daily...).",
    "DEL <name>",
    "    Remove a schedule (its tasks stay).",
    "LIST",
    "    Every schedule with its next and last run.",
    "HELP",
    "    Print this help.",
]


def scheduler_of(session):
    scheduler = session.state.scheduler
    if scheduler is None:
        raise errors.SCHEDULES_NOT_SERVED
    return scheduler


@command("XSCHEDULE", -2)
def xschedule(session, args):
    """XSCHEDULE SET name queue cron [TZ zone] [SKIP-IF-UNFINISHED] [SLOT-FIELD f] FIELDS f v ... | DEL name | LIST"""
    sub = args[1].upper()
    if sub == b"SET" and len(args) >= 5:
        definition = schedule_settings.parse(args[2:], session.state.settings.max_task_size)
        live_queue(definition.queue)  # not a q::dead view
        return Deferred(scheduler_of(session).set(definition), lambda _: OK)
    if sub == b"DEL" and len(args) == 3:
        return Deferred(scheduler_of(session).delete(args[2]))
    if sub == b"LIST" and len(args) == 2:
        if session.in_exec:  # it cannot wait for a thread: read in the transaction
            return Deferred(scheduler_of(session).rows(), list_reply)
        return list_reply(scheduler_of(session).rows_apart())
    if sub == b"HELP" and len(args) == 2:
        return [SimpleString(line) for line in HELP]
    if sub in (b"SET", b"DEL", b"LIST"):
        raise errors.wrong_subcommand_arity("xschedule", sub)
    raise errors.unknown_subcommand(args[1].decode("utf-8", "replace"), "XSCHEDULE")


def list_reply(rows) -> Mapped:
    """Made while it is written (resp.Mapped): a schedule's fields may be a megabyte."""
    return Mapped(rows, schedule_reply)


def schedule_reply(row) -> dict:
    """A schedule as LIST shows it: times in ms since the epoch, and the next run in its zone."""
    never = row.next_at >= NEVER
    return {"name": row.name, "queue": row.queue, "cron": row.cron, "tz": row.zone, "fields": row.fields,
            "skip-if-unfinished": int(row.skip_unfinished), "slot-field": row.slot_field, "origin": row.origin,
            "next-run": None if never else row.next_at,
            "next-run-local": None if never else local_time(row.next_at, row.zone),
            "last-run": row.last_slot, "last-fired-at": row.last_fired_at,
            "last-task-id": None if row.last_task is None else stream_ids.format_id(row.last_task),
            "firings": row.firings, "skipped": row.skipped}
