"""Reads whose cost grows with the data (XPENDING's summary, XINFO's consumers and idempotency
figures, the done listing): each a function of a connection. The Database runs them in the writer's transaction
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


def pending_entries(conn, queue: bytes, start: tuple, end: tuple, count: int, worker: bytes | None,
                    min_delivered_before: int | None, by_lease_index: bool) -> list[tuple]:
    """(id_ms, id_seq, worker, delivered_at, attempts) of in-flight tasks in a range (XPENDING's
    extended form; `by_lease_index`: see in_flight_source)."""
    sql = (f"SELECT id_ms, id_seq, worker, delivered_at, attempts FROM tasks{in_flight_source(by_lease_index)} "
           "WHERE queue = ? AND state = 'in_flight' AND (id_ms, id_seq) >= (?, ?) "
           "AND (id_ms, id_seq) <= (?, ?)")
    params: list = [name_value(queue), start[0], start[1], end[0], end[1]]
    if worker is not None:
        sql += " AND worker = ?"
        params.append(name_value(worker))
    if min_delivered_before is not None:
        sql += " AND delivered_at <= ?"
        params.append(min_delivered_before)
    sql += " ORDER BY id_ms, id_seq LIMIT ?"
    params.append(count)
    return conn.execute(sql, params).fetchall()


# Done tasks have no index (schema 10): a walk of their listing looks at this many tasks at most.
DONE_LOOK_BACK = 10_000
# What the dashboard and XINFO TASKS show of a task.
INSPECT_COLUMNS = ("id_ms, id_seq, fields, attempts, worker, created_at, available_at, deadline, "
                   "delivered_at, finished_at, unique_key, failure")


def newest_done(conn, queue: bytes, count: int, head: int | None) -> list[tuple]:
    """Up to `count` done tasks (INSPECT_COLUMNS rows), newest id first: the done among the
    queue's DONE_LOOK_BACK newest tasks, then, if that is not enough, among as many below `head`
    (the row id of its oldest available task): a backlog sits above the tasks done last."""
    q = name_value(queue)
    rows, floor = _done_down_from(conn, q, None, count)
    if len(rows) < count and floor is not None and head is not None:
        start = conn.execute("SELECT id_ms, id_seq FROM tasks WHERE rowid = ?", (head,)).fetchone()
        if start is not None:
            rows += _done_down_from(conn, q, min(floor, tuple(start)), count - len(rows))[0]
    return rows


def _done_down_from(conn, q, top: tuple | None, count: int) -> tuple[list[tuple], tuple | None]:
    """The done tasks among the DONE_LOOK_BACK tasks below `top` (None: from the newest), newest
    first, and the lowest id looked at (None: the walk reached the queue's first task). Down the
    primary key, each row's state read, until `count` are found."""
    below, params = ("", (q,)) if top is None else (" AND (id_ms, id_seq) < (?, ?)", (q, *top))
    floor = conn.execute(  # the id DONE_LOOK_BACK tasks down: found on the index alone
        f"SELECT id_ms, id_seq FROM tasks WHERE queue = ?{below} ORDER BY id_ms DESC, id_seq DESC "
        "LIMIT 1 OFFSET ?", (*params, DONE_LOOK_BACK - 1)).fetchone()
    rows = conn.execute(
        f"SELECT {INSPECT_COLUMNS} FROM tasks WHERE queue = ?{below} AND (id_ms, id_seq) >= (?, ?) "
        "AND state = 'done' ORDER BY id_ms DESC, id_seq DESC LIMIT ?",
        (*params, *(floor or (0, 0)), count)).fetchall()
    return rows, None if floor is None else tuple(floor)


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


def tasks_by_id(conn, queue: bytes, states: tuple, count: int, after: tuple) -> list[tuple]:
    """INSPECT_COLUMNS + state of a queue's tasks in `states`, in id order after `after`
    (the primary key's order: pages of any size, no sort). Shared by the server's
    Database and the export's Snapshot."""
    marks = ",".join("?" * len(states))
    return conn.execute(
        f"SELECT {INSPECT_COLUMNS}, state FROM tasks WHERE queue = ? AND state IN ({marks}) "
        "AND (id_ms, id_seq) > (?, ?) ORDER BY id_ms, id_seq LIMIT ?",
        (name_value(queue), *states, after[0], after[1], count)).fetchall()


def task_by_id(conn, queue: bytes, task_id: tuple) -> tuple | None:
    """INSPECT_COLUMNS + state of one task (the dashboard's task page), or None: a primary-key look."""
    return conn.execute(f"SELECT {INSPECT_COLUMNS}, state FROM tasks WHERE queue = ? AND id_ms = ? AND id_seq = ?",
                        (name_value(queue), *task_id)).fetchone()
