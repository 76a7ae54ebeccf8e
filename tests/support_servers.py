"""Servers for the tests: EZRA started for real on a free port, redis-server beside it, and
the polling every test waits with (conftest.py's fixtures are built from these)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
# Test clients fail at once, as redis-py before 6 did: many tests wait for a refused or cut
# connection, and redis-py 6+ retries each failure 3 times, with up to 1 + 2 + 4 s of backoff.
NO_RETRY = {"retry": None}
LISTENING = re.compile(r"listening on [^ ]+:(\d+),")
HTTP_LISTENING = re.compile(r"dashboard on (https?://[^ ]+:\d+)/")


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
        env = {**os.environ, "PYTHONPATH": str(ROOT), **(self.env or {})}  # a test may add to PYTHONPATH
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def redis_answers_or_exited(proc: subprocess.Popen, port: int, workdir: Path) -> bool:
    """redis-server `proc` answers on `port`, or has exited (another process took the port)."""
    if proc.poll() is not None:
        return True
    try:  # ours answers, not another redis-server on that port: its dir is ours
        client = redis.Redis(port=port, socket_timeout=1, **NO_RETRY)
        return client.config_get("dir")["dir"] == os.path.realpath(workdir)
    except redis.ConnectionError:
        return False


def start_redis_server(workdir: Path) -> tuple[subprocess.Popen, int]:
    """A real, empty redis-server on a free port, no persistence, answering: (process, port)."""
    for _ in range(3):  # another process (a pytest-xdist worker's redis) may take the port first
        port = free_port()
        proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: redis_answers_or_exited(proc, port, workdir), message="redis-server to answer")
        if proc.poll() is None:
            return proc, port
    raise AssertionError(f"redis-server exited with {proc.returncode} three times")


def _openssl(*args: str, cwd) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certificates(d: Path) -> Path:
    """In `d`: a CA, a server certificate for 127.0.0.1/localhost and a client certificate,
    all signed by the CA (ca.pem, server.pem/.key, client.pem/.key)."""
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
