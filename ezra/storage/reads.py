"""Reads whose cost grows with the data (XPENDING's summary, XINFO's consumers and idempotency
figures): each a function of a connection. The Database runs them in the writer's transaction
when they are small; the broker runs them through `read_apart`, on a native thread with a
read-only connection of its own, when they are not, so that counting 400,000 in-flight tasks
(28 ms) does not hold the event loop.
"""

from __future__ import annotations

import sqlite3

from .schema import name_value


def in_flight_source(by_lease_index: bool) -> str:
    """Where a read of in-flight tasks in id order takes them from. SQLite, knowing no counts,
    walks the queue's primary key in id order and steps over every task in another state: done
    tasks are kept for ever by default, and 300,000 of them made an XPENDING or XAUTOCLAIM hold
    the loop 63-90 ms. The in-flight index holds only in-flight tasks, by worker, so rows read
    from it need a sort. The broker picks (QueueState.in_flight_are_fewer): the index when the
    queue has no more tasks in flight than in all other states together, so each read costs
    about the smaller of the two."""
    return " INDEXED BY tasks_in_flight" if by_lease_index else ""


def pending_summary(conn, queue: bytes, by_lease_index: bool) -> tuple:
    """(first id, last id, [(worker, count)]) of a queue's in-flight tasks (XPENDING's summary;
    `by_lease_index`: see in_flight_source)."""
    q = name_value(queue)
    source = in_flight_source(by_lease_index)
    first = conn.execute(
        f"SELECT id_ms, id_seq FROM tasks{source} WHERE queue = ? AND state = 'in_flight' "
        "ORDER BY id_ms, id_seq LIMIT 1", (q,)).fetchone()
    last = conn.execute(
        f"SELECT id_ms, id_seq FROM tasks{source} WHERE queue = ? AND state = 'in_flight' "
        "ORDER BY id_ms DESC, id_seq DESC LIMIT 1", (q,)).fetchone()
    workers = conn.execute(
        "SELECT worker, count(*) FROM tasks WHERE queue = ? AND state = 'in_flight' "
        "GROUP BY worker ORDER BY worker", (q,)).fetchall()
    return first, last, workers


def consumers(conn, queue: bytes) -> list[tuple]:
    """(worker, in-flight count, last delivery) per worker holding tasks (XINFO CONSUMERS)."""
    return conn.execute(
        "SELECT worker, count(*), max(delivered_at) FROM tasks WHERE queue = ? AND state = 'in_flight' "
        "GROUP BY worker ORDER BY worker", (name_value(queue),)).fetchall()


def idmp_tracked(conn, queue: bytes, now: int) -> tuple[int, int]:
    """(producers, iids) remembered for a queue (XINFO STREAM pids-tracked, iids-tracked)."""
    return conn.execute(
        "SELECT count(DISTINCT producer), count(*) FROM idempotency WHERE queue = ? AND expires_at > ?",
        (name_value(queue), now)).fetchone()


def stream_counts(conn, queue: bytes, now: int) -> tuple:
    """XINFO's counted figures in one snapshot: (consumers rows, (producers, iids))."""
    conn.execute("BEGIN")
    try:
        return consumers(conn, queue), idmp_tracked(conn, queue, now)
    finally:
        conn.execute("COMMIT")


READ_APART_BUSY_MS = 5000


def read_apart(path: str, query, *args):
    """`query(conn, *args)` (one of the reads above) on a read-only connection of its own: for a
    native thread, so that counting 400,000 rows does not hold the event loop. It sees what has
    committed (the caller waits for its own writes first)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False)
    try:
        conn.execute(f"PRAGMA busy_timeout = {READ_APART_BUSY_MS}")
        return query(conn, *args)
    finally:
        conn.close()
