"""The schema (ezra/storage/schema.sql) and the migration of a schema 1 file, through the real server.

Schema 2 and 3 are covered by test_pause.py (a schema 2 file gains queues.paused); here a
file as EZRA 0.1 wrote it (schema 1: no 'delayed' state, no ttl_ms, fewer queue settings)
is opened: its tasks table is rebuilt from the schema's own `tasks` statement, so the
migrated file must end with exactly the tables and indexes a new file gets.
"""

from __future__ import annotations

import sqlite3

from support_queue import claim, text
from support_files import schema_13_text, write_old_file
from ezra.storage import SCHEMA_VERSION  # 4 since schedules (test_schedules.py)

# Schema 1 as EZRA wrote it (storage.py before schema 2), comments left out.
SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS queues (
    name                TEXT PRIMARY KEY,
    last_id_ms          INTEGER NOT NULL DEFAULT 0,
    last_id_seq         INTEGER NOT NULL DEFAULT 0,
    visibility_timeout  REAL,
    max_attempts        INTEGER,
    retention_seconds   REAL,
    created_at          INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS tasks (
    queue         TEXT    NOT NULL,
    id_ms         INTEGER NOT NULL,
    id_seq        INTEGER NOT NULL,
    id            TEXT    GENERATED ALWAYS AS (id_ms || '-' || id_seq) VIRTUAL,
    state         TEXT    NOT NULL CHECK (state IN ('available', 'in_flight', 'done', 'dead')),
    fields        TEXT    NOT NULL,
    attempts      INTEGER NOT NULL DEFAULT 0,
    worker        TEXT,
    created_at    INTEGER NOT NULL,
    available_at  INTEGER NOT NULL,
    deadline      INTEGER,
    delivered_at  INTEGER,
    finished_at   INTEGER,
    PRIMARY KEY (queue, id_ms, id_seq)
);
CREATE INDEX IF NOT EXISTS tasks_available ON tasks (queue, id_ms, id_seq) WHERE state = 'available';
CREATE INDEX IF NOT EXISTS tasks_in_flight ON tasks (queue, worker, id_ms, id_seq) WHERE state = 'in_flight';
CREATE INDEX IF NOT EXISTS tasks_done ON tasks (queue, finished_at) WHERE state = 'done';
"""


def schema_of(path) -> tuple[list, set]:
    """Every table and index as created, but queues' (which only gains columns): its columns."""
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name != 'queues' "
                          "ORDER BY type, name").fetchall()
        columns = {row for row in db.execute("PRAGMA table_info(queues)")}
    db.close()
    return rows, {(name, kind, notnull, default) for _, name, kind, notnull, default, _ in columns}


def write_v1_file(data_dir) -> None:
    data_dir.mkdir(mode=0o700)
    db = sqlite3.connect(data_dir / "ezra.db")
    db.executescript(SCHEMA_V1)
    db.execute("PRAGMA application_id = 1163547201")  # 0x455A5241, "EZRA"
    db.execute("PRAGMA user_version = 1")
    db.execute("INSERT INTO queues (name, last_id_ms, last_id_seq, max_attempts, created_at) "
               "VALUES ('jobs', 1000, 1, 7, 1000)")
    db.executemany("INSERT INTO tasks (queue, id_ms, id_seq, state, fields, attempts, created_at, "
                   "available_at, finished_at) VALUES ('jobs', 1000, ?, ?, ?, ?, 1000, 1000, ?)",
                   [(0, "available", '["n", "1"]', 0, None), (1, "dead", '["n", "2"]', 7, 1500)])
    db.commit()
    db.close()


def test_a_schema_1_file_is_migrated_to_the_schema_a_new_file_gets(ezra_factory, tmp_path):
    fresh = ezra_factory()
    fresh.stop()
    write_v1_file(tmp_path / "old")
    server = ezra_factory(data_dir=tmp_path / "old")
    assert f"from schema 1 to {SCHEMA_VERSION}" in server.log()
    r = server.client()
    assert text(r.xinfo_stream("jobs")["max-attempts"]) == "7"
    assert [(i, f) for i, f in claim(r, "jobs")] == [(b"1000-0", {b"n": b"1"})]
    assert [i for i, _ in r.xrange("jobs::dead")] == [b"1000-1"]
    r.xadd("jobs", {"n": 3}, id="2000-0")  # the new table takes what schema 1 refused
    r.execute_command("XADD", "jobs", "DELAY", "60", "*", "n", "4")
    r.close()
    server.stop()
    with sqlite3.connect(server.data_dir / "ezra.db") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("SELECT count(*) FROM tasks WHERE state = 'delayed'").fetchone()[0] == 1
    db.close()
    assert schema_of(server.data_dir / "ezra.db") == schema_of(fresh.data_dir / "ezra.db")


def schema_12_text() -> str:
    """Schema 12 as EZRA wrote it: schema 13's, with the generated column tasks.id the view read."""
    old = schema_13_text().replace("    id_seq        INTEGER NOT NULL,\n",
                         "    id_seq        INTEGER NOT NULL,\n"
                         "    id            TEXT    GENERATED ALWAYS AS (id_ms || '-' || id_seq) VIRTUAL,\n", 1)
    old = old.replace("SELECT queue, id_ms || '-' || id_seq AS id, id_ms", "SELECT queue, id, id_ms", 1)
    assert old.count("GENERATED ALWAYS") == 1 and "SELECT queue, id, id_ms" in old
    return old


def generated_columns(path) -> list[str]:
    with sqlite3.connect(path) as db:  # table_xinfo's `hidden`: 2 a VIRTUAL column, 3 a STORED one
        names = [row[1] for row in db.execute("PRAGMA table_xinfo(tasks)") if row[6] in (2, 3)]
    db.close()
    return names


def test_the_tasks_table_has_no_generated_column_a_write_would_compute(ezra_factory):
    # SQLite computes every generated column in each INSERT and UPDATE of a row: the id's text
    # cost a push, a claim and an ack 2.2k instructions each. The view carries it.
    server = ezra_factory()
    server.stop()
    assert generated_columns(server.data_dir / "ezra.db") == []


def test_a_schema_12_file_loses_tasks_id_and_its_view_gives_the_same_ids(ezra_factory, tmp_path):
    fresh = ezra_factory()
    fresh.stop()
    data_dir = tmp_path / "old"
    data_dir.mkdir(mode=0o700)
    db = sqlite3.connect(data_dir / "ezra.db")
    db.execute("PRAGMA auto_vacuum = INCREMENTAL")  # as a new file gets it (before the first table)
    db.executescript(schema_12_text())
    db.execute("PRAGMA application_id = 1163547201")
    db.execute("PRAGMA user_version = 12")
    db.execute("INSERT INTO queues (name, last_id_ms, last_id_seq, created_at) VALUES ('jobs', 1000, 2, 1000)")
    db.executemany("INSERT INTO tasks (queue, id_ms, id_seq, state, fields, attempts, created_at, available_at, "
                   "finished_at) VALUES ('jobs', 1000, ?, ?, ?, ?, 1000, 1000, ?)",
                   [(0, "available", '["n", "1"]', 0, None), (1, "done", '["n", "2"]', 1, 1500),
                    (2, "dead", '["n", "3"]', 5, 1500)])
    db.commit()
    db.close()
    assert generated_columns(data_dir / "ezra.db") == ["id"]
    server = ezra_factory(data_dir=data_dir)
    assert f"from schema 12 to {SCHEMA_VERSION}" in server.log()
    r = server.client()
    assert [(i, f) for i, f in claim(r, "jobs")] == [(b"1000-0", {b"n": b"1"})]
    assert [i for i, _ in r.xrange("jobs::dead")] == [b"1000-2"]
    r.close()
    server.stop()
    assert generated_columns(server.data_dir / "ezra.db") == []
    with sqlite3.connect(server.data_dir / "ezra.db") as db:
        # 1000-0 back to available: a clean stop gives the tasks in flight back
        assert db.execute("SELECT id, state FROM tasks_readable ORDER BY id_seq").fetchall() == [
            ("1000-0", "available"), ("1000-1", "done"), ("1000-2", "dead")]
    db.close()
    assert schema_of(server.data_dir / "ezra.db") == schema_of(fresh.data_dir / "ezra.db")


def test_a_schema_13_file_gives_each_queue_a_range_of_row_ids_in_id_order(ezra_factory, tmp_path):
    """Schema 14 finds a queue's tasks as a range of row ids, in id order (storage/row_ranges.py):
    a schema 13 file's rows, in whatever order SQLite numbered them, are renumbered so, every
    task kept with its id, fields and state; a task whose queue has no row gets one."""
    fresh = ezra_factory()
    fresh.stop()
    db = write_old_file(tmp_path / "old", schema_13_text(), 13)
    db.executemany("INSERT INTO queues (name, last_id_ms, last_id_seq, created_at) VALUES (?, 2000, 0, 1000)",
                   [("mail",), ("jobs",)])
    rows = [("jobs", ms, seq, state) for ms in (1000, 1500, 1999) for seq in (0, 7)
            for state in ("available",)] + [("mail", 1200, 0, "done"), ("mail", 1300, 0, "available"),
                                            ("mail", 1100, 0, "dead"), ("orphan", 5, 5, "available")]
    rows[1] = ("jobs", 1000, 7, "done")
    for rowid, (queue, ms, seq, state) in zip(range(900, 0, -50), rows):  # row ids against id order
        db.execute("INSERT INTO tasks (rowid, queue, id_ms, id_seq, state, fields, created_at, available_at, "
                   "finished_at) VALUES (?, ?, ?, ?, ?, ?, 1000, 1000, ?)",
                   (rowid, queue, ms, seq, state, f'["n", "{queue}-{ms}-{seq}"]', 1500 if state != "available" else None))
    db.commit()
    db.close()
    server = ezra_factory(data_dir=tmp_path / "old")
    assert f"from schema 13 to {SCHEMA_VERSION}" in server.log()
    r = server.client()
    assert [i for i, _ in r.xrange("jobs")] == [b"1000-0", b"1000-7", b"1500-0", b"1500-7", b"1999-0", b"1999-7"]
    assert [i for i, _ in r.xrange("jobs", "1000-1", "1999-0")] == [b"1000-7", b"1500-0", b"1500-7", b"1999-0"]
    assert [i for i, _ in r.xrevrange("jobs", "1999", "1500-7", count=2)] == [b"1999-7", b"1999-0"]
    assert [(i, f) for i, f in r.xrange("mail")] == [(b"1200-0", {b"n": b"mail-1200-0"}),
                                                    (b"1300-0", {b"n": b"mail-1300-0"})]
    assert [i for i, _ in r.xrange("mail::dead")] == [b"1100-0"]
    assert [i for i, _ in claim(r, "jobs", count=10)] == [b"1000-0", b"1500-0", b"1500-7", b"1999-0", b"1999-7"]
    assert [i for i, _ in claim(r, "orphan")] == [b"5-5"]
    new = r.xadd("mail", {"n": "new"})  # after its last id, in its range
    assert [i for i, _ in r.xrange("mail")] == [b"1200-0", b"1300-0", new]
    r.close()
    server.stop()
    with sqlite3.connect(server.data_dir / "ezra.db") as db:
        for name, number in db.execute("SELECT name, number FROM queues").fetchall():
            rowids = [row[0] for row in db.execute("SELECT rowid FROM tasks WHERE queue = ? ORDER BY id_ms, id_seq",
                                                   (name,))]
            assert rowids == sorted(rowids) and all(rowid >> 40 == number for rowid in rowids), (name, rowids)
        assert sorted(number for (number,) in db.execute("SELECT number FROM queues")) == [1, 2, 3]
    db.close()
    assert schema_of(server.data_dir / "ezra.db") == schema_of(fresh.data_dir / "ezra.db")
