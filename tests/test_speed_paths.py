"""The hot path's shapes (issue 22): what one read of pipelined commands costs the writer.

Each test counts what the server did (INFO's commit_batches and committed_requests) on a
server of its own, so no other test's commands are counted; the replies are checked too.
Speed itself is measured by scripts/bench.py and scripts/stages.py, never here.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ezra.front.connection import READS_PER_FLUSH
from ezra.storage.schema import decode_fields, encode_fields
from ezra.protocol.task_fields import stored

PIPELINED = 20


def batches(client) -> int:
    return client.info("persistence")["commit_batches"]


@pytest.mark.parametrize("protocol", [2, 3], ids=["resp2", "resp3"])
def test_pipelined_claims_share_one_commit(ezra_factory, protocol):
    """Pipelined XREADGROUP '>' (with BLOCK, as workers send it) that find tasks are answered
    together after one commit, as pipelined XADDs are; before, each waited for its own commit."""
    server = ezra_factory()
    client = server.client(protocol)
    used = []
    for _ in range(3):  # the reaper commits a pass of its own every 0.1 s: the least of three counts
        ids = client.pipeline(transaction=False)
        for i in range(PIPELINED):
            ids.xadd("q", {"n": str(i)})
        pushed = ids.execute()
        before = batches(client)
        pipe = client.pipeline(transaction=False)
        for _ in range(PIPELINED):
            pipe.xreadgroup("g", "w1", {"q": ">"}, count=1, block=1000)
        replies = pipe.execute()
        used.append(batches(client) - before)
        claimed = []
        for reply in replies:
            entries = reply[b"q"][0] if protocol == 3 else reply[0][1]
            claimed += [(task_id, fields) for task_id, fields in entries]
        assert [task_id for task_id, _ in claimed] == pushed  # each claim got the next task, in order
        assert [fields[b"n"] for _, fields in claimed] == [str(i).encode() for i in range(PIPELINED)]
        assert client.xpending("q", "g")["pending"] == PIPELINED
        assert client.xack("q", "g", *pushed) == PIPELINED
    # Claims are reads: a read's replies are sent every READS_PER_FLUSH of them (memory bound).
    most = math.ceil(PIPELINED / READS_PER_FLUSH)
    assert min(used) <= most, f"{PIPELINED} pipelined claims took {used} commits"


def test_pipelined_claims_after_an_empty_one_still_block_and_flush(ezra_factory):
    """A claim that finds nothing and blocks sends the replies before it first, and is then
    served by a push from another client."""
    server = ezra_factory()
    client, producer = server.client(2), server.client(2)
    client.xadd("q", {"n": "0"})
    claim = ("XREADGROUP", "GROUP", "g", "w1", "COUNT", 1, "BLOCK", 20000, "STREAMS", "q", ">")
    conn = client.connection_pool.get_connection()
    try:
        conn.send_packed_command(conn.pack_commands([claim, claim]))  # one write: both in one read
        first = conn.read_response()  # sent before the second claim blocks: no push needed for it
        assert first[0][1][0][1] == [b"n", b"0"]
        producer.xadd("q", {"n": "1"})
        second = conn.read_response()
        assert second[0][1][0][1] == [b"n", b"1"]
    finally:
        client.connection_pool.release(conn)


# ---------------------------------------------------------------- the fields' stored form

@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=6))
def test_fields_are_stored_as_json_dumps_writes_them(fields):
    """encode_fields' fast path writes exactly json.dumps' text (the file's documented form,
    readable in the sqlite3 shell), and decode_fields reads any bytes back."""
    text = encode_fields(fields)
    assert text == json.dumps([f.decode("utf-8", "surrogateescape") for f in fields])
    assert decode_fields(text) == fields


def test_fields_written_by_hand_still_read_and_bad_text_is_an_error():
    assert decode_fields(' [ "a" ,"b\\u00e9"]\n') == [b"a", "bé".encode()]
    with pytest.raises(ValueError):
        decode_fields('["a"] trailing')
    with pytest.raises(ValueError):
        decode_fields("not json")


# ---------------------------------------------------------------- the writer's fsync flag

@pytest.mark.parametrize("flag", ["committed", "synced"])
def test_a_batch_flag_wakes_every_waiter_once_and_skips_killed_ones(flag):
    """A batch's flags (committed, synced): set_*() from a greenlet wakes the waiters in a later
    callback, set_synced_now() (the fsync callback, on the hub) switches to them at once; a
    waiter killed while waiting is skipped, and waiting on a set flag returns at once."""
    import gevent
    from gevent import get_hub

    from ezra.writer.batch import Batch

    for how in ("set", "set_now") if flag == "synced" else ("set",):
        batch, woken = Batch(), []
        wait, is_set = getattr(batch, f"wait_{flag}"), lambda: getattr(batch, f"is_{flag}")

        def waiting_one(name):
            wait()
            woken.append(name)
        waiting = [gevent.spawn(waiting_one, i) for i in range(3)]
        gevent.sleep(0)  # all three wait now
        waiting[1].kill()
        if how == "set":
            getattr(batch, f"set_{flag}")()
            assert woken == []  # the wake-up is a callback of its own
        else:
            get_hub().loop.run_callback(batch.set_synced_now)
        gevent.joinall(waiting, timeout=5)
        assert woken == [0, 2], how
        assert is_set()
        wait()  # returns at once
        getattr(batch, f"set_{flag}")()  # a second set does nothing
        gevent.sleep(0)
        assert woken == [0, 2]


# ---------------------------------------------------------------- the common push's INSERT

def test_a_plain_push_stores_the_row_the_full_insert_stores(tmp_path):
    """insert_task's short statement (available, no attempts, no TTL) leaves the same row as
    the statement that binds every column."""
    from ezra import storage
    from ezra.storage.schema import claim_room

    db = storage.open_database(str(tmp_path))
    try:
        db.begin()
        db.insert_queue(b"q", 100)
        rowid = db.insert_task(b"q", (5, 1), stored([b"f", b"v"]), 100, 100)
        db.conn.execute(
            "INSERT INTO tasks (rowid, queue, id_ms, id_seq, state, fields, attempts, created_at, available_at, "
            "finished_at, ttl_ms, reserved) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (rowid + 1, "q", 5, 2, "available", stored([b"f", b"v"]), 0, 100, 100, None, None, claim_room("available")))
        db.commit()
        short, full = [row[1:] for row in db.conn.execute("SELECT * FROM tasks WHERE queue = 'q' ORDER BY id_seq")]
    finally:
        db.close()
    assert short[:2] == full[:2] and short[2] == 1 and full[2] == 2
    assert short[3:] == full[3:]
