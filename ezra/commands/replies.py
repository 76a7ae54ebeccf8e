"""Redis's reply shapes, built from the broker's plain values (issue 25: the broker and storage
know no protocol). Each is built once, in the command's reply, from the rows the broker returns:
no pass converts the broker's shape into another one.

    task row     (id_ms, id_seq, fields as stored, ...)   as storage reads it (task_fields.py)
    entry        [id, [field, value, ...]]                XRANGE, XREAD, XREADGROUP, XCLAIM
    idle claim   (id_ms, id_seq, fields as stored, idle ms, deliveries)   XREADGROUP CLAIM's rows
"""

from __future__ import annotations

from operator import itemgetter

from ..protocol.resp import Mapped, PairsMap, WrittenMap, bulk, entries_frame
from ..protocol.task_fields import as_resp, listed, readable, readable_resp
from ..protocol.stream_ids import format_id

FIELDS = itemgetter(2)  # a claimed row's stored fields
LONG = 500  # a reply of more rows is made while it is written (resp.Mapped)


def entry(row) -> list | None:
    """A task row as a Redis stream entry [id, [f, v, ...]]; None if its fields cannot be read."""
    fields = readable(row)
    return None if fields is None else [format_id(row[:2]), fields]


def entries(rows) -> list:
    """Task rows as entries; a row whose fields cannot be read (written by hand) is left out."""
    try:
        return [[format_id(row[:2]), listed(row[2])] for row in rows]
    except (ValueError, TypeError):
        return [[format_id(row[:2]), fields] for row in rows if (fields := readable(row)) is not None]


def long_entries(rows):
    """`entries`, made while they are written when there are many (a long XRANGE: resp.Mapped)."""
    return Mapped(rows, entry) if len(rows) > LONG else entries(rows)


def entry_or_none(row):
    return None if row is None else entry(row)


def idle_entries(rows) -> list:
    """XREADGROUP CLAIM's entries: [id, fields, idle ms, deliveries before this one]."""
    return [[format_id(row[:2]), fields, row[3], row[4]] for row in rows if (fields := readable(row)) is not None]


def read_reply(found: dict) -> PairsMap:
    """{queue or stream: task rows} as XREAD's and XREADGROUP's map (RESP2: [[key, entries]...])."""
    return PairsMap({name: entries(rows) for name, rows in found.items()})


def claimed_reply(found: dict) -> WrittenMap:
    """read_reply's bytes, written from the rows at once: XREADGROUP's claims, the hot path. Building
    the entries' lists and walking them to encode took 2.9 µs for one task of two fields, this 1.7."""
    if len(found) == 1:  # one queue, as workers read: no generator
        ((name, rows),) = found.items()
        return WrittenMap(((bulk(name), written_entries(rows)),))
    return WrittenMap((bulk(name), written_entries(rows)) for name, rows in found.items())


def claimed_size(found: dict) -> int:
    """The bytes a claim's tasks hold (their stored fields): what its reply will hold, about."""
    size = 0
    for rows in found.values():  # one task (a worker's COUNT 1) by itself; many in C, no step per task
        size += len(rows[0][2]) if len(rows) == 1 else sum(map(len, map(FIELDS, rows)))
    return size


def written_entries(rows) -> bytes:
    """entries(rows) as RESP bytes (resp.entries_frame); rows whose fields cannot be read (text
    written by hand) are left out."""
    try:
        return entries_frame(rows, as_resp)
    except (ValueError, TypeError):  # the reply is written again without those rows
        return entries_frame(_readable(rows), as_resp)


def _readable(rows) -> list:
    """The rows whose fields can be read (the others are logged and counted: task_fields.UNREADABLE)."""
    return [row for row in rows if readable_resp(row) is not None]


def claim_reply(found: dict, claim_idle: int | None) -> PairsMap:
    """XREADGROUP's claims; with CLAIM every entry carries its idle time and deliveries."""
    if claim_idle is None:
        return read_reply(found)
    return PairsMap({name: idle_entries(rows) for name, rows in found.items()})


def taken_over(claimed: list, justid: bool) -> list:
    """XCLAIM's and XAUTOCLAIM's tasks: (id_ms, id_seq, fields JSON) rows, or ids with JUSTID."""
    if justid:
        return [format_id(task) for task in claimed]
    return entries(claimed)
