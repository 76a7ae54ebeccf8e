"""The core's hot statements (issue 22, round three): each shape of a claim and an ack stores
the same row as every other shape, read back from the file with sqlite3 as an operator would.

Speed itself is measured by scripts/stages.py and scripts/bench.py, never here.
"""

from __future__ import annotations

import sqlite3

import pytest

ROW = "state, worker, deadline IS NOT NULL, delivered_at IS NOT NULL, attempts, finished_at IS NOT NULL"


def stored(server, queue: str) -> list[tuple]:
    """Every task row of `queue`, in id order, from the file (a read-only connection)."""
    conn = sqlite3.connect(f"file:{server.data_dir / 'ezra.db'}?mode=ro", uri=True)
    try:
        return conn.execute(f"SELECT id_ms || '-' || id_seq, {ROW} FROM tasks WHERE queue = ? "
                            "ORDER BY id_ms, id_seq", (queue,)).fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize("protocol", [2, 3], ids=["resp2", "resp3"])
@pytest.mark.parametrize("count", [1, 3])
def test_a_claim_stores_its_lease_whatever_its_count(ezra_factory, protocol, count):
    """COUNT 1 (a read of the head, then an update of its row) and COUNT 3 (one UPDATE ...
    RETURNING) take the oldest tasks in order and write the same lease, and a redelivery
    counts its attempt either way."""
    server = ezra_factory("--max-attempts", "5")
    client = server.client(protocol)
    ids = [client.xadd("q", {"n": str(i)}).decode() for i in range(6)]
    client.xgroup_create("q", "g", id="0")
    got = []
    while len(got) < 6:
        reply = client.xreadgroup("g", "w1", {"q": ">"}, count=count)
        entries = reply[b"q"][0] if protocol == 3 else reply[0][1]
        assert 1 <= len(entries) <= count
        got += [(task_id.decode(), fields[b"n"]) for task_id, fields in entries]
    assert got == [(task_id, str(i).encode()) for i, task_id in enumerate(ids)]  # oldest first
    assert stored(server, "q") == [(task_id, "in_flight", "w1", 1, 1, 1, 0) for task_id in ids]
    assert client.execute_command("XNACK", "q", "g", "FAIL", "IDS", 1, ids[1]) == 1  # back, as "fixed 0"
    reply = client.xreadgroup("g", "w2", {"q": ">"}, count=count)
    entries = reply[b"q"][0] if protocol == 3 else reply[0][1]
    assert entries[0][0].decode() == ids[1]
    row = stored(server, "q")[1]
    assert row == (ids[1], "in_flight", "w2", 1, 1, 2, 0)  # delivered twice: attempts 2
    pending = client.xpending_range("q", "g", min=ids[1], max=ids[1], count=1)
    assert pending[0]["times_delivered"] == 2


@pytest.mark.parametrize("count", [1, 3])
def test_a_noack_claim_finishes_the_task_whatever_its_count(ezra_factory, count):
    """NOACK: the claimed task is done at once (finished_at set, no lease), in either shape."""
    server = ezra_factory()
    client = server.client()
    task_id = client.xadd("q", {"f": "v"}).decode()
    client.xgroup_create("q", "g", id="0")
    reply = client.xreadgroup("g", "w1", {"q": ">"}, count=count, noack=True)
    assert reply[0][1][0][0].decode() == task_id
    assert stored(server, "q") == [(task_id, "done", "w1", 0, 1, 1, 1)]
    assert client.xpending("q", "g")["pending"] == 0
