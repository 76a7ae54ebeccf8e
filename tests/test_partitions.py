"""XADD PARTITION key and XCFGSET PARTITION-LIMIT n (issue 47 items 4 and 5): at most n tasks of
one partition in flight at once (default 1: a partition's tasks one after another, in push order),
partitions served in turn (one with 10,000 queued does not delay another's first task), tasks
without PARTITION never limited, MAX-IN-FLIGHT on top, a worker blocked while every partition
with work is at its limit served when one of their leases ends. Through the real server, redis-py
in RESP2 and RESP3; the rollback's rebuild in process.

No sleeps: a blocked reader "did not get a task" is checked right after a command that would have
served it returns (a task goes to a blocked reader in the batch that frees it, committed before
that command's reply); its wake-up is polled with a deadline.
"""

from __future__ import annotations

import urllib.request

import pytest

from support_broker import acked, claim_committed, push_one
from support_queue import BlockedReader, blocked, claim, configure, submit_broken_request
from ezra.protocol import stream_ids
from ezra.protocol.task_fields import stored


def push(r, queue, partition=None, name="t", *options):
    extra = () if partition is None else ("PARTITION", partition)
    return r.execute_command("XADD", queue, *extra, *options, "*", "name", name)


def names(entries) -> list:
    return [fields[b"name"].decode() for _, fields in entries]


def take(r, queue, worker="w", count=1) -> list:
    """One claim: the names it got (in id order, as the reply has them)."""
    return names(claim(r, queue, worker=worker, count=count))


def id_of(r, queue, name):
    for task_id, fields in r.xrange(queue):
        if fields[b"name"].decode() == name:
            return task_id
    raise AssertionError(f"no task {name}")


def shown(r, queue) -> dict:
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in r.xinfo_stream(queue).items()}


# ---------------------------------------------------------------- one after another

def test_a_partition_s_tasks_go_one_after_another_while_others_proceed(r, queue):
    for name in ["a1", "a2", "a3"]:
        push(r, queue, "A", name)
    for name in ["b1", "b2"]:
        push(r, queue, "B", name)
    assert take(r, queue, count=10) == ["a1", "b1"]  # one of each: both at the limit, 1
    assert take(r, queue, count=10) == []
    assert r.xack(queue, "g", id_of(r, queue, "a1")) == 1
    assert take(r, queue, count=10) == ["a2"]         # the next only once the previous is acked
    assert r.execute_command("XNACK", queue, "g", "FAIL", "IDS", 1, id_of(r, queue, "b1")) == 1
    assert take(r, queue, count=10) == ["b1"]         # failed: back first in its partition
    assert r.xack(queue, "g", id_of(r, queue, "b1"), id_of(r, queue, "a2")) == 2
    assert sorted(take(r, queue, count=10)) == ["a3", "b2"]


def test_without_partition_the_same_tasks_all_go_at_once(r, queue):
    """The control: the same pushes without PARTITION are not limited."""
    for name in ["a1", "a2", "a3", "b1", "b2"]:
        push(r, queue, None, name)
    assert take(r, queue, count=10) == ["a1", "a2", "a3", "b1", "b2"]


def test_tasks_without_partition_are_not_limited_in_a_queue_with_partitions(r, queue):
    push(r, queue, "A", "a1")
    push(r, queue, "A", "a2")
    for name in ["p1", "p2", "p3"]:
        push(r, queue, None, name)
    assert sorted(take(r, queue, count=10)) == ["a1", "p1", "p2", "p3"]


def test_partition_limit_2_lets_two_of_a_partition_out(r, queue):
    configure(r, queue, "PARTITION-LIMIT", "2")
    for name in ["a1", "a2", "a3", "a4"]:
        push(r, queue, "A", name)
    assert take(r, queue, count=10) == ["a1", "a2"]
    assert take(r, queue, count=10) == []
    assert r.xack(queue, "g", id_of(r, queue, "a2")) == 1
    assert take(r, queue, count=10) == ["a3"]
    configure(r, queue, "PARTITION-LIMIT", "DEFAULT")  # back to 1: two in flight, none more
    assert r.xack(queue, "g", id_of(r, queue, "a1")) == 1
    assert take(r, queue, count=10) == []
    assert r.xack(queue, "g", id_of(r, queue, "a3")) == 1
    assert take(r, queue, count=10) == ["a4"]


def test_max_in_flight_applies_on_top_of_the_partitions(r, queue):
    configure(r, queue, "MAX-IN-FLIGHT", "2")
    for key in "ABC":
        push(r, queue, key, f"{key.lower()}1")
        push(r, queue, key, f"{key.lower()}2")
    assert take(r, queue, count=10) == ["a1", "b1"]  # the cap: 2
    assert take(r, queue, count=10) == []
    assert r.xack(queue, "g", id_of(r, queue, "a1")) == 1
    assert take(r, queue, count=10) == ["c1"]  # C's turn before A comes round again
    assert r.xack(queue, "g", id_of(r, queue, "b1")) == 1
    assert take(r, queue, count=10) == ["a2"]


def test_priorities_come_before_partitions(r, queue):
    push(r, queue, "A", "a-low", "PRIORITY", 7)
    push(r, queue, "B", "b-plain")
    push(r, queue, "A", "a-urgent", "PRIORITY", 0)
    assert take(r, queue) == ["a-urgent"]
    assert take(r, queue) == ["b-plain"]  # A is at its limit: its priority 7 task waits
    assert take(r, queue) == []
    assert r.xack(queue, "g", id_of(r, queue, "a-urgent")) == 1
    assert take(r, queue) == ["a-low"]


# ---------------------------------------------------------------- blocked workers

@pytest.mark.parametrize("end", ["ack", "nack", "expiry", "xackdel"])
def test_a_worker_blocked_at_the_partition_limit_is_served_when_its_lease_ends(shared_server, protocol, queue, end):
    r = shared_server.client(protocol)
    if end == "expiry":
        configure(r, queue, "VISIBILITY-TIMEOUT", "0.3")
    push(r, queue, "A", "a1")
    push(r, queue, "A", "a2")
    assert take(r, queue, worker="busy") == ["a1"]
    reader = BlockedReader(shared_server, protocol, queue).start(r)
    push(r, queue, "A", "a3")  # more work, same partition: the reader still waits
    assert not reader.done.is_set() and blocked(r) >= 1
    held = id_of(r, queue, "a1")
    if end == "ack":
        assert r.xack(queue, "g", held) == 1
    elif end == "nack":
        assert r.execute_command("XNACK", queue, "g", "FAIL", "IDS", 1, held) == 1
    elif end == "xackdel":
        r.execute_command("XACKDEL", queue, "g", "IDS", 1, held)
    got = reader.ids()
    assert got == [held if end in ("nack", "expiry") else id_of(r, queue, "a2")]
    r.close()


def test_a_push_to_another_partition_serves_the_blocked_worker(shared_server, protocol, queue):
    r = shared_server.client(protocol)
    push(r, queue, "A", "a1")
    push(r, queue, "A", "a2")
    assert take(r, queue, worker="busy") == ["a1"]
    reader = BlockedReader(shared_server, protocol, queue).start(r)
    b1 = push(r, queue, "B", "b1")
    assert reader.ids() == [b1]
    r.close()


# ---------------------------------------------------------------- fairness

def push_many(r, queue, key, count, prefix):
    pipe = r.pipeline(transaction=False)
    for i in range(count):
        if key is None:
            pipe.execute_command("XADD", queue, "*", "name", f"{prefix}{i}")
        else:
            pipe.execute_command("XADD", queue, "PARTITION", key, "*", "name", f"{prefix}{i}")
    pipe.execute()


def first_claims(r, queue, n) -> list:
    """The names of the first n tasks handed out, one claim of COUNT 1 and its ack each."""
    got = []
    for _ in range(n):
        [(task_id, fields)] = claim(r, queue, count=1)
        got.append(fields[b"name"].decode())
        r.xack(queue, "g", task_id)
    return got


@pytest.mark.parametrize("partitioned", [True, False], ids=["partitions", "control"])
def test_one_partition_with_10000_queued_does_not_delay_fifty_others(shared_server, protocol, queue, partitioned):
    r = shared_server.client(protocol)
    push_many(r, queue, "big" if partitioned else None, 10_000, "big")
    for p in range(50):
        push_many(r, queue, f"p{p}" if partitioned else None, 10, f"p{p}-")
    got = first_claims(r, queue, 100)
    firsts = {f"p{p}-0" for p in range(50)}
    if partitioned:
        assert firsts <= set(got), f"missing among the first 100: {sorted(firsts - set(got))[:5]}"
        assert got.index(max(firsts, key=got.index)) < 52  # round-robin: the last of them by claim 51
    else:
        assert not firsts & set(got)  # pushed after the 10,000, without PARTITION: none of them
    r.close()


# ---------------------------------------------------------------- the setting

def test_xinfo_stream_shows_partition_limit_where_set(r, queue):
    push(r, queue, "A", "a1")
    assert "partition-limit" not in shown(r, queue)
    configure(r, queue, "PARTITION-LIMIT", "3")
    assert shown(r, queue)["partition-limit"] in (b"3", "3")


@pytest.mark.parametrize("value", ["0", "-1", "x", "1.5", "2147483648"])
def test_a_bad_partition_limit_is_refused_and_changes_nothing(r, queue, value):
    configure(r, queue, "PARTITION-LIMIT", "2")
    with pytest.raises(Exception) as refused:
        r.execute_command("XCFGSET", queue, "PARTITION-LIMIT", value)
    assert "PARTITION-LIMIT" in str(refused.value) or "integer" in str(refused.value)
    assert shown(r, queue)["partition-limit"] in (b"2", "2")


@pytest.mark.parametrize("stop", ["restart", "kill9"])
def test_partitions_and_their_limit_hold_across_a_restart(ezra_factory, protocol, stop):
    server = ezra_factory("--queue", "conf PARTITION-LIMIT 2")
    r = server.client(protocol)
    configure(r, "jobs", "PARTITION-LIMIT", "2")
    for name in ["a1", "a2", "a3"]:
        push(r, "jobs", "A", name)
    push(r, "jobs", "B", "b1")
    assert take(r, "jobs", count=1) == ["a1"]  # in flight at the stop: available again, first of A
    server.restart() if stop == "restart" else (server.kill9(), server.start())
    r = server.client(protocol)
    assert shown(r, "jobs")["partition-limit"] in (b"2", "2")
    assert sorted(take(r, "jobs", count=10)) == ["a1", "a2", "b1"]
    assert take(r, "jobs", count=10) == []
    push(r, "conf", "C", "c1")
    push(r, "conf", "C", "c2")
    push(r, "conf", "C", "c3")
    assert take(r, "conf", count=10) == ["c1", "c2"]  # the config file's --queue line
    r.close()


def test_a_rollback_rebuilds_the_lanes_and_what_they_hold(clocked_broker):
    broker = clocked_broker
    pushed = [stream_ids.parse_id(push_one(broker, b"q", stored([b"n", str(i).encode()]), partition=b"A"))
              for i in range(3)]
    first = claim_committed(broker, [b"q"], b"w", 10)
    assert [row[:2] for row in first[b"q"]] == [pushed[0]]
    submit_broken_request(broker)  # the batch rolls back: the queues are read again from the file
    assert claim_committed(broker, [b"q"], b"w", 10) is None  # A's one task in flight still counts
    assert acked(broker, b"q", [pushed[0]]) == 1
    assert [row[:2] for row in claim_committed(broker, [b"q"], b"w", 10)[b"q"]] == [pushed[1]]


# ---------------------------------------------------------------- ways out of available other than a claim

def test_a_task_taken_by_xclaim_force_or_cancelled_by_xdel_is_stepped_over(r, queue):
    a1 = push(r, queue, "A", "a1")
    push(r, queue, "A", "a2")
    b1 = push(r, queue, "B", "b1")
    push(r, queue, "B", "b2")
    assert take(r, queue, count=1) == ["a1"]  # the lanes are built (a claim read them)
    assert r.xack(queue, "g", a1) == 1
    a3 = push(r, queue, "A", "a3")
    assert r.execute_command("XCLAIM", queue, "g", "other", 0, a3, "FORCE")  # A's in flight: a3
    assert r.xdel(queue, b1) == 1                                            # cancelled: gone
    assert take(r, queue, count=10) == ["b2"]  # A has one in flight (a3); B's b1 is gone
    assert r.xack(queue, "g", a3) == 1
    assert take(r, queue, count=10) == ["a2"]  # a3's entry in A's lane is stepped over
    assert take(r, queue, count=10) == []


def test_xdel_takes_tasks_out_of_their_own_lanes_at_every_priority(ezra_factory, protocol):
    """Deleted available tasks leave their lane (priority and partition as stored, text or not):
    a lane they emptied no longer counts as a partition with work; the rest keep their order."""
    server = ezra_factory()
    r = server.client(protocol)
    x = push(r, "jobs", "X", "x", "PRIORITY", 0)
    a1 = push(r, "jobs", "A", "a1", "PRIORITY", 1)
    b1 = push(r, "jobs", b"\xffB", "b1", "PRIORITY", 3)
    push(r, "jobs", b"\xffB", "b2", "PRIORITY", 3)
    p1 = push(r, "jobs", None, "p1", "PRIORITY", 2)
    push(r, "jobs", None, "p2")
    assert take(r, "jobs", count=1) == ["x"]  # the lanes are built (a claim read them)
    assert r.xack("jobs", "g", x) == 1
    assert r.info("queues")["queue_jobs"]["partitions"] == 2  # the control: A and B have work
    assert r.xdel("jobs", a1, b1, p1) == 3
    assert r.info("queues")["queue_jobs"]["partitions"] == 1  # B, with b2; A's lane is empty
    assert take(r, "jobs", count=10) == ["b2", "p2"]


def test_info_metrics_and_the_dashboard_count_the_partitions_with_work(ezra_factory):
    server = ezra_factory("--http-port", "0")
    r = server.client(2)
    for partition in ("a", "a", "b", "c"):
        push(r, "tenants", partition)
    push(r, "plain")  # the control: a queue with no partition shows no such figure
    take(r, "tenants", count=10)  # a1, b1, c1: a still has work, b and c have none
    info = r.info("queues")
    assert info["queue_tenants"]["partitions"] == 1 and "partitions" not in info["queue_plain"]
    with urllib.request.urlopen(server.http_url + "/metrics", timeout=10) as reply:
        body = reply.read().decode()
    assert 'ezra_queue_partitions_with_work{queue="tenants"} 1.0' in body
    assert 'ezra_queue_partitions_with_work{queue="plain"}' not in body
    with urllib.request.urlopen(server.http_url + "/queue?name=tenants", timeout=10) as reply:
        assert "1 partition with work" in reply.read().decode()


# ---------------------------------------------------------------- against a model

def test_random_pushes_claims_acks_nacks_and_rollbacks_keep_the_order_s_promises(clocked_broker):
    """A seeded random run in process, checked at every claim against a model of the queue: the
    claim takes a task iff one may go (its partition below the limit), of the most urgent such
    priority, the oldest of its partition at that priority; no partition is ever over the limit."""
    import random
    broker, rng = clocked_broker, random.Random(47)
    broker.admin.configure(b"q", {"max_attempts": 1000, "partition_limit": 2}).wait()
    available, flying = {}, {}  # id -> (priority, partition)
    seen = {"claimed": 0, "held back": 0, "rollbacks": 0}
    for step in range(1500):
        action = rng.random()
        if action < 0.4:
            priority, partition = rng.choice([None, 0, 3, 5, 9]), rng.choice([None, b"a", b"b", b"c", b"d"])
            options = {k: v for k, v in (("priority", priority), ("partition", partition)) if v is not None}
            task_id = stream_ids.parse_id(push_one(broker, b"q", stored([b"n", b"%d" % step]), **options))
            available[task_id] = (5 if priority is None else priority, partition)
        elif action < 0.75:
            in_flight = {}
            for _, partition in flying.values():
                in_flight[partition] = in_flight.get(partition, 0) + 1
            may = {task_id: place for task_id, place in available.items()
                   if place[1] is None or in_flight.get(place[1], 0) < 2}
            got = claim_committed(broker, [b"q"], b"w", 1)
            if not may:
                assert got is None, f"step {step}: claimed {got} while every partition with work is full"
                seen["held back"] += bool(available)
                continue
            assert got is not None, f"step {step}: nothing claimed while {sorted(may)} may go"
            [row] = got[b"q"]
            task_id = row[:2]
            priority, partition = available.pop(task_id)
            assert priority == min(place[0] for place in may.values()), f"step {step}: not the most urgent"
            assert task_id == min(i for i, place in may.items() if place == (priority, partition)), \
                f"step {step}: not the oldest of its partition"
            flying[task_id] = (priority, partition)
            seen["claimed"] += 1
        elif action < 0.85 and flying:
            task_id = rng.choice(sorted(flying))
            assert acked(broker, b"q", [task_id]) == 1
            del flying[task_id]
        elif action < 0.95 and flying:
            task_id = rng.choice(sorted(flying))
            assert broker.tasks.fail(b"q", [task_id]).wait() == 1
            available[task_id] = flying.pop(task_id)
        elif action >= 0.95:
            submit_broken_request(broker)  # a rollback: the lanes are read again from the file
            seen["rollbacks"] += 1
    assert seen["claimed"] > 250 and seen["held back"] > 100 and seen["rollbacks"] > 30, seen  # the run meant something
