"""The schema and how values sit in its rows: schema.sql read and split by name,
the file's mark and version, the column lists the queries share, StorageError.

Names (queues, workers) are stored as TEXT when they are valid UTF-8, so a
person reading the file in a SQLite browser sees them; other names are stored
as BLOBs. Fields are a JSON array `[name, value, ...]`, readable too; bytes that
are not UTF-8 survive through Python's surrogateescape (JSON escapes them as
\\udcXX), so fields stay binary-safe.
"""

from __future__ import annotations

import json
import re
import sqlite3
from importlib import resources


APPLICATION_ID = 0x455A5241  # "EZRA": marks the file as ours
# 2: delayed state, per-task TTL, per-queue settings, idempotent producers; 3: paused;
# 4: schedules (XSCHEDULE); 5: tasks.failure (why a task last failed, XNACK REASON);
# 6: unique tasks (XADD UNIQUE: tasks.unique_key, index tasks_unique)
SCHEMA_VERSION = 18  # 18: XADD NAME: tasks.name and its index tasks_named; no tasks_waiting (waiting
# tasks counted from the dependencies table); 17: XADD AFTER: the 'waiting' state, tasks_waiting, dependencies; 16: tasks.result
# (XACK ... RESULT) and tasks.progress (XPROGRESS), shown by tasks_readable;
# 15: flow control: tasks.priority and tasks.partition_key (XADD PRIORITY,
# PARTITION), shown by tasks_readable; queues.max_in_flight, rate_limit_count, rate_limit_seconds,
# partition_limit and lanes (the claim order by priority and partition, broker/lanes.py);
# 14: a queue's tasks are a range of row ids (queues.number, storage/row_ranges.py),
# no primary key on (queue, id); 13: no tasks.id column (the id's text is tasks_readable's); 12: no
# tasks_in_flight index (the leases are in memory); 11: tasks.reserved
# (room for a claim's columns, RESERVED_BYTES); 10: no tasks_done index (tasks.retained,
# tasks_retained, queues.unmarked_done); 9: fields stored as RESP (the tasks_readable view); 8: no
# tasks_available index (the available order is in memory); 7: the state CHECK as comparisons

# The schema lives in schema.sql beside this module (package data, bundled by setup.cfg
# and ezra.spec); read once.
SCHEMA = resources.files("ezra.storage").joinpath("schema.sql").read_text(encoding="utf-8")
_CREATES = re.compile(r"CREATE (?:TABLE|VIEW|(?:UNIQUE )?INDEX) IF NOT EXISTS (\w+) ")


def _named_statements(script: str) -> dict[str, str]:
    """The script's statements by the name of the table or index each creates.

    Migrations take a statement by its name (the v1 tasks table is rebuilt from "tasks"),
    never by cutting the text at a comment. Comments between statements are left out.
    """
    statements, lines = {}, []
    for line in script.splitlines(keepends=True):
        if not lines and (not line.strip() or line.lstrip().startswith("--")):
            continue
        lines.append(line)
        statement = "".join(lines)
        if sqlite3.complete_statement(statement):
            match = _CREATES.match(statement)
            if not match or match.group(1) in statements:
                raise ValueError(f"schema.sql: not a CREATE of a new name: {statement[:80]!r}")
            statements[match.group(1)] = statement.strip()
            lines = []
    if lines:
        raise ValueError(f"schema.sql ends inside a statement: {''.join(lines)[:80]!r}")
    return statements


SCHEMA_STATEMENTS = _named_statements(SCHEMA)

# The queues table's settings columns (XCFGSET); NULL in one: the server's flag.
SETTING_COLUMNS = ("visibility_timeout", "max_attempts", "retention_seconds", "backoff",
                   "release_on_disconnect", "idmp_duration", "idmp_maxsize", "paused",
                   "max_in_flight", "rate_limit_count", "rate_limit_seconds", "partition_limit")

# A task waiting for its first claim keeps room in its row (tasks.reserved: zeros) for the columns
# its claim fills (worker, deadline, delivered_at). The claim sets it NULL, so the row keeps its size
# and is rewritten in place: a row that grows splits its page (pushes leave pages full), and then
# a commit of 50 claims wrote 3.8 pages in 38 µs, against 2.4 pages in 13 µs (measured). Worker
# names up to 20 bytes fit. Only waiting tasks carry it; finished ones never do.
RESERVED_BYTES = 32
_ROOM = bytes(RESERVED_BYTES)
ROOM_SQL = f"zeroblob({RESERVED_BYTES})"  # the same room, written by a statement's text (no value bound)


def claim_room(state: str) -> bytes | None:
    """tasks.reserved for a task written in `state`: room if it waits for a claim."""
    return _ROOM if state == "available" or state == "delayed" else None


class StorageError(Exception):
    """The database could not be opened or used; the message names the file."""


def row_list(rowids) -> str:
    """Row ids as the JSON array a statement reads with json_each(?): one bound value for a batch
    (a list of `?` costs a bind each, and was slower: BENCHMARKS.md, "A batch of rows is one
    statement")."""
    return "[%s]" % ",".join(map(str, rowids))


def name_value(name: bytes):
    """The SQL value of a queue or worker name (TEXT when it is UTF-8)."""
    try:
        return name.decode()
    except UnicodeDecodeError:
        return name


def name_bytes(value) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


# Fields are encoded and decoded once per task on the hot path. json.dumps builds an encoder per
# call; its C string escaper alone writes the same text (a list of strings, ", " between them)
# in half the time. json's C scanner reads the list back without json.loads' checks around it;
# text it cannot read whole (written by hand in the sqlite3 shell, say) goes to json.loads.
_escape = json.encoder.encode_basestring_ascii
_scan = json.JSONDecoder().scan_once


def encode_fields(fields: list[bytes]) -> str:
    """The JSON array of the fields, as json.dumps writes it (tests/test_speed_paths.py checks)."""
    return "[" + ", ".join([_escape(f.decode("utf-8", "surrogateescape")) for f in fields]) + "]"


def decode_fields(text: str) -> list[bytes]:
    """The names and values of a JSON array of text; ValueError, saying why, for any other text
    (written by hand: storage/hand_rows.py)."""
    try:
        values, end = _scan(text, 0)
    except (StopIteration, ValueError):
        values, end = None, -1
    if end != len(text) or type(values) is not list:
        values = json.loads(text)  # a clear error for text that is not JSON
        if type(values) is not list:
            raise ValueError(f"JSON {type(values).__name__}, not an array of names and values")
    try:
        return [f.encode("utf-8", "surrogateescape") for f in values]
    except AttributeError:
        raise ValueError("an item that is not text") from None


def encode_failure(failure: dict | None) -> str | None:
    """A task's last failure (lifecycle.failure_record) as the JSON text of tasks.failure,
    as json.dumps(failure, ensure_ascii=False) writes it (tests/test_failure_record_text.py checks)."""
    if failure is None:
        return None
    if tuple(failure) == _RECORD_KEYS:  # every record the server makes: written by hand
        cause, reason, worker, at = failure.values()
        if type(cause) is str and type(at) is int and (reason is None or type(reason) is str) and (
                worker is None or type(worker) is str):
            return '{"cause": %s, "reason": %s, "worker": %s, "at": %d}' % (
                _escape_text(cause), "null" if reason is None else _escape_text(reason),
                "null" if worker is None else _escape_text(worker), at)
    return _FAILURE_ENCODER.encode(failure)  # anything else (an import's FAILURE), the same way


# A nack encodes one record. json.dumps builds a new encoder on every call that passes an option
# (2.5 µs a record), the encoder made once takes 1.8; the record written with json's C string
# escaper (the one ensure_ascii=False uses) 0.6, measured.
_RECORD_KEYS = ("cause", "reason", "worker", "at")
_escape_text = json.encoder.encode_basestring
_FAILURE_ENCODER = json.JSONEncoder(ensure_ascii=False)


def decode_failure(text: str | None) -> dict | None:
    """tasks.failure back as a dict; text that is not a JSON object (edited by hand) as its reason."""
    if text is None:
        return None
    try:
        failure = json.loads(text)
    except ValueError:
        failure = None
    if not isinstance(failure, dict):
        return {"cause": None, "reason": str(text), "worker": None, "at": None}
    return failure


def roll_back(conn) -> None:
    """Undo a failed step's transaction. SQLite may have rolled it back itself (a full disk, an
    I/O error): a ROLLBACK then fails, "no transaction is active", and would hide the reason."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")
