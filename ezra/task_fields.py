"""A task's fields as tasks.fields holds them, and read back for replies, pages and exports.

A push stores the RESP array of its names and values (resp.bulk_array, a BLOB), so a claim's
reply sends those bytes on as they are: no encoding per push beyond the array, no decoding per
delivery (JSON both ways cost 2.7 µs a task of two fields, this 0.6 with the reply's bytes,
measured). The other form is a JSON array of text (storage.schema.encode_fields): rows written
before schema 9, a schedule's pushes (the schedules table keeps JSON), fields set by hand in
the sqlite3 shell. Both are read here; the tasks_readable view shows both as JSON.

Only resp.py writes and reads the wire format: this module picks the form and calls it.
A BLOB is trusted to be what EZRA wrote (a hand edit writes text, which is read and checked).
"""

from __future__ import annotations

from .resp import bulk_array, read_bulk_array
from .storage import decode_fields


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
