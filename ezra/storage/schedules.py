"""The schedules table's queries (XSCHEDULE), named; run in the writer's transaction like the rest.

A row is read as a `ScheduleRow`, names and fields decoded as the tasks table's are.
"""

from __future__ import annotations

from typing import NamedTuple

from .row_ranges import queue_span, row_of
from .schema import decode_fields, encode_fields, name_bytes, name_value

COLUMNS = ("name, queue, cron, zone, fields, skip_unfinished, slot_field, origin, next_at, last_slot, "
           "last_fired_at, last_task_ms, last_task_seq, firings, skipped, created_at")
SHOWN = COLUMNS.replace("fields, ", "NULL, ")  # every column of the index schedules_shown (schema.sql)
UNFINISHED = ("available", "delayed", "in_flight")
NEVER = 2 ** 62  # next_at of a schedule whose expression has no run left (none within 50 years)


class ScheduleRow(NamedTuple):
    name: bytes
    queue: bytes
    cron: str
    zone: str
    fields: list | None  # None: read without them (Schedules.shown)
    skip_unfinished: bool
    slot_field: bytes | None
    origin: str
    next_at: int
    last_slot: int | None
    last_fired_at: int | None
    last_task: tuple | None
    firings: int
    skipped: int
    created_at: int


def _row(row) -> ScheduleRow:
    (name, queue, cron, zone, fields, skip, slot_field, origin, next_at, last_slot, fired_at,
     task_ms, task_seq, firings, skipped, created_at) = row
    return ScheduleRow(name_bytes(name), name_bytes(queue), cron, zone,
                       None if fields is None else decode_fields(fields), bool(skip),
                       None if slot_field is None else name_bytes(slot_field), origin, next_at, last_slot,
                       fired_at, None if task_ms is None else (task_ms, task_seq), firings, skipped, created_at)


class Schedules:
    """The schedules table on the server's connection."""

    def __init__(self, conn):
        self.conn = conn

    def all(self) -> list[ScheduleRow]:
        """Every schedule, by name."""
        return [_row(row) for row in self.conn.execute(f"SELECT {COLUMNS} FROM schedules ORDER BY name")]

    def shown(self) -> list[ScheduleRow]:
        """Every schedule, by name, its fields None: read from the index schedules_shown alone, not
        one page of the fields (INFO, /metrics, the dashboard)."""
        return [_row(row) for row in self.conn.execute(f"SELECT {SHOWN} FROM schedules ORDER BY name")]

    def get(self, name: bytes) -> ScheduleRow | None:
        row = self.conn.execute(f"SELECT {COLUMNS} FROM schedules WHERE name = ?", (name_value(name),)).fetchone()
        return None if row is None else _row(row)

    def count(self) -> int:
        return self.conn.execute("SELECT count(*) FROM schedules").fetchone()[0]

    def due(self, now: int, limit: int) -> list[ScheduleRow]:
        """Schedules whose next slot has come, earliest first."""
        return [_row(row) for row in self.conn.execute(
            f"SELECT {COLUMNS} FROM schedules WHERE next_at <= ? ORDER BY next_at LIMIT ?", (now, limit))]

    def earliest(self) -> int | None:
        """The next slot of all schedules (ms), or None without schedules."""
        return self.conn.execute("SELECT min(next_at) FROM schedules").fetchone()[0]

    def timings(self) -> list[tuple[bytes, str, str, int, int]]:
        """(name, cron, zone, next slot, when it last fired or else was set) of every schedule."""
        return [(name_bytes(name), cron, zone, next_at, last_seen) for name, cron, zone, next_at, last_seen in
                self.conn.execute("SELECT name, cron, zone, next_at, coalesce(last_fired_at, created_at) "
                                  "FROM schedules ORDER BY name")]

    def save(self, name: bytes, queue: bytes, cron: str, zone: str, fields: list[bytes], skip_unfinished: bool,
             slot_field: bytes | None, origin: str, next_at: int, now: int) -> None:
        """A new definition under `name` (replacing any): nothing fired yet."""
        self.conn.execute(
            "INSERT OR REPLACE INTO schedules (name, queue, cron, zone, fields, skip_unfinished, slot_field, "
            "origin, next_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (name_value(name), name_value(queue), cron, zone, encode_fields(fields), int(skip_unfinished),
             None if slot_field is None else name_value(slot_field), origin, next_at, now))

    def set_origin(self, name: bytes, origin: str) -> None:
        self.conn.execute("UPDATE schedules SET origin = ? WHERE name = ?", (origin, name_value(name)))

    def delete(self, name: bytes) -> int:
        return self.conn.execute("DELETE FROM schedules WHERE name = ?", (name_value(name),)).rowcount

    def config_names(self) -> list[bytes]:
        """The schedules the config file set last (removed at start when the file no longer has them)."""
        return [name_bytes(name) for (name,) in
                self.conn.execute("SELECT name FROM schedules WHERE origin = 'config' ORDER BY name")]

    def record_firing(self, name: bytes, slot: int, next_at: int, now: int, task_id: tuple | None) -> None:
        """The slot fired (pushing `task_id`) or was skipped (None): in the push's transaction."""
        if task_id is None:
            self.conn.execute("UPDATE schedules SET last_slot = ?, next_at = ?, last_fired_at = ?, "
                              "skipped = skipped + 1 WHERE name = ?", (slot, next_at, now, name_value(name)))
        else:
            self.conn.execute("UPDATE schedules SET last_slot = ?, next_at = ?, last_fired_at = ?, "
                              "last_task_ms = ?, last_task_seq = ?, firings = firings + 1 WHERE name = ?",
                              (slot, next_at, now, task_id[0], task_id[1], name_value(name)))

    def move_next(self, name: bytes, next_at: int) -> None:
        self.conn.execute("UPDATE schedules SET next_at = ? WHERE name = ?", (next_at, name_value(name)))

    def unfinished(self, queue: bytes, task_id: tuple) -> bool:
        """Is this task still available, delayed or in flight?"""
        span = queue_span(self.conn, queue)
        rowid = None if span is None else row_of(self.conn, span, task_id)
        return rowid is not None and self.conn.execute(
            "SELECT 1 FROM tasks WHERE rowid = ? AND state IN (?, ?, ?)", (rowid, *UNFINISHED)).fetchone() is not None
