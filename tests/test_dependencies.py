"""XADD AFTER n queue id ... (issue 49 item 4): a task waits until every task it names is done,
through the real server with redis-py in RESP2 and RESP3: chains, fan-in across queues, a done
dependency counting at once, an unknown one refused with nothing stored, a dead or deleted one
killing its dependents with a reason, XREQUEUE's rule, a blocked worker woken by the release, and
the release exactly once across kill -9."""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import uuid

import pytest
import redis

from support_servers import wait_until


def push(client, queue, *options, fields=("n", "1")):
    return client.execute_command("XADD", queue, *options, "*", *fields)


def after(*named) -> list:
    """AFTER's arguments for (queue, id) pairs."""
    return ["AFTER", len(named), *[part for pair in named for part in pair]]


def tasks(client, queue, state="unfinished") -> list[dict]:
    reply = client.execute_command("XINFO", "TASKS", queue, state, "COUNT", 1000)
    return [t if isinstance(t, dict) else dict(zip(t[::2], t[1::2])) for t in reply]


def claim(client, queue, count=10, group="g"):
    reply = client.xreadgroup(group, "w", {queue: ">"}, count=count)
    if not reply:
        return []
    entries = reply[queue.encode()][0] if isinstance(reply, dict) else reply[0][1]
    return [task_id for task_id, _ in entries]


def run(client, queue):
    """Claim and ack the queue's one available task: its id."""
    [task_id] = claim(client, queue, 1)
    assert client.xack(queue, "g", task_id) == 1
    return task_id


def stream_info(client, queue) -> dict:
    info = client.execute_command("XINFO", "STREAM", queue)
    return info if isinstance(info, dict) else dict(zip(info[::2], info[1::2]))


def test_a_chain_runs_in_order_and_each_waits_until_the_one_before_is_done(r, queue):
    a = push(r, queue + "-a")
    b = push(r, queue + "-b", *after((queue + "-a", a)))
    c = push(r, queue + "-c", *after((queue + "-b", b)))
    assert [t[b"state"] for t in tasks(r, queue + "-b")] == [b"waiting"]
    assert claim(r, queue + "-b") == [] and claim(r, queue + "-c") == []  # waiting: not claimable
    assert r.xlen(queue + "-b") == 1  # a task not done, as a delayed one is
    assert run(r, queue + "-a") == a
    assert claim(r, queue + "-c") == []  # b is available, not done
    assert run(r, queue + "-b") == b  # positive control: b became claimable with a's ack
    assert run(r, queue + "-c") == c


def test_fan_in_across_queues_waits_for_the_last(r, queue):
    named = [(f"{queue}-{i % 3}", push(r, f"{queue}-{i % 3}")) for i in range(9)]
    joined = push(r, queue, *after(*named))
    for source, _ in named[:-1]:
        run(r, source)
    assert claim(r, queue) == [] and [t[b"state"] for t in tasks(r, queue)] == [b"waiting"]
    run(r, named[-1][0])
    assert claim(r, queue) == [joined]


def test_a_dependency_done_already_counts_at_once(r, queue):
    done = push(r, queue + "-a")
    run(r, queue + "-a")
    pending = push(r, queue + "-a")
    first = push(r, queue, *after((queue + "-a", done)))
    assert claim(r, queue) == [first]  # available at once
    second = push(r, queue, *after((queue + "-a", done), (queue + "-a", pending)))
    assert [t[b"state"] for t in tasks(r, queue)] == [b"in_flight", b"waiting"]  # the not done one counts
    run(r, queue + "-a")
    assert claim(r, queue) == [second]


def test_an_unknown_dependency_refuses_the_push_and_stores_nothing(r, queue):
    known = push(r, queue + "-a")
    with pytest.raises(redis.ResponseError, match=re.escape(f"queue '{queue}-a' id 1-1 (") + ".*nothing was stored"):
        push(r, queue, *after((queue + "-a", known), (queue + "-a", "1-1")))
    with pytest.raises(redis.ResponseError, match="does not exist: queue 'nowhere"):
        push(r, queue, *after(("nowhere-" + queue, known)))
    assert r.exists(queue) == 0 and r.xlen(queue) == 0
    assert push(r, queue, *after((queue + "-a", known)))  # positive control: a known one is stored
    assert r.xlen(queue) == 1


@pytest.mark.parametrize("arguments, message", [
    (["AFTER", "0", "q", "1-0"], "from 1 to 10000"),
    (["AFTER", "10001", "q", "1-0"], "from 1 to 10000"),
    (["AFTER", "x", "q", "1-0"], "from 1 to 10000"),
    (["AFTER", "3", "q", "1-0"], "AFTER 3 needs 3 queue and id pairs"),
    (["AFTER", "1", "q", "bad-id"], "Invalid stream ID"),
    (["AFTER", "1", "q", "1-0", "AFTER", "1", "q", "1-0"], "AFTER specified multiple times"),
    (["UNIQUE", "k", "AFTER", "1", "q", "1-0"], "AFTER and UNIQUE cannot be combined"),
])
def test_a_malformed_after_is_refused(r, queue, arguments, message):
    with pytest.raises(redis.ResponseError, match=message):
        r.execute_command("XADD", queue, *arguments, "*", "f", "v")
    assert r.exists(queue) == 0


def test_after_on_a_dead_queue_is_refused(r, queue):
    named = push(r, queue + "-a")
    with pytest.raises(redis.ResponseError, match="AFTER does not apply to a dead task"):
        push(r, queue + "::dead", *after((queue + "-a", named)))


def test_a_dead_dependency_kills_its_dependents_down_the_chain_with_the_reason(r, queue):
    a = push(r, queue + "-a")
    b = push(r, queue + "-b", *after((queue + "-a", a)))
    c = push(r, queue + "-c", *after((queue + "-b", b)))
    bystander = push(r, queue + "-b")
    assert claim(r, queue + "-a") == [a]
    assert r.execute_command("XNACK", queue + "-a", "g", "FATAL", "IDS", 1, a) == 1
    [dead_b] = tasks(r, queue + "-b", "dead")
    assert dead_b[b"id"] == b and dead_b[b"failure-cause"] == b"dependency"
    assert dead_b[b"failure-reason"] == f"dependency {queue}-a {a.decode()} is dead".encode()
    [dead_c] = tasks(r, queue + "-c", "dead")
    assert dead_c[b"failure-reason"] == f"dependency {queue}-b {b.decode()} is dead".encode()
    assert [t[b"id"] for t in tasks(r, queue + "-b")] == [bystander]  # only the dependents died
    assert r.xlen(queue + "-c::dead") == 1 and r.xlen(queue + "-c") == 0


def test_a_dependency_dead_at_the_push_stores_the_task_dead(r, queue):
    a = push(r, queue + "-a")
    claim(r, queue + "-a")
    r.execute_command("XNACK", queue + "-a", "g", "FATAL", "IDS", 1, a)
    b = push(r, queue, *after((queue + "-a", a)))
    [dead] = tasks(r, queue, "dead")
    assert dead[b"id"] == b and dead[b"failure-reason"].endswith(b"is dead")


def test_xdel_of_a_dependency_kills_the_dependent(r, queue):
    a = push(r, queue + "-a")
    b = push(r, queue, *after((queue + "-a", a)))
    assert r.xdel(queue + "-a", a) == 1
    [dead] = tasks(r, queue, "dead")
    assert dead[b"id"] == b and dead[b"failure-reason"] == f"dependency {queue}-a {a.decode()} was deleted".encode()


def test_xdel_of_a_waiting_task_deletes_it(r, queue):
    a = push(r, queue + "-a")
    b = push(r, queue, *after((queue + "-a", a)))
    assert r.xdel(queue, b) == 1
    assert r.xlen(queue) == 0
    run(r, queue + "-a")  # its dependency done later: nothing comes back
    assert r.xlen(queue) == 0 and claim(r, queue) == []


def test_requeueing_the_dependency_alone_does_not_revive_the_dependent(r, queue):
    a = push(r, queue + "-a")
    b = push(r, queue, *after((queue + "-a", a)))
    claim(r, queue + "-a")
    r.execute_command("XNACK", queue + "-a", "g", "FATAL", "IDS", 1, a)
    # the dependent's own requeue while its dependency is dead: it stays dead, not counted
    assert r.execute_command("XREQUEUE", queue, "IDS", 1, b) == 0
    assert [t[b"id"] for t in tasks(r, queue, "dead")] == [b]
    assert r.execute_command("XREQUEUE", queue + "-a", "IDS", 1, a) == 1
    assert [t[b"id"] for t in tasks(r, queue, "dead")] == [b]  # still dead: not revived silently
    assert r.execute_command("XREQUEUE", queue, "IDS", 1, b) == 1  # now it waits again
    assert [t[b"state"] for t in tasks(r, queue)] == [b"waiting"]
    run(r, queue + "-a")
    assert claim(r, queue) == [b]


def test_requeueing_a_dependent_whose_dependency_is_done_makes_it_available(r, queue):
    a = push(r, queue + "-a")
    b = push(r, queue, *after((queue + "-a", a)))
    claim(r, queue + "-a")
    r.execute_command("XNACK", queue + "-a", "g", "FATAL", "IDS", 1, a)
    r.execute_command("XREQUEUE", queue + "-a", "IDS", 1, a)
    run(r, queue + "-a")
    assert tasks(r, queue, "dead")[0][b"id"] == b  # done now, but b died before: still dead
    assert r.execute_command("XREQUEUE", queue, "IDS", 1, b) == 1
    assert claim(r, queue) == [b]


def test_noack_reads_and_xackdel_count_as_done(r, queue):
    a = push(r, queue + "-a")
    b = push(r, queue, *after((queue + "-a", a)))
    r.xreadgroup("g", "w", {queue + "-a": ">"}, count=1, noack=True)
    assert claim(r, queue) == [b]
    c = push(r, queue + "-c")
    d = push(r, queue, *after((queue + "-c", c)))
    claim(r, queue + "-c")
    r.execute_command("XACKDEL", queue + "-c", "g", "IDS", 1, c)
    assert claim(r, queue) == [d]


def test_an_ack_with_a_result_releases_its_dependents(r, queue):
    """XACK ... RESULT is an ack: alone, in MULTI/EXEC after XCLAIM FORCE (the result backends'
    store), and in a pipeline's run of them, it releases the tasks waiting for the task acked."""
    a, b, c = (push(r, queue + "-a") for _ in range(3))
    waiting = [push(r, queue, *after((queue + "-a", task))) for task in (a, b)]
    both = push(r, queue, *after((queue + "-a", b), (queue + "-a", c)))
    claim(r, queue + "-a", 1)
    assert r.execute_command("XACK", queue + "-a", "g", a, "RESULT", "ra") == 1
    assert claim(r, queue) == [waiting[0]]
    with r.pipeline(transaction=True) as pipe:
        pipe.xclaim(queue + "-a", "g", "w", 0, [b], force=True, justid=True)
        pipe.execute_command("XACK", queue + "-a", "g", b, "RESULT", "rb")
        assert pipe.execute()[-1] == 1
    assert claim(r, queue) == [waiting[1]]
    assert [t[b"state"] for t in tasks(r, queue, "waiting")] == [b"waiting"]  # `both` waits for c still
    claim(r, queue + "-a", 1)
    with r.pipeline(transaction=False) as pipe:
        pipe.execute_command("XACK", queue + "-a", "g", c, "RESULT", "rc")
        pipe.execute_command("XACK", queue + "-a", "g", c, "RESULT", "again")
        assert pipe.execute() == [1, 0]
    assert claim(r, queue) == [both]


def test_a_delay_still_runs_once_released(r, queue):
    a = push(r, queue + "-a")
    push(r, queue, "DELAY", 3600, *after((queue + "-a", a)))
    run(r, queue + "-a")
    assert [t[b"state"] for t in tasks(r, queue)] == [b"delayed"]


def test_waiting_tasks_are_counted_and_listed(ezra_factory, protocol):
    """On a server of its own: INFO lists the first 100 queues by name, and a shared one has more."""
    r, queue = ezra_factory().client(protocol), "jobs"
    a = push(r, queue + "-a")
    before = stream_info(r, queue + "-a")
    assert b"waiting" not in before  # no field while none waits: the reply as before
    b = push(r, queue, *after((queue + "-a", a)))
    assert stream_info(r, queue)[b"waiting"] == 1
    assert r.xrange(queue) == [(b, {b"n": b"1"})]
    [row] = tasks(r, queue, "waiting")
    assert row[b"id"] == b and row[b"state"] == b"waiting"
    assert row[b"waits-for"] == [[(queue + "-a").encode(), a]]  # what it waits for, in both protocols
    assert b"waits-for" not in tasks(r, queue + "-a", "available")[0]  # only a waiting task's map has it
    info = r.info("queues")
    line = info[f"queue_{queue}"]
    assert line["waiting"] == 1
    assert "waiting" not in info[f"queue_{queue}-a"]
    run(r, queue + "-a")
    assert b"waiting" not in stream_info(r, queue)


def test_a_pipeline_with_after_between_plain_pushes(r, queue):
    a = push(r, queue + "-a")
    pipe = r.pipeline(transaction=False)
    pipe.xadd(queue, {"n": "0"})
    pipe.execute_command("XADD", queue, *after((queue + "-a", a)), "*", "n", "1")
    pipe.xadd(queue, {"n": "2"})
    first, waiting, third = pipe.execute()
    assert claim(r, queue) == [first, third]
    run(r, queue + "-a")
    assert claim(r, queue) == [waiting]


def test_a_blocked_worker_is_woken_by_the_release(ezra_factory, protocol, queue):
    server = ezra_factory()  # its own: INFO's blocked_clients is this worker's alone
    client = server.client(protocol)
    a = push(client, queue + "-a")
    b = push(client, queue, *after((queue + "-a", a)))
    got = []
    blocked = server.client(protocol)  # its socket_timeout (30 s) outlasts the BLOCK
    thread = threading.Thread(target=lambda: got.append(blocked.xreadgroup("g", "w2", {queue: ">"}, block=20000)))
    thread.start()
    wait_until(lambda: client.info("clients")["blocked_clients"] == 1, message="the worker blocked")
    run(client, queue + "-a")
    wait_until(lambda: got, message="the blocked worker woken")
    thread.join(10)
    entries = got[0][queue.encode()][0] if isinstance(got[0], dict) else got[0][0][1]
    assert [task_id for task_id, _ in entries] == [b]


def test_fan_in_of_a_thousand(r, queue):
    pipe = r.pipeline(transaction=False)
    for _ in range(1000):
        pipe.xadd(queue + "-a", {"n": "1"})
    named = [(queue + "-a", task_id) for task_id in pipe.execute()]
    joined = push(r, queue, *after(*named))
    claimed = claim(r, queue + "-a", 1000)
    assert r.xack(queue + "-a", "g", *claimed[:-1]) == 999
    assert claim(r, queue) == []
    assert r.xack(queue + "-a", "g", claimed[-1]) == 1
    assert claim(r, queue) == [joined]


def test_waiting_tasks_stay_waiting_and_a_release_happens_once_across_kill9(ezra_factory):
    """The ack and the release are one transaction: after a kill -9 right after the acks' replies,
    every dependent of an acked task is available exactly once, the others still wait."""
    server = ezra_factory()
    client = server.client()
    pairs = []
    for i in range(200):
        a = push(client, "deps")
        pairs.append((a, push(client, "after", *after(("deps", a)), fields=("for", a))))
    claimed = claim(client, "deps", 200)
    acked = claimed[:120]
    pipe = client.pipeline(transaction=False)
    for task_id in acked:
        pipe.xack("deps", "g", task_id)
    assert pipe.execute() == [1] * 120
    server.kill9()
    server.start()
    client = server.client()
    dependents = {a: b for a, b in pairs}
    released = claim(client, "after", 1000)
    assert sorted(released) == sorted(dependents[a] for a in acked)
    assert claim(client, "after", 1000) == []  # once
    assert len(tasks(client, "after", "waiting")) == 80
    for task_id in claim(client, "deps", 200):  # the rest, back from flight after the restart
        client.xack("deps", "g", task_id)
    assert len(claim(client, "after", 1000)) == 80 and tasks(client, "after", "waiting") == []


def test_an_ack_cut_by_kill9_releases_at_most_once(ezra_factory):
    """An XACK sent and the server killed before its reply: after the restart a retried XACK
    answers 0 if the first one was applied, and then the dependent is available, once."""
    server = ezra_factory()
    client = server.client()
    rounds = []
    for i in range(20):
        a = push(client, "deps")
        rounds.append((a, push(client, "after", *after(("deps", a)))))
    claimed = claim(client, "deps", 20)
    raw = redis.Connection(port=server.port)
    raw.connect()
    for task_id in claimed:
        raw.send_command("XACK", "deps", "g", task_id)
    server.kill9()
    server.start()
    client = server.client()
    for task_id in claim(client, "deps", 20):  # those whose ack was lost are back
        assert client.xack("deps", "g", task_id) == 1
    released = claim(client, "after", 100)
    assert sorted(released) == sorted(b for _, b in rounds)
    assert claim(client, "after", 100) == []


@pytest.mark.parametrize("version", [15, 16])
def test_an_older_file_is_upgraded_and_its_tasks_can_be_waited_for(ezra_factory, tmp_path, version):
    """Schema 17's step: the state CHECK admits 'waiting' (its text rewritten, no copy), and the
    index and table of the waiting tasks are made; a task the old file holds can be named. From
    schema 16 (results) and from 15, through 16's step."""
    from support_files import hand_rowids, schema_15_text, schema_16_text, write_old_file
    from ezra.storage import SCHEMA_VERSION

    data_dir = tmp_path / "old"
    db = write_old_file(data_dir, (schema_15_text if version == 15 else schema_16_text)(), version)
    db.execute("INSERT INTO queues (name, created_at) VALUES ('old', 1)")
    [rowid] = hand_rowids(db, "old", 1)
    db.execute("INSERT INTO tasks (rowid, queue, id_ms, id_seq, state, fields, created_at, available_at) "
               "VALUES (?, 'old', 5, 0, 'available', '[\"n\", \"1\"]', 1, 1)", (rowid,))
    db.commit()
    with pytest.raises(sqlite3.IntegrityError):  # the old CHECK: no waiting task fits
        db.execute("UPDATE tasks SET state = 'waiting'")
    db.close()
    server = ezra_factory(data_dir=data_dir)
    assert f"from schema {version} to {SCHEMA_VERSION}" in server.log()
    client = server.client()
    waiting = push(client, "new", *after(("old", "5-0")))
    assert [t[b"state"] for t in tasks(client, "new")] == [b"waiting"]
    assert run(client, "old") == b"5-0"
    assert claim(client, "new") == [waiting]
    server.stop()
    with sqlite3.connect(data_dir / "ezra.db") as conn:
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'tasks'").fetchone()[0]
        assert "state = 'waiting'" in sql
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


@pytest.mark.parametrize("dead_letters", [0, 20])
def test_waiting_tasks_are_counted_after_a_restart_and_after_schema_17s_index_is_dropped(ezra_factory, dead_letters):
    """Start-up counts waiting tasks from the dependencies table (schema 18 has no index of them):
    dependents that died with their dependency keep their edges and are not counted; after kill -9,
    and from a schema-17 file, whose index tasks_waiting the step drops. The dead dependents are
    found from the dependents, or from the dead tasks when those are fewer (dead_letters: more)."""
    server = ezra_factory()
    client = server.client()
    for _ in range(dead_letters):
        push(client, "letters::dead")
    a, b = push(client, "deps"), push(client, "deps")
    gone = push(client, "deps")
    for _ in range(3):
        push(client, "after", *after(("deps", a)))
    push(client, "after", *after(("deps", a), ("deps", b)))
    push(client, "other", *after(("deps", b)))
    dies = push(client, "after", *after(("deps", gone)))
    assert client.xdel("deps", gone) == 1  # its dependent dies, keeping its edge
    assert [t[b"id"] for t in tasks(client, "after", "dead")] == [dies]
    expected = {"after": 4, "other": 1}
    assert {q: stream_info(client, q)[b"waiting"] for q in expected} == expected  # positive control

    server.kill9()
    server.start()
    client = server.client()
    assert {q: stream_info(client, q)[b"waiting"] for q in expected} == expected
    assert b"waiting" not in stream_info(client, "deps")
    server.stop()

    with sqlite3.connect(server.data_dir / "ezra.db") as conn:  # as schema 17 left the file
        conn.execute("CREATE INDEX tasks_waiting ON tasks (queue, id_ms, id_seq) WHERE state = 'waiting'")
        conn.execute("PRAGMA user_version = 17")
    server.start()
    assert "from schema 17 to" in server.log()
    client = server.client()
    assert {q: stream_info(client, q)[b"waiting"] for q in expected} == expected
    run(client, "deps")  # a: three released, one still waits for b
    assert {q: stream_info(client, q)[b"waiting"] for q in expected} == {"after": 1, "other": 1}
    server.stop()
    with sqlite3.connect(server.data_dir / "ezra.db") as conn:
        assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'tasks_waiting'").fetchone()[0] == 0


def test_the_dashboard_and_metrics_show_waiting_tasks_and_dependencies_both_ways(ezra_factory):
    from urllib.parse import quote

    from support_http import http, scrape, value

    server = ezra_factory("--http-port", "0")
    client = server.client()
    a = push(client, "src").decode()
    b = push(client, "joined", *after(("src", a))).decode()
    samples = scrape(server)
    assert value(samples, "ezra_tasks", queue="joined", state="waiting") == 1
    assert value(samples, "ezra_tasks", queue="src", state="waiting") == 0
    status, _, body = http(f"{server.http_url}/queue?name=joined")
    assert status == 200 and b'data-state="waiting">1<' in body
    status, _, body = http(f"{server.http_url}/queue?name=src")
    assert b'data-state="waiting"' not in body  # no tile while none waits
    status, _, body = http(f"{server.http_url}/task?queue=joined&id={quote(b)}")
    assert status == 200 and b"waits for (not done yet)" in body and f"id={a}".encode() in body
    status, _, body = http(f"{server.http_url}/task?queue=src&id={quote(a)}")
    assert b"waited for by" in body and f"id={b}".encode() in body
    status, _, body = http(f"{server.http_url}/task?queue=src&id={quote(push(client, 'src').decode())}")
    assert b"Dependencies" not in body  # positive control above: a task with none has no section


def test_ezra_ls_shows_waiting_tasks(ezra_factory):
    import subprocess
    import sys

    from support_servers import ROOT

    server = ezra_factory()
    client = server.client()
    a = push(client, "src")
    b = push(client, "joined", *after(("src", a)))
    out = subprocess.run([sys.executable, "-m", "ezra", "ls", "joined", "--port", str(server.port)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    [line] = [line for line in out.stdout.splitlines() if b.decode() in line]
    assert "waiting" in line and "waiting for others" in line


@pytest.mark.parametrize("from_file", [False, True], ids=["port", "data-dir"])
def test_export_to_redis_and_import_back_restores_waiting_tasks(ezra_factory, redis_server_port, from_file):
    """EZRA -> Redis -> EZRA: a waiting task is an entry of its stream in Redis (delivered at once
    there), its dependencies in q::ezra-after; imported back into a fresh EZRA it waits again for the
    tasks it named, in whichever queue they are."""
    from support_move import ezra_cli, ok, raw_client, unique

    source, target = ezra_factory(), ezra_factory()
    src, red = raw_client(source.port), raw_client(redis_server_port)
    deps, joined = unique("deps"), unique("joined")
    done = push(src, deps)
    run(src, deps)
    a, b = push(src, deps), push(src, deps)
    waiting = push(src, joined, *after((deps, a), (deps, b), (deps, done)))
    plain = push(src, joined)
    redis_url = f"redis://127.0.0.1:{redis_server_port}"
    where = ["--data-dir", str(source.data_dir)] if from_file else ["--port", str(source.port)]
    exported = ok(ezra_cli("export", *where, "--to", redis_url, deps, joined))
    assert f"{joined}: 1 waiting task(s), their dependencies kept in {joined}::ezra-after" in exported.stdout
    assert red.xlen(joined) == 2 and json.loads(red.hget(f"{joined}::ezra-after", waiting)) == [
        [deps, a.decode()], [deps, b.decode()]]  # the done one is not waited for any more
    imported = ok(ezra_cli("import", "--port", str(target.port), "--from", redis_url, deps, joined))
    assert f"{joined}: 1 task(s) pushed with XADD AFTER" in imported.stdout
    dst = target.client()
    [row] = tasks(dst, joined, "waiting")
    assert row[b"id"] == waiting and row[b"waits-for"] == [[deps.encode(), a], [deps.encode(), b]]
    assert claim(dst, joined) == [plain]
    assert sorted(claim(dst, deps)) == sorted([a, b])
    dst.xack(deps, "g", a, b)
    assert claim(dst, joined) == [waiting]


def test_a_dependency_out_of_attempts_kills_the_dependent(r, queue):
    """Not only FATAL: the failure rule's dead (the shared server allows 3 attempts)."""
    a = push(r, queue + "-a")
    b = push(r, queue, *after((queue + "-a", a)))
    claim(r, queue + "-a")
    assert r.execute_command("XNACK", queue + "-a", "g", "FAIL", "IDS", 1, a) == 1  # attempts left: back
    assert [t[b"state"] for t in tasks(r, queue)] == [b"waiting"]  # positive control: still waiting
    claim(r, queue + "-a")
    r.execute_command("XNACK", queue + "-a", "g", "FAIL", "IDS", 1, a, "RETRYCOUNT", 3)
    assert [t[b"id"] for t in tasks(r, queue, "dead")] == [b]


def test_a_deleted_dead_dependency_keeps_its_dependent_dead_on_requeue(r, queue):
    a = push(r, queue + "-a")
    b = push(r, queue, *after((queue + "-a", a)))
    claim(r, queue + "-a")
    r.execute_command("XNACK", queue + "-a", "g", "FATAL", "IDS", 1, a)
    assert r.xdel(queue + "-a::dead", a) == 1
    assert r.execute_command("XREQUEUE", queue, "IDS", 1, b) == 0
    [dead] = tasks(r, queue, "dead")
    assert dead[b"failure-reason"] == b"a task it waits for was deleted"


def test_a_purged_dead_dependent_leaves_no_edge(ezra_factory, tmp_path):
    server = ezra_factory()
    client = server.client()
    a = push(client, "src")
    push(client, "joined", "TTL", "0.2", *after(("src", a)))
    claim(client, "src")
    client.execute_command("XNACK", "src", "g", "FATAL", "IDS", 1, a)

    def edges():
        with sqlite3.connect(f"file:{server.data_dir / 'ezra.db'}?mode=ro", uri=True) as conn:
            return conn.execute("SELECT count(*) FROM dependencies").fetchone()[0]

    assert edges() == 1 and client.xlen("joined::dead") == 1  # positive control: dead, its edge kept
    wait_until(lambda: client.xlen("joined::dead") == 0, message="the dead dependent's TTL purge")
    assert edges() == 0
