"""Issue 22: a task's fields are stored as the RESP array a reply sends (task_fields.py).

A push stores resp.bulk_array's bytes and a claim sends them on as they are; rows in the older
form (a JSON array of text: files from before schema 9, a schedule's pushes, a hand edit) are
read as before; the tasks_readable view shows both as JSON in the sqlite3 shell; a schema 8 file
gains the view and keeps its rows.
"""

from __future__ import annotations

import sqlite3

import pytest

from ezra.protocol import task_fields
from ezra.protocol.resp import bulk_array, read_bulk_array
from ezra.storage import SCHEMA_VERSION, encode_fields

from support_queue import entries_of

# Values a JSON text would escape, and a RESP reader must not split on.
AWKWARD = [b"crlf", b"a\r\nb", b"binary", bytes(range(256)), b"empty", b"", b"utf-8", "é✓".encode(),
           b"quote", b'"\\', b"long", b"x" * 70_000]


# ---------------------------------------------------------------- the stored form alone

@pytest.mark.parametrize("items", [[b"f", b"v"], AWKWARD, [b"f"] * 1030, [b""]],
                         ids=["two", "awkward", "1030 fields", "one empty"])
def test_the_stored_array_reads_back_as_the_values_written(items):
    data = bulk_array(items)
    assert data.startswith(b"*%d\r\n" % len(items)) and read_bulk_array(data) == items


@pytest.mark.parametrize("data", [b"", b"*0\r\n", b"*1\r\n$2\r\nabc\r\n", b"*1\r\n$3\r\nabc\r\nx",
                                  b"*2\r\n$1\r\na\r\n", b"*1\r\n$-1\r\n", b'["a", "b"]'],
                         ids=["empty", "no items", "length too short", "bytes after", "item missing",
                              "null", "json"])
def test_bytes_that_are_not_one_array_of_bulk_strings_are_refused(data):
    with pytest.raises(ValueError):
        read_bulk_array(data)


def test_both_stored_forms_give_the_same_fields_and_the_same_reply_bytes():
    values = [b"f", b"v", b"n", "é".encode()]
    blob, text = task_fields.stored(values), encode_fields(values)
    assert type(blob) is bytes and type(text) is str
    assert task_fields.listed(blob) == task_fields.listed(text) == values
    assert task_fields.as_resp(blob) is blob and task_fields.as_resp(text) == blob


# ---------------------------------------------------------------- the server

def test_awkward_values_come_back_byte_for_byte_and_are_stored_as_the_reply_sends_them(ezra_factory, protocol):
    server = ezra_factory()
    r = server.client(protocol)
    r.xgroup_create("q", "g", id="0", mkstream=True)
    pairs = dict(zip(AWKWARD[::2], AWKWARD[1::2]))
    task_id = r.xadd("q", pairs)
    assert entries_of(r.xreadgroup("g", "w", {"q": ">"}, count=1), "q") == [(task_id, pairs)]
    assert r.xrange("q") == [(task_id, pairs)]
    r.close()
    with sqlite3.connect(server.data_dir / "ezra.db") as db:
        (stored,) = db.execute("SELECT fields FROM tasks").fetchone()
        (shown,) = db.execute("SELECT json_extract(fields, '$[1]') FROM tasks_readable").fetchone()
    assert stored == bulk_array(AWKWARD)
    assert shown == "a\r\nb"


def test_the_view_shows_both_forms_as_json(ezra_factory):
    server = ezra_factory()
    r = server.client()
    r.xadd("q", {"to": "a@example.com", "n": "1"})
    r.close()
    server.stop()
    with sqlite3.connect(server.data_dir / "ezra.db") as db:
        db.execute("INSERT INTO tasks (queue, id_ms, id_seq, state, fields, created_at, available_at) "
                   "VALUES ('q', 1, 0, 'available', ?, 0, 0)", (encode_fields([b"to", b"b@example.com"]),))
        rows = db.execute("SELECT id, fields FROM tasks_readable WHERE queue = 'q' ORDER BY id_ms").fetchall()
    assert [fields for _, fields in rows] == ['["to", "b@example.com"]', '["to","a@example.com","n","1"]']


def test_a_schema_8_file_gains_the_view_and_serves_its_json_rows(ezra_factory, protocol):
    """A file an older EZRA wrote: its tasks' fields are JSON text. After the migration the
    server claims and lists them as before, and new pushes beside them are stored as RESP."""
    server = ezra_factory()
    r = server.client()
    r.xgroup_create("q", "g", id="0", mkstream=True)
    r.close()
    server.stop()
    with sqlite3.connect(server.data_dir / "ezra.db") as db:  # back to what version 8 wrote
        db.execute("DROP VIEW tasks_readable")
        db.execute("INSERT INTO tasks (queue, id_ms, id_seq, state, fields, created_at, available_at) "
                   "VALUES ('q', 1, 0, 'available', ?, 0, 0)", (encode_fields([b"old", "é".encode()]),))
        db.execute("PRAGMA user_version = 8")
    server.start()
    r = server.client(protocol)
    new_id = r.xadd("q", {"new": "1"})
    assert entries_of(r.xreadgroup("g", "w", {"q": ">"}, count=2), "q") == [
        (b"1-0", {b"old": "é".encode()}), (new_id, {b"new": b"1"})]
    assert r.xrange("q", count=1) == [(b"1-0", {b"old": "é".encode()})]
    r.close()
    with sqlite3.connect(server.data_dir / "ezra.db") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert [type(fields) for (fields,) in db.execute("SELECT fields FROM tasks ORDER BY id_ms")] == [str, bytes]
        assert db.execute("SELECT count(*) FROM tasks_readable").fetchone()[0] == 2
