"""XCFGSET q MAX-IN-FLIGHT n (issue 47): at most n tasks of a queue leased at once, across all
workers and connections. A read at the cap answers nothing (or blocks); a blocked worker is
served when a slot frees (ack, nack, expiry, XACKDEL), in the batch that frees it.
redis-py in RESP2 and RESP3, a real server.

No sleeps: a blocked reader "did not get a task" is checked right after the command that would
have served it returns (a task goes to a blocked reader in the same batch that frees a slot,
and that batch commits before the reply); its wake-up is polled with a deadline.
"""

from __future__ import annotations

import urllib.request

import pytest
from support_queue import BlockedReader, blocked, claim, configure, pending, queue_figures


def push(r, queue, n) -> list:
    return [r.xadd(queue, {"n": str(i)}) for i in range(n)]


def test_three_reads_get_two_tasks_then_nothing(r, queue):
    configure(r, queue, "MAX-IN-FLIGHT", "2")
    ids = push(r, queue, 5)
    got = [claim(r, queue, worker=f"w{i}", count=1) for i in range(3)]
    assert [[i for i, _ in entries] for entries in got] == [[ids[0]], [ids[1]], []]
    assert claim(r, queue, worker="w9", count=10) == []               # COUNT asks for more: none
    assert claim(r, queue, worker="w9", count=10, noack=True) == []   # NOACK at the cap: none either
    assert len(pending(r, queue)) == 2 and queue_figures(r, queue)["available"] == 3
    assert r.xack(queue, "g", ids[0]) == 1                            # a slot frees: one more
    assert [i for i, _ in claim(r, queue, worker="w3", count=10)] == [ids[2]]


def test_a_count_above_the_room_gets_the_room(r, queue):
    configure(r, queue, "MAX-IN-FLIGHT", "3")
    ids = push(r, queue, 5)
    assert [i for i, _ in claim(r, queue, count=10)] == ids[:3]
    assert claim(r, queue, count=10) == []


@pytest.mark.parametrize("free", ["ack", "nack", "xackdel", "xdel"])
def test_a_worker_blocked_at_the_cap_gets_a_task_when_a_slot_frees(shared_server, protocol, queue, free):
    r = shared_server.client(protocol)
    configure(r, queue, "MAX-IN-FLIGHT", "1")
    ids = push(r, queue, 3)
    [(held, _)] = claim(r, queue, worker="busy", count=1)
    reader = BlockedReader(shared_server, protocol, queue).start(r)
    r.xadd(queue, {"n": "more"})  # a push does not pass the cap
    assert not reader.done.is_set() and len(pending(r, queue)) == 1
    if free == "ack":
        assert r.xack(queue, "g", held) == 1
    elif free == "nack":
        assert r.execute_command("XNACK", queue, "g", held) == 1
    elif free == "xackdel":
        assert r.execute_command("XACKDEL", queue, "g", "IDS", 1, held) == [1]
    else:
        assert r.xdel(queue, held) == 1
    # The slot went to the blocked reader in the batch that freed it; after a nack the task that
    # went back is first in line again (available, id order).
    assert reader.ids() == [held if free in ("nack", "xdel") else ids[1]]
    assert [p["consumer"] for p in pending(r, queue)] == [b"blocked"]
    r.close()


def test_a_worker_blocked_at_the_cap_gets_a_task_when_a_lease_expires(ezra_factory, protocol):
    server = ezra_factory("--visibility-timeout", "0.3")
    r = server.client(protocol)
    configure(r, "capped", "MAX-IN-FLIGHT", "1")
    ids = push(r, "capped", 2)
    [(held, _)] = claim(r, "capped", worker="slow", count=1)
    reader = BlockedReader(server, protocol, "capped").start(r)
    assert reader.ids() == [held]  # the lease ran out: the slot and the task both came back
    assert queue_figures(r, "capped")["expired"] == 1 and queue_figures(r, "capped")["available"] == 1
    assert [p["message_id"] for p in pending(r, "capped")] == [held] and ids[1] != held


def test_the_cap_holds_across_connections(shared_server, protocol, queue):
    clients = [shared_server.client(protocol) for _ in range(4)]
    configure(clients[0], queue, "MAX-IN-FLIGHT", "2")
    push(clients[0], queue, 10)
    got = [claim(c, queue, worker=f"w{i}", count=5) for i, c in enumerate(clients)]
    assert sum(len(entries) for entries in got) == 2
    for c in clients:
        c.close()


def test_default_removes_the_cap_and_serves_blocked_workers(shared_server, protocol, queue):
    r = shared_server.client(protocol)
    configure(r, queue, "MAX-IN-FLIGHT", "1")
    ids = push(r, queue, 3)
    claim(r, queue, worker="busy", count=1)
    reader = BlockedReader(shared_server, protocol, queue).start(r)
    assert not reader.done.is_set()
    configure(r, queue, "MAX-IN-FLIGHT", "DEFAULT")
    assert reader.ids() == [ids[1]]
    assert "max-in-flight" not in {k.decode() if isinstance(k, bytes) else k for k in r.xinfo_stream(queue)}
    assert [i for i, _ in claim(r, queue, count=10)] == [ids[2]]
    r.close()


def test_xinfo_stream_shows_the_cap_and_what_holds_the_queue_back(r, queue):
    configure(r, queue, "MAX-IN-FLIGHT", "1")
    push(r, queue, 2)
    shown = {k.decode() if isinstance(k, bytes) else k: v for k, v in r.xinfo_stream(queue).items()}
    assert (shown["max-in-flight"], shown["held-back"], shown["in-flight"]) in ((b"1", b"no", 0), ("1", "no", 0))
    claim(r, queue, count=1)
    shown = {k.decode() if isinstance(k, bytes) else k: v for k, v in r.xinfo_stream(queue).items()}
    assert shown["held-back"] in (b"cap", "cap") and shown["in-flight"] == 1


def test_a_queue_without_limits_shows_no_new_fields(r, queue):
    r.xadd(queue, {"n": "1"})
    keys = [k.decode() if isinstance(k, bytes) else k for k in r.xinfo_stream(queue)]
    assert keys[-1] == "paused"  # as before: EZRA's settings end with PAUSED
    assert not {"max-in-flight", "rate-limit", "held-back"} & set(keys)


def test_the_cap_survives_a_restart(ezra_factory, protocol):
    server = ezra_factory()
    r = server.client(protocol)
    configure(r, "kept", "MAX-IN-FLIGHT", "2")
    push(r, "kept", 4)
    r.close()
    server.restart()
    r = server.client(protocol)
    assert len(claim(r, "kept", count=10)) == 2
    assert claim(r, "kept", worker="other", count=10) == []


def test_info_metrics_show_the_queue_held_back(ezra_factory):
    server = ezra_factory("--http-port", "0")
    r = server.client(2)
    configure(r, "held", "MAX-IN-FLIGHT", "1")
    push(r, "held", 2)
    claim(r, "held", count=1)
    assert r.info("queues")["queue_held"]["at_cap"] == 1
    with urllib.request.urlopen(server.http_url + "/metrics", timeout=10) as reply:
        body = reply.read().decode()
    assert 'ezra_queue_held_back{queue="held",reason="cap"} 1.0' in body


@pytest.mark.parametrize("value", ["0", "-1", "x", "1.5", "1_0", "2147483648"])
def test_bad_values_are_refused_and_change_nothing(r, queue, value):
    configure(r, queue, "MAX-IN-FLIGHT", "2")
    with pytest.raises(Exception) as refused:
        r.execute_command("XCFGSET", queue, "MAX-IN-FLIGHT", value)
    assert "MAX-IN-FLIGHT" in str(refused.value) or "integer" in str(refused.value)
    shown = {k.decode() if isinstance(k, bytes) else k: v for k, v in r.xinfo_stream(queue).items()}
    assert shown["max-in-flight"] in (b"2", "2")


def test_a_worker_blocked_at_the_cap_gets_a_task_when_a_gone_workers_tasks_are_released(shared_server, protocol,
                                                                                         queue):
    r = shared_server.client(protocol)
    configure(r, queue, "MAX-IN-FLIGHT", "1", "RELEASE-ON-DISCONNECT", "0.1")
    ids = push(r, queue, 2)
    gone = shared_server.client(protocol)
    [(held, _)] = claim(gone, queue, worker="gone", count=1)
    reader = BlockedReader(shared_server, protocol, queue).start(r)
    assert not reader.done.is_set()
    gone.close()  # its last connection: after the grace its task goes back, and the slot with it
    assert reader.ids() == [held] and held == ids[0]
    assert [(p["message_id"], p["consumer"], p["times_delivered"]) for p in pending(r, queue)] == \
        [(held, b"blocked", 2)]
    r.close()
