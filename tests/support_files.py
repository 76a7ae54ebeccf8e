"""Tasks written by hand into a stopped server's ezra.db, laid out as the server lays them out."""

from __future__ import annotations


def hand_rowids(conn, queue, count: int) -> range:
    """Row ids for `count` new tasks of `queue` (its name as stored), after its last: a queue's tasks
    are its range of row ids (ezra/storage/row_ranges.py). A queue row without a number (one the
    test wrote) gets the next one."""
    from ezra.storage.row_ranges import span

    row = conn.execute("SELECT number FROM queues WHERE name = ?", (queue,)).fetchone()
    assert row is not None, f"no queue {queue!r} in the file: write its row first"
    number = row[0]
    if number is None:
        number = conn.execute("SELECT coalesce(max(number), 0) + 1 FROM queues").fetchone()[0]
        conn.execute("UPDATE queues SET number = ? WHERE name = ?", (number, queue))
    low, high = span(number)
    last = conn.execute("SELECT max(rowid) FROM tasks WHERE rowid BETWEEN ? AND ?", (low, high)).fetchone()[0]
    first = low if last is None else last + 1
    return range(first, first + count)
