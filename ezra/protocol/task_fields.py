"""A task's fields as tasks.fields holds them, and read back for replies, pages and exports.

A push stores the RESP array of its names and values (resp.bulk_array, a BLOB), so a claim's
reply sends those bytes on as they are: no encoding per push beyond the array, no decoding per
delivery (JSON both ways cost 2.7 µs a task of two fields, this 0.6 with the reply's bytes,
measured). The other form is a JSON array of text (storage.schema.encode_fields): rows written
before schema 9, a schedule's pushes (the schedules table keeps JSON), fields set by hand in
the sqlite3 shell. Both are read here; the tasks_readable view shows both as JSON.

The stored form is the wire's own RESP array, so this module lives in protocol/ beside resp.py.
Only resp.py writes and reads the wire format: this module picks the form and calls it.
A BLOB is trusted to be what EZRA wrote (a hand edit writes text, which is read and checked;
a start checks rows written by hand while the server was stopped: storage/hand_rows.py).
Text that is not a JSON array of text (written while the server runs) is left out of a reply,
logged and counted (UNREADABLE), never sent.
"""

from __future__ import annotations

from loguru import logger

from .resp import bulk_array, read_bulk_array
from ..storage import decode_fields


# The fields of a push as tasks.fields stores them: bulk_array itself, not a function around it
# (a frame less per push).
stored = bulk_array


def listed(value: bytes | str) -> list[bytes]:
    """The fields as names and values, from either stored form."""
    if type(value) is bytes:
        return read_bulk_array(value)
    return decode_fields(value)


def as_resp(value: bytes | str) -> bytes:
    """The fields as a reply sends them (an array of bulk strings, RESP2 and RESP3 alike)."""
    if type(value) is bytes:
        return value
    return bulk_array(decode_fields(value))


class UnreadableTasks:
    """Tasks whose fields a reply could not read (text written by hand while the server runs):
    each logged once, and counted (INFO's unreadable_tasks, with those the start set aside)."""

    KEPT = 10_000  # distinct rows remembered (logged once each); more are logged and counted again

    def __init__(self):
        self._seen: set = set()

    @property
    def count(self) -> int:
        return len(self._seen)

    def found(self, task_id: tuple, fields, exc: Exception) -> None:
        key = (task_id, fields)
        if key in self._seen:
            return
        if len(self._seen) < self.KEPT:
            self._seen.add(key)
        logger.warning("task {}-{}: its fields cannot be read ({}; written by hand?), so it is left out of "
                       "replies; the next start moves it to the table unreadable_tasks: {}",
                       task_id[0], task_id[1], exc, repr(fields)[:200])


UNREADABLE = UnreadableTasks()


def readable_resp(row) -> bytes | None:
    """A task row's fields as a reply sends them, or None (logged, counted): they cannot be read."""
    fields = row[2]
    if type(fields) is bytes:
        return fields
    try:
        return bulk_array(decode_fields(fields))
    except (ValueError, TypeError) as exc:
        UNREADABLE.found((row[0], row[1]), fields, exc)
        return None


def readable(row) -> list[bytes] | None:
    """A task row's fields as names and values, or None (logged, counted): they cannot be read."""
    try:
        return listed(row[2])
    except (ValueError, TypeError) as exc:
        UNREADABLE.found((row[0], row[1]), row[2], exc)
        return None


def shown(value: bytes | str, task_id: tuple) -> list[bytes]:
    """For inspection (the dashboard, XINFO TASKS): the fields, or a pair saying they cannot be read."""
    fields = readable((*task_id, value))
    return [b"unreadable", b"its fields cannot be read (see the server's log)"] if fields is None else fields
