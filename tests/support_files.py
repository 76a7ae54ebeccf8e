"""Tasks written by hand into a stopped server's ezra.db, laid out as the server lays them out;
files of an older schema, as that EZRA wrote them (the upgrade tests)."""

from __future__ import annotations

import sqlite3

from ezra.storage.schema import SCHEMA


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


def schema_15_text() -> str:
    """Schema 15 as EZRA wrote it: schema 16's, without tasks.result and tasks.progress (schema 16's) in
    tasks, unreadable_tasks and the view tasks_readable."""
    old = schema_16_text()
    for new_text, old_text in [
            ("    partition_key TEXT,\n    result        BLOB,\n    progress      BLOB\n);", "    partition_key TEXT\n);"),
            ("priority, partition_key, result, progress\nFROM tasks;", "priority, partition_key\nFROM tasks;"),
            ("priority, partition_key, result, progress,  -- as tasks had them", "priority, partition_key,  -- as tasks had them")]:
        assert old.count(new_text) == 1, new_text
        old = old.replace(new_text, old_text)
    return old


def schema_17_text() -> str:
    """Schema 17 as EZRA wrote it: today's, without schema 18's (XADD NAME): tasks.name (in tasks,
    unreadable_tasks and the view tasks_readable) and its index tasks_named; with the index tasks_waiting
    (schema 18 dropped it)."""
    old = SCHEMA
    for new_text, old_text in [
            ("    progress      BLOB,\n    name          TEXT\n);", "    progress      BLOB\n);"),
            ("partition_key, result, progress, name\nFROM tasks;", "partition_key, result, progress\nFROM tasks;"),
            ("result, progress, name,  -- as tasks had them", "result, progress,  -- as tasks had them"),
            ("    -- name: XADD NAME's (BLOB if not UTF-8), unique in its queue while the row exists (tasks_named);\n"
             "    -- NULL: pushed without one (a plain push binds none). Schema 18 added it at the end.\n", "")]:
        assert old.count(new_text) == 1, new_text
        old = old.replace(new_text, old_text)
    start = old.index("-- XADD NAME: at most one task per name and queue")
    old = old[:start] + old[old.index("\n", old.index("CREATE UNIQUE INDEX IF NOT EXISTS tasks_named", start)) + 1:]
    assert "tasks_named" not in old and " name          TEXT" not in old
    start = old.index("-- XADD AFTER's waiting tasks have no index")
    end = old.index("-- The reaper makes delayed tasks available", start)
    return (old[:start] + "-- XADD AFTER's waiting tasks, for start-up's counts.\n"
            "CREATE INDEX IF NOT EXISTS tasks_waiting ON tasks (queue, id_ms, id_seq) WHERE state = 'waiting';\n"
            + old[end:])


def schema_16_text() -> str:
    """Schema 16 as EZRA wrote it: schema 17's, without schema 17's own (XADD AFTER): 'waiting' in the state
    CHECK, the index tasks_waiting, the table dependencies and its index."""
    old = schema_17_text().replace(" OR state = 'dead' OR state = 'waiting'),", " OR state = 'dead'),")
    assert "'waiting')," not in old
    start = old.index("-- XADD AFTER's waiting tasks, for start-up's counts")
    old = old[:start] + old[old.index("-- The reaper makes delayed tasks available", start):]
    start = old.index("-- XADD AFTER (broker/dependencies.py)")
    old = old[:start] + old[old.index("-- Idempotent producers", start):]
    assert "waiting" not in old.replace("waits for its first claim", "").replace("while the task waits", ""), old
    return old


def schema_14_text() -> str:
    """Schema 14 as EZRA wrote it: schema 15's, without tasks.priority and tasks.partition_key (schema 15's)
    in tasks, unreadable_tasks and the view tasks_readable."""
    old = schema_15_text()
    for new_text, old_text in [
            ("    reserved      BLOB,\n    priority      INTEGER,\n    partition_key TEXT\n);",
             "    reserved      BLOB\n);"),
            (",\n       coalesce(priority, 5) AS priority, partition_key\nFROM tasks;", "\nFROM tasks;"),
            ("retained, reserved, priority, partition_key,  -- as tasks had them", "retained, reserved,  -- as tasks had them")]:
        assert old.count(new_text) == 1, new_text
        old = old.replace(new_text, old_text)
    return old


def schema_13_text() -> str:
    """Schema 13 as EZRA wrote it: schema 14's, with tasks keyed by (queue, id_ms, id_seq) (its index
    found a queue's tasks) and row ids SQLite chose, and no queues.number."""
    old = schema_14_text()
    for new_text, old_text in [
            ("    rowid         INTEGER PRIMARY KEY,  -- storage/row_ranges.py; `rowid` in a query reads it\n", ""),
            ("    reserved      BLOB\n);", "    reserved      BLOB,\n    PRIMARY KEY (queue, id_ms, id_seq)\n);"),
            ("    unmarked_done         INTEGER NOT NULL DEFAULT 1,\n", "    unmarked_done         INTEGER NOT NULL DEFAULT 1\n"),
            ("CREATE UNIQUE INDEX IF NOT EXISTS queues_number ON queues (number);\n", "")]:
        assert old.count(new_text) == 1, new_text
        old = old.replace(new_text, old_text)
    start = old.index("    -- The queue's tasks are the rows of tasks")
    old = old[:start] + old[old.index(");", start):]  # queues.number and its comment
    assert "    number " not in old and "queues_number" not in old
    return old


def write_old_file(data_dir, schema: str, version: int):
    """An empty file of an older schema, as that EZRA made it; open for the caller to fill."""
    data_dir.mkdir(mode=0o700)
    db = sqlite3.connect(data_dir / "ezra.db")
    db.execute("PRAGMA auto_vacuum = INCREMENTAL")  # as a new file gets it (before the first table)
    db.executescript(schema)
    db.execute("PRAGMA application_id = 1163547201")
    db.execute(f"PRAGMA user_version = {version}")
    return db
