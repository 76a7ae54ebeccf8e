"""Issue 22, core3: the failure record a nack stores is written by hand (schema.encode_failure's
fast path) and must be the very text json.dumps(record, ensure_ascii=False) wrote before, for
every record the server makes and for the odd ones an import brings (which take the encoder)."""

from __future__ import annotations

import json
import sqlite3

import pytest
from support_queue import claim

from ezra import lifecycle
from ezra.storage.schema import encode_failure

AWKWARD = ["", "plain", 'a "quoted" \\ back\\slash', "new\nline\ttab\r\x00\x1f\x7f", "é 日本 🎉",
           "\ud800 lone surrogate", "</script>&<b>", "x" * 5000]


@pytest.mark.parametrize("text", AWKWARD)
def test_server_records_are_the_text_json_dumps_writes(text):
    for cause in (lifecycle.NACKED, lifecycle.LEASE_EXPIRED, text):
        for record in (lifecycle.failure_record(cause, text, text, 1764626400123),
                       lifecycle.failure_record(cause, None, None, 0),
                       lifecycle.failure_record(cause, text, None, 2 ** 63 - 1),
                       lifecycle.failure_record(cause, None, text, -1)):
            assert encode_failure(record) == json.dumps(record, ensure_ascii=False)


@pytest.mark.parametrize("record", [
    {"cause": "nack", "reason": None, "worker": None, "at": True},      # a bool is not an int here
    {"cause": "nack", "reason": 3, "worker": None, "at": 1},            # a reason that is not text
    {"cause": "nack", "reason": None, "worker": None, "at": 1.5},
    {"reason": None, "cause": "nack", "worker": None, "at": 1},         # keys in another order
    {"cause": "nack", "reason": None, "worker": None, "at": 1, "extra": [1, {"a": None}]},
    {"cause": None, "reason": None, "worker": None, "at": 1},
    {},
])
def test_other_records_take_the_encoder_and_read_the_same(record):
    assert encode_failure(record) == json.dumps(record, ensure_ascii=False)
    assert encode_failure(None) is None


def test_a_nack_stores_its_record_as_json_dumps_wrote_it(ezra_factory, protocol):
    server = ezra_factory()
    r = server.client(protocol)
    reason = 'KeyError: "é\\n"\n\t日本'
    task_id = r.xadd("jobs", {"job": "1"})
    claim(r, "jobs", "wörker-1")
    assert r.execute_command("XNACK", "jobs", "g", "FATAL", "IDS", 1, task_id, "REASON", reason) == 1
    r.close()
    with sqlite3.connect(server.data_dir / "ezra.db") as db:
        [(text, finished_at)] = db.execute("SELECT failure, finished_at FROM tasks_readable WHERE id = ?",
                                           (task_id.decode(),)).fetchall()
    record = json.loads(text)
    assert record == {"cause": "nack", "reason": reason, "worker": "wörker-1", "at": finished_at}
    assert text == json.dumps(record, ensure_ascii=False)
