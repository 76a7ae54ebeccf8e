"""XCFGSET q RATE-LIMIT n seconds (issue 47): at most n tasks of a queue handed out in any window
of that many seconds, a sliding window (never 2n across a boundary). Redeliveries, NOACK claims
and take-overs count; a worker blocked by the limit is served when the window opens, without
polling. redis-py in RESP2 and RESP3, a real server.

Hand-out times are the server's: one XPENDING reply gives every task's idle time at one instant,
so the differences between deliveries are exact to the ms whatever the load. No wall-clock upper
bound: the tests assert the window's count, and poll wake-ups with a deadline.
"""

from __future__ import annotations

import threading

import pytest
from support_queue import claim, configure, entries_of, pending, queue_figures
from support_servers import wait_until


def push(r, queue, n) -> list:
    return [r.xadd(queue, {"n": str(i)}) for i in range(n)]


def delivered_at(r, queue) -> list[int]:
    """Each task in flight's delivery, as ms before one instant of the server's clock, oldest first."""
    return sorted(-p["time_since_delivered"] for p in r.xpending_range(queue, "g", "-", "+", 1000))


def most_in_one_window(times: list[int], window_ms: int) -> int:
    """The most hand-outs within any window of window_ms (a half-open interval of that length)."""
    most, start = 0, 0
    for end, at in enumerate(times):
        while at - times[start] >= window_ms:
            start += 1
        most = max(most, end - start + 1)
    return most


def shown(r, queue) -> dict:
    return {k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v
            for k, v in r.xinfo_stream(queue).items()}


def test_reads_get_n_then_nothing_and_every_hand_out_counts(r, queue):
    configure(r, queue, "RATE-LIMIT", "3", "3600")
    ids = push(r, queue, 6)
    assert [i for i, _ in claim(r, queue, count=2)] == ids[:2]
    assert [i for i, _ in claim(r, queue, worker="w2", count=5)] == ids[2:3]  # the room left: one
    assert claim(r, queue, worker="w3", count=5) == []
    assert claim(r, queue, worker="w3", count=5, noack=True) == []
    assert r.execute_command("XNACK", queue, "g", ids[0]) == 1  # back to available: its redelivery waits too
    assert claim(r, queue, worker="w3", count=5) == []
    assert shown(r, queue)["held-back"] == "rate limit" and shown(r, queue)["rate-limit"] == "3 3600"
    # A take-over is a hand-out: the full window holds it back; the owner's heartbeat is not one.
    assert r.xclaim(queue, "g", "thief", 0, [ids[1]]) == []
    assert [i for i, _ in r.xclaim(queue, "g", "w1", 0, [ids[1]])] == [ids[1]]
    assert r.xautoclaim(queue, "g", "thief", 0, "0-0")[1] == []
    configure(r, queue, "RATE-LIMIT", "DEFAULT")
    assert len(claim(r, queue, worker="w4", count=10)) == 4


def test_noack_claims_count_for_the_rate(r, queue):
    configure(r, queue, "RATE-LIMIT", "2", "3600")
    push(r, queue, 4)
    assert len(claim(r, queue, count=5, noack=True)) == 2
    assert claim(r, queue, count=5) == []


def test_take_overs_count_for_the_rate_but_not_the_cap(r, queue):
    configure(r, queue, "RATE-LIMIT", "2", "3600", "MAX-IN-FLIGHT", "1")
    ids = push(r, queue, 3)
    assert [i for i, _ in claim(r, queue, count=5)] == ids[:1]
    assert [i for i, _ in r.xclaim(queue, "g", "thief", 0, [ids[0]])] == [ids[0]]  # at the cap: still taken
    assert r.xclaim(queue, "g", "w1", 0, [ids[0]]) == []  # the window is full: no take-over back
    assert queue_figures(r, queue)["delivered"] == 2


def test_no_window_of_the_length_holds_more_than_n(shared_server, protocol, queue):
    """RATE-LIMIT 5 0.5, 15 tasks read by three workers that block: no 500 ms holds more than 5."""
    r = shared_server.client(protocol)
    configure(r, queue, "RATE-LIMIT", "5", "0.5", "VISIBILITY-TIMEOUT", "600")
    push(r, queue, 15)
    got = []

    def work(name):
        client = shared_server.client(protocol)
        while True:
            entries = entries_of(client.xreadgroup("g", name, {queue: ">"}, count=2, block=3000), queue)
            if not entries:
                break
            got.extend(entries)
        client.close()

    workers = [threading.Thread(target=work, args=(f"w{i}",), daemon=True) for i in range(3)]
    for worker in workers:
        worker.start()
    wait_until(lambda: len(got) == 15, timeout=30, message="every task handed out")
    times = delivered_at(r, queue)
    assert len(times) == 15
    assert most_in_one_window(times, 500) == 5  # full windows, never more
    assert times[-1] - times[0] >= 1000         # 15 at 5 per 500 ms: three windows at least
    r.close()


def test_a_blocked_worker_is_woken_when_the_window_opens(shared_server, protocol, queue):
    r = shared_server.client(protocol)
    configure(r, queue, "RATE-LIMIT", "2", "1")
    ids = push(r, queue, 3)
    assert len(claim(r, queue, count=5)) == 2
    reply, done = [], threading.Event()
    reader = shared_server.client(protocol)

    def read():
        reply.append(reader.xreadgroup("g", "blocked", {queue: ">"}, count=1, block=20_000))
        done.set()

    threading.Thread(target=read, daemon=True).start()
    r.xadd(queue, {"n": "late"})  # a push while the window is full serves nobody
    assert done.wait(15), "the blocked worker was not woken when the window opened"
    assert [i for i, _ in entries_of(reply[0], queue)] == [ids[2]]
    times = delivered_at(r, queue)
    assert times[-1] - times[0] >= 1000  # it was served when the first hand-out left the window
    assert r.info("clients")["blocked_clients"] >= 0 and len(pending(r, queue)) == 3
    reader.close()
    r.close()


def test_the_rate_limit_survives_a_restart_and_config_lines_take_both(ezra_factory, protocol, tmp_path):
    config = tmp_path / "ezra.conf"
    config.write_text("queue = [limited MAX-IN-FLIGHT 5 RATE-LIMIT 100 60, other RATE-LIMIT 2 0.25]\n")
    server = ezra_factory("--config", str(config))
    r = server.client(protocol)
    assert (shown(r, "limited")["max-in-flight"], shown(r, "limited")["rate-limit"]) == ("5", "100 60")
    assert shown(r, "other")["rate-limit"] == "2 0.25"
    configure(r, "kept", "RATE-LIMIT", "2", "3600")
    push(r, "kept", 5)
    assert len(claim(r, "kept", count=5)) == 2
    r.close()
    server.restart()
    r = server.client(protocol)
    assert shown(r, "kept")["rate-limit"] == "2 3600"
    # The window is in memory: a restart starts it empty (and makes the tasks in flight available).
    assert len(claim(r, "kept", count=5)) == 2
    assert claim(r, "kept", count=5) == []


@pytest.mark.parametrize("args", [["0", "1"], ["5", "0"], ["5", "-1"], ["5", "x"], ["x", "1"], ["1_0", "1"],
                                  ["5"], ["5", "inf"], ["2147483648", "1"]])
def test_bad_values_are_refused_and_change_nothing(r, queue, args):
    configure(r, queue, "RATE-LIMIT", "7", "2")
    with pytest.raises(Exception) as refused:
        r.execute_command("XCFGSET", queue, "RATE-LIMIT", *args)
    assert refused.type.__name__ == "ResponseError"
    assert shown(r, queue)["rate-limit"] == "7 2"


def test_a_queue_flag_takes_both(ezra_factory):
    r = ezra_factory("--queue", "flagged MAX-IN-FLIGHT 5 RATE-LIMIT 100 60").client(2)
    assert (shown(r, "flagged")["max-in-flight"], shown(r, "flagged")["rate-limit"]) == ("5", "100 60")


def test_a_bad_config_line_stops_the_start_with_a_clear_error(ezra_factory):
    with pytest.raises(AssertionError) as failed:
        ezra_factory("--queue", "q RATE-LIMIT 0 1")
    assert "RATE-LIMIT" in str(failed.value)


def test_the_window_slides_exactly_to_the_ms():
    """The window arithmetic alone (broker/flow.py), on a clock the test moves: 5 per 1000 ms."""
    from ezra.broker.flow import Flow
    flow = Flow(None, 5, 1.0)
    assert flow.room(0, 0) == 5
    assert not flow.handed_out(3, 0) and flow.handed_out(2, 400)  # full at 400 ms
    assert flow.room(0, 999) == 0 and flow.opens_at(999) == 1000  # the first three leave at 1000
    assert flow.room(0, 1000) == 3 and flow.opens_at(1000) is None
    assert flow.handed_out(3, 1000) and flow.room(0, 1399) == 0 and flow.opens_at(1399) == 1400
    assert flow.room(0, 1400) == 2  # 9 handed out by 1400, never more than 5 within 1000 ms
    assert Flow(None, 2, 0.0005).window_ms == 1  # a fraction of a ms counts as a whole one: never shorter
    lowered = Flow(None, 2, 1.0, before=flow)  # new settings keep the hand-outs made
    assert lowered.room(0, 1400) == 0 and lowered.opens_at(1400) == 2000
