"""XADD UNIQUE key (issue 26 item 3): at most one unfinished task per key and queue, through the real
server with redis-py in RESP2 and RESP3; its restarts, the 4 -> 6 migration, XREQUEUE of a dead task
whose key was reused, and ezra export/import carrying the key."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import uuid

import pytest
import redis

from support_servers import ROOT, wait_until
from ezra.storage import SCHEMA_VERSION, open_database
from ezra.protocol.task_fields import stored


def push(client, queue, *options, fields=("n", "1")):
    return client.execute_command("XADD", queue, *options, "*", *fields)


def tasks(client, queue, state="unfinished") -> list[dict]:
    reply = client.execute_command("XINFO", "TASKS", queue, state, "COUNT", 1000)
    return [t if isinstance(t, dict) else dict(zip(t[::2], t[1::2])) for t in reply]


def claim(client, queue, count=10):
    reply = client.xreadgroup("g", "w", {queue: ">"}, count=count)
    entries = reply[queue.encode()][0] if isinstance(reply, dict) else reply[0][1]
    return [task_id for task_id, _ in entries]


def test_a_second_push_returns_the_first_id_while_it_is_available_delayed_or_in_flight(r, queue):
    first = push(r, queue, "UNIQUE", "report-7", fields=("v", "1"))
    assert push(r, queue, "UNIQUE", "report-7", fields=("v", "2")) == first  # available
    assert r.xlen(queue) == 1 and tasks(r, queue)[0][b"fields"] == [b"v", b"1"]  # the first's fields stay
    assert claim(r, queue) == [first]
    assert push(r, queue, "UNIQUE", "report-7") == first  # in flight
    assert r.xack(queue, "g", first) == 1
    second = push(r, queue, "DELAY", 3600, "UNIQUE", "report-7")  # done: the key is free again
    assert second != first
    assert push(r, queue, "UNIQUE", "report-7", "DELAY", 5) == second  # delayed: its delay unchanged
    [task] = tasks(r, queue)
    assert task[b"state"] == b"delayed" and task[b"unique-key"] == b"report-7"
    # DELAY 3600, not the second push's 5; one ms more: the clock reads whole ms (lifecycle.due_after)
    assert task[b"available-at"] - task[b"created-at"] == 3600_001


def test_a_dead_task_frees_its_key(r, queue):
    first = push(r, queue, "UNIQUE", "k")
    assert claim(r, queue) == [first]
    assert r.execute_command("XNACK", queue, "g", "FATAL", "IDS", 1, first) == 1
    assert r.xlen(f"{queue}::dead") == 1
    second = push(r, queue, "UNIQUE", "k")
    assert second != first and r.xlen(queue) == 1


def test_keys_and_queues_are_independent_and_plain_pushes_are_untouched(r, queue):
    a, b = push(r, queue, "UNIQUE", "a"), push(r, queue, "UNIQUE", "b")
    elsewhere = push(r, f"{queue}-other", "UNIQUE", "a")
    plain = [push(r, queue), push(r, queue)]
    assert len({a, b, *plain}) == 4 and elsewhere  # (ids are per queue: `elsewhere` may equal `a`)
    assert r.xlen(queue) == 4 and r.xlen(f"{queue}-other") == 1
    assert [t[b"unique-key"] for t in tasks(r, queue)] == [b"a", b"b", None, None]
    binary = b"\xff\x00key"  # binary-safe, as names are
    assert push(r, queue, "UNIQUE", binary) == push(r, queue, "unique", binary)


def test_an_explicit_id_works_the_same(r, queue):
    first = r.execute_command("XADD", queue, "UNIQUE", "k", "5-1", "n", "1")
    assert first == b"5-1"
    # Held: the holder's id, whatever id was asked (even one below the queue's last id).
    assert r.execute_command("XADD", queue, "UNIQUE", "k", "9-1", "n", "2") == b"5-1"
    assert r.execute_command("XADD", queue, "UNIQUE", "k", "1-1", "n", "2") == b"5-1"
    assert r.execute_command("XADD", queue, "UNIQUE", "other", "9-1", "n", "2") == b"9-1"


def test_with_idmp_both_apply(r, queue):
    first = push(r, queue, "IDMP", "shop", "order-1", "UNIQUE", "k")
    # Another iid, same key: the key's task; that iid now answers it too.
    assert push(r, queue, "IDMP", "shop", "order-2", "UNIQUE", "k") == first
    assert claim(r, queue) == [first] and r.xack(queue, "g", first) == 1
    # The key is free, but IDMP remembers both iids: retries still answer the first id.
    assert push(r, queue, "IDMP", "shop", "order-1", "UNIQUE", "k") == first
    assert push(r, queue, "IDMP", "shop", "order-2", "UNIQUE", "k") == first
    third = push(r, queue, "IDMP", "shop", "order-3", "UNIQUE", "k")
    assert third != first and r.xlen(queue) == 1


def test_nomkstream_and_trimming(r, queue):
    assert push(r, queue, "NOMKSTREAM", "UNIQUE", "k") is None and not r.exists(queue)
    first = push(r, queue, "UNIQUE", "k")
    done = push(r, queue)
    assert claim(r, queue, 1) == [first]
    assert r.xack(queue, "g", first) == 1  # done tasks: what MAXLEN ~ trims
    assert claim(r, queue, 1) == [done] and r.xack(queue, "g", done) == 1
    again = push(r, queue, "MAXLEN", "~", 0, "UNIQUE", "k")
    assert push(r, queue, "MAXLEN", "~", 0, "UNIQUE", "k") == again
    assert r.xlen(queue) == 1


def test_two_pushes_of_a_key_in_one_exec_give_one_task(r, queue):
    pipe = r.pipeline(transaction=True)
    pipe.execute_command("XADD", queue, "UNIQUE", "k", "*", "n", "1")
    pipe.execute_command("XADD", queue, "UNIQUE", "k", "*", "n", "2")
    pipe.execute_command("XADD", queue, "UNIQUE", "j", "*", "n", "3")
    first, second, other = pipe.execute()
    assert first == second != other and r.xlen(queue) == 2


@pytest.mark.parametrize("options, message", [
    (("UNIQUE", ""), "UNIQUE requires a non-empty key"),
    (("UNIQUE", "k" * 257), "UNIQUE key is 257 bytes long; at most 256 bytes"),
    (("UNIQUE", "a", "UNIQUE", "b"), "UNIQUE specified multiple times"),
])
def test_bad_keys_get_clear_errors_and_store_nothing(r, queue, options, message):
    with pytest.raises(redis.ResponseError, match=message):
        push(r, queue, *options)
    assert not r.exists(queue)
    assert push(r, queue, "UNIQUE", "k" * 256)  # the bound itself is fine


def test_unique_is_refused_on_a_dead_queue_and_without_an_id(r, queue):
    with pytest.raises(redis.ResponseError, match="UNIQUE does not apply to a dead task"):
        push(r, f"{queue}::dead", "UNIQUE", "k")
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        r.execute_command("XADD", queue, "UNIQUE", "k")
    assert not r.exists(queue)


def test_many_clients_pushing_one_key_at_once_make_exactly_one_task(shared_server, protocol, queue):
    clients = [shared_server.client(protocol) for _ in range(16)]
    replies, start = [], threading.Barrier(len(clients))

    def producer(client):
        start.wait(30)
        replies.extend(push(client, queue, "UNIQUE", "same", fields=("n", str(n))) for n in range(20))

    threads = [threading.Thread(target=producer, args=(client,)) for client in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(replies) == 16 * 20 and len(set(replies)) == 1
    assert clients[0].xlen(queue) == 1
    for client in clients:
        client.close()


def test_restart_keeps_the_key_held(ezra_factory, protocol):
    server = ezra_factory()
    client = server.client(protocol)
    held = push(client, "jobs", "UNIQUE", "k")
    leased = push(client, "jobs", "UNIQUE", "leased")
    assert claim(client, "jobs", 2) == [held, leased]
    client.close()
    server.kill9()
    server.start()
    client = server.client(protocol)
    # The restart gave the leased task back (available): both still hold their keys.
    assert push(client, "jobs", "UNIQUE", "k") == held and push(client, "jobs", "UNIQUE", "leased") == leased
    assert client.xlen("jobs") == 2
    client.close()


def test_requeue_of_a_dead_task_whose_key_was_reused_drops_its_key(ezra_factory, protocol):
    server = ezra_factory()
    client = server.client(protocol)
    dead = []
    for _ in range(2):  # two dead tasks that held "k" in turn, and one of "solo"
        dead.append(push(client, "jobs", "UNIQUE", "k"))
        assert claim(client, "jobs") == [dead[-1]]
        client.execute_command("XNACK", "jobs", "g", "FATAL", "IDS", 1, dead[-1])
    solo = push(client, "jobs", "UNIQUE", "solo")
    claim(client, "jobs")
    client.execute_command("XNACK", "jobs", "g", "FATAL", "IDS", 1, solo)
    holder = push(client, "jobs", "UNIQUE", "k")
    assert client.execute_command("XREQUEUE", "jobs", "IDS", 1, dead[0]) == 1
    keys = {t[b"id"]: t[b"unique-key"] for t in tasks(client, "jobs")}
    assert keys == {dead[0]: None, holder: b"k"}  # requeued, without the key someone holds
    wait_until(lambda: "requeued without their unique key" in server.log(), message="the log line")
    assert push(client, "jobs", "UNIQUE", "k") == holder
    # ALL: "solo" keeps its free key; the other dead "k" loses it (holder has it).
    assert client.execute_command("XREQUEUE", "jobs", "ALL") == 2
    keys = {t[b"id"]: t[b"unique-key"] for t in tasks(client, "jobs")}
    assert keys == {dead[0]: None, dead[1]: None, solo: b"solo", holder: b"k"}
    assert push(client, "jobs", "UNIQUE", "solo") == solo
    client.close()


def test_requeue_all_of_dead_tasks_sharing_a_free_key_keeps_it_on_the_oldest(ezra_factory, protocol):
    server = ezra_factory()
    client = server.client(protocol)
    dead = []
    for _ in range(3):
        dead.append(push(client, "jobs", "UNIQUE", "k"))
        claim(client, "jobs")
        client.execute_command("XNACK", "jobs", "g", "FATAL", "IDS", 1, dead[-1])
    assert client.execute_command("XREQUEUE", "jobs", "ALL") == 3
    keys = {t[b"id"]: t[b"unique-key"] for t in tasks(client, "jobs")}
    assert keys == {dead[0]: b"k", dead[1]: None, dead[2]: None}
    assert push(client, "jobs", "UNIQUE", "k") == dead[0]
    client.close()


def test_a_schema_4_database_gains_the_unique_key_column_and_index(tmp_path):
    data = tmp_path / "data"
    open_database(str(data)).close()
    db = sqlite3.connect(data / "ezra.db")
    db.execute("DROP VIEW tasks_readable")  # schema 9's
    db.execute("DROP INDEX tasks_unique")
    db.execute("ALTER TABLE tasks DROP COLUMN unique_key")
    db.execute("INSERT INTO tasks (queue, id_ms, id_seq, state, fields, created_at, available_at) "
               "VALUES ('q', 1, 0, 'available', '[\"n\", \"0\"]', 0, 0)")  # a task has a field at least
    db.execute("PRAGMA user_version = 4")
    db.commit()
    db.close()
    database = open_database(str(data))
    try:
        assert database.unique_keys.holder(b"q", b"k") is None  # the index exists: INDEXED BY would fail
        database.insert_task(b"q", (2, 0), stored([b"n", b"1"]), 0, 0, "available", None, 0, unique_key=b"k")
        assert database.unique_keys.holder(b"q", b"k") == (2, 0)
        with pytest.raises(sqlite3.IntegrityError):  # the index itself refuses a second holder
            database.insert_task(b"q", (3, 0), stored([]), 0, 0, "delayed", None, 0, unique_key=b"k")
        assert database.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 6
        assert database.conn.execute("SELECT count(*), count(unique_key) FROM tasks").fetchone() == (2, 1)
    finally:
        database.conn.close()


def test_the_holder_lookup_uses_the_partial_index(tmp_path):
    database = open_database(str(tmp_path / "data"))
    try:
        plan = database.conn.execute(
            "EXPLAIN QUERY PLAN SELECT id_ms, id_seq FROM tasks WHERE queue = 'q' AND unique_key = 'k' "
            "AND state IN ('available', 'delayed', 'in_flight')").fetchall()
        assert "tasks_unique" in str(plan)
    finally:
        database.conn.close()


def ezra_cli(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "ezra", *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    return result


def test_export_and_import_carry_the_key(ezra_factory, redis_server_port):
    source, target = ezra_factory(), ezra_factory()
    src, dst = source.client(), target.client()
    red = redis.Redis(port=redis_server_port, socket_timeout=30)
    queue = f"jobs-{uuid.uuid4().hex[:8]}"
    keyed, plain = push(src, queue, "UNIQUE", "k"), push(src, queue)
    dead = push(src, queue, "UNIQUE", "gone")
    claim(src, queue)
    src.execute_command("XNACK", queue, "g", "FATAL", "IDS", 1, dead)
    url = f"redis://127.0.0.1:{redis_server_port}"
    ok = ezra_cli("export", "--port", str(source.port), "--to", url, queue)
    assert "verified 3 of 3" in ok.stdout
    assert red.hgetall(f"{queue}::ezra-unique") == {keyed: b"k"}  # a dead task holds no key
    ok = ezra_cli("import", "--from", url, "--port", str(target.port), queue)
    assert "verified 3 of 3" in ok.stdout
    keys = {t[b"id"]: t[b"unique-key"] for t in tasks(dst, queue)}
    assert keys == {keyed: b"k", plain: None}
    assert push(dst, queue, "UNIQUE", "k") == keyed
    assert push(dst, queue, "UNIQUE", "gone") not in (dead, keyed, plain)
    for client in (src, dst, red):
        client.close()


def test_import_of_two_entries_sharing_a_key_keeps_it_on_the_first(ezra_factory, redis_server_port):
    target = ezra_factory()
    dst = target.client()
    red = redis.Redis(port=redis_server_port, socket_timeout=30)
    queue = f"jobs-{uuid.uuid4().hex[:8]}"
    first, second = red.xadd(queue, {"n": "1"}), red.xadd(queue, {"n": "2"})
    red.hset(f"{queue}::ezra-unique", mapping={first: b"k", second: b"k"})
    result = ezra_cli("import", "--from", f"redis://127.0.0.1:{redis_server_port}", "--port", str(target.port),
                      queue)
    assert "verified 2 of 2" in result.stdout
    assert "1 task(s) had a unique key an earlier task of the stream has too" in result.stderr
    assert {t[b"id"]: t[b"unique-key"] for t in tasks(dst, queue)} == {first: b"k", second: None}
    for client in (dst, red):
        client.close()


def test_export_from_the_file_carries_the_key_too(ezra_factory, redis_server_port):
    source = ezra_factory()
    src = source.client()
    red = redis.Redis(port=redis_server_port, socket_timeout=30)
    queue = f"jobs-{uuid.uuid4().hex[:8]}"
    keyed, binary = push(src, queue, "UNIQUE", "k"), push(src, queue, "UNIQUE", b"\xff\xfe")
    result = ezra_cli("export", "--data-dir", str(source.data_dir), "--to", f"redis://127.0.0.1:{redis_server_port}",
                      queue)
    assert "verified 2 of 2" in result.stdout
    assert red.hgetall(f"{queue}::ezra-unique") == {keyed: b"k", binary: b"\xff\xfe"}
    for client in (src, red):
        client.close()


def test_a_lease_that_runs_out_keeps_the_key_until_the_task_dies(ezra_factory, protocol):
    server = ezra_factory("--visibility-timeout", "0.3", "--max-attempts", "2")
    client = server.client(protocol)
    first = push(client, "jobs", "UNIQUE", "k")
    assert claim(client, "jobs") == [first]
    wait_until(lambda: tasks(client, "jobs")[0][b"state"] == b"available", message="the lease to run out")
    assert push(client, "jobs", "UNIQUE", "k") == first  # back to available: still the key's task
    assert claim(client, "jobs") == [first]
    wait_until(lambda: client.xlen("jobs::dead") == 1, message="the second lease to run out: dead")
    second = push(client, "jobs", "UNIQUE", "k")
    assert second != first and client.xlen("jobs") == 1
    client.close()


# ---------------------------------------------------------------- where tasks are listed (finish of issue 26)

HOSTILE_KEY = '<script>window.__xss=1</script>\x1b[31m'


def test_ezra_ls_shows_each_task_s_key(ezra_factory):
    server = ezra_factory()
    client = server.client()
    keyed = push(client, "jobs", "UNIQUE", "<b>\x1b[31m")
    long_key = push(client, "jobs", "UNIQUE", "k" * 256)
    plain = push(client, "jobs")
    client.close()

    def ls(queue):
        result = subprocess.run([sys.executable, "-m", "ezra", "ls", queue, "--port", str(server.port)], cwd=ROOT,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()

    header, *rows = ls("jobs")
    assert header.split()[5:9] == ["unique", "key", "fields", "last"]
    by_id = {row.split()[0]: row for row in rows}
    # control characters escaped (nothing reaches the terminal), a long key cut like fields
    assert "<b>\\x1b[31m" in by_id[keyed.decode()] and "\x1b" not in by_id[keyed.decode()]
    assert "k" * 29 + "…" in by_id[long_key.decode()] and "k" * 30 not in by_id[long_key.decode()]
    assert plain.decode() in by_id
    client = server.client()
    push(client, "plain")
    client.close()
    assert "unique" not in ls("plain")[0]  # no column when no task has a key


def test_the_dashboard_lists_each_task_s_key_escaped(ezra_factory):
    from support_http import http
    server = ezra_factory("--http-port", "0")
    client = server.client()
    dead = push(client, "jobs", "UNIQUE", "dead <b>key</b>")
    assert claim(client, "jobs") == [dead]
    client.execute_command("XNACK", "jobs", "g", "FATAL", "IDS", 1, dead)
    held = push(client, "jobs", "UNIQUE", "held")
    assert claim(client, "jobs") == [held]
    push(client, "jobs", "UNIQUE", HOSTILE_KEY)
    push(client, "jobs", "UNIQUE", "k" * 256)
    push(client, "jobs", "DELAY", 3_600_000, "UNIQUE", "later")
    push(client, "plain")
    client.close()
    status, _, page = http(f"{server.http_url}/queue?name=jobs")
    assert status == 200
    assert b"<script>window" not in page and b"<b>key" not in page
    in_flight = page.split(b'<table class="tasks in-flight">', 1)[1].split(b"</table>", 1)[0]
    assert b'<td class="unique-key">held</td>' in in_flight
    dead_table = page.split(b'<table class="tasks dead">', 1)[1].split(b"</table>", 1)[0]
    assert b'<td class="unique-key">dead &lt;b&gt;key&lt;/b&gt;</td>' in dead_table
    waiting = page.split(b"Next available", 1)[1].split(b"Delayed", 1)[0]
    assert b'<td class="unique-key">&lt;script&gt;window.__xss=1&lt;/script&gt;\x1b[31m</td>' in waiting
    assert b'<td class="unique-key">' + b"k" * 80 + "…".encode() + b"</td>" in waiting  # cut like fields
    assert b'<td class="unique-key">later</td>' in page.split(b"Delayed", 1)[1]
    status, _, page = http(f"{server.http_url}/queue?name=plain")
    assert b"unique key" not in page  # no column when no listed task has a key
