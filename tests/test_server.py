"""Server-level behaviour: timeouts, restarts, signals, config, bad input, auth."""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import sqlite3
import subprocess
import stat
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis

from support_queue import claim, entries_of
from support_servers import ROOT, wait_until


def raw_exchange(port: int, payload: bytes, expect_close: bool = False) -> bytes:
    """Send raw bytes; read the replies until the server closes (expect_close), or else until
    it answers an ECHO sent after them: the replies come in order, so what came before the
    ECHO's is the payload's whole reply."""
    marker = b"end-%s" % uuid.uuid4().hex.encode()
    echo = b"$%d\r\n%s\r\n" % (len(marker), marker)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(payload if expect_close else payload + b"*2\r\n$4\r\nECHO\r\n" + echo)
        data = b""
        while expect_close or not data.endswith(echo):
            chunk = sock.recv(65536)
            if not chunk:
                assert expect_close, f"closed after {data!r}"
                return data
            data += chunk
        return data.removesuffix(echo)


def test_visibility_timeout_redelivers_then_dead(ezra_factory, protocol):
    server = ezra_factory("--visibility-timeout", "0.3", "--max-attempts", "2")
    r = server.client(protocol)
    task_id = r.xadd("q", {"n": 1})
    [(first, _)] = claim(r, "q", worker="slow")
    assert first == task_id
    # Not acked: after the timeout another worker gets it, as its second attempt.
    redelivered = wait_until(lambda: claim(r, "q", worker="other"), message="redelivery")
    assert redelivered[0][0] == task_id
    assert r.xack("q", "g", task_id) == 1
    # A task that is never acked goes dead after max attempts, not lost.
    poison = r.xadd("q", {"n": 2})
    claim(r, "q", worker="slow")
    wait_until(lambda: claim(r, "q", worker="slow"), message="second delivery")
    wait_until(lambda: r.xlen("q::dead") == 1, message="dead after max attempts")
    assert r.xrange("q::dead")[0][0] == poison
    assert r.xack("q", "g", first) == 0, "a stale ack counts 0"


def test_blocked_reader_gets_a_task_released_by_timeout(ezra_factory):
    server = ezra_factory("--visibility-timeout", "0.5")
    r = server.client()
    task_id = r.xadd("q", {"n": 1})
    claim(r, "q", worker="crashed")
    reply = r.xreadgroup("g", "patient", {"q": ">"}, count=1, block=15000)
    assert entries_of(reply, "q")[0][0] == task_id


def test_kill9_with_tasks_in_flight_loses_nothing(ezra_factory, protocol):
    server = ezra_factory("--max-attempts", "1")
    r = server.client(protocol)
    ids = [r.xadd("jobs", {"n": i}) for i in range(20)]
    claimed = claim(r, "jobs", worker="w", count=5)
    r.xack("jobs", "g", claimed[0][0])
    server.kill9()
    server.start()
    r = server.client(protocol)
    assert r.xlen("jobs") == 19
    # In-flight tasks came back as available (never dead, even with max-attempts 1).
    assert r.xpending("jobs", "g")["pending"] == 0
    assert r.xlen("jobs::dead") == 0
    rest = claim(r, "jobs", worker="w2", count=100)
    assert [i for i, _ in rest] == ids[1:]
    new_id = r.xadd("jobs", {"n": "after"})
    assert new_id > ids[-1], "ids keep growing across restarts"


def test_sigterm_stops_cleanly_and_keeps_everything(ezra_factory):
    server = ezra_factory()
    r = server.client()
    for i in range(10):
        r.xadd("q", {"n": i})
    claim(r, "q", count=3)
    assert server.stop(signal.SIGTERM) == 0
    log = server.log()
    assert "stopped cleanly" in log
    db = sqlite3.connect(server.data_dir / "ezra.db")
    states = dict(db.execute("SELECT state, count(*) FROM tasks GROUP BY state").fetchall())
    db.close()
    # The stop gave the tasks in flight back, as the next start's recovery would have: after a
    # clean stop, that start reads no row to find them (schema 12 keeps no index of them).
    assert states == {"available": 10}
    assert "gave 3 tasks in flight back to available" in log
    server.start()
    assert server.client().xlen("q") == 10


def test_sigterm_answers_a_blocked_reader(ezra_factory):
    server = ezra_factory()
    r = server.client()
    result = {}

    def read():
        try:
            result["reply"] = r.xreadgroup("g", "w", {"q": ">"}, block=0)
        except redis.ConnectionError as exc:
            result["error"] = exc

    thread = threading.Thread(target=read)
    thread.start()
    probe = server.client()
    wait_until(lambda: int(probe.info("clients")["blocked_clients"]) == 1, message="blocked reader")
    probe.close()
    assert server.stop(signal.SIGTERM) == 0
    thread.join(10)
    assert not thread.is_alive()


def test_sigterm_waits_the_grace_for_a_client_that_reads_none_of_its_reply_then_closes_it(ezra_factory):
    """A connection still sending its replies at a stop has SHUTDOWN_GRACE (5 s) to finish, then it is
    closed: one whose client reads nothing neither holds the stop (--client-send-timeout is 60 s) nor is
    cut off before the grace."""
    server = ezra_factory()
    producer = server.client()
    for _ in range(16):
        producer.xadd("big", {"blob": b"x" * 1_000_000})
    producer.close()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as stuck:
        stuck.sendall(b"XRANGE big - +\r\n")  # 16 MB of reply, none of it read
        readable, _, _ = select.select([stuck], [], [], 30)
        assert readable, "the reply began"  # the server's greenlet now waits for the client to read
        started = time.monotonic()
        assert server.stop(signal.SIGTERM) == 0, server.log()
        took = time.monotonic() - started
    assert "stopped cleanly" in server.log()
    assert 4 <= took < 15, f"the stop took {took:.1f} s"


def test_sigterm_as_soon_as_it_listens_stops_it_cleanly(tmp_path):
    """A supervisor (or a test) may stop the server the moment it logs that it listens: the
    signal arrives while the start ends (the collector tuned, the handlers not yet set), and
    the default action killed it mid-way (-15), with no clean stop. Here the signal comes from
    inside App.start, just after it returned: the server must still stop in order."""
    script = (
        "import os, signal, sys\n"
        "from ezra import app\n"
        "started = app.App.start\n"
        "def start_then_term(self):\n"
        "    started(self)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "app.App.start = start_then_term\n"
        "app.main(sys.argv[1:])\n")
    done = subprocess.run([sys.executable, "-c", script, "--port", "0", "--data-dir", str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=60, cwd=str(ROOT),
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "stopped cleanly" in done.stdout + done.stderr


def test_database_is_readable_by_a_person(ezra_factory):
    server = ezra_factory()
    r = server.client()
    task_id = r.xadd("emails", {"to": "a@example.com"})
    claim(r, "emails", worker="worker-1")
    db = sqlite3.connect(server.data_dir / "ezra.db")
    row = db.execute("SELECT queue, id_ms, id_seq, state, fields, attempts, worker FROM tasks").fetchone()
    # The id in its two parts, the fields as a reply sends them (task_fields.py); the documented view
    # shows the id as text and the fields as JSON.
    assert row == ("emails", *map(int, task_id.split(b"-")), "in_flight",
                   b"*2\r\n$2\r\nto\r\n$13\r\na@example.com\r\n", 1, "worker-1")
    row = db.execute("SELECT queue, id, state, fields, json_extract(fields, '$[1]'), attempts, worker "
                     "FROM tasks_readable").fetchone()
    assert row == ("emails", task_id.decode(), "in_flight", '["to","a@example.com"]', "a@example.com", 1, "worker-1")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()
    mode = stat.S_IMODE(os.stat(server.data_dir / "ezra.db").st_mode)
    assert mode == 0o600
    assert stat.S_IMODE(os.stat(server.data_dir).st_mode) == 0o700


def test_refuses_a_foreign_database(ezra_factory, tmp_path):
    data_dir = tmp_path / "foreign"
    data_dir.mkdir()
    db = sqlite3.connect(data_dir / "ezra.db")
    db.execute("CREATE TABLE invoices (id INTEGER)")
    db.commit()
    db.close()
    with pytest.raises(AssertionError, match="not an EZRA database"):
        ezra_factory(data_dir=data_dir)
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "ezra.db").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(AssertionError, match="ezra.db"):
        ezra_factory(data_dir=tmp_path / "garbage")
    db = sqlite3.connect(data_dir / "ezra.db")
    assert db.execute("SELECT name FROM sqlite_master").fetchall() == [("invoices",)], "left untouched"
    db.close()


def test_config_precedence_flag_env_file(ezra_factory, tmp_path):
    config = tmp_path / "ezra.conf"
    config.write_text("max-attempts = 7\nvisibility-timeout = 11\nmax-task-size = 100\n")
    server = ezra_factory("--config", str(config), "--max-task-size", "200",
                          env={"EZRA_VISIBILITY_TIMEOUT": "12"})
    log = server.log()
    assert "max_attempts=7" in log  # from the file
    assert "visibility_timeout=12.0s" in log  # env beats the file
    assert "max_task_size=200" in log  # flag beats everything
    r = server.client()
    with pytest.raises(redis.ResponseError, match="task too large"):
        r.xadd("q", {"x": "y" * 200})


def test_inline_commands_and_pipelines(shared_server):
    assert raw_exchange(shared_server.port, b"PING\r\n") == b"+PONG\r\n"
    assert raw_exchange(shared_server.port, b"ECHO \"a b\"\r\n") == b"$3\r\na b\r\n"
    pipeline = b"*1\r\n$4\r\nPING\r\n" * 3 + b"*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n"
    assert raw_exchange(shared_server.port, pipeline) == b"+PONG\r\n" * 3 + b"$2\r\nhi\r\n"


def test_hello_3_applies_to_commands_pipelined_behind_it(shared_server):
    payload = b"*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n*2\r\n$6\r\nCLIENT\r\n$7\r\nGETNAME\r\n"
    reply = raw_exchange(shared_server.port, payload)
    assert reply.startswith(b"%7\r\n")
    assert reply.endswith(b"_\r\n"), "GETNAME after HELLO 3 answers a RESP3 null"


@pytest.mark.parametrize("frame, error", [
    (b"*abc\r\n", b"-ERR Protocol error: invalid multibulk length\r\n"),
    (b"*99999999999\r\n", b"-ERR Protocol error: invalid multibulk length\r\n"),
    (b"*1\r\n$99999999999\r\n", b"-ERR task too large: an argument of 99999999999 bytes, the limit is 1048576 "
                                 b"(--max-task-size); above 536870912 bytes the connection is closed\r\n"),
    (b"*1\r\n$-5\r\n", b"-ERR Protocol error: invalid bulk length\r\n"),
    (b"*1\r\n+PING\r\n", b"-ERR Protocol error: expected '$', got '+'\r\n"),
    (b"*1\r\n$4\r\nPINGxx", b"-ERR Protocol error: bulk string not terminated by CRLF\r\n"),
])
def test_broken_frames_get_an_error_and_the_connection_closes(shared_server, frame, error):
    assert raw_exchange(shared_server.port, frame, expect_close=True) == error
    assert shared_server.client().ping(), "other clients are unaffected"


def virtual_memory_kb(pid: int) -> int:
    """VmSize: what the process has allocated, touched or not (a bytearray of zeros is not resident)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmSize:\s+(\d+) kB", status, re.M).group(1))


def test_huge_declared_length_allocates_nothing(ezra_factory):
    """Eight clients each declaring a 500 MB argument (under the 512 MiB frame cap, so the
    connection stays open) but sending three bytes of it: the server allocates nothing for
    what has not arrived, and keeps serving others."""
    server = ezra_factory("--max-task-size", str(600_000_000))
    client = server.client()
    before = virtual_memory_kb(server.proc.pid)
    slow = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(8)]
    try:
        for sock in slow:
            sock.sendall(b"*3\r\n$4\r\nXADD\r\n$1\r\nq\r\n$500000000\r\nabc")
        # The positive control: the eight are connected and their frames still pending, not refused.
        wait_until(lambda: client.info("clients")["connected_clients"] == 9, 10, message="eight slow clients")
        assert client.ping()
        for sock in slow:
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                sock.recv(1)  # no reply (no error) yet: the server waits for the rest
        grown_mb = (virtual_memory_kb(server.proc.pid) - before) / 1024
        assert grown_mb < 400, f"{grown_mb:.0f} MB allocated for 4,000 MB declared and 24 bytes sent"
    finally:
        for sock in slow:
            sock.close()


def test_password_protects_every_command(ezra_factory):
    server = ezra_factory("--password", "s3cret")
    anonymous = server.client()
    with pytest.raises(redis.AuthenticationError):
        anonymous.xlen("q")
    with pytest.raises(redis.AuthenticationError):
        server.client(password="wrong").ping()
    assert server.client(password="s3cret").xadd("q", {"a": 1})
    assert server.client(password="s3cret", username="default", protocol=3).xlen("q") == 1
    reply = raw_exchange(server.port, b"XLEN q\r\nAUTH default nope\r\nAUTH s3cret\r\nXLEN q\r\n")
    assert reply == (b"-NOAUTH Authentication required.\r\n"
                     b"-WRONGPASS invalid username-password pair or user is disabled.\r\n+OK\r\n:1\r\n")


def test_connection_commands(r):
    assert r.ping() is True
    assert r.echo("hi") == b"hi"
    assert r.client_setname("worker-7")
    assert r.client_getname() in (b"worker-7", "worker-7")
    assert isinstance(r.client_id(), int)
    assert r.execute_command("CLIENT", "SETINFO", "LIB-NAME", "x") in (b"OK", "OK", True)
    assert r.execute_command("SELECT", 0) in (b"OK", "OK", True)
    with pytest.raises(redis.ResponseError, match="unknown subcommand"):
        r.execute_command("CLIENT", "FOO")
    assert r.command_count() > 10


def test_info_reports_real_figures(ezra_factory, protocol):
    # A server of its own: INFO lists the first 100 queues by name, and a shared server holds more
    r, queue = ezra_factory().client(protocol), "figures"
    r.xadd(queue, {"a": 1})
    r.xadd(queue, {"a": 2})
    claim(r, queue, count=1)
    info = r.info("everything")
    assert info["redis_version"] == "7.0.15"
    assert info["loading"] == 0
    assert info["connected_clients"] >= 1
    assert info["used_memory"] > 1_000_000
    assert info["total_commands_processed"] > 0
    counts = info[f"queue_{queue}"]
    assert counts == {"available": 1, "in_flight": 1, "done": 0, "dead": 0, "delayed": 0,
                      "pushed": 2, "delivered": 1, "acked": 0, "failed": 0, "expired": 0, "paused": 0}


def test_max_clients_refuses_with_redis_error(ezra_factory):
    server = ezra_factory("--max-clients", "2")
    first, second = server.client(), server.client()
    first.ping()
    second.ping()
    with pytest.raises(redis.ConnectionError, match="max number of clients"):
        server.client().ping()
    first.close()
    wait_until(lambda: _can_connect(server), message="a free slot")


def _can_connect(server):
    try:
        return server.client().ping()
    except redis.ConnectionError:
        return False


def _server_side_timer(server_port: int, client_port: int) -> tuple[int, int] | None:
    """(timer kind, clock ticks left) of the server's end of a loopback connection, from /proc/net/tcp.

    Kind 2 is the socket timer that TCP keepalive runs on; 0 is no timer.
    """
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].split(":")[1], 16)
            remote_port = int(fields[2].split(":")[1], 16)
            if (local_port, remote_port) == (server_port, client_port):
                kind, ticks = fields[5].split(":")
                return int(kind, 16), int(ticks, 16)
    return None


@pytest.mark.parametrize("flag, probe_after", [((), 300), (("--tcp-keepalive", "7"), 7), (("--tcp-keepalive", "0"), None)])
def test_tcp_keepalive_probes_silent_clients(ezra_factory, flag, probe_after):
    """A client whose machine died sends no FIN: keepalive probes find it (Redis's tcp-keepalive)."""
    server = ezra_factory(*flag)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"PING\r\n")
        assert sock.recv(64) == b"+PONG\r\n"
        client_port = sock.getsockname()[1]

        def reply_acknowledged():  # the reply's retransmit timer (kind 1) runs until the client's ACK
            timer = _server_side_timer(server.port, client_port)
            return timer if timer is not None and timer[0] != 1 else None

        kind, ticks = wait_until(reply_acknowledged, message="the server's end, its reply acknowledged")
        if probe_after is None:
            assert kind == 0, "no keepalive timer with --tcp-keepalive 0"
        else:
            ticks_per_second = os.sysconf("SC_CLK_TCK")
            assert kind == 2 and 0 < ticks <= probe_after * ticks_per_second, (kind, ticks)
            assert ticks > (probe_after - 5) * ticks_per_second, "the first probe is due after the idle time"
