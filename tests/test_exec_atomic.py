"""Issue 21 item 3: one EXEC commits in one transaction, whatever it holds.

The scenario of the issue: MULTI; XACK job; XREADGROUP ... 0; 998 x XADD results; EXEC.
The XREADGROUP waited for its batch's commit, so the XACK committed alone first: a second
process reading ezra.db saw the job done with none of its results, and a kill -9 at that
moment left it so for good. Checked here through a reader in another process (a read-only
sqlite3 connection polling the file during the EXECs) and by kill -9 during such EXECs.
"""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
import redis

from ezra.protocol.task_fields import stored

from reliability import report
from support_queue import entries_of, queue_counts
from support_servers import wait_until
from support_broker import claim_committed, push_one

RESULTS = 998  # with the XACK and the XREADGROUP: 1,000 commands, the most one MULTI may hold

# Polls the file in its own process until `rounds` jobs are done; prints what it saw. Each
# SELECT is one read transaction: one consistent snapshot of both counts.
READER = r"""
import json, sqlite3, sys, time
path, rounds, per_job = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
conn.execute("PRAGMA busy_timeout = 5000")
looks, torn, example, deadline = 0, 0, None, time.monotonic() + 240
while time.monotonic() < deadline:
    done, results = conn.execute(
        "SELECT (SELECT count(*) FROM tasks WHERE queue = 'jobs' AND state = 'done'), "
        "(SELECT count(*) FROM tasks WHERE queue = 'results')").fetchone()
    looks += 1
    if results != done * per_job:
        torn += 1
        example = example or (done, results)
    if done >= rounds:
        break
    time.sleep(0.0005)
print(json.dumps({"looks": looks, "torn": torn, "example": example, "done": done}), flush=True)
"""


def claim_jobs(client, count: int) -> list[bytes]:
    """Lease up to `count` available jobs to worker w; their ids."""
    return [task_id for task_id, _ in entries_of(client.xreadgroup("g", "w", {"jobs": ">"}, count=count), "jobs")]


def queue_exec(pipe, job_id: bytes) -> None:
    """The issue's transaction: the ack, a read of the worker's own pending tasks, the results."""
    pipe.xack("jobs", "g", job_id)
    pipe.xreadgroup("g", "w", {"jobs": "0"}, count=1)
    for n in range(RESULTS):
        pipe.xadd("results", {"job": job_id, "n": str(n)})


def run_exec_pipeline(client, job_id: bytes) -> list:
    pipe = client.pipeline(transaction=True)
    queue_exec(pipe, job_id)
    return pipe.execute()


def run_exec_raw(client, job_id: bytes) -> list:
    """MULTI, each command and EXEC sent one by one on one connection (QUEUED between), read raw."""
    connection = client.connection

    def send(*args):
        connection.send_command(*args)
        return connection.read_response()

    assert send("MULTI") == b"OK"
    assert send("XACK", "jobs", "g", job_id) == b"QUEUED"
    assert send("XREADGROUP", "GROUP", "g", "w", "COUNT", "1", "STREAMS", "jobs", "0") == b"QUEUED"
    for n in range(RESULTS):
        assert send("XADD", "results", "*", "job", job_id, "n", str(n)) == b"QUEUED"
    return send("EXEC")


def check_replies(replies: list) -> None:
    assert len(replies) == RESULTS + 2
    assert replies[0] == 1, replies[0]  # the XACK
    assert not any(isinstance(reply, Exception) for reply in replies), replies[:3]
    assert all(isinstance(task_id, bytes) and b"-" in task_id for task_id in replies[2:])


@pytest.mark.parametrize("how", ["pipeline", "raw"])
def test_a_reader_of_the_file_never_sees_the_ack_without_its_results(ezra_factory, protocol, how):
    rounds = 12
    server = ezra_factory()
    client = server.client(protocol, single_connection_client=(how == "raw"))
    client.xgroup_create("jobs", "g", id="0", mkstream=True)
    for n in range(rounds):
        client.xadd("jobs", {"job": str(n)})
    job_ids = claim_jobs(client, rounds)
    reader = subprocess.Popen([sys.executable, "-c", READER, str(server.data_dir / "ezra.db"), str(rounds),
                               str(RESULTS)], stdout=subprocess.PIPE, text=True)
    try:
        for job_id in job_ids:
            replies = (run_exec_pipeline if how == "pipeline" else run_exec_raw)(client, job_id)
            check_replies(replies)
            # The XREADGROUP ran after the XACK: the acked job is no longer among the worker's own.
            assert job_id not in repr(replies[1]).encode(), replies[1]
        out, _ = reader.communicate(timeout=240)
    finally:
        reader.kill()
    seen = json.loads(out)
    assert seen["done"] == rounds
    assert seen["torn"] == 0, f"the reader saw {seen['torn']} of {seen['looks']} snapshots with acks " \
                              f"but not their results (done, results) = {seen['example']}"
    assert client.xlen("results") == rounds * RESULTS
    report(f"exec_reader_{how}_resp{protocol}", execs=rounds, looks=seen["looks"], torn=seen["torn"])


def test_kill9_during_execs_leaves_each_exec_whole_or_absent(ezra_factory):
    jobs, cycles = 80, 4
    server = ezra_factory()
    port_args = ["--port", str(server.port)]
    client = server.client()
    client.xgroup_create("jobs", "g", id="0", mkstream=True)
    for n in range(jobs):
        client.xadd("jobs", {"job": str(n)})
    replied: set[bytes] = set()  # jobs whose EXEC answered: they must be done, with every result
    rng = random.Random(21)
    cut: list[bytes] = []  # jobs whose EXEC the kill cut off before its reply
    for cycle in range(cycles):
        protocol = 3 if cycle % 2 else 2
        pending = claim_jobs(server.client(protocol), jobs)
        stop = threading.Event()

        def run_execs(job_ids: list[bytes]):
            client = server.client(protocol)  # each thread its connection: their EXECs share batches
            for job_id in job_ids:
                if stop.is_set():
                    return
                try:
                    check_replies(run_exec_pipeline(client, job_id))
                except (redis.ConnectionError, redis.TimeoutError, ConnectionError, OSError):
                    cut.append(job_id)  # killed mid-EXEC: whole or absent, the file says
                    return
                replied.add(job_id)

        before = len(replied)
        threads = [threading.Thread(target=run_execs, args=(pending[half::2],), daemon=True) for half in (0, 1)]
        for thread in threads:
            thread.start()
        wait_until(lambda: len(replied) >= before + 2 or not any(t.is_alive() for t in threads), 120,
                   message=f"EXECs to finish in cycle {cycle}")
        time.sleep(rng.uniform(0, 0.08))  # to land the kill anywhere in the next EXECs
        server.kill9()
        stop.set()
        for thread in threads:
            thread.join(30)
        whole, torn = exec_outcomes(server.data_dir / "ezra.db")
        assert not torn, f"cycle {cycle}: EXECs neither whole nor absent (job: done, results): {torn}"
        assert replied <= whole, f"replied EXECs missing after the kill: {sorted(replied - whole)[:3]}"
        server.args = server.args + port_args if port_args[0] not in server.args else server.args
        server.start()
    whole, torn = exec_outcomes(server.data_dir / "ezra.db")
    assert not torn
    assert len(whole) >= cycles
    assert cut, "no kill landed during an EXEC"
    report("exec_kill9", kill9_cycles=cycles, execs_replied=len(replied), execs_whole=len(whole),
           torn=len(torn), execs_cut_by_the_kill=len(cut),
           cut_and_committed=len(set(cut) & whole))


def exec_outcomes(path) -> tuple[set[bytes], dict]:
    """(jobs done with all their results, {job: (done?, results)} for any other mix) from the file."""
    db = sqlite3.connect(path)
    try:
        done = {row[0] for row in db.execute("SELECT id FROM tasks_readable WHERE queue = 'jobs' AND state = 'done'")}
        counts: dict[str, int] = {}
        for (fields,) in db.execute("SELECT fields FROM tasks_readable WHERE queue = 'results'"):
            job = json.loads(fields)[1]
            counts[job] = counts.get(job, 0) + 1
    finally:
        db.close()
    torn = {job: (job in done, counts.get(job, 0)) for job in done | set(counts)
            if (job in done) != (counts.get(job, 0) == RESULTS) or counts.get(job, 0) not in (0, RESULTS)}
    return {job.encode() for job in done if counts.get(job) == RESULTS}, torn


def test_a_run_time_error_inside_exec_answers_its_error_and_the_rest_applies(r, queue):
    """As in Redis: the failing XADD (an id not above the top) answers its error; the claim, the
    ack and the other pushes of the same EXEC commit."""
    r.xadd(queue, {"n": "0"}, id="5-1")
    r.xgroup_create(queue, "g", id="0")
    pipe = r.pipeline(transaction=True)
    pipe.xreadgroup("g", "w", {queue: ">"}, count=1)
    pipe.xack(queue, "g", "5-1")
    pipe.xadd(queue, {"n": "1"}, id="5-1")
    pipe.xadd(queue, {"n": "2"}, id="5-2")
    claimed, acked, refused, pushed = pipe.execute(raise_on_error=False)
    assert [task_id for task_id, _ in entries_of(claimed, queue)] == [b"5-1"]
    assert acked == 1
    assert isinstance(refused, redis.ResponseError) and "equal or smaller" in str(refused)
    assert pushed == b"5-2"
    assert r.xpending(queue, "g")["pending"] == 0 and r.xlen(queue) == 1


def test_backup_inside_multi_is_refused_at_queue_time(r, queue):
    """BACKUP waits for a commit, which an EXEC (one open transaction) cannot give it: refused when
    queued, with a reason, and the EXEC then answers EXECABORT with nothing applied."""
    connection = r.connection_pool.get_connection()
    try:
        def send(*args):
            connection.send_command(*args)
            try:
                return connection.read_response()
            except redis.ResponseError as exc:
                return exc

        assert send("MULTI") == b"OK"
        assert send("XADD", queue, "*", "n", "1") == b"QUEUED"
        refused = send("BACKUP", f"{queue}.db")
        assert isinstance(refused, redis.ResponseError), refused
        assert "BACKUP is not allowed inside MULTI" in str(refused) and "on its own" in str(refused)
        aborted = send("EXEC")
        assert isinstance(aborted, redis.ResponseError) and str(aborted).startswith("Transaction discarded")
    finally:
        r.connection_pool.release(connection)
    assert r.xlen(queue) == 0


def test_a_storage_failure_inside_an_exec_undoes_all_of_it(tmp_path):
    """In-process (the failure cannot be caused from a client): a statement fails half-way through
    an EXEC. The pushes before it roll back with the batch, the commands after it are refused, not
    committed alone in a batch of their own, and the EXEC's wait reports the error."""
    from ezra.broker import Broker
    from ezra.config import Settings
    from ezra.errors import CommandError
    from ezra.storage import open_database
    from support_queue import submit_broken_request

    broker = Broker(open_database(str(tmp_path / "data")), Settings(data_dir=str(tmp_path), durability="normal"))
    try:
        with broker.writer.atomic() as atomic:
            before = broker.tasks.push(b"jobs", [stored([b"n", b"1"])])
            assert before.wait()[0].endswith(b"-0")  # answered at once, inside the open transaction
            submit_broken_request(broker)
            with pytest.raises(CommandError, match="storage error"):
                broker.tasks.push(b"jobs", [stored([b"n", b"2"])])
        assert "storage error" in str(atomic.wait())
        assert broker.tasks.length(b"jobs", False).wait() == 0
        assert push_one(broker, b"jobs", stored([b"n", b"3"]))  # the next turn starts afresh
        assert broker.tasks.length(b"jobs", False).wait() == 1
    finally:
        broker.stop()
        broker.db.close()


def test_a_full_disk_at_the_commit_refuses_the_exec_whole_and_runs_the_rest_again(small_fs):
    """In-process, one loop turn on a 16 MB tmpfs: an EXEC (a push and a claim), 7 pushes of 1 MB that
    cannot fit, and another worker's claim. The commit meets the full disk: the batch runs again
    without its pushes, as before, but the EXEC is refused whole (its claim read rows the first run
    changed, so its replies could not stand), never in part; the other claim still succeeds."""
    import gevent

    from ezra.broker import Broker
    from ezra.config import Settings
    from ezra.errors import CommandError
    from ezra.storage import open_database
    from support_disk import leave_free

    broker = Broker(open_database(str(small_fs / "data"), 2 * 1024 * 1024),
                    Settings(data_dir=str(small_fs / "data"), durability="normal", disk_reserve=2 * 1024 * 1024))
    try:
        for n in range(50):
            push_one(broker, b"jobs", stored([b"n", b"%d" % n]))
        leave_free(small_fs, 4 * 1024 * 1024)

        def an_exec():
            with broker.writer.atomic() as atomic:
                pushed = broker.tasks.push(b"results", [stored([b"r", b"1"])])
                claimed = claim_committed(broker, [b"jobs"], b"w1", 1, False)
            return atomic.wait(), pushed, claimed

        def big_push():
            try:
                return push_one(broker, b"filler", stored([b"pad", b"x" * (1024 * 1024 - 100)]))
            except CommandError as exc:
                return exc

        greenlets = [gevent.spawn(an_exec), *(gevent.spawn(big_push) for _ in range(7)),
                     gevent.spawn(claim_committed, broker, [b"jobs"], b"w2", 1, False)]
        gevent.joinall(greenlets, raise_error=True)
        undone, _, _ = greenlets[0].value
        assert "disk full" in str(undone), undone
        assert all(isinstance(g.value, CommandError) for g in greenlets[1:8])
        other_claim = greenlets[-1].value
        assert other_claim and len(other_claim[b"jobs"]) == 1, other_claim
        counts = queue_counts(broker)
        assert counts[b"jobs"]["in_flight"] == 1 and counts[b"jobs"]["available"] == 49
        assert b"results" not in counts or counts[b"results"]["available"] == 0
    finally:
        broker.stop()
        broker.db.close()


def test_every_kind_of_command_in_one_exec_is_one_commit(tmp_path):
    """In-process, through the command table: reads, claims, blocking reads (which do not block in
    an EXEC), take-overs, acks, nacks, settings and INFO in one EXEC make one commit, where each
    read or claim used to commit the commands before it (the server's reaper, which commits on
    its own, is not running here)."""
    from ezra.broker import Broker
    from ezra.commands import dispatch, resolved
    from ezra.config import Settings
    from ezra.protocol.resp import ErrorReply
    from ezra.front.session import ServerState, Session
    from ezra.storage import open_database

    settings = Settings(data_dir=str(tmp_path), durability="normal")
    broker = Broker(open_database(str(tmp_path / "data")), settings)
    front = SimpleNamespace(wait=lambda event, seconds: event.wait(seconds), flush=lambda: None)
    session = Session(ServerState(broker, settings), "test:1", front)

    def send(*words):
        reply = dispatch(session, [word.encode() for word in words])
        return resolved(reply)

    try:
        send("XGROUP", "CREATE", "jobs", "g", "0", "MKSTREAM")
        for n in range(1, 5):
            send("XADD", "jobs", f"1-{n}", "n", str(n))
        send("XREADGROUP", "GROUP", "g", "w1", "COUNT", "2", "STREAMS", "jobs", ">")  # 1-1, 1-2 in flight
        queued = [
            ("XADD", "jobs", "*", "n", "5"),
            ("XREADGROUP", "GROUP", "g", "w2", "COUNT", "1", "BLOCK", "1000", "STREAMS", "jobs", ">"),
            ("XREADGROUP", "GROUP", "g", "w1", "STREAMS", "jobs", "0"),
            ("XACK", "jobs", "g", "1-1"),
            ("XNACK", "jobs", "g", "SILENT", "IDS", "1", "1-2"),
            ("XCLAIM", "jobs", "g", "w3", "0", "1-3"),
            ("XAUTOCLAIM", "jobs", "g", "w4", "0", "0-0"),
            ("XPENDING", "jobs", "g"),
            ("XRANGE", "jobs", "-", "+"),
            ("XREAD", "COUNT", "1", "BLOCK", "1000", "STREAMS", "jobs", "0"),
            ("XLEN", "jobs"),
            ("XINFO", "STREAM", "jobs"),
            ("XCFGSET", "jobs", "VISIBILITY-TIMEOUT", "30"),
            ("INFO", "persistence"),
            ("PING",),
        ]
        commits = broker.writer.batches
        assert send("MULTI") == "OK"
        for command in queued:
            assert send(*command) == "QUEUED", command
        replies = send("EXEC")
        errors = [(command, reply) for command, reply in zip(queued, replies) if isinstance(reply, ErrorReply)]
        assert not errors, errors
        assert broker.writer.batches == commits + 1, f"the EXEC committed in {broker.writer.batches - commits} parts"
    finally:
        broker.stop()
        broker.db.close()


def test_two_execs_that_begin_during_a_checkpoint_pause_both_run(tmp_path):
    """In-process: the first batch after a PASSIVE checkpoint pauses for the RESTART, which yields.
    An EXEC that began then must not be the writer's current EXEC while it waits: a second
    client's EXEC arriving meanwhile was refused ("EXEC inside EXEC")."""
    import gevent

    from ezra.broker import Broker
    from ezra.config import Settings
    from ezra.storage import open_database

    broker = Broker(open_database(str(tmp_path / "data")), Settings(data_dir=str(tmp_path), durability="normal"))
    writer = broker.writer

    def an_exec(n: int):
        with writer.atomic() as atomic:
            broker.tasks.push(b"jobs", [stored([b"n", b"%d" % n])])
            broker.tasks.length(b"jobs", False).wait()
        return atomic.wait()

    try:
        writer._restart_wal = True  # as _checkpoint_done leaves it: the next batch waits for a RESTART
        execs = [gevent.spawn(an_exec, n) for n in range(2)]
        gevent.joinall(execs, raise_error=True)
        assert [g.value for g in execs] == [None, None]
        assert broker.tasks.length(b"jobs", False).wait() == 2
    finally:
        broker.stop()
        broker.db.close()
