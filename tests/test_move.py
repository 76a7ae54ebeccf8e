"""`ezra export` / `ezra import`: tasks moved between a real EZRA and a real redis-server by the
real `python -m ezra export|import` programs, then consumed on the other side by redis-py and by
the Node.js example worker. Also the protocol extensions they use (XADD ATTEMPTS, XADD q::dead,
XINFO TASKS unfinished) in RESP2 and RESP3, and the progress display."""

from __future__ import annotations

import hashlib
import io
import subprocess
import threading

import pytest
import redis

from support_compat import node_env
from support_move import ezra_cli, ok, raw_client, unique
from support_servers import ROOT
from ezra.tools.progress import Progress

EXAMPLES = ROOT / "examples"
BLOB = bytes(range(256))  # every byte value, NUL and non-UTF-8 ones included


def as_map(reply) -> dict:
    return reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2]))


def ezra_tasks(client: redis.Redis, queue: str, state: str) -> dict:
    """{id: (state, attempts, fields)} of an EZRA queue's tasks in a state (XINFO TASKS)."""
    tasks = map(as_map, client.execute_command("XINFO", "TASKS", queue, state, "COUNT", 10000))
    return {t[b"id"]: (t[b"state"], t[b"attempts"], t[b"fields"]) for t in tasks}


def entries(client: redis.Redis, key: str) -> dict:
    """{id: fields as sent} of a stream."""
    return {entry_id: fields for entry_id, fields in client.execute_command("XRANGE", key, "-", "+")}


def fill(client: redis.Redis, queue: str) -> dict:
    """A queue with a task in each situation; {name: id}. Attempts: b 1 (failed once), c 1 (in
    flight), d 2 (taken over by another worker), e 1 (dead); f, g (delayed), h 0; a is done."""
    client.xgroup_create(queue, "workers", id="0", mkstream=True)
    ids = {name: client.xadd(queue, {"n": name}) for name in "abcde"}
    assert len(client.xreadgroup("workers", "w1", {queue: ">"}, count=5)[0][1]) == 5
    client.xack(queue, "workers", ids["a"])
    client.execute_command("XNACK", queue, "workers", "FAIL", "IDS", 1, ids["b"])
    client.xclaim(queue, "workers", "w2", 0, [ids["d"]])
    client.execute_command("XNACK", queue, "workers", "FATAL", "IDS", 1, ids["e"])
    ids["f"] = client.execute_command("XADD", queue, "*", "to", "ada", "blob", BLOB, "to", "again")
    ids["g"] = client.execute_command("XADD", queue, "DELAY", 3600, "*", "n", "later")
    ids["h"] = client.execute_command("XADD", queue, "*", "empty", "")
    return ids


def expected_after_move(source: redis.Redis, queue: str) -> tuple[dict, dict]:
    """What the other side must hold: unfinished tasks as available, dead ones as dead, same
    ids, attempts and fields."""
    unfinished = {task_id: (b"available", attempts, fields)
                  for task_id, (_, attempts, fields) in ezra_tasks(source, queue, "unfinished").items()}
    return unfinished, ezra_tasks(source, queue, "dead")


# ---------------------------------------------------------------- EZRA -> Redis -> EZRA

def test_round_trip_keeps_every_task_id_field_and_attempt(ezra_factory, redis_server_port):
    source, target = ezra_factory("--max-attempts", "5"), ezra_factory()
    src, red = raw_client(source.port), raw_client(redis_server_port)
    queue, other, finished = unique("orders"), unique("mails"), unique("finished")
    ids = fill(src, queue)
    other_id = src.xadd(other, {"k": "v"})
    src.xadd(finished, {"k": "v"})
    src.xreadgroup("g", "w", {finished: ">"})
    src.xack(finished, "g", *[i for i, _ in entries(src, finished).items()])
    unfinished, dead = expected_after_move(src, queue)
    assert set(unfinished) == {ids[n] for n in "bcdfgh"} and set(dead) == {ids["e"]}
    redis_url = f"redis://127.0.0.1:{redis_server_port}"

    dry = ok(ezra_cli("export", "--port", str(source.port), "--to", redis_url, "--dry-run"))
    rows = {line.split()[0]: line.split()[1:] for line in dry.stdout.splitlines()[2:]}
    #                 available delayed in-flight dead already to-copy group
    assert rows[queue] == ["3", "1", "2", "1", "0", "7", "workers"]
    assert rows[other] == ["1", "0", "0", "0", "0", "1", "default"]
    assert red.exists(queue, f"{queue}::dead", f"{queue}::ezra-attempts", other, finished) == 0

    first = ok(ezra_cli("export", "--port", str(source.port), "--to", redis_url))  # every queue
    assert f"{queue}: 7 copied, 0 already there" in first.stdout and "verified 7 of 7 in Redis" in first.stdout
    assert f"{queue}: 1 delayed task(s) become available at once" in first.stderr
    assert entries(red, queue) == {task_id: fields for task_id, (_, _, fields) in unfinished.items()}
    assert list(entries(red, queue)) == sorted(unfinished, key=lambda i: tuple(map(int, i.split(b"-"))))
    assert entries(red, f"{queue}::dead") == {ids["e"]: [b"n", b"e"]}
    assert entries(red, queue)[ids["f"]] == [b"to", b"ada", b"blob", BLOB, b"to", b"again"]
    assert red.hgetall(f"{queue}::ezra-attempts") == {ids["b"]: b"1", ids["c"]: b"1", ids["d"]: b"2",
                                                      ids["e"]: b"1"}
    [group] = red.xinfo_groups(queue)
    assert (group["name"], group["last-delivered-id"], group["pending"]) == (b"workers", b"0-0", 0)
    assert list(entries(red, other)) == [other_id] and red.exists(finished) == 0

    again = ok(ezra_cli("export", "--port", str(source.port), "--to", redis_url, queue))
    assert f"{queue}: 0 copied, 7 already there" in again.stdout and "verified 7 of 7" in again.stdout
    assert red.xlen(queue) == 6 and red.xlen(f"{queue}::dead") == 1

    dry_in = ok(ezra_cli("import", "--port", str(target.port), "--from", redis_url, queue, "--dry-run"))
    #                                   new pending done dead already to-copy group
    assert dry_in.stdout.splitlines()[2].split() == [queue, "6", "0", "0", "1", "0", "7", "workers"]
    assert target.client().exists(queue) == 0

    into = ok(ezra_cli("import", "--port", str(target.port), "--from", redis_url, queue))
    assert f"{queue}: 7 copied, 0 already there" in into.stdout and "verified 7 of 7 in EZRA" in into.stdout
    dst = raw_client(target.port)
    assert expected_after_move(dst, queue) == (unfinished, dead)
    assert as_map(dst.execute_command("XINFO", "GROUPS", queue)[0])[b"name"] == b"workers"

    rerun = ok(ezra_cli("import", "--port", str(target.port), "--from", redis_url, queue))
    assert f"{queue}: 0 copied, 7 already there" in rerun.stdout
    assert dst.xlen(queue) == 6 and dst.xlen(f"{queue}::dead") == 1


def test_export_from_the_data_dir_running_or_stopped(ezra_factory, redis_server_port):
    source = ezra_factory()
    src, red = raw_client(source.port), raw_client(redis_server_port)
    queue = unique("files")
    fill(src, queue)
    unfinished, dead = expected_after_move(src, queue)
    redis_url = f"redis://127.0.0.1:{redis_server_port}"
    running = ok(ezra_cli("export", "--data-dir", str(source.data_dir), "--to", redis_url, "--dry-run"))
    assert running.stdout.splitlines()[2].split() == [queue, "3", "1", "2", "1", "0", "7", "workers"]

    assert source.stop() == 0
    database = source.data_dir / "ezra.db"
    before = hashlib.sha256(database.read_bytes()).digest()
    result = ok(ezra_cli("export", "--data-dir", str(source.data_dir), "--to", redis_url))
    assert f"{queue}: 7 copied" in result.stdout and "verified 7 of 7 in Redis" in result.stdout
    assert hashlib.sha256(database.read_bytes()).digest() == before  # read-only: not a byte changed
    assert entries(red, queue) == {task_id: fields for task_id, (_, _, fields) in unfinished.items()}
    assert entries(red, f"{queue}::dead") == {task_id: fields for task_id, (_, _, fields) in dead.items()}
    assert red.hgetall(f"{queue}::ezra-attempts") == {
        task_id: b"%d" % attempts for task_id, (_, attempts, _) in {**unfinished, **dead}.items() if attempts}


def test_import_into_a_stopped_servers_data_dir(ezra_factory, redis_server_port):
    red = raw_client(redis_server_port)
    queue = unique("intodir")
    ids = [red.xadd(queue, {"n": str(n)}) for n in range(3)]
    target = ezra_factory()
    redis_url = f"redis://127.0.0.1:{redis_server_port}"
    refused = ezra_cli("import", "--data-dir", str(target.data_dir), "--from", redis_url, queue)
    assert refused.returncode == 1 and "in use (is EZRA running on it?)" in refused.stderr
    assert target.client().exists(queue) == 0
    assert target.stop() == 0
    result = ok(ezra_cli("import", "--data-dir", str(target.data_dir), "--from", redis_url, queue))
    assert f"{queue}: 3 copied" in result.stdout and "no group" in result.stdout
    target.start()
    assert list(ezra_tasks(target.client(), queue, "available")) == ids


def test_a_rerun_copies_only_what_came_since(ezra_factory, redis_server_port):
    source, target = ezra_factory(), ezra_factory()
    src, red = source.client(), raw_client(redis_server_port)
    queue = unique("growing")
    redis_url = f"redis://127.0.0.1:{redis_server_port}"
    first = [src.xadd(queue, {"n": str(n)}) for n in range(3)]
    out = ok(ezra_cli("export", "--port", str(source.port), "--to", redis_url, "--group", "mailers", queue))
    assert "EZRA knows no group name" not in out.stderr and "group 'mailers'" in out.stdout
    later = [src.xadd(queue, {"n": str(n)}) for n in range(3, 5)]
    out = ok(ezra_cli("export", "--port", str(source.port), "--to", redis_url, "--group", "mailers", queue))
    assert f"{queue}: 2 copied, 3 already there" in out.stdout and "verified 5 of 5" in out.stdout
    assert list(entries(red, queue)) == first + later and red.xinfo_groups(queue)[0]["name"] == b"mailers"

    ok(ezra_cli("import", "--port", str(target.port), "--from", redis_url, queue))
    newest = red.xadd(queue, {"n": "5"})
    out = ok(ezra_cli("import", "--port", str(target.port), "--from", redis_url, queue))
    assert f"{queue}: 1 copied, 5 already there" in out.stdout and "verified 6 of 6 in EZRA" in out.stdout
    assert list(ezra_tasks(target.client(), queue, "available")) == first + later + [newest]


# ---------------------------------------------------------------- consumed on the Redis side

def test_redis_py_workers_do_every_exported_task_once(ezra_factory, redis_server_port):
    source = ezra_factory()
    src = source.client()
    queue = unique("consumed")
    src.xgroup_create(queue, "workers", id="0", mkstream=True)
    pushed = [src.xadd(queue, {"n": str(n)}) for n in range(60)]
    src.xreadgroup("workers", "old-worker", {queue: ">"}, count=10)  # in flight: exported as new
    ok(ezra_cli("export", "--port", str(source.port), "--to", f"redis://127.0.0.1:{redis_server_port}", queue))
    done, lock = [], threading.Lock()

    def work(name: str) -> None:
        client = redis.Redis(port=redis_server_port, socket_timeout=30)
        while reply := client.xreadgroup("workers", name, {queue: ">"}, count=7, block=500):
            for task_id, _ in reply[0][1]:
                with lock:
                    done.append(task_id)
                client.xack(queue, "workers", task_id)
        client.close()

    workers = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert sorted(done) == sorted(pushed) and len(done) == len(set(done))
    assert redis.Redis(port=redis_server_port).xpending(queue, "workers")["pending"] == 0


@pytest.mark.slow  # Node.js, as the clients family: not in `pytest -m "not slow"`
def test_node_example_worker_consumes_the_exported_stream(ezra_factory, redis_server_port):
    env = node_env()  # skips when Node.js or its modules are missing
    source = ezra_factory()
    src = source.client()
    queue = unique("node")
    src.xgroup_create(queue, "workers", id="0", mkstream=True)  # the group examples/node/worker.js uses
    pushed = [src.xadd(queue, {"to": f"user{n}@example.com"}).decode() for n in range(10)]
    ok(ezra_cli("export", "--port", str(source.port), "--to", f"redis://127.0.0.1:{redis_server_port}", queue))
    env = dict(env, QUEUE=queue, MAX_TASKS="5", IDLE_TIMEOUT="10")
    workers = [subprocess.Popen(["node", str(EXAMPLES / "node" / "worker.js"), str(redis_server_port)],
                                stdout=subprocess.PIPE, text=True, env=dict(env, WORKER_NAME=f"node{i}"))
               for i in (1, 2)]
    done = []
    for proc in workers:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        done += [line.split()[1] for line in out.splitlines()]
    assert sorted(done) == sorted(pushed) and len(done) == len(set(done))
    assert redis.Redis(port=redis_server_port).xpending(queue, "workers")["pending"] == 0


# ---------------------------------------------------------------- Redis -> EZRA

def test_import_of_a_redis_stream_used_as_a_queue(ezra_factory, redis_server_port):
    red = raw_client(redis_server_port)
    queue = unique("billing")
    red.xgroup_create(queue, "billing", id="0", mkstream=True)
    e = [red.xadd(queue, {"n": str(n)}) for n in range(10)]
    assert len(red.xreadgroup("billing", "c1", {queue: ">"}, count=6)[0][1]) == 6
    red.xack(queue, "billing", e[0], e[1], e[2])                # done in Redis: not copied
    red.xclaim(queue, "billing", "c2", 0, [e[4]])               # delivered twice
    red.xdel(queue, e[5])                                       # pending, but its entry is gone
    # A dead-letter stream has ids of its own: this one's first id is an id of the queue's stream too.
    dead = [red.execute_command("XADD", f"{queue}::dead", task_id, "why", "poison") for task_id in (e[9], "*")]
    ms, seq = map(int, e[9].split(b"-"))
    moved = b"%d-%d" % (ms, seq + 2 ** 62)  # after every id Redis makes in that millisecond
    target = ezra_factory()
    redis_url = f"redis://127.0.0.1:{redis_server_port}"

    result = ok(ezra_cli("import", "--port", str(target.port), "--from", redis_url, queue))
    assert f"{queue}: 8 copied, 0 already there (4 new, 2 pending" in result.stdout
    assert "3 done in Redis, not copied" in result.stdout and "verified 8 of 8 in EZRA" in result.stdout
    assert "1 pending entry is no longer in the stream" in result.stderr
    assert f"1 dead entry of {queue}::dead had an id of {queue} too" in result.stderr
    dst = target.client()
    assert {task_id: attempts for task_id, (_, attempts, _) in ezra_tasks(dst, queue, "available").items()} == {
        e[3]: 1, e[4]: 2, e[6]: 0, e[7]: 0, e[8]: 0, e[9]: 0}
    assert {task_id: fields for task_id, (_, _, fields) in ezra_tasks(dst, queue, "dead").items()} == {
        moved: [b"why", b"poison"], dead[1]: [b"why", b"poison"]}
    assert as_map(dst.execute_command("XINFO", "GROUPS", queue)[0])[b"name"] == b"billing"

    red.xgroup_create(queue, "audit", id="0")
    several = ezra_cli("import", "--port", str(target.port), "--from", redis_url, queue)
    assert several.returncode == 1 and "2 consumer groups (audit, billing): --group names" in several.stderr
    chosen = ok(ezra_cli("import", "--port", str(target.port), "--from", redis_url, "--group", "billing", queue))
    assert f"{queue}: 0 copied, 8 already there" in chosen.stdout
    assert dst.xlen(queue) == 6 and dst.xlen(f"{queue}::dead") == 2

    fresh = unique("nogroup")
    plain = [red.xadd(fresh, {"n": str(n)}) for n in range(3)]
    ok(ezra_cli("import", "--port", str(target.port), "--from", redis_url, fresh))
    assert list(ezra_tasks(dst, fresh, "available")) == plain  # no group: nothing was delivered yet


def test_a_stream_that_cannot_take_the_ids_is_reported_and_the_rest_moves(ezra_factory, redis_server_port):
    source = ezra_factory()
    src, red = source.client(), raw_client(redis_server_port)
    crowded, fine, wrong = unique("crowded"), unique("fine"), unique("wrongtype")
    for name in (crowded, fine, wrong):
        src.xadd(name, {"n": "1"})
    red.xadd(crowded, {"from": "a producer already on Redis"})  # a newer id than EZRA's task
    red.rpush(wrong, "not a stream")
    result = ezra_cli("export", "--port", str(source.port), "--to", f"redis://127.0.0.1:{redis_server_port}",
                      crowded, fine, wrong)
    assert result.returncode == 1
    assert f"{crowded}: verification failed: 1 of 1 tasks are not in Redis (1 were taken as already there" \
        in result.stderr
    assert f"{wrong}: {wrong} is a list at" in result.stderr and red.lrange(wrong, 0, -1) == [b"not a stream"]
    assert f"{fine}: 1 copied" in result.stdout and red.xlen(fine) == 1
    missing = ezra_cli("export", "--port", str(source.port), "--to", f"redis://127.0.0.1:{redis_server_port}",
                       unique("nosuch"))
    assert missing.returncode == 1 and "no such queue in EZRA" in missing.stderr
    unreachable = ezra_cli("export", "--port", str(source.port), "--to", "redis://127.0.0.1:1", fine)
    assert unreachable.returncode == 1 and "cannot reach 127.0.0.1:1" in unreachable.stderr


def test_the_servers_config_file_finds_the_port_but_not_a_data_dir(ezra_factory, redis_server_port, tmp_path):
    source = ezra_factory()
    queue = unique("configured")
    source.client().xadd(queue, {"n": "1"})
    config = tmp_path / "ezra.conf"
    config.write_text(f"port = {source.port}\ndata-dir = {tmp_path / 'elsewhere'}\n")
    result = ok(ezra_cli("export", "--config", str(config), "--to", f"redis://127.0.0.1:{redis_server_port}",
                         "--dry-run", queue))
    assert result.stdout.splitlines()[2].split() == [queue, "1", "0", "0", "0", "0", "1", "default"]


# ---------------------------------------------------------------- the extensions they use

def test_xadd_attempts_counts_deliveries_made_elsewhere(shared_server, protocol, queue):
    r = shared_server.client(protocol)  # --max-attempts 3
    task_id = r.execute_command("XADD", queue, "ATTEMPTS", 2, "*", "n", "1")
    assert ezra_tasks(r, queue, "available")[task_id][1] == 2
    r.xreadgroup("g", "w", {queue: ">"})
    assert r.xpending_range(queue, "g", "-", "+", 10)[0]["times_delivered"] == 3
    r.execute_command("XNACK", queue, "g", "FAIL", "IDS", 1, task_id)
    assert r.xlen(f"{queue}::dead") == 1  # its third delivery failed: no attempts left
    for bad in ("-1", "2147483648", "x"):
        with pytest.raises(redis.ResponseError, match="ATTEMPTS must be an integer from 0 to 2147483647"):
            r.execute_command("XADD", queue, "ATTEMPTS", bad, "*", "n", "2")
    assert r.xlen(queue) == 0


def test_xadd_on_the_dead_view_pushes_a_dead_task(shared_server, protocol, queue):
    r = shared_server.client(protocol)
    assert r.execute_command("XADD", f"{queue}::dead", "ATTEMPTS", 3, "5-1", "n", "1") == b"5-1"
    assert (r.xlen(queue), r.xlen(f"{queue}::dead")) == (0, 1)
    assert ezra_tasks(r, queue, "dead") == {b"5-1": (b"dead", 3, [b"n", b"1"])}
    with pytest.raises(redis.ResponseError, match="equal or smaller"):  # one id space with the queue
        r.execute_command("XADD", queue, "5-1", "n", "2")
    with pytest.raises(redis.ResponseError, match="DELAY does not apply to a dead task"):
        r.execute_command("XADD", f"{queue}::dead", "DELAY", 5, "*", "n", "3")
    assert r.execute_command("XREQUEUE", queue, "ALL") == 1
    assert ezra_tasks(r, queue, "available") == {b"5-1": (b"available", 0, [b"n", b"1"])}


def test_xinfo_tasks_unfinished_pages_in_id_order(shared_server, protocol, queue):
    r = shared_server.client(protocol)
    done, held, later, waiting = (r.execute_command("XADD", queue, *delay, "*", "n", str(n))
                                  for n, delay in enumerate(([], [], ["DELAY", 600], [])))
    r.xreadgroup("g", "w", {queue: ">"}, count=2)
    r.xack(queue, "g", done)
    page = r.execute_command("XINFO", "TASKS", queue, "unfinished", "COUNT", 2)
    assert [(t[b"id"], t[b"state"], t[b"attempts"]) for t in map(as_map, page)] == [
        (held, b"in_flight", 1), (later, b"delayed", 0)]
    rest = r.execute_command("XINFO", "TASKS", queue, "unfinished", "COUNT", 2, "AFTER", later)
    assert [(t[b"id"], t[b"state"]) for t in map(as_map, rest)] == [(waiting, b"available")]


# ---------------------------------------------------------------- progress

class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_bar_on_a_terminal_and_periodic_lines_elsewhere():
    now = [0.0]
    plain = io.StringIO()
    progress = Progress("export q", 1000, stream=plain, interval=10, clock=lambda: now[0])
    for _ in range(25):
        now[0] += 1
        progress.advance(20)
    progress.finish()
    assert plain.getvalue().splitlines() == ["export q:  20% 200/1,000 tasks, 20/s",
                                             "export q:  40% 400/1,000 tasks, 20/s"]
    screen = Terminal()
    bar = Progress("import q", 10, stream=screen, clock=lambda: now[0])
    for _ in range(10):
        now[0] += 1
        bar.advance()
    bar.finish()
    shown = screen.getvalue()
    assert shown.startswith("\rimport q [###......") and shown.endswith("100% 10/10 tasks, 1/s\033[K\n")
    assert shown.count("\r") == 11  # redrawn in place, then closed with a newline
