"""Fixtures that start the real server (`python -m ezra`) on a free port in a temp dir."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis

from support import ROOT, VENV_REQUIREMENTS, python_venv, tmpfs

# Test clients fail at once, as redis-py before 6 did: many tests wait for a refused or cut
# connection, and redis-py 6+ retries each failure 3 times, with up to 1 + 2 + 4 s of backoff.
NO_RETRY = {"retry": None}
LISTENING = re.compile(r"listening on [^ ]+:(\d+),")
HTTP_LISTENING = re.compile(r"dashboard on (https?://[^ ]+:\d+)/")


def pytest_configure(config):
    """This process and the Pythons it starts (servers, tools, xdist workers) cache their
    bytecode in build/pycache.

    Under PYTHONDONTWRITEBYTECODE each of the ~150 server starts compiled EZRA's modules
    again (a third of its CPU), and each pytest process rewrote and compiled every test
    module (3 of its 4 s of collection). A cache outside the tree keeps the tree as clean
    as that setting does (build/ is ignored by git).
    """
    if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX"):
        cache = str(ROOT / "build" / "pycache")
        del os.environ["PYTHONDONTWRITEBYTECODE"]
        os.environ["PYTHONPYCACHEPREFIX"] = cache
        sys.dont_write_bytecode, sys.pycache_prefix = False, cache


def wait_until(condition, timeout=10.0, interval=0.01, message="condition"):
    """Poll `condition` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


class EzraProcess:
    """A real EZRA server process; `port` is known once it listens."""

    def __init__(self, data_dir: Path, *args: str, env: dict | None = None):
        self.data_dir = Path(data_dir)
        self.args = list(args)
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-{uuid.uuid4().hex[:6]}.log"

    def start(self, timeout: float = 20.0) -> "EzraProcess":
        env = dict(os.environ, PYTHONPATH=str(ROOT), **(self.env or {}))
        self.log_file = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ezra", "--port", "0", "--data-dir", str(self.data_dir), *self.args],
            stdout=self.log_file, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT))

        def port_in_log():
            if self.proc.poll() is not None:
                raise AssertionError(f"ezra exited with {self.proc.returncode}:\n{self.log()}")
            match = LISTENING.search(self.log())
            return int(match.group(1)) if match else None

        self.port = wait_until(port_in_log, timeout, message="ezra to listen")
        return self

    @property
    def http_url(self) -> str:
        """The --http-port listener's base URL (the server must have been started with it)."""
        match = HTTP_LISTENING.search(self.log())
        assert match, f"no HTTP listener in the log:\n{self.log()}"
        return match.group(1)

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def client(self, protocol: int = 2, **kwargs) -> redis.Redis:
        return redis.Redis(port=self.port, protocol=protocol, socket_timeout=30, **(NO_RETRY | kwargs))

    def stop(self, sig=signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.log_file.close()
        return code

    def kill9(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self) -> "EzraProcess":
        self.stop()
        return self.start()


@pytest.fixture
def ezra_factory(tmp_path):
    """Start servers with extra flags: ezra_factory('--visibility-timeout', '1')."""
    started = []

    def make(*args, data_dir=None, env=None):
        server = EzraProcess(data_dir or tmp_path / f"data{len(started)}", *args, env=env)
        started.append(server)
        return server.start()

    yield make
    for server in started:
        server.stop(signal.SIGKILL)


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory):
    """One server for the tests that use their own queue names."""
    server = EzraProcess(tmp_path_factory.mktemp("shared") / "data",
                         "--visibility-timeout", "30", "--max-attempts", "3").start()
    yield server
    assert server.stop() == 0, server.log()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers_or_exited(proc: subprocess.Popen, port: int, workdir: Path) -> bool:
    """redis-server `proc` answers on `port`, or has exited (another process took the port)."""
    if proc.poll() is not None:
        return True
    try:  # ours answers, not another redis-server on that port: its dir is ours
        client = redis.Redis(port=port, socket_timeout=1, **NO_RETRY)
        return client.config_get("dir")["dir"] == os.path.realpath(workdir)
    except redis.ConnectionError:
        return False


@pytest.fixture(scope="session")
def redis_server_port(tmp_path_factory):
    """A real, empty redis-server on a free port, no persistence (skipped if not installed)."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; scripts/test.sh does)")
    workdir = tmp_path_factory.mktemp("redis")
    for _ in range(3):  # another process (a pytest-xdist worker's redis) may take the port first
        port = free_port()
        proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: _answers_or_exited(proc, port, workdir), message="redis-server to answer")
        if proc.poll() is None:
            break
    else:
        raise AssertionError(f"redis-server exited with {proc.returncode} three times")
    yield port
    proc.terminate()
    proc.wait(10)


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def protocol(request):
    return request.param


@pytest.fixture
def r(shared_server, protocol):
    """A redis-py client of the shared server, in RESP2 and in RESP3."""
    client = shared_server.client(protocol)
    yield client
    client.close()


@pytest.fixture
def queue(request):
    """A queue name no other test uses."""
    return f"q-{request.node.name}-{uuid.uuid4().hex[:8]}"


def _openssl(*args: str, cwd) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="session")
def certificates(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, all signed by the CA."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed (scripts/test.sh installs it from Debian)")
    d = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=EZRA test CA",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    for name, extension in (("server", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
                            ("client", "extendedKeyUsage=clientAuth")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=ezra-{name}",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
        (d / f"{name}.ext").write_text(extension + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=d)
    return d


@pytest.fixture
def small_fs(tmp_path):
    """A 16 MB tmpfs as a data directory (disk full); skips where it cannot be mounted."""
    yield from tmpfs(tmp_path / "fs", "16m")


@pytest.fixture(scope="module")
def venv_python():
    """build/venv-worker-libs's python, with the worker libraries (test_worker_libs*.py)."""
    return python_venv("venv-worker-libs", VENV_REQUIREMENTS)
