"""One server per data directory (issue 21 item 1): ezra.lock, held while a server runs.

Before it, a second server on the same --data-dir started, and its start-up recovery
turned the first server's leased tasks back to available: 5 of 5 tasks worker-a held on
a 300 s lease went to worker-b. Now it refuses, naming the directory and the holder, or
waits for it with --lock-timeout (a rolling update); the embedded Server takes the lock too.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest
import redis

from ezra import Server
from ezra.storage import DataDirLock, DataDirLocked

from support_servers import LISTENING, NO_RETRY, ROOT, EzraProcess, wait_until

LEASE = ("--visibility-timeout", "300")


def start_second(data_dir, *args, log_path):
    """A second server process on `data_dir`; its log goes to `log_path`."""
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "ezra", "--port", "0", "--data-dir", str(data_dir), *args],
                            stdout=log, stderr=subprocess.STDOUT, cwd=str(ROOT),
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    log.close()
    return proc


def exited_or_listening(proc, log_path):
    """'exited' or the port it listens on, or None while neither."""
    if proc.poll() is not None:
        return "exited"
    match = LISTENING.search(log_path.read_text())
    return int(match.group(1)) if match else None


def lease_five(server) -> list:
    """Five tasks, all leased to worker-a on the first server; their ids."""
    r = server.client()
    ids = [r.xadd("jobs", {"n": str(n)}) for n in range(5)]
    reply = r.xreadgroup("g", "worker-a", {"jobs": ">"}, count=5)
    assert [task_id for task_id, _ in reply[0][1]] == ids
    r.close()
    return ids


def claimed_by_worker_b(port) -> int:
    r = redis.Redis(port=port, socket_timeout=30, **NO_RETRY)
    reply = r.xreadgroup("g", "worker-b", {"jobs": ">"}, count=5)
    r.close()
    return len(reply[0][1]) if reply else 0


def test_a_second_server_on_the_same_directory_refuses_and_takes_no_lease(ezra_factory, tmp_path, protocol):
    first = ezra_factory(*LEASE)
    ids = lease_five(first)
    log_path = tmp_path / "second.log"
    second = start_second(first.data_dir, *LEASE, log_path=log_path)
    try:
        outcome = wait_until(lambda: exited_or_listening(second, log_path), timeout=30, message="the second server")
        if outcome != "exited":  # the old code: it started, and recovery freed worker-a's leases
            stolen = claimed_by_worker_b(outcome)
            pytest.fail(f"a second server started on the same data directory; worker-b got {stolen} of the "
                        f"5 tasks worker-a holds")
        log = log_path.read_text()
        assert second.returncode == 1, log
        assert f"the data directory {first.data_dir} is in use by another EZRA" in log, log
        assert f"host {socket.gethostname()} pid {first.proc.pid} since" in log, log
        assert "--lock-timeout" in log
    finally:
        if second.poll() is None:
            second.kill()
        second.wait()
    r = first.client(protocol)
    assert claimed_by_worker_b(first.port) == 0  # the leases stand
    pending = r.xpending("jobs", "g")
    assert pending["pending"] == 5
    assert [c["name"] for c in pending["consumers"]] == [b"worker-a"]
    assert r.xack("jobs", "g", *ids) == 5
    r.close()


def test_a_second_server_waits_for_the_lock_then_starts(ezra_factory, tmp_path):
    first = ezra_factory(*LEASE)
    lease_five(first)
    log_path = tmp_path / "second.log"
    second = start_second(first.data_dir, "--lock-timeout", "120", log_path=log_path)
    try:
        wait_until(lambda: "waiting up to 120s" in log_path.read_text() or second.poll() is not None,
                   timeout=30, message="the second server to wait for the lock")
        assert second.poll() is None, log_path.read_text()
        assert not LISTENING.search(log_path.read_text())  # it waits without opening the file
        assert first.stop() == 0
        port = wait_until(lambda: exited_or_listening(second, log_path), timeout=60, message="it to start")
        assert port != "exited", log_path.read_text()
        # It started where the first one stopped: the five tasks are back for anyone.
        assert claimed_by_worker_b(port) == 5
        assert "gave 5 tasks in flight back to available" in first.log()  # the first's clean stop
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(30) == 0


def test_the_wait_gives_up_after_lock_timeout(ezra_factory, tmp_path):
    first = ezra_factory()
    log_path = tmp_path / "second.log"
    second = start_second(first.data_dir, "--lock-timeout", "0.5", log_path=log_path)
    assert second.wait(60) == 1
    log = log_path.read_text()
    assert "waiting up to 0.5s" in log and "is in use by another EZRA" in log, log


def test_the_embedded_server_takes_the_lock_and_lets_it_go(tmp_path):
    data_dir = tmp_path / "data"
    with Server(data_dir=data_dir) as embedded:
        with pytest.raises(DataDirLocked, match=f"the data directory {data_dir} is in use.*pid {os.getpid()}"):
            Server(data_dir=data_dir).start()  # a second one in the same process
        other = EzraProcess(data_dir)
        with pytest.raises(AssertionError, match="is in use by another EZRA"):
            other.start()  # a server process while the embedded one runs
        assert other.proc.returncode == 1
        r = redis.Redis(port=embedded.port, socket_timeout=10, **NO_RETRY)
        r.xadd("jobs", {"n": "1"})
        r.close()
    process = EzraProcess(data_dir).start()  # let go at stop: the next server starts
    try:
        assert process.client().xlen("jobs") == 1
        with pytest.raises(DataDirLocked, match=f"pid {process.proc.pid}"):
            Server(data_dir=data_dir).start()  # and an embedded one refuses while a process holds it
    finally:
        assert process.stop() == 0


def test_import_into_a_data_directory_in_use_is_refused(ezra_factory, tmp_path):
    first = ezra_factory()
    done = subprocess.run([sys.executable, "-m", "ezra", "import", "--from", "redis://127.0.0.1:1",
                           "--data-dir", str(first.data_dir), "jobs"], capture_output=True, text=True,
                          cwd=str(ROOT), env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert done.returncode != 0
    assert "in use" in done.stderr, done.stderr


def test_the_lock_file_is_never_reached_through_a_link(tmp_path):
    data_dir, outside = tmp_path / "data", tmp_path / "outside"
    data_dir.mkdir()
    outside.mkdir()
    (data_dir / "ezra.lock").symlink_to(outside / "victim")
    server = EzraProcess(data_dir)
    with pytest.raises(AssertionError, match="exited with 1"):
        server.start()
    assert "ezra.lock is a symbolic link" in server.log(), server.log()
    assert list(outside.iterdir()) == []  # nothing created or written where the link points


def test_import_into_a_directory_whose_lock_is_held_names_the_holder(tmp_path):
    """The lock, not only the database's open file, refuses the import: here a server that has
    taken the directory and not opened ezra.db yet (this test process holds the lock)."""
    data_dir = tmp_path / "data"
    lock = DataDirLock.acquire(str(data_dir))
    try:
        done = subprocess.run([sys.executable, "-m", "ezra", "import", "--from", "redis://127.0.0.1:1",
                               "--data-dir", str(data_dir), "jobs"], capture_output=True, text=True,
                              cwd=str(ROOT), env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    finally:
        lock.release()
    assert done.returncode == 1
    assert f"is in use by another EZRA (host {socket.gethostname()} pid {os.getpid()} since" in done.stderr, \
        done.stderr
    assert "import through its port instead (--port), or stop it first" in done.stderr
    assert "--lock-timeout" not in done.stderr  # not an option of the import
    assert not (data_dir / "ezra.db").exists()
