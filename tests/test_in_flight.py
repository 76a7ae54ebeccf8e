"""The tasks in flight kept in memory (ezra/broker/in_flight.py; schema 12 dropped their index).

The leases must say what the file says after every move in or out of in_flight, and after a
rolled-back batch; the reads that the index served (XPENDING, XAUTOCLAIM, XREADGROUP CLAIM and
id 0, XINFO, expiry, release) answer from them, in id order, whatever the done tasks around
them; a start without recovery reads them from the file; the expiry heap stays bounded.
"""

from __future__ import annotations

import sqlite3

import pytest

from ezra import errors, lifecycle
from ezra.broker import Broker
from ezra.broker.in_flight import COMPACT_MIN, HORIZON_MS, InFlight, QueueLeases
from ezra.broker.queues import Defaults, Queues
from ezra.config import Settings
from ezra.lifecycle import AVAILABLE, IN_FLIGHT
from ezra.storage import done_counts, name_bytes, open_database
from ezra.protocol.task_fields import stored
from support_queue import Clock, claim as claim_by_client, submit_broken_request
from support_broker import acked, claim_committed, push_one
from ezra.broker.waiters import Claim

Q = b"q"


def push(broker, n: int = 1, queue: bytes = Q) -> list[tuple]:
    return [tuple(map(int, push_one(broker, queue, stored([b"n", b"%d" % i])).split(b"-")))
            for i in range(n)]


def claim(broker, worker: bytes = b"w1", count: int = 1, queue: bytes = Q, **kwargs) -> list[tuple]:
    found = claim_committed(broker, [queue], worker, count, False, **kwargs) or {}
    return [row[:2] for row in found.get(queue, [])]


def file_leases(broker) -> dict:
    """{(queue, task id): lease} as the file has its tasks in flight."""
    rows = broker.writer.call(broker.db.in_flight_tasks, durable=False)
    return {(name_bytes(name), (ms, seq)): (rowid, name_bytes(worker), deadline, delivered_at, attempts)
            for name, ms, seq, rowid, worker, deadline, delivered_at, attempts in rows}


def memory_leases(broker) -> dict:
    return {(name, task_id): lease for name, queue in broker.queues.items()
            for task_id, lease in queue.leases.items()}


def assert_mirrors_the_file(broker, after: str = "") -> None:
    assert memory_leases(broker) == file_leases(broker), after
    for queue in broker.queues.values():
        assert queue.counts[IN_FLIGHT] == len(queue.leases), (after, queue.name)


# ---------------------------------------------------------------- every move in and out of in_flight

def test_the_leases_say_what_the_file_says_after_every_move(clocked_broker):
    broker, clock = clocked_broker, clocked_broker.clock_
    ids = push(broker, 40)
    checks = [
        ("claim COUNT 1", lambda: claim(broker, b"w1")),
        ("claim COUNT 5", lambda: claim(broker, b"w2", 5)),
        ("claim COUNT 5, another worker", lambda: claim(broker, b"w3", 5)),
        ("claim own (id 0), a delivery counted", lambda: broker.claims.claim_own(Q, b"w2", (0, 0), None).wait()),
        ("ack one", lambda: broker.tasks.ack(Q, [ids[0]]).wait()),
        ("ack many, one repeated, one stale", lambda: broker.tasks.ack(Q, [ids[1], ids[2], ids[1], ids[30]]).wait()),
        ("a run of pipelined acks", lambda: broker.tasks.ack(Q, [ids[3], ids[3], ids[4]]).wait()),
        ("nack (FAIL)", lambda: broker.tasks.fail(Q, [ids[5]]).wait()),
        ("nack SILENT", lambda: broker.tasks.fail(Q, [ids[6]], lifecycle.SILENT).wait()),
        ("nack FATAL", lambda: broker.tasks.fail(Q, [ids[7]], lifecycle.FATAL).wait()),
        ("XCLAIM by the owner (a renewal)", lambda: broker.leases.take_over(Q, b"w3", 0, [ids[8]]).wait()),
        ("XCLAIM by another (a take-over)", lambda: broker.leases.take_over(Q, b"w1", 0, [ids[9]]).wait()),
        ("XCLAIM FORCE of an available task",  # (idle, time, retry count: None; force)
         lambda: broker.leases.take_over(Q, b"w1", 0, [ids[20]], None, None, None, True).wait()),
        ("XNACK FORCE of tasks in flight and available",
         lambda: broker.tasks.fail(Q, [ids[10], ids[21]], lifecycle.FAIL, None, True).wait()),
        ("XACKDEL", lambda: broker.admin.ack_delete(Q, [ids[11]]).wait()),
        ("XGROUP DELCONSUMER", lambda: broker.tasks.delete_worker(Q, b"w3").wait()),
        ("claim 10 more", lambda: claim(broker, b"w4", 10)),
        ("XAUTOCLAIM", lambda: broker.leases.autoclaim(Q, b"w5", 0, (0, 0), 3, False).wait()),
        ("XREADGROUP CLAIM", lambda: claim(broker, b"w6", 2, claim_idle=0)),
    ]
    for name, move in checks:
        move()
        assert_mirrors_the_file(broker, name)
    broker.admin.configure(Q, {"retention_seconds": 0.0}).wait()
    held = list(broker.queues[Q].leases)
    assert acked(broker, Q, held[:2]) == 2  # retention 0: acked and deleted
    assert_mirrors_the_file(broker)
    clock.now += 31_000  # every lease runs out
    while broker.reaper.maintain():
        pass
    broker.reaper.maintain()
    assert_mirrors_the_file(broker)
    assert not broker.queues[Q].leases


def test_a_rolled_back_batch_leaves_the_leases_as_before_it(clocked_broker):
    broker = clocked_broker
    ids = push(broker, 10)
    claim(broker, b"w1", 4)
    before = memory_leases(broker)
    # One batch: a claim, an ack, a nack and a take-over run, then a broken request rolls it all back.
    broker.claim(Claim([Q], b"w2", 3, False))
    broker.tasks.ack(Q, [ids[0]])
    broker.tasks.fail(Q, [ids[1]])
    broker.leases.take_over(Q, b"w3", 0, [ids[2]])
    submit_broken_request(broker)
    assert memory_leases(broker) == before
    assert_mirrors_the_file(broker)
    broker.clock_.now += 31_000  # the heap was rebuilt with them: each still expires
    while broker.reaper.maintain():
        pass
    broker.reaper.maintain()
    assert not broker.queues[Q].leases
    assert broker.queues[Q].counts[AVAILABLE] == 10



def test_one_journal_takes_a_rolled_back_batch_back_in_every_shape(clocked_broker):
    """Counts, leases, the deadlines and the available order: a batch that pushed, claimed, acked
    and nacked, then rolled back, leaves each as the file has it, through the one batch journal."""
    broker = clocked_broker
    ids = push(broker, 4)
    assert claim(broker, b"w1", 1) == ids[:1]
    broker.reaper.maintain()  # the reaper's schedule looked, and moved its bounds up
    assert broker.schedule.earliest_deadline > 0
    counts, leases = dict(broker.queues[Q].counts), memory_leases(broker)
    broker.tasks.push(Q, [stored([b"n", b"rolled back"])])  # not waited for: in the batch below
    broker.claim(Claim([Q], b"w2", 2, False))
    broker.tasks.ack(Q, [ids[0]])
    broker.tasks.fail(Q, [ids[1]])
    submit_broken_request(broker)
    assert not broker.queues.journal and broker.queues[Q].counts == counts and memory_leases(broker) == leases
    assert broker.schedule.earliest_deadline == 0  # rebuilt: the next pass looks at everything
    assert claim(broker, b"w3", 5) == ids[1:]  # the order read again: the oldest first, the push gone
    more = push(broker, 1)  # its row id, free again, taken by a new task: claimed once
    assert claim(broker, b"w3", 5) == more and claim(broker, b"w3", 5) == []


def test_an_ack_a_corrupt_file_refuses_leaves_the_leases_as_they_were(clocked_broker):
    # A write refused on a corrupt file is no batch rollback (Writer._submit_read_only runs the
    # request alone and reloads nothing): an ack takes its leases before its UPDATE, so the
    # refusal must put them back, or XPENDING would lose tasks the file holds in flight.
    broker = clocked_broker
    ids = push(broker, 3)
    claim(broker, b"w1", 3)
    before = memory_leases(broker)
    broker.db.integrity.mark_corrupt("a test's")
    for acked in ([ids[0]], ids[:2]):  # one id (a worker's usual ack), then a batch
        with pytest.raises(errors.CommandError, match="database corrupt"):
            broker.tasks.ack(Q, acked)
    with pytest.raises(errors.CommandError, match="database corrupt"):
        broker.tasks.ack(Q, ids[1:])
    assert memory_leases(broker) == before
    assert broker.tasks.pending_summary(Q).wait()[2] == [(b"w1", 3)]

def test_a_start_without_recovery_reads_the_tasks_in_flight_from_the_file(tmp_path):
    settings = Settings(data_dir=str(tmp_path), durability="normal")
    broker = Broker(open_database(str(tmp_path / "data")), settings)
    ids = push(broker, 5)
    claim(broker, b"w1", 2)
    claim(broker, b"w2", 1)
    before = memory_leases(broker)
    broker.writer.stop()  # no clean stop: the tasks in flight stay so in the file
    broker.db.close()
    broker = Broker(open_database(str(tmp_path / "data")), settings)  # and no recovery either
    try:
        assert memory_leases(broker) == before
        assert broker.queues[Q].counts[IN_FLIGHT] == 3 and broker.queues[Q].counts[AVAILABLE] == 2
        first, last, workers = broker.tasks.pending_summary(Q).wait()
        assert (first, last, workers) == (ids[0], ids[2], [(b"w1", 2), (b"w2", 1)])
    finally:
        broker.stop()
        broker.db.close()


def test_a_clean_stop_gives_the_tasks_in_flight_back_and_the_next_start_reads_no_row(tmp_path):
    settings = Settings(data_dir=str(tmp_path), durability="normal")
    broker = Broker(open_database(str(tmp_path / "data")), settings)
    push(broker, 5)
    claim(broker, b"w1", 3)
    broker.stop()
    broker.db.close()
    db = open_database(str(tmp_path / "data"))
    try:
        assert db.counts_at_close is not None  # a clean stop's file, unchanged since
        assert db.conn.execute("SELECT count(*) FROM tasks WHERE state = 'in_flight'").fetchone()[0] == 0
        assert db.recover() == 0 and db.in_flight_recovered
    finally:
        db.close()


# ---------------------------------------------------------------- the reads, in id order

def test_the_reads_answer_from_the_leases_in_id_order(clocked_broker):
    broker, clock = clocked_broker, clocked_broker.clock_
    ids = push(broker, 300)
    done = claim(broker, b"w0", 290)
    assert acked(broker, Q, done) == 290  # 290 done tasks before the ones in flight
    for worker in (b"w2", b"w1", b"w2"):
        clock.now += 10
        claim(broker, worker)
    in_flight = ids[290:293]  # delivered 20, 10 and 0 ms ago
    assert broker.tasks.pending_summary(Q).wait() == (in_flight[0], in_flight[-1], [(b"w1", 1), (b"w2", 2)])
    entries = broker.pending_entries(Q, (0, 0), (2 ** 62, 0), 10, None, None).wait()
    assert [(task_id, worker, idle, n) for task_id, worker, idle, n in entries] == [
        (in_flight[0], b"w2", 20, 1), (in_flight[1], b"w1", 10, 1), (in_flight[2], b"w2", 0, 1)]
    assert [e[0] for e in broker.pending_entries(Q, in_flight[1], (2 ** 62, 0), 10, b"w2", None).wait()] == \
        [in_flight[2]]
    assert [e[0] for e in broker.pending_entries(Q, (0, 0), (2 ** 62, 0), 10, None, 15).wait()] == [in_flight[0]]
    info = broker.admin.stream_info(Q, apart=False).wait()
    assert info.consumers == [(b"w1", 1, clock.now - 10), (b"w2", 2, clock.now)]
    assert [row[:2] for row in broker.admin.tasks(Q, IN_FLIGHT, 2, in_flight[0]).wait()] == in_flight[1:]
    cursor, taken = broker.leases.autoclaim(Q, b"w3", 15, (0, 0), 1, True).wait()
    assert taken == [in_flight[0]] and cursor == in_flight[1]
    assert [row[:2] for row in broker.claims.claim_own(Q, b"w2", (0, 0), None).wait()] == [in_flight[2]]
    assert claim(broker, b"w4", 5, claim_idle=5)[:1] == [in_flight[1]]  # the longest idle first


# ---------------------------------------------------------------- InFlight alone

def leases_of(*queue_names, clock=None):
    queues = Queues(Defaults(Settings()))
    for name in queue_names:
        queues.add(queues.new(name))
    clock = clock or Clock(0)
    in_flight = InFlight(queues, clock)
    assert in_flight.expired(clock.now, 1) == []  # the heap's first build: leases due within HORIZON_MS go in it
    return queues, in_flight


def claimed(in_flight, queue, ids, worker, deadline, now=0):
    queue.move(None, AVAILABLE, len(ids))
    queue.move(AVAILABLE, IN_FLIGHT, len(ids))
    in_flight.claimed(queue, [(ms, seq, b"", 1, ms) for ms, seq in ids], worker, deadline, now)


def test_expiry_comes_in_deadline_order_past_renewals_and_ended_leases():
    queues, in_flight = leases_of(b"a", b"b")
    a, b = queues[b"a"], queues[b"b"]
    claimed(in_flight, a, [(1, 0), (2, 0)], b"w", deadline=1000)
    claimed(in_flight, b, [(1, 0)], b"w", deadline=500)  # a shorter lease, later: comes first
    in_flight.leased(a, (2, 0), (2, b"w", 3000, 0, 1))   # renewed: its old deadline no longer counts
    in_flight.ended(a, (1, 0))                           # acked
    queues.journal.batch_ended()
    assert in_flight.next_deadline() == 500
    assert [(q.name, task_id) for q, task_id, _ in in_flight.expired(999, 100)] == [(b"b", (1, 0))]
    in_flight.ended(b, (1, 0))
    assert in_flight.next_deadline() == 3000
    assert in_flight.expired(2999, 100) == []
    assert [(q.name, task_id) for q, task_id, _ in in_flight.expired(3000, 100)] == [(b"a", (2, 0))]


def test_the_batch_journal_undoes_the_batch_in_reverse():
    queues, in_flight = leases_of(b"a")
    a = queues[b"a"]
    claimed(in_flight, a, [(1, 0), (2, 0)], b"w", deadline=1000)
    queues.journal.batch_ended()
    before, counts = dict(a.leases), dict(a.counts)
    claimed(in_flight, a, [(3, 0)], b"w", deadline=1000)
    in_flight.leased(a, (1, 0), (1, b"x", 2000, 5, 2))
    in_flight.ended(a, (1, 0))
    in_flight.all_ended(a, [((2, 0), a.leases[(2, 0)])])
    queues.journal.roll_back()  # the one undo of a batch: the leases, and the count moves beside them
    assert a.leases == before and a.counts == counts and not queues.journal
    assert sorted(task_id for _, task_id, _ in in_flight.expired(1000, 100)) == [(1, 0), (2, 0)]


def test_a_lease_due_after_the_horizon_costs_the_heap_nothing_until_its_next_build():
    clock = Clock(0)
    queues, in_flight = leases_of(b"a", clock=clock)
    a = queues[b"a"]
    claimed(in_flight, a, [(1, 0)], b"w", deadline=HORIZON_MS + 30_000)  # a usual lease: not in the heap
    assert in_flight._deadlines == []
    assert in_flight.next_deadline() == HORIZON_MS  # the reaper looks again at the next build
    clock.now = HORIZON_MS
    assert in_flight.expired(clock.now, 100) == []  # built: it is in the heap now
    assert in_flight._deadlines and in_flight.next_deadline() == 2 * HORIZON_MS  # the next build, sooner
    clock.now = HORIZON_MS + 30_000
    assert [task_id for _, task_id, _ in in_flight.expired(clock.now, 100)] == [(1, 0)]


def test_the_deadline_heap_stays_bounded_by_the_leases_in_force():
    queues, in_flight = leases_of(b"a")
    a = queues[b"a"]
    for n in range(20 * COMPACT_MIN):  # short leases acked at once: every entry they leave is stale
        claimed(in_flight, a, [(n, 0)], b"w", deadline=1000 + n % 1000)
        in_flight.ended(a, (n, 0))
        queues.journal.batch_ended()
    claimed(in_flight, a, [(10 ** 6, 0)], b"w", deadline=3000)
    assert 0 < len(in_flight._deadlines) <= 2 * COMPACT_MIN
    assert in_flight.next_deadline() == 3000


def test_the_figures_are_worked_out_once_per_change():
    leases = QueueLeases()
    leases[(2, 0)] = (1, b"w2", 100, 10, 1)
    leases[(1, 0)] = (2, b"w1", 100, 20, 1)
    assert leases.summed() == ((1, 0), (2, 0), {b"w2": 1, b"w1": 1})
    assert leases.summed() is leases.summed()
    assert leases.last_deliveries() == {b"w2": 10, b"w1": 20}
    leases.figures = None  # as every change of them does
    leases[(3, 0)] = (3, b"w1", 100, 30, 1)
    assert leases.summed() == ((1, 0), (3, 0), {b"w2": 1, b"w1": 2})
    assert leases.last_deliveries() == {b"w2": 10, b"w1": 30}


@pytest.mark.parametrize("protocol", [2, 3], ids=["resp2", "resp3"])
def test_xpending_and_xautoclaim_answer_in_id_order_with_many_done_tasks(ezra_factory, protocol):
    """Black box, through the server: in id order whatever order the workers claimed in."""
    server = ezra_factory()
    r = server.client(protocol)
    r.xgroup_create("q", "g", id="0", mkstream=True)
    pipe = r.pipeline(transaction=False)
    for i in range(303):
        pipe.xadd("q", {"n": str(i)})
    ids = pipe.execute()
    claimed_now = r.xreadgroup("g", "w0", {"q": ">"}, count=300)
    entries = claimed_now[0][1] if protocol == 2 else claimed_now[b"q"][0]
    assert r.xack("q", "g", *[task_id for task_id, _ in entries]) == 300
    for worker in ("w2", "w1", "w2"):
        assert r.xreadgroup("g", worker, {"q": ">"}, count=1)
    in_flight = ids[300:]
    summary = r.xpending("q", "g")
    assert summary["pending"] == 3 and (summary["min"], summary["max"]) == (in_flight[0], in_flight[-1])
    detail = r.xpending_range("q", "g", "-", "+", 10)
    assert [(p["message_id"], p["consumer"]) for p in detail] == list(zip(in_flight, [b"w2", b"w1", b"w2"]))
    assert r.xautoclaim("q", "g", "w3", 0, "0-0", count=10, justid=True) == in_flight  # redis-py: the ids
    assert r.xinfo_groups("q")[0]["pending"] == 3
    assert [(c["name"], c["pending"]) for c in r.xinfo_consumers("q", "g")] == [(b"w3", 3)]  # it took them all
    r.close()


def test_a_schema_11_file_stopped_cleanly_with_tasks_in_flight_gets_them_back(ezra_factory):
    """An EZRA of schema 11 left its tasks in flight at a clean stop, and the ezra.counts that lets
    the next start skip recovery's pass over the table: the migration must make them available
    (found by the old index, before it is dropped), or no lease would ever expire them."""
    server = ezra_factory()
    r = server.client()
    ids = [r.xadd("q", {"n": str(i)}) for i in range(5)]
    r.close()
    assert server.stop() == 0
    path = server.data_dir / "ezra.db"
    with sqlite3.connect(path) as db:  # the file as a clean stop of schema 11 left it
        db.execute("CREATE INDEX tasks_in_flight ON tasks (queue, worker, id_ms, id_seq) WHERE state = 'in_flight'")
        for task_id in ids[:3]:
            ms, seq = map(int, task_id.split(b"-"))
            db.execute("UPDATE tasks SET state = 'in_flight', worker = 'w1', deadline = 1, delivered_at = 1, "
                       "attempts = 1, reserved = NULL WHERE id_ms = ? AND id_seq = ?", (ms, seq))
        db.execute("PRAGMA user_version = 11")
    db.close()
    done_counts.save(str(server.data_dir), str(path), {})
    server.start()
    assert "from schema 11 to" in server.log()
    r = server.client()
    assert r.xpending("q", "g")["pending"] == 0
    assert [task_id for task_id, _ in claim_by_client(r, "q", count=10)] == ids
    r.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM sqlite_master WHERE name = 'tasks_in_flight'").fetchone()[0] == 0
    db.close()


def test_the_heap_is_not_rebuilt_more_often_than_there_are_queues_to_walk():
    """A build walks every queue: with many queues and short leases acked at once, the builds a
    claim triggers must come no more often than once per as many claims as there are queues."""
    names = [b"q%05d" % n for n in range(5 * COMPACT_MIN)]
    queues, in_flight = leases_of(*names)
    a = queues[names[0]]
    builds = 0
    build = in_flight._build

    def counted_build():
        nonlocal builds
        builds += 1
        build()
    in_flight._build = counted_build
    for n in range(20 * COMPACT_MIN):
        claimed(in_flight, a, [(n, 0)], b"w", deadline=1000)
        in_flight.ended(a, (n, 0))
        queues.journal.batch_ended()
    assert builds <= 20 * COMPACT_MIN // (2 * len(names)) + 1, builds
