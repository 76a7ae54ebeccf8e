"""Redis's reply shapes, built from the broker's plain values (issue 25: the broker and storage
know no protocol). Each is built once, in the command's reply, from the rows the broker returns:
no pass converts the broker's shape into another one.

    task row     (id_ms, id_seq, fields JSON, ...)     as storage reads it
    entry        [id, [field, value, ...]]             XRANGE, XREAD, XREADGROUP, XCLAIM
    idle claim   (id_ms, id_seq, fields JSON, idle ms, deliveries)   XREADGROUP CLAIM's rows
"""

from __future__ import annotations

from ..resp import PairsMap
from ..storage import decode_fields
from ..stream_ids import format_id


def entry(row) -> list:
    """A task row as a Redis stream entry [id, [f, v, ...]]."""
    return [format_id(row[:2]), decode_fields(row[2])]


def entries(rows) -> list:
    return [[format_id(row[:2]), decode_fields(row[2])] for row in rows]


def entry_or_none(row):
    return None if row is None else entry(row)


def idle_entries(rows) -> list:
    """XREADGROUP CLAIM's entries: [id, fields, idle ms, deliveries before this one]."""
    return [[format_id(row[:2]), decode_fields(row[2]), row[3], row[4]] for row in rows]


def read_reply(found: dict) -> PairsMap:
    """{queue or stream: task rows} as XREAD's and XREADGROUP's map (RESP2: [[key, entries]...])."""
    return PairsMap({name: entries(rows) for name, rows in found.items()})


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
