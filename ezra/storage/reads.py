"""Reads whose cost grows with the data (XINFO's idempotency figures, the done listing): each a
function of a connection. The Database runs them in the writer's transaction
when they are small; the broker runs them through `read_apart`, on a native thread with a
read-only connection of its own, when they are not, so that counting 300,000 idempotent ids
(123 ms) does not hold the event loop.
"""

from __future__ import annotations

import sqlite3

from .. import lifecycle
from . import row_ranges
from .schedules import Schedules
from .schema import name_value, row_list


# Done tasks have no index (schema 10): a walk of their listing looks at this many tasks at most.
DONE_LOOK_BACK = 10_000
# What the dashboard and XINFO TASKS show of a task; `ezra export --data-dir` carries it. Of a
# result (up to --max-task-size) its size only: a listing of 100 done tasks reads no result.
INSPECT_COLUMNS = ("id_ms, id_seq, fields, attempts, worker, created_at, available_at, deadline, "
                   "delivered_at, finished_at, unique_key, failure, priority, partition_key, progress, length(result), name")
RESULT_SHOWN_BYTES = 2000  # of a task's result, on its dashboard page (task_by_id)
# Each state's listing in an order that costs no sort of a million rows (tasks_in_state).
INSPECT_ORDER = {lifecycle.AVAILABLE: "id_ms, id_seq", lifecycle.DEAD: "id_ms, id_seq",
                 lifecycle.DELAYED: "available_at, id_ms, id_seq", lifecycle.DONE: "id_ms DESC, id_seq DESC",
                 lifecycle.WAITING: "id_ms, id_seq"}


def tasks_in_state(conn, span: tuple, queue: bytes, state: str, count: int, after: tuple,
                   head: int | None) -> list[tuple]:
    """Up to `count` tasks of one state (INSPECT_COLUMNS rows) of the queue whose range of row ids is
    `span`: available and dead in id order after `after` (delivery order); delayed by when they
    come due; done newest id first (`after` is not used for those two; `head`: see newest_done).
    Tasks in flight: `tasks_by_rowid`."""
    order = INSPECT_ORDER[state]  # KeyError for anything but a known state: never user text
    if state == lifecycle.DONE:
        return newest_done(conn, queue, count, head)
    if state == lifecycle.AVAILABLE:  # no index of its own (schema 8): the queue's range of row ids
        low = row_ranges.lowest_row(conn, span, after, above=True)
        return conn.execute(
            f"SELECT {INSPECT_COLUMNS} FROM tasks WHERE rowid BETWEEN ? AND ? AND state = 'available' "
            "ORDER BY rowid LIMIT ?", (low, span[1], count)).fetchall()
    if state == lifecycle.WAITING:
        return _waiting(conn, row_ranges.lowest_row(conn, span, after, above=True), span[1], count)
    sql = f"SELECT {INSPECT_COLUMNS} FROM tasks INDEXED BY tasks_{state} WHERE queue = ? AND state = '{state}'"
    params: list = [name_value(queue)]
    if order.startswith("id_ms"):
        sql += " AND (id_ms, id_seq) > (?, ?)"
        params += after
    return conn.execute(f"{sql} ORDER BY {order} LIMIT ?", (*params, count)).fetchall()


def _waiting(conn, low: int, high: int, count: int) -> list[tuple]:
    """Up to `count` waiting tasks with row ids from `low` to `high`, in id order: the dependents of the
    dependencies table (in row id order, no sort), waiting unless they died with a dependency (few)."""
    dependents = conn.execute("SELECT DISTINCT dependent FROM dependencies INDEXED BY dependencies_dependent "
                              "WHERE dependent BETWEEN ? AND ? ORDER BY dependent", (low, high))
    rows = []
    while len(rows) < count:
        rowids = [row[0] for row in dependents.fetchmany(count - len(rows))]
        if not rowids:
            break
        rows += conn.execute(f"SELECT {INSPECT_COLUMNS} FROM tasks WHERE rowid IN (SELECT value FROM json_each(?)) "
                             "AND state = 'waiting' ORDER BY rowid", (row_list(rowids),)).fetchall()
    return rows


def tasks_by_rowid(conn, rowids: list[int]) -> list[tuple]:
    """These rows (INSPECT_COLUMNS), in id order."""
    return conn.execute(
        f"SELECT {INSPECT_COLUMNS} FROM tasks WHERE rowid IN (SELECT value FROM json_each(?)) "
        "ORDER BY id_ms, id_seq", (row_list(rowids),)).fetchall()


def newest_done(conn, queue: bytes, count: int, head: int | None) -> list[tuple]:
    """Up to `count` done tasks (INSPECT_COLUMNS rows), newest id first: the done among the
    queue's DONE_LOOK_BACK newest tasks, then, if that is not enough, among as many below `head`
    (the row id of its oldest available task): a backlog sits above the tasks done last."""
    span = row_ranges.queue_span(conn, queue)
    if span is None:
        return []
    rows, floor = _done_down_from(conn, span[0], span[1], count)
    if len(rows) < count and floor is not None and head is not None:
        rows += _done_down_from(conn, span[0], min(floor, head) - 1, count - len(rows))[0]
    return rows


def _done_down_from(conn, low: int, top: int, count: int) -> tuple[list[tuple], int | None]:
    """The done tasks among the DONE_LOOK_BACK tasks from row id `top` down (to `low`, the queue's
    first), newest first, and the lowest row id looked at (None: the walk reached the queue's first
    task). Down the queue's range of row ids, each row's state read, until `count` are found."""
    floor = conn.execute(  # the row DONE_LOOK_BACK tasks down
        "SELECT rowid FROM tasks WHERE rowid BETWEEN ? AND ? ORDER BY rowid DESC LIMIT 1 OFFSET ?",
        (low, top, DONE_LOOK_BACK - 1)).fetchone()
    rows = conn.execute(
        f"SELECT {INSPECT_COLUMNS} FROM tasks WHERE rowid BETWEEN ? AND ? AND state = 'done' "
        "ORDER BY rowid DESC LIMIT ?", (low if floor is None else floor[0], top, count)).fetchall()
    return rows, None if floor is None else floor[0]


def idmp_tracked(conn, queue: bytes, now: int) -> tuple[int, int]:
    """(producers, iids) remembered for a queue (XINFO STREAM pids-tracked, iids-tracked)."""
    return conn.execute(
        "SELECT count(DISTINCT producer), count(*) FROM idempotency WHERE queue = ? AND expires_at > ?",
        (name_value(queue), now)).fetchone()


def schedule_rows(conn) -> list:
    """Every schedule, fields and all (XSCHEDULE LIST): Schedules.all on this connection."""
    return Schedules(conn).all()


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
    (the order of the queue's row ids: pages of any size, no sort). Shared by the server's
    Database and the export's Snapshot."""
    span = row_ranges.queue_span(conn, queue)
    if span is None:
        return []
    low = row_ranges.lowest_row(conn, span, after, above=True)
    marks = ",".join("?" * len(states))
    return conn.execute(
        f"SELECT {INSPECT_COLUMNS}, state FROM tasks WHERE rowid BETWEEN ? AND ? AND state IN ({marks}) "
        "ORDER BY rowid LIMIT ?", (low, span[1], *states, count)).fetchall()


def outcomes_after(conn, queue: bytes, count: int, after: tuple) -> list[tuple]:
    """(id_ms, id_seq, state, fields, result, progress, name) of up to `count` tasks of the queue that have a
    result or a progress, in id order after `after` (ezra export --data-dir: a walk of the queue's
    range of row ids, no index)."""
    span = row_ranges.queue_span(conn, queue)
    if span is None:
        return []
    low = row_ranges.lowest_row(conn, span, after, above=True)
    return conn.execute(
        "SELECT id_ms, id_seq, state, fields, result, progress, name FROM tasks WHERE rowid BETWEEN ? AND ? "
        "AND (result IS NOT NULL OR progress IS NOT NULL) ORDER BY rowid LIMIT ?", (low, span[1], count)).fetchall()


def task_by_id(conn, queue: bytes, task_id: tuple) -> tuple | None:
    """INSPECT_COLUMNS + the first RESULT_SHOWN_BYTES of its result + state, of one task (the
    dashboard's task page), or None: a search of the queue's row ids."""
    span = row_ranges.queue_span(conn, queue)
    rowid = None if span is None else row_ranges.row_of(conn, span, task_id)
    return None if rowid is None else conn.execute(
        f"SELECT {INSPECT_COLUMNS}, substr(result, 1, ?), state FROM tasks WHERE rowid = ?",
        (RESULT_SHOWN_BYTES, rowid)).fetchone()
