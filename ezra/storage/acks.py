"""The ack's statements: in_flight -> done, each task found by its id (the primary key).

`ack` counts the tasks it finished, as XACK answers. `ack_each` tells for each id whether it
was in flight, for a pipeline's XACKs of one id each worked as one request (commands/runs.py):
each of them answers for its own task, as if they had run one after another.
"""

from __future__ import annotations

from itertools import repeat
from operator import lshift, or_

from .schema import name_value

# An ack of this many ids or more is one UPDATE, not one per id: 50 ids 3.4 -> 2.2 µs an id (executemany
# binds, steps and resets each); 5 ids cost the same either way; 1 id 5.6 against 9.6 (measured).
ACK_IN_ONE_STATEMENT = 8
# Its ids go as one JSON text, each found by the key (CROSS JOIN: from each id to its row, no scan), as
# one integer ms << 20 | seq that SQLite splits with two integer operations: reading [ms, seq] pairs
# with json_extract (not ->>: SQLite 3.38+) cost 0.6 µs an id more (2.7 against 2.1, measured). Ids
# past it (seq 2^20 or more, ms past the year 2248) go as pairs.
ACK_SEQ_BITS = 20
_DONE = "UPDATE tasks SET state = 'done', deadline = NULL, finished_at = ?, retained = ? WHERE "
_BY_KEY = (_DONE + "rowid IN (SELECT t.rowid FROM json_each(?) AS j CROSS JOIN tasks AS t WHERE t.queue = ? "
           "AND {}) AND state = 'in_flight'")
_PACKED_SQL = _BY_KEY.format(f"t.id_ms = j.value >> {ACK_SEQ_BITS} AND t.id_seq = j.value & {(1 << ACK_SEQ_BITS) - 1}")
_PAIRS_SQL = _BY_KEY.format("t.id_ms = json_extract(j.value, '$[0]') AND t.id_seq = json_extract(j.value, '$[1]')")
_ONE_SQL = _DONE + "queue = ? AND id_ms = ? AND id_seq = ? AND state = 'in_flight'"


def ack(conn, queue: bytes, ids: list[tuple], now: int, retained: int | None = None) -> int:
    """in_flight -> done for each id; how many it finished (a stale or repeated id counts 0)."""
    q = name_value(queue)
    if len(ids) == 1:  # a worker's ack of one task: execute, not executemany (no list, no iterator)
        (ms, seq), = ids
        return conn.execute(_ONE_SQL, (now, retained, q, ms, seq)).rowcount
    if len(ids) >= ACK_IN_ONE_STATEMENT:  # a batch: one statement (ACK_SEQ_BITS)
        mss, seqs = zip(*ids)
        if max(mss) >> (63 - ACK_SEQ_BITS) or max(seqs) >> ACK_SEQ_BITS:
            sql, listed = _PAIRS_SQL, ",".join([f"[{ms},{seq}]" for ms, seq in ids])
        else:  # ms << ACK_SEQ_BITS | seq of each, in C
            packed = map(or_, map(lshift, mss, repeat(ACK_SEQ_BITS)), seqs)
            sql, listed = _PACKED_SQL, ",".join(map(str, packed))
        return conn.execute(sql, (now, retained, f"[{listed}]", q)).rowcount
    return conn.executemany(_ONE_SQL, [(now, retained, q, ms, seq) for ms, seq in ids]).rowcount


def ack_each(conn, queue: bytes, ids: list[tuple], now: int, retained: int | None = None) -> list[int]:
    """in_flight -> done for each id, in order; for each, 1 if this finished its task, else 0
    (stale, or an id repeated: done by its first). Many ids go as `ack`'s one statement in a
    savepoint: when it finished one task per id, as acks of held leases nearly always do, each
    counts 1; else it is undone and each id goes alone, to tell which counts."""
    if len(ids) >= ACK_IN_ONE_STATEMENT:
        conn.execute("SAVEPOINT ack_each")
        if ack(conn, queue, ids, now, retained) == len(ids):
            conn.execute("RELEASE ack_each")
            return [1] * len(ids)
        conn.execute("ROLLBACK TO ack_each")
        conn.execute("RELEASE ack_each")
    q = name_value(queue)
    return [conn.execute(_ONE_SQL, (now, retained, q, ms, seq)).rowcount for ms, seq in ids]
