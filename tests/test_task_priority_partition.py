"""XADD PRIORITY p and PARTITION key (issue 47, the storage half): every task carries its priority
(0-9; the default, 5, when pushed without one) and its partition, stored in its row (tasks.priority,
tasks.partition_key, NULL when not given), kept through every transition and a restart, shown by
XINFO TASKS, `ezra ls`, the dashboard's task page and the sqlite3 shell, and carried by ezra export
and import. Through the real server, redis-py in RESP2 and RESP3. (The claim order that priorities
and partitions give is not here: only that each task keeps both.)"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import uuid

import pytest
import redis

from support_files import hand_rowids, schema_14_text, write_old_file
from support_servers import ROOT, wait_until
from ezra.lifecycle import DEFAULT_PRIORITY
from ezra.storage import SCHEMA_VERSION


def push(client, queue, *options, fields=("n", "1")):
    return client.execute_command("XADD", queue, *options, "*", *fields)


def tasks(client, queue, state="unfinished") -> dict:
    """{id: (state, priority, partition)} of a queue's tasks in a state (XINFO TASKS)."""
    reply = client.execute_command("XINFO", "TASKS", queue, state, "COUNT", 1000)
    found = [t if isinstance(t, dict) else dict(zip(t[::2], t[1::2])) for t in reply]
    return {t[b"id"]: (t[b"state"], t[b"priority"], t[b"partition"]) for t in found}


def claim(client, queue, count=10) -> list:
    reply = client.xreadgroup("g", "w", {queue: ">"}, count=count)
    if not reply:
        return []
    entries = reply[queue.encode()][0] if isinstance(reply, dict) else reply[0][1]
    return [task_id for task_id, _ in entries]


def rows(path, sql: str, *params) -> list:
    """What the sqlite3 shell shows of the file (read-only, beside the server or after it)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute(sql, params).fetchall()
    finally:
        db.close()


def ezra_cli(*args: str, code: int = 0) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "ezra", *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert result.returncode == code, f"{result.stdout}\n{result.stderr}"
    return result


# ---------------------------------------------------------------- XADD

def test_each_task_keeps_the_priority_and_partition_it_was_pushed_with(r, queue):
    first = push(r, queue, "PRIORITY", 0)
    second = push(r, queue, "priority", 9, "partition", "tenant-a")  # any case, any order among the options
    plain = push(r, queue)
    binary = push(r, queue, "PARTITION", b"\xff\x00p", "PRIORITY", 3, "DELAY", 3600)
    longest = push(r, queue, "PARTITION", "k" * 256)
    assert tasks(r, queue) == {
        first: (b"available", 0, None), second: (b"available", 9, b"tenant-a"),
        plain: (b"available", DEFAULT_PRIORITY, None), binary: (b"delayed", 3, b"\xff\x00p"),
        longest: (b"available", DEFAULT_PRIORITY, b"k" * 256)}
    assert r.xlen(queue) == 5
    # the fields are as they are without the options (XRANGE does not show them)
    assert [fields for _, fields in r.xrange(queue)] == [{b"n": b"1"}] * 5


@pytest.mark.parametrize("options, message", [
    (("PRIORITY", "10"), "PRIORITY must be an integer from 0 to 9"),
    (("PRIORITY", "-1"), "PRIORITY must be an integer from 0 to 9"),
    (("PRIORITY", "x"), "PRIORITY must be an integer from 0 to 9"),
    (("PRIORITY", "1_0"), "PRIORITY must be an integer from 0 to 9"),
    (("PRIORITY", "+1"), "PRIORITY must be an integer from 0 to 9"),
    (("PRIORITY", " 1"), "PRIORITY must be an integer from 0 to 9"),
    (("PRIORITY", "05"), "PRIORITY must be an integer from 0 to 9"),
    (("PRIORITY", "1.0"), "PRIORITY must be an integer from 0 to 9"),
    (("PRIORITY", ""), "PRIORITY must be an integer from 0 to 9"),
    (("PRIORITY", "1", "PRIORITY", "1"), "PRIORITY specified multiple times"),
    (("PARTITION", ""), "PARTITION requires a non-empty key"),
    (("PARTITION", "k" * 257), "PARTITION key is 257 bytes long; at most 256 bytes"),
    (("PARTITION", "a", "PARTITION", "b"), "PARTITION specified multiple times"),
])
def test_a_bad_priority_or_partition_is_refused_and_stores_nothing(r, queue, options, message):
    with pytest.raises(redis.ResponseError, match=f"^{message}$"):
        push(r, queue, *options)
    assert r.exists(queue) == 0 and r.xlen(queue) == 0  # no task, not even the queue
    # positive control: the same queue takes a good push
    assert push(r, queue, "PRIORITY", 1) and r.xlen(queue) == 1


def test_a_pipeline_of_pushes_keeps_each_push_s_options(r, queue):
    """Plain XADDs in a pipeline are stored as one run; one with PRIORITY or PARTITION ends it."""
    pipe = r.pipeline(transaction=False)
    pipe.xadd(queue, {"n": 1})
    pipe.execute_command("XADD", queue, "PRIORITY", 2, "PARTITION", "p", "*", "n", 2)
    pipe.xadd(queue, {"n": 3})
    pipe.execute_command("XADD", queue, "PRIORITY", 99, "*", "n", 4)  # refused alone
    pipe.xadd(queue, {"n": 5})
    *ids, refused, last = pipe.execute(raise_on_error=False)
    assert isinstance(refused, redis.ResponseError)
    assert [tasks(r, queue)[task_id][1:] for task_id in (*ids, last)] == [
        (DEFAULT_PRIORITY, None), (2, b"p"), (DEFAULT_PRIORITY, None), (DEFAULT_PRIORITY, None)]


def test_the_sqlite3_shell_reads_both_and_a_plain_push_writes_neither(ezra_factory):
    server = ezra_factory()
    client = server.client()
    plain = push(client, "jobs")
    placed = push(client, "jobs", "PRIORITY", 1, "PARTITION", "tenant-a")
    binary = push(client, "jobs", "PARTITION", b"\xff")
    client.close()
    server.stop()
    path = server.data_dir / "ezra.db"
    # the view: the effective priority (the default where none was given), the partition
    assert rows(path, "SELECT id, priority, partition_key FROM tasks_readable ORDER BY id_ms, id_seq") == [
        (plain.decode(), DEFAULT_PRIORITY, None), (placed.decode(), 1, "tenant-a"),
        (binary.decode(), DEFAULT_PRIORITY, b"\xff")]
    # the table: NULL where the push gave nothing (a plain push binds no new column); BLOB when not UTF-8
    assert rows(path, "SELECT priority, partition_key, typeof(partition_key) FROM tasks ORDER BY rowid") == [
        (None, None, "null"), (1, "tenant-a", "text"), (None, b"\xff", "blob")]
    assert rows(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]


# ---------------------------------------------------------------- kept through every transition

def test_both_survive_nack_backoff_expiry_death_requeue_and_restarts(ezra_factory, protocol):
    server = ezra_factory("--max-attempts", "2")
    client = server.client(protocol)
    task = push(client, "jobs", "PRIORITY", 2, "PARTITION", "tenant-a")
    client.execute_command("XCFGSET", "jobs", "BACKOFF", "FIXED", "2")
    other = push(client, "jobs", "PARTITION", "tenant-b")
    expected = {task: (2, b"tenant-a"), other: (DEFAULT_PRIORITY, b"tenant-b")}

    def holds(state: bytes, queue="jobs", kind="unfinished") -> None:
        found = tasks(client, queue, kind)
        assert {task_id: shown[1:] for task_id, shown in found.items()} == expected
        assert {shown[0] for shown in found.values()} == {state}

    assert claim(client, "jobs") == [task, other]
    holds(b"in_flight")
    assert client.execute_command("XNACK", "jobs", "g", "FAIL", "IDS", 2, task, other) == 2
    holds(b"delayed")  # the queue's backoff (2 s)
    wait_until(lambda: {s[0] for s in tasks(client, "jobs").values()} == {b"available"}, message="the backoff")
    holds(b"available")
    assert claim(client, "jobs") == [task, other]  # attempt 2
    assert client.execute_command("XNACK", "jobs", "g", "SILENT", "IDS", 2, task, other) == 2  # given back: 1
    holds(b"available")
    client.execute_command("XCFGSET", "jobs", "VISIBILITY-TIMEOUT", "0.2")
    assert claim(client, "jobs") == [task, other]  # attempt 2 again, its lease runs out: the last
    wait_until(lambda: client.xlen("jobs::dead") == 2, message="the last lease to run out: dead")
    holds(b"dead", kind="dead")
    server.kill9()  # a crash: the start reads every row (and checks them)
    server.start()
    client = server.client(protocol)
    holds(b"dead", kind="dead")
    assert client.execute_command("XREQUEUE", "jobs", "ALL") == 2
    holds(b"available")
    server.restart()  # a clean stop and start
    client = server.client(protocol)
    holds(b"available")
    assert client.xlen("jobs") == 2
    client.close()


def test_a_dead_letter_pushed_to_the_dead_queue_keeps_both_and_a_requeue_keeps_them(r, queue):
    dead = push(r, f"{queue}::dead", "PRIORITY", 0, "PARTITION", "p", "ATTEMPTS", 3)
    assert tasks(r, queue, "dead") == {dead: (b"dead", 0, b"p")}
    assert r.execute_command("XREQUEUE", queue, "IDS", 1, dead) == 1
    assert tasks(r, queue) == {dead: (b"available", 0, b"p")}
    assert claim(r, queue) == [dead]


def test_a_hand_written_row_with_a_priority_xadd_refuses_is_set_aside(ezra_factory):
    server = ezra_factory()
    client = server.client()
    push(client, "jobs")
    client.close()
    server.stop()
    path = server.data_dir / "ezra.db"
    db = sqlite3.connect(path)
    first, second, third, fourth, fifth, sixth = hand_rowids(db, "jobs", 6)
    # keys of 200 bytes in 100 characters (kept) and of 280 in 70 (set aside): the check counts bytes
    db.executemany("INSERT INTO tasks (rowid, queue, id_ms, id_seq, state, fields, created_at, available_at, "
                   "priority, partition_key) VALUES (?, 'jobs', 9999999999999, ?, 'available', '[\"n\", \"v\"]', "
                   "0, 0, ?, ?)", [(first, 0, 1, "mine"), (second, 1, 42, None), (third, 2, None, "k" * 300),
                                   (fourth, 3, None, ""), (fifth, 4, None, "\U0001f600" * 70),
                                   (sixth, 5, 2, "\u00e9" * 100)])
    db.commit()
    db.close()
    server.start()
    client = server.client()
    # positive control: the good row is served with its priority and partition
    assert tasks(client, "jobs")[b"9999999999999-0"] == (b"available", 1, b"mine")
    assert tasks(client, "jobs")[b"9999999999999-5"] == (b"available", 2, ("\u00e9" * 100).encode())
    assert client.xlen("jobs") == 3
    client.close()
    server.stop()
    set_aside = "SELECT id_seq, priority, length(partition_key), reason FROM unreadable_tasks ORDER BY id_seq"
    assert [row[:3] for row in rows(path, set_aside)] == [(1, 42, None), (2, None, 300), (3, None, 0), (4, None, 70)]
    assert rows(path, set_aside)[:2] == [
        (1, 42, None, "its priority (42) is not an integer from 0 to 9 (NULL: the default)"),
        (2, None, 300, "its partition key ('" + "k" * 59 + ") is not 1 to 256 bytes of text or a BLOB (NULL: none)")]


# ---------------------------------------------------------------- where tasks are shown

def test_ezra_ls_shows_priority_and_partition_columns_when_a_task_has_one(ezra_factory):
    server = ezra_factory()
    client = server.client()
    placed = push(client, "jobs", "PRIORITY", 0, "PARTITION", "tenant-\x1b[31m")
    plain = push(client, "jobs")
    push(client, "plain")
    push(client, "plain", "PRIORITY", DEFAULT_PRIORITY)
    client.close()

    def ls(queue):
        return ezra_cli("ls", queue, "--port", str(server.port)).stdout.splitlines()

    header, *listed = ls("jobs")
    assert header.split()[5:7] == ["priority", "partition"]
    by_id = {row.split()[0]: row for row in listed}
    start, end = header.index("priority"), header.index("partition")

    def cells(task_id):  # the priority and partition columns of a task's row (left-aligned)
        row = by_id[task_id.decode()]
        return row[start:end].strip(), row[end:].split()[0] if row[end:].strip() else ""

    assert cells(placed) == ("0", "tenant-\\x1b[31m")  # escaped: nothing reaches the terminal
    assert "\x1b" not in by_id[placed.decode()]
    assert cells(plain)[0] == str(DEFAULT_PRIORITY)
    # no column when every listed task has the default priority and none a partition
    assert "priority" not in ls("plain")[0] and "partition" not in ls("plain")[0]


def test_the_dashboard_task_page_shows_priority_and_partition(ezra_factory):
    from support_http import http
    server = ezra_factory("--http-port", "0")
    client = server.client()
    placed = push(client, "jobs", "PRIORITY", 7, "PARTITION", "<b>tenant</b>")
    plain = push(client, "jobs")
    client.close()
    status, _, page = http(f"{server.http_url}/task?queue=jobs&id={placed.decode()}")
    assert status == 200
    assert b'<th>priority</th><td><span class="priority">7</span></td>' in page
    assert b'<th>partition</th><td><span class="partition">&lt;b&gt;tenant&lt;/b&gt;</span></td>' in page
    status, _, page = http(f"{server.http_url}/task?queue=jobs&id={plain.decode()}")
    assert b'<span class="priority">5</span> <span class="muted">\xc2\xb7 the default</span>' in page
    assert b'<th>partition</th><td><span class="partition"><span class="muted">' in page


# ---------------------------------------------------------------- export and import

def test_export_to_redis_and_import_back_keep_both(ezra_factory, redis_server_port):
    source, target = ezra_factory(), ezra_factory()
    src, dst = source.client(), target.client()
    red = redis.Redis(port=redis_server_port, socket_timeout=30)
    queue = f"jobs-{uuid.uuid4().hex[:8]}"
    placed = push(src, queue, "PRIORITY", 1, "PARTITION", "tenant-a")
    binary = push(src, queue, "PARTITION", b"\xff\xfe", "DELAY", 3600)
    plain = push(src, queue)
    dead = push(src, f"{queue}::dead", "PRIORITY", 8, "PARTITION", "gone")
    url = f"redis://127.0.0.1:{redis_server_port}"
    result = ezra_cli("export", "--port", str(source.port), "--to", url, queue)
    assert "verified 4 of 4" in result.stdout
    assert (f"{queue}: 2 with a priority kept in {queue}::ezra-priorities, 3 with a partition kept in "
            f"{queue}::ezra-partitions") in result.stdout
    assert red.hgetall(f"{queue}::ezra-priorities") == {placed: b"1", dead: b"8"}
    assert red.hgetall(f"{queue}::ezra-partitions") == {placed: b"tenant-a", binary: b"\xff\xfe", dead: b"gone"}
    # the entries are the tasks' fields alone
    assert {entry_id for entry_id, _ in red.xrange(queue)} == {placed, binary, plain}
    result = ezra_cli("import", "--from", url, "--port", str(target.port), queue)
    assert "verified 4 of 4" in result.stdout
    assert f"{queue}: 2 with a priority from {queue}::ezra-priorities" in result.stdout
    assert tasks(dst, queue) == {placed: (b"available", 1, b"tenant-a"), binary: (b"available", 5, b"\xff\xfe"),
                                 plain: (b"available", 5, None)}
    assert tasks(dst, queue, "dead") == {dead: (b"dead", 8, b"gone")}
    assert tasks(src, queue) | tasks(src, queue, "dead") == {
        placed: (b"available", 1, b"tenant-a"), binary: (b"delayed", 5, b"\xff\xfe"),
        plain: (b"available", 5, None), dead: (b"dead", 8, b"gone")}
    for client in (src, dst, red):
        client.close()


def test_export_from_the_file_carries_what_the_row_holds(ezra_factory, redis_server_port):
    source = ezra_factory()
    src = source.client()
    red = redis.Redis(port=redis_server_port, socket_timeout=30)
    queue = f"jobs-{uuid.uuid4().hex[:8]}"
    explicit = push(src, queue, "PRIORITY", DEFAULT_PRIORITY)
    placed = push(src, queue, "PRIORITY", 0, "PARTITION", "p")
    push(src, queue)
    src.close()
    result = ezra_cli("export", "--data-dir", str(source.data_dir), "--to", f"redis://127.0.0.1:{redis_server_port}",
                      queue)
    assert "verified 3 of 3" in result.stdout
    # the row's own priority, the default's too when it was given (through the port, XINFO TASKS
    # shows the default either way: such a task is carried as one without)
    assert red.hgetall(f"{queue}::ezra-priorities") == {explicit: b"5", placed: b"0"}
    assert red.hgetall(f"{queue}::ezra-partitions") == {placed: b"p"}
    red.close()


def test_an_import_with_a_priority_xadd_would_refuse_moves_nothing_of_that_queue(ezra_factory, redis_server_port):
    target = ezra_factory()
    dst = target.client()
    red = redis.Redis(port=redis_server_port, socket_timeout=30)
    queue = f"jobs-{uuid.uuid4().hex[:8]}"
    good, bad = red.xadd(queue, {"n": "1"}), red.xadd(queue, {"n": "2"})
    red.hset(f"{queue}::ezra-priorities", mapping={good: b"3", bad: b"high"})
    result = ezra_cli("import", "--from", f"redis://127.0.0.1:{redis_server_port}", "--port", str(target.port),
                      queue, code=1)
    assert "its ::ezra-priorities hash holds 'high', not a priority (a digit from 0 to 9)" in result.stderr
    assert dst.exists(queue) == 0
    red.hset(f"{queue}::ezra-priorities", bad, b"4")  # positive control: mended, it moves
    assert "verified 2 of 2" in ezra_cli("import", "--from", f"redis://127.0.0.1:{redis_server_port}", "--port",
                                         str(target.port), queue).stdout
    assert {task_id: shown[1] for task_id, shown in tasks(dst, queue).items()} == {good: 3, bad: 4}
    for client in (dst, red):
        client.close()


# ---------------------------------------------------------------- the upgrade

def test_a_schema_14_file_gains_both_columns_and_keeps_its_tasks(ezra_factory, tmp_path):
    fresh = ezra_factory()
    fresh.stop()
    data_dir = tmp_path / "old"
    db = write_old_file(data_dir, schema_14_text(), 14)
    db.execute("INSERT INTO queues (name, last_id_ms, last_id_seq, created_at, number) VALUES ('jobs', 1000, 1, "
               "1000, 1)")
    first, second = hand_rowids(db, "jobs", 2)
    db.executemany("INSERT INTO tasks (rowid, queue, id_ms, id_seq, state, fields, attempts, created_at, "
                   "available_at, finished_at) VALUES (?, 'jobs', 1000, ?, ?, '[\"n\", \"v\"]', ?, 1000, 1000, ?)",
                   [(first, 0, "available", 0, None), (second, 1, "dead", 3, 1500)])
    db.execute("INSERT INTO unreadable_tasks (row, queue, id_ms, id_seq, state, fields, reason, found_at) "
               "VALUES (7, 'jobs', 1, 1, 'available', 'not json', 'set aside before', 1000)")
    db.commit()
    columns = [row[1] for row in db.execute("PRAGMA table_info(tasks)")]
    db.close()
    assert "priority" not in columns and "partition_key" not in columns
    server = ezra_factory(data_dir=data_dir)
    assert f"from schema 14 to {SCHEMA_VERSION}" in server.log()
    client = server.client()
    assert tasks(client, "jobs") == {b"1000-0": (b"available", DEFAULT_PRIORITY, None)}
    assert tasks(client, "jobs", "dead") == {b"1000-1": (b"dead", DEFAULT_PRIORITY, None)}
    placed = push(client, "jobs", "PRIORITY", 4, "PARTITION", "p")
    assert tasks(client, "jobs")[placed] == (b"available", 4, b"p")
    client.close()
    server.stop()
    path = data_dir / "ezra.db"
    assert rows(path, "SELECT id, priority, partition_key FROM tasks_readable ORDER BY id_ms, id_seq") == [
        ("1000-0", 5, None), ("1000-1", 5, None), (placed.decode(), 4, "p")]
    assert rows(path, "SELECT row, reason, priority, partition_key FROM unreadable_tasks") == [
        (7, "set aside before", None, None)]
    # the same columns, in the same order, as a new file's (the tasks table's text differs: SQLite
    # appends an added column to it); the view and unreadable_tasks are a new file's
    for table in ("tasks", "unreadable_tasks", "tasks_readable"):
        info = f"PRAGMA table_info({table})"
        assert rows(path, info) == rows(fresh.data_dir / "ezra.db", info)
    for name in ("unreadable_tasks", "tasks_readable"):
        sql = "SELECT sql FROM sqlite_master WHERE name = ?"
        assert rows(path, sql, name) == rows(fresh.data_dir / "ezra.db", sql, name)
