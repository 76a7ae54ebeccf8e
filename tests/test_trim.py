"""Trimming and XGROUP DESTROY through the front door (redis-py, RESP2 and RESP3).

Approximate trimming (`XADD ... MAXLEN|MINID ~ ...`, `XTRIM ... ~`) removes done tasks only,
lowest ids first, never an available, delayed, in-flight or dead one; exact forms are refused
the same way by XADD and XTRIM; syntax errors are Redis 7's, compared with a real redis-server.
XGROUP DESTROY answers 1 for the group XGROUP CREATE named, 0 otherwise, and drops no task.
"""

from __future__ import annotations

import pytest
import redis

from ezra.errors import EXACT_TRIM_REFUSED
from ezra.settings.trimming import DEFAULT_LIMIT
from support_queue import queue_figures

EXACT = EXACT_TRIM_REFUSED.message[len("ERR "):]  # redis-py drops the prefix


def entry_ids(r, queue: str) -> list[str]:
    """The queue's entries as XRANGE shows them (available, delayed, in flight, done)."""
    return [task_id.decode() for task_id, _ in r.xrange(queue)]


def claim(r, queue: str, count: int, worker: str = "w1", noack: bool = False) -> list[str]:
    reply = r.xreadgroup("g", worker, {queue: ">"}, count=count, noack=noack)
    if isinstance(reply, dict):  # RESP3: {queue: [entries]}
        entries = reply[queue.encode()][0] if reply else []
    else:
        entries = reply[0][1] if reply else []
    return [task_id.decode() for task_id, _ in entries]


def push(r, queue: str, n: int, start: int = 0) -> list[str]:
    return [r.xadd(queue, {"n": str(start + i)}).decode() for i in range(n)]


def error_of(client, *command) -> str:
    with pytest.raises(redis.ResponseError) as failure:
        client.execute_command(*command)
    return str(failure.value)


def queue_counts(r, queue: str) -> dict:
    """INFO's counts of one queue (the broker's own figures)."""
    return queue_figures(r, queue)


# ------------------------------------------------------------------ approximate trimming

def test_maxlen_approx_removes_done_tasks_oldest_first(r, queue):
    ids = push(r, queue, 6)
    assert claim(r, queue, 4) == ids[:4]
    assert r.xack(queue, "g", ids[0], ids[1], ids[3]) == 3  # ids[2] stays in flight
    # one at a time (LIMIT 1): the lowest id that is done goes first
    assert r.execute_command("XTRIM", queue, "MAXLEN", "~", "0", "LIMIT", "1") == 1
    assert entry_ids(r, queue) == ids[1:]
    new = r.execute_command("XADD", queue, "MAXLEN", "~", "3", "*", "n", "new").decode()
    # 6 entries with the new one, 2 of them done: both go, and only they (3 is the floor, not a goal)
    assert entry_ids(r, queue) == [ids[2], ids[4], ids[5], new]
    assert r.xlen(queue) == 4 and r.xpending(queue, "g")["pending"] == 1
    assert r.xack(queue, "g", ids[2]) == 1, "the in-flight task was kept and can still be acked"


def test_maxlen_counts_the_entries_xrange_shows_and_stops_at_the_threshold(r, queue):
    ids = push(r, queue, 5)
    assert claim(r, queue, 5, noack=True) == ids  # NOACK: done at once
    assert r.execute_command("XADD", queue, "MAXLEN", "~", "3", "*", "n", "5")
    assert len(entry_ids(r, queue)) == 3, "6 entries, 3 go: the oldest done ones"
    assert entry_ids(r, queue)[:2] == ids[3:]
    assert r.execute_command("XTRIM", queue, "MAXLEN", "~", "3") == 0, "3 entries: nothing to do"
    assert r.execute_command("XTRIM", queue, "MAXLEN", "~", "1") == 2
    assert r.xlen(queue) == 1 and len(entry_ids(r, queue)) == 1


def test_trimming_never_touches_available_delayed_in_flight_or_dead_tasks(r, queue):
    dead = push(r, queue, 1)
    assert claim(r, queue, 1) == dead
    assert r.execute_command("XNACK", queue, "g", "FATAL", "IDS", "1", dead[0]) == 1
    in_flight = push(r, queue, 2)
    assert claim(r, queue, 2) == in_flight
    delayed = r.execute_command("XADD", queue, "DELAY", "3600", "*", "n", "later").decode()
    available = push(r, queue, 2)
    unfinished = in_flight + [delayed] + available
    far = "99999999999999-0"
    assert r.execute_command("XTRIM", queue, "MAXLEN", "~", "0") == 0
    assert r.execute_command("XTRIM", queue, "MINID", "~", far) == 0
    pushed = r.execute_command("XADD", queue, "MAXLEN", "~", "0", "*", "n", "more").decode()
    pushed2 = r.execute_command("XADD", queue, "MINID", "~", far, "*", "n", "more").decode()
    assert entry_ids(r, queue) == unfinished + [pushed, pushed2]
    assert [i.decode() for i, _ in r.xrange(queue + "::dead")] == dead
    assert r.xlen(queue) == 7 and r.xpending(queue, "g")["pending"] == 2
    # once one is acked, it is the only one trimming may take
    assert r.xack(queue, "g", in_flight[0]) == 1
    assert r.execute_command("XTRIM", queue, "MAXLEN", "~", "0") == 1
    assert entry_ids(r, queue) == unfinished[1:] + [pushed, pushed2]
    assert [i.decode() for i, _ in r.xrange(queue + "::dead")] == dead


def test_the_dead_view_is_never_trimmed(r, queue):
    [dead] = push(r, queue, 1)
    claim(r, queue, 1)
    r.execute_command("XNACK", queue, "g", "FATAL", "IDS", "1", dead)
    assert "read-only dead-letter view" in error_of(r, "XTRIM", queue + "::dead", "MAXLEN", "~", "0")
    # XADD on the dead view pushes a dead task (ezra import); trimming options are refused there.
    assert "do not apply to a dead task" in error_of(r, "XADD", queue + "::dead", "MAXLEN", "~", "0", "*", "n", "1")
    assert r.xlen(queue + "::dead") == 1


def test_xtrim_counts_what_it_removed_and_limit_caps_it(r, queue):
    ids = push(r, queue, 10)
    claim(r, queue, 10)
    assert r.xack(queue, "g", *ids) == 10
    purged_before = r.info("stats")["tasks_purged"]
    assert r.execute_command("XTRIM", queue, "MAXLEN", "~", "7", "LIMIT", "2") == 2
    assert r.execute_command("XTRIM", queue, "MAXLEN", "~", "7") == 1
    assert r.execute_command("XTRIM", queue, "MAXLEN", "~", "7") == 0
    assert entry_ids(r, queue) == ids[3:]
    assert r.execute_command("XTRIM", queue, "MAXLEN", "~", "0", "LIMIT", "0") == 7  # 0: EZRA's cap
    assert r.xrange(queue) == [] and r.xlen(queue) == 0
    # the figures follow: counts by state, purges, XINFO's added / deleted ids
    assert queue_counts(r, queue)["done"] == 0
    assert r.info("stats")["tasks_purged"] - purged_before >= 10
    info = r.xinfo_stream(queue)
    assert info["entries-added"] == 10 and info["max-deleted-entry-id"] == ids[-1].encode()
    assert r.execute_command("XTRIM", queue + "-missing", "MAXLEN", "~", "0") == 0
    assert r.exists(queue + "-missing") == 0, "XTRIM does not make a queue"


def test_minid_removes_done_tasks_below_the_id(r, queue):
    for task_id in ("1-1", "1-2", "1-3", "1-4", "2-1"):
        r.xadd(queue, {"n": task_id}, id=task_id)
    assert claim(r, queue, 5) == ["1-1", "1-2", "1-3", "1-4", "2-1"]
    assert r.xack(queue, "g", "1-1", "1-2", "1-4", "2-1") == 4  # 1-3 stays in flight
    assert r.execute_command("XTRIM", queue, "MINID", "~", "1-2", "LIMIT", "5") == 1  # below 1-2: 1-1
    assert r.execute_command("XTRIM", queue, "MINID", "~", "2") == 2  # "2" is 2-0: 1-2 and 1-4
    assert entry_ids(r, queue) == ["1-3", "2-1"]
    assert r.execute_command("XADD", queue, "MINID", "~", "3", "3-1", "n", "3-1") == b"3-1"
    assert entry_ids(r, queue) == ["1-3", "3-1"], "the done 2-1 went; the in-flight 1-3 stayed"
    assert r.xack(queue, "g", "1-3") == 1
    assert r.execute_command("XTRIM", queue, "MINID", "~", "1-3") == 0, "below, not at"
    assert r.execute_command("XTRIM", queue, "MINID", "~", "18446744073709551615-18446744073709551615") == 1
    assert entry_ids(r, queue) == ["3-1"]


def test_maxlen_waits_for_a_tenth_of_n_over_then_trims_to_n(r, queue):
    """Approximate, as Redis's nodes of 100 entries: a queue up to n + n/10 (at most n + 100) over
    MAXLEN ~ n is left alone; past that, one trim takes it back to n."""
    push(r, queue, 108)
    assert len(claim(r, queue, 108, noack=True)) == 108
    assert r.execute_command("XTRIM", queue, "MAXLEN", "~", "100") == 0  # 8 over: within the tenth
    r.execute_command("XADD", queue, "MAXLEN", "~", "100", "*", "n", "a")
    r.execute_command("XADD", queue, "MAXLEN", "~", "100", "*", "n", "b")
    assert len(entry_ids(r, queue)) == 110
    r.execute_command("XADD", queue, "MAXLEN", "~", "100", "*", "n", "c")  # 111: trimmed to 100
    assert len(entry_ids(r, queue)) == 100 and r.xlen(queue) == 3
    assert r.execute_command("XTRIM", queue, "MAXLEN", "~", "50") == 50


def test_tasks_done_late_below_earlier_trims_are_trimmed_too(r, queue):
    """A trim scans from where the last one stopped; an ack or a NOACK claim of an older task
    (a slow worker, a requeued dead task) must make it look lower again."""
    for task_id in ("1-1", "1-2", "1-3", "1-4"):
        r.xadd(queue, {"n": task_id}, id=task_id)
    claim(r, queue, 4)
    r.execute_command("XNACK", queue, "g", "FATAL", "IDS", "1", "1-1")
    assert r.xack(queue, "g", "1-3", "1-4") == 2
    assert r.execute_command("XTRIM", queue, "MINID", "~", "2") == 2
    assert r.xack(queue, "g", "1-2") == 1  # a slow worker, below the last trim
    assert r.execute_command("XTRIM", queue, "MINID", "~", "2") == 1
    assert r.execute_command("XREQUEUE", queue, "IDS", "1", "1-1") == 1
    assert claim(r, queue, 1, noack=True) == ["1-1"]  # done at once, below every trim so far
    assert r.execute_command("XTRIM", queue, "MAXLEN", "~", "0") == 1
    assert r.xrange(queue) == [] and queue_counts(r, queue)["done"] == 0


def test_trimming_is_in_the_push_and_nomkstream_makes_nothing(r, queue):
    assert r.execute_command("XADD", queue, "NOMKSTREAM", "MAXLEN", "~", "0", "*", "n", "1") is None
    assert r.exists(queue) == 0
    ids = push(r, queue, 3)
    claim(r, queue, 3)
    r.xack(queue, "g", *ids)
    # options in any order, any case, as Redis takes them
    new = r.execute_command("XADD", queue, "LIMIT", "2", "maxlen", "~", "0", "TTL", "60", "*", "n", "x")
    assert entry_ids(r, queue) == [ids[2], new.decode()]


def test_one_trim_removes_at_most_the_default_limit(r, queue):
    pipe = r.pipeline(transaction=False)
    for i in range(DEFAULT_LIMIT + 200):
        pipe.xadd(queue, {"n": str(i)})
    pipe.execute()
    assert len(claim(r, queue, DEFAULT_LIMIT + 200, noack=True)) == DEFAULT_LIMIT + 200
    assert r.execute_command("XTRIM", queue, "MAXLEN", "~", "0") == DEFAULT_LIMIT
    assert r.execute_command("XTRIM", queue, "MAXLEN", "~", "0") == 200


def test_trimmed_ids_are_never_handed_out_again(ezra_factory):
    server = ezra_factory()
    client = server.client()
    ids = push(client, "jobs", 3)
    claim(client, "jobs", 3, noack=True)
    assert client.execute_command("XTRIM", "jobs", "MAXLEN", "~", "0") == 3  # the newest task went too
    client.close()
    server.stop()
    server.restart()
    client = server.client()
    assert client.xrange("jobs") == []
    assert client.xadd("jobs", {"n": "after"}, id="*").decode() > ids[-1]
    assert client.xinfo_stream("jobs")["last-generated-id"].decode() > ids[-1]
    client.close()


# ------------------------------------------------------------------ exact forms: one refusal

@pytest.mark.parametrize("form", [["MAXLEN", "2"], ["MAXLEN", "=", "2"], ["MINID", "1-2"], ["MINID", "=", "1-2"]],
                         ids=["maxlen", "maxlen=", "minid", "minid="])
def test_exact_forms_are_refused_alike_and_change_nothing(r, queue, form):
    ids = [r.xadd(queue, {"n": str(i)}, id=f"1-{i}").decode() for i in (1, 2, 3)]
    claim(r, queue, 3, noack=True)  # all done: even then, nothing is trimmed exactly
    assert error_of(r, "XADD", queue, *form, "*", "n", "x") == EXACT
    assert error_of(r, "XTRIM", queue, *form) == EXACT
    assert error_of(r, "XTRIM", queue + "-missing", *form) == EXACT
    assert entry_ids(r, queue) == ids and r.xlen(queue) == 0


# ------------------------------------------------------------------ syntax: Redis 7's own errors

REDIS_ERRORS = [  # each fails on redis-server too: EZRA must answer the same text
    ["XADD", "{q}", "MAXLEN", "-1", "*", "f", "v"],
    ["XADD", "{q}", "MAXLEN", "~", "-1", "*", "f", "v"],
    ["XADD", "{q}", "MAXLEN", "abc", "*", "f", "v"],
    ["XADD", "{q}", "MAXLEN", "1_0", "*", "f", "v"],
    ["XADD", "{q}", "MAXLEN", "18446744073709551616", "*", "f", "v"],
    ["XADD", "{q}", "MAXLEN", "~", "*", "f", "v"],
    ["XADD", "{q}", "MINID", "~", "abc", "*", "f", "v"],
    ["XADD", "{q}", "MINID", "~", "-", "*", "f", "v"],
    ["XADD", "{q}", "MINID", "~", "5-*", "*", "f", "v"],
    ["XADD", "{q}", "MINID", "~", "18446744073709551616", "*", "f", "v"],
    ["XADD", "{q}", "MAXLEN", "~", "5", "MINID", "~", "5", "*", "f", "v"],
    ["XADD", "{q}", "MAXLEN", "~", "5", "MAXLEN", "~", "6", "*", "f", "v"],
    ["XADD", "{q}", "LIMIT", "10", "*", "f", "v"],
    ["XADD", "{q}", "LIMIT", "0", "*", "f", "v"],
    ["XADD", "{q}", "MAXLEN", "5", "LIMIT", "10", "*", "f", "v"],
    ["XADD", "{q}", "MAXLEN", "=", "5", "LIMIT", "10", "*", "f", "v"],
    ["XADD", "{q}", "MAXLEN", "~", "5", "LIMIT", "-1", "*", "f", "v"],
    ["XADD", "{q}", "MAXLEN", "~", "5", "LIMIT", "abc", "*", "f", "v"],
    ["XADD", "{q}", "LIMIT", "5", "bad", "f", "v"],
    ["XADD", "{q}", "MAXLEN", "~", "5", "*", "f"],
    ["XADD", "{q}", "LIMIT", "5", "*", "f"],
    ["XADD", "{q}", "MAXLEN", "~", "5", "LIMIT", "5", "0-0", "f", "v"],
    ["XADD", "{q}", "MAXLEN", "~", "5", "foo", "f", "v"],
    ["XTRIM", "{q}"],
    ["XTRIM", "{q}", "MAXLEN"],
    ["XTRIM", "{q}", "MAXLEN", "~"],
    ["XTRIM", "{q}", "MAXLEN", "~", "5", "LIMIT"],
    ["XTRIM", "{q}", "FOO", "5"],
    ["XTRIM", "{q}", "MAXLEN", "~", "5", "FOO"],
    ["XTRIM", "{q}", "MAXLEN", "~", "5", "5"],
    ["XTRIM", "{q}", "NOMKSTREAM", "MAXLEN", "~", "5"],
    ["XTRIM", "{q}", "LIMIT", "10"],
    ["XTRIM", "{q}", "LIMIT", "0"],
    ["XTRIM", "{q}", "MAXLEN", "5", "LIMIT", "10"],
    ["XTRIM", "{q}", "MAXLEN", "-5"],
    ["XTRIM", "{q}", "MAXLEN", "~", "-5"],
    ["XTRIM", "{q}", "MINID", "abc"],
    ["XTRIM", "{q}", "MINID", "~", "+"],
    ["XTRIM", "{q}", "MAXLEN", "~", "5", "MINID", "~", "3"],
    ["XTRIM", "{q}", "MAXLEN", "~", "5", "LIMIT", "-1"],
    ["XGROUP", "DESTROY", "{q}"],
    ["XGROUP", "DESTROY", "{q}", "g", "extra"],
    ["XGROUP", "DESTROY", "{q}-missing", "g"],
]

REDIS_ACCEPTS = [  # approximate forms redis-server takes: EZRA takes them too, with the same reply type
    ["XADD", "{q}", "MAXLEN", "~", "5", "*", "f", "v"],
    ["XADD", "{q}", "maxlen", "~", "5", "limit", "10", "*", "f", "v"],
    ["XADD", "{q}", "LIMIT", "10", "MAXLEN", "~", "5", "*", "f", "v"],
    ["XADD", "{q}", "MAXLEN", "~", "5", "LIMIT", "0", "*", "f", "v"],
    ["XADD", "{q}", "MAXLEN", "~", "1", "LIMIT", "10", "LIMIT", "20", "*", "f", "v"],
    ["XADD", "{q}", "MAXLEN", "~", "5", "NOMKSTREAM", "*", "f", "v"],
    ["XADD", "{q}", "MINID", "~", "5", "*", "f", "v"],
    ["XADD", "{q}", "MAXLEN", "~", "9223372036854775807", "*", "f", "v"],
    ["XADD", "{q}", "*", "MAXLEN", "5"],  # after the id: fields
    ["XTRIM", "{q}", "MAXLEN", "~", "5"],
    ["XTRIM", "{q}", "LIMIT", "0", "MAXLEN", "~", "1"],
    ["XTRIM", "{q}", "minid", "~", "18446744073709551615", "limit", "3"],
]


def run(client, command: list[str], queue: str):
    try:
        return client.execute_command(*(arg.replace("{q}", queue) for arg in command))
    except redis.ResponseError as error:
        return error


@pytest.fixture
def both(shared_server, redis_server_port):
    """EZRA and redis-server, through redis-py's RESP2 without reply callbacks."""
    clients = [redis.Redis(port=shared_server.port), redis.Redis(port=redis_server_port)]
    yield clients
    for client in clients:
        client.close()


def test_syntax_errors_are_redis_7s(both, queue):
    ezra, real = both
    for command in REDIS_ERRORS:
        for client in both:
            run(client, ["XADD", "{q}", "1-1", "f", "v"], queue)  # the key exists on both
        expected = run(real, command, queue)
        assert isinstance(expected, redis.ResponseError), (command, expected)
        got = run(ezra, command, queue)
        assert isinstance(got, redis.ResponseError) and str(got) == str(expected), (command, got, expected)


def test_approximate_forms_that_redis_takes_are_taken(both, queue):
    ezra, real = both
    for command in REDIS_ACCEPTS:
        expected, got = run(real, command, queue), run(ezra, command, queue)
        assert not isinstance(expected, Exception), (command, expected)
        assert type(got) is type(expected), (command, got, expected)


# ------------------------------------------------------------------ XGROUP DESTROY

def test_xgroup_destroy_answers_1_for_the_created_group_and_drops_no_task(r, queue):
    r.xgroup_create(queue, "g", id="0", mkstream=True)
    ids = push(r, queue, 3)
    assert claim(r, queue, 1) == ids[:1]
    assert r.xgroup_destroy(queue, "other") == 0
    assert r.xgroup_destroy(queue, "g") == 1
    assert r.xgroup_destroy(queue, "g") == 0, "destroyed already"
    # the tasks are as they were: the in-flight one can be acked, the others claimed
    assert r.xlen(queue) == 3 and r.xpending(queue, "g")["pending"] == 1
    assert r.xack(queue, "g", ids[0]) == 1
    assert claim(r, queue, 10, worker="w2") == ids[1:]
    r.xgroup_create(queue, "g2", id="0")
    assert r.xinfo_groups(queue)[0]["name"] == b"g2"
    assert r.xgroup_destroy(queue, "g2") == 1


def test_xgroup_destroy_answers_as_redis(both, queue):
    for client in both:
        client.xadd(queue, {"n": "1"})
    steps = [["XGROUP", "DESTROY", "{q}", "g"], ["XGROUP", "CREATE", "{q}", "g", "0"],
             ["XGROUP", "DESTROY", "{q}", "g"], ["XGROUP", "DESTROY", "{q}", "g"]]
    assert [run(both[0], step, queue) for step in steps] == [run(both[1], step, queue) for step in steps] \
        == [0, b"OK", 1, 0]


def test_walrus_destroy_reports_true(shared_server, queue):
    walrus = pytest.importorskip("walrus")
    db = walrus.Database(port=shared_server.port)
    group = db.consumer_group("workers", [queue])
    assert group.create(ensure_keys_exist=False, mkstream=True) == {queue: True}
    assert group.destroy() == {queue: True}
    db.close()


@pytest.mark.parametrize("policy", ["KEEPREF", "DELREF", "ACKED"])
def test_xtrim_takes_the_reference_policies_as_xadd_does(r, queue, policy):
    """Issue 45 item 12: redis-py 8's xtrim(ref_policy=...) sends Redis 8.2's KEEPREF | DELREF |
    ACKED after the threshold; EZRA trims only done tasks, which is what each of them leaves."""
    ids = push(r, queue, 4)
    assert claim(r, queue, 3) == ids[:3]
    assert r.xack(queue, "g", *ids[:2]) == 2
    assert r.xtrim(queue, maxlen=0, approximate=True, ref_policy=policy) == 2  # the two done ones
    assert entry_ids(r, queue) == ids[2:]  # the in-flight and the available one stay
    ids += push(r, queue, 1)
    assert r.xack(queue, "g", ids[2]) == 1
    assert r.execute_command("XTRIM", queue, "MINID", "~", ids[4], policy, "LIMIT", 10) == 1  # any order
    assert entry_ids(r, queue) == ids[3:]
    assert r.xlen(queue) == 2
    with pytest.raises(redis.ResponseError, match="XTRIM must be called with a trimming strategy"):
        r.execute_command("XTRIM", queue, policy, policy)  # a policy alone trims nothing: Redis's error
    assert entry_ids(r, queue) == ids[3:]
