"""`from ezra import Server`: EZRA in a thread of a plain (not monkey-patched) Python program.

Everything here runs in pytest's main thread with ordinary sockets and
threads, as a host application would; redis-py talks to the embedded server.
"""

from __future__ import annotations

import gc
import os
import socket
import subprocess
import sys
import threading

import pytest
import redis

from ezra import Server
from ezra.storage import StorageError

from support_servers import NO_RETRY, ROOT, wait_until


def ezra_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("ezra")]


def open_fds() -> int:
    """Descriptors open in this process, after collecting garbage: earlier tests' dropped
    sockets are closed by the collector at unpredictable times otherwise."""
    gc.collect()
    return _count_open_fds()


def _count_open_fds() -> int:
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0


@pytest.fixture
def server(tmp_path):
    with Server(data_dir=tmp_path / "data") as running:
        yield running


def test_import_ezra_is_cheap_and_patches_nothing():
    code = ("import sys, ezra; assert 'gevent' not in sys.modules, 'import ezra pulled in gevent'; "
            "from ezra import Server; import socket, threading; "
            "from gevent import monkey; assert not monkey.is_anything_patched()")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


def test_push_claim_ack_from_the_main_thread(server, protocol):
    assert threading.current_thread() is threading.main_thread()
    r = redis.Redis(port=server.port, protocol=protocol, socket_timeout=10)
    task_id = r.xadd("emails", {"to": "ada@example.com"})
    reply = r.xreadgroup("workers", "w1", {"emails": ">"}, count=1)
    tasks = reply[b"emails"][0] if protocol == 3 else reply[0][1]
    assert tasks == [(task_id, {b"to": b"ada@example.com"})]
    assert r.xack("emails", "workers", task_id) == 1
    assert r.xlen("emails") == 0
    assert redis.Redis.from_url(server.url).ping()
    r.close()


def test_start_returns_with_the_port_open(tmp_path):
    server = Server(data_dir=tmp_path / "data")
    assert server.port is None and not server.running
    server.start()
    try:
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()  # no retry needed
    finally:
        server.stop()
    assert server.port is None and not server.running


def test_stop_is_clean_and_restart_keeps_the_tasks(tmp_path):
    data_dir = tmp_path / "data"
    baseline_fds = open_fds()
    server = Server(data_dir=data_dir, visibility_timeout=300).start()
    r = redis.Redis(port=server.port, socket_timeout=10)
    done, held, waiting = (r.xadd("q", {"n": str(n)}) for n in range(3))
    r.xreadgroup("g", "w1", {"q": ">"}, count=2)  # `done` and `held` in flight
    r.xack("q", "g", done)
    r.close()

    server.stop()
    assert ezra_threads() == []  # the server thread and any fsync or checkpoint thread have ended
    # WAL folded in: the database was closed; ezra.lock stays (empty: nobody holds the directory);
    # ezra.counts holds the done counts for the next start (storage/done_counts.py)
    assert sorted(os.listdir(data_dir)) == ["ezra.counts", "ezra.db", "ezra.lock"]
    assert os.path.getsize(data_dir / "ezra.lock") == 0
    if baseline_fds:
        assert open_fds() == baseline_fds  # the hub's loop, sockets and files are all closed

    server.start()  # the same object, again
    r = redis.Redis(port=server.port, socket_timeout=10)
    assert r.xlen("q") == 2  # `held` is back to available, `waiting` never left
    reply = r.xreadgroup("g", "w2", {"q": ">"}, count=10)
    assert [task_id for task_id, _ in reply[0][1]] == [held, waiting]
    r.close()
    server.stop()


def test_stop_answers_a_blocked_reader(tmp_path):
    server = Server(data_dir=tmp_path / "data").start()
    try:
        r = redis.Redis(port=server.port, socket_timeout=30)
        r.xgroup_create("jobs", "g", mkstream=True)
        replies = []
        reader = threading.Thread(target=lambda: replies.append(r.xreadgroup("g", "w", {"jobs": ">"}, block=0)))
        reader.start()
        probe = redis.Redis(port=server.port)
        wait_until(lambda: probe.info("clients")["blocked_clients"] == 1, message="the reader to block")
        probe.close()
    finally:
        server.stop()
    reader.join(10)
    assert not reader.is_alive()
    assert len(replies) == 1 and not replies[0]  # a null reply (redis-py: []), as Redis gives on timeout


def test_two_servers_at_once(tmp_path):
    with Server(data_dir=tmp_path / "a") as a, Server(data_dir=tmp_path / "b") as b:
        assert a.port != b.port
        ra, rb = redis.Redis(port=a.port), redis.Redis(port=b.port)
        ra.xadd("q", {"from": "a"})
        assert (ra.xlen("q"), rb.xlen("q")) == (1, 0)
        rb.xadd("q", {"from": "b"})
        rb.xadd("q", {"from": "b"})
        assert (ra.xlen("q"), rb.xlen("q")) == (1, 2)
        ra.close()
        rb.close()
    assert ezra_threads() == []


def test_host_threads_share_one_server(server):
    def produce(n):
        client = redis.Redis(port=server.port, socket_timeout=10)
        for i in range(50):
            client.xadd("shared", {"producer": str(n), "i": str(i)})
        client.close()

    producers = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
    for thread in producers:
        thread.start()
    for thread in producers:
        thread.join(30)
    assert redis.Redis(port=server.port).xlen("shared") == 200


def test_a_foreign_database_raises_in_the_caller(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "ezra.db").write_bytes(b"this is not a database, it is a text file " * 100)
    server = Server(data_dir=data_dir)
    with pytest.raises(StorageError, match="ezra.db"):
        server.start()
    assert not server.running and ezra_threads() == []
    with pytest.raises(StorageError):  # the same again: nothing was left half-started
        server.start()


def test_a_data_dir_that_is_a_file_raises(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(OSError):
        Server(data_dir=not_a_dir).start()
    assert ezra_threads() == []


def test_a_port_in_use_raises_and_releases_the_database(tmp_path):
    data_dir = tmp_path / "data"
    with Server(data_dir=tmp_path / "other") as busy:
        with pytest.raises(OSError):
            Server(data_dir=data_dir, port=busy.port).start()
    assert ezra_threads() == []
    with Server(data_dir=data_dir) as server:  # the database was closed after the failed start
        assert redis.Redis(port=server.port).ping()


def test_settings_are_checked_like_flags(tmp_path):
    with pytest.raises(ValueError, match="visibility-timeout"):
        Server(data_dir=tmp_path, visibility_timeout=0)
    with pytest.raises(ValueError, match="durability"):
        Server(data_dir=tmp_path, durability="sometimes")
    with pytest.raises(TypeError, match="visibilty_timeout"):
        Server(data_dir=tmp_path, visibilty_timeout=5)
    server = Server(data_dir=tmp_path, visibility_timeout="2.5", max_attempts=7, password="-secret")
    assert (server.settings.visibility_timeout, server.settings.max_attempts) == (2.5, 7)
    assert server.settings.password == "-secret"


def test_every_command_line_setting_is_a_keyword(tmp_path):
    server = Server(data_dir=tmp_path, backoff="exponential 1 60", queues=["emails MAX-ATTEMPTS 5"])
    assert server.settings.backoff == "exponential 1 60"
    assert len(server.settings.queues) == 1


def test_the_environment_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setenv("EZRA_PASSWORD", "from-the-environment")
    monkeypatch.setenv("EZRA_MAX_ATTEMPTS", "9")
    server = Server(data_dir=tmp_path)
    assert server.settings.password is None and server.settings.max_attempts == 3


def test_password_setting(tmp_path):
    with Server(data_dir=tmp_path / "data", password="s3cret") as server:
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=server.port, **NO_RETRY).xlen("q")
        assert redis.Redis(port=server.port, password="s3cret").xlen("q") == 0


def test_start_twice_is_refused(server):
    with pytest.raises(RuntimeError, match="already started"):
        server.start()
