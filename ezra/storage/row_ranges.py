"""Where a queue's tasks sit in the tasks table: one range of row ids per queue (schema 14).

A task's row id is its queue's number (queues.number) shifted left by ROW_BITS, plus the order
of its push within the queue: the queue's tasks are the rows between span(number)'s two ends,
and within them row ids grow as task ids do (a push's id is above every id of its queue, and
its row id above every row id there). So the table needs no index on (queue, id): a queue's
tasks in id order are a range of its B-tree, and the row of a task id is found by a binary
search of that range (`lowest_row`). Before schema 14 a primary key on (queue, id_ms, id_seq)
did that, and every push wrote its index: 3.5 of a commit's 11.4 WAL pages (BENCHMARKS.md,
"SQLite: pages and statements"), as SQLite rebalances an index's rightmost leaf where a table
appends.

The search is for commands that name ids (XRANGE's bounds, XCLAIM, XACKDEL...), never for a
push, a claim or an ack, which know their rows: 3 probes of the B-tree among a million tasks pushed at a steady rate, at most ~40
whatever the ids.
"""

from __future__ import annotations

from ..protocol.stream_ids import TOP
from .schema import name_value

ROW_BITS = 40  # rows a queue can hold over its life: 2^40, 1.1e12 pushes (255 days at 50,000 a second)
QUEUE_ROWS = 1 << ROW_BITS
MAX_QUEUE_NUMBER = (1 << (63 - ROW_BITS)) - 1  # 8,388,607 queues: a row id is 63 bits and positive

NO_ROWS = (1, 0)  # the range of a queue not in the file: no row id is in it
# A queue's tasks, in a statement that reads its queues row beside them.
IN_QUEUE_RANGE = (f"tasks.rowid BETWEEN queues.number << {ROW_BITS} "
                  f"AND (queues.number << {ROW_BITS}) + {QUEUE_ROWS - 1}")

_FIRST = "SELECT rowid, id_ms, id_seq FROM tasks WHERE rowid BETWEEN ? AND ? ORDER BY rowid LIMIT 1"
_LAST = "SELECT rowid, id_ms, id_seq FROM tasks WHERE rowid BETWEEN ? AND ? ORDER BY rowid DESC LIMIT 1"


def span(number: int) -> tuple[int, int]:
    """The first and last row id of queue number `number`'s range."""
    first = number << ROW_BITS
    return first, first + QUEUE_ROWS - 1


def queue_span(conn, queue: bytes) -> tuple[int, int] | None:
    """The row-id range of a queue, read from the file (None: no such queue, or one made by hand
    without a number, which holds no task). For connections other than the server's Database,
    which keeps the answer (Database.span)."""
    row = conn.execute("SELECT number FROM queues WHERE name = ?", (name_value(queue),)).fetchone()
    return None if row is None or row[0] is None else span(row[0])


def lowest_row(conn, rows: tuple[int, int], task_id: tuple, above: bool = False) -> int:
    """The row id that splits the range `rows` at `task_id`: tasks with ids at or above it (`above`:
    strictly above) are at that row id or after it, the others before it. A search of the B-tree,
    a probe per step, over the rows the range holds: rows can be missing anywhere (deleted
    tasks), so each probe reads the first row at or after its row id. The id (0, 0) is below every
    task (XADD refuses 0-0): the range's start, no search.

    A probe goes where the id would sit if tasks were pushed at a steady rate between the two ends
    known so far (the ids are times and a push's sequence number within its millisecond): XRESULT,
    XCLAIM and XDEL name a task that is there, found in 3 probes among a million where halving
    took 20. A probe that did not halve what is left is followed by a halving, so uneven ids cost
    at most twice the halving's probes."""
    return _search(conn, rows, task_id, above)[0]


def _search(conn, rows: tuple[int, int], task_id: tuple, above: bool) -> tuple[int, tuple | None]:
    """lowest_row's search: (the split, the first (rowid, id_ms, id_seq) row at or after it, or None:
    there is none, or the id is (0, 0), which no task has)."""
    if task_id <= (0, 0):
        return rows[0], None
    first = conn.execute(_FIRST, rows).fetchone()
    if first is None or _after(first, task_id, above):
        return rows[0], first
    last = conn.execute(_LAST, rows).fetchone()
    if not _after(last, task_id, above):
        return last[0] + 1, None
    # Every row up to `below` is before task_id; every row from `split` on is at or after it, the
    # first of them `after`. `split` keeps the ids of the row found there (an empty row id: `after`'s).
    below, split, after, estimate = first, last, last, True
    while split[0] - below[0] > 1:
        left = split[0] - below[0]
        middle = _estimated(below, split, task_id) if estimate else (below[0] + split[0]) // 2
        row = conn.execute(_FIRST, (middle, split[0] - 1)).fetchone()
        if row is None:  # no row from middle to split: they all start at middle or later
            split = (middle, split[1], split[2])
        elif (row[1], row[2]) == task_id:  # ids grow with row ids: the split is this row, or the next
            if not above:
                return row[0], row
            later = conn.execute(_FIRST, (row[0] + 1, split[0] - 1)).fetchone()
            return (split[0], after) if later is None else (later[0], later)
        elif _after(row, task_id, above):
            split = after = row
        else:
            below = row
        estimate = not estimate or 2 * (split[0] - below[0]) <= left
    return split[0], after


def _estimated(below: tuple, split: tuple, task_id: tuple) -> int:
    """The row id strictly between two (rowid, id_ms, id_seq) rows where task_id would sit if the
    pushes between them came at a steady rate, each taking the next sequence number within its
    millisecond (XADD *)."""
    guess = below[0] + task_id[1] - below[2]
    if split[1] > below[1]:  # rows a millisecond: those between the two ends less their sequence's share
        guess += (task_id[0] - below[1]) * (split[0] - below[0] - split[2] + below[2]) // (split[1] - below[1])
    return min(max(guess, below[0] + 1), split[0] - 1)


def _after(row: tuple, task_id: tuple, above: bool) -> bool:
    """Is this (rowid, id_ms, id_seq) row's id at or above task_id (`above`: strictly above)?"""
    row_id = (row[1], row[2])
    return row_id > task_id if above else row_id >= task_id


def rows_between(conn, rows: tuple[int, int], start: tuple, end: tuple) -> tuple[int, int]:
    """The part of `rows` holding ids from `start` to `end`, both included; a bound at the range's
    end (the ids (0, 0) and TOP) is no search."""
    low = lowest_row(conn, rows, start)
    high = rows[1] if end >= TOP else lowest_row(conn, rows, end, above=True) - 1
    return low, high


def row_of(conn, rows: tuple[int, int], task_id: tuple) -> int | None:
    """The row id of one task of the range, or None: no such task."""
    row = _search(conn, rows, task_id, False)[1]
    return row[0] if row is not None and (row[1], row[2]) == task_id else None

