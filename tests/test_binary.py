"""The one-file executable works on its own: no Python, no source tree, no environment.

The binary is built once by scripts/build-binary.sh and cached in
build/test-binary/<hash>/, the hash covering everything that goes into it
(ezra/**/*.py, ezra/**/*.sql, ezra/web/static/, ezra.spec, setup.cfg, the build
script, this Python); later runs reuse it. A cold build takes about a minute on 2 cores. EZRA_BINARY=<path>
tests a given binary instead (the release workflow does this on each runner);
EZRA_SKIP_BINARY=1 skips this module.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

import pytest
import redis

import ezra
from ezra.config import build_parser

from support_servers import ROOT, wait_until

pytestmark = pytest.mark.slow  # builds and runs the PyInstaller binary: not in `pytest -m "not slow"`

CACHE = ROOT / "build" / "test-binary"
BUILD_TIMEOUT = 900
MAX_SIZE = 20_000_000  # bytes (issue 7: at most 20 MB)
MAX_START_UP = 2.0  # seconds to an open port; the target is 1 s (measured ~0.55 s), slack for a busy CI
LISTENING = re.compile(r"listening on [^ ]+:(\d+),")


def binary_name() -> str:
    """ezra-<os>_<arch>, as ezra.spec names it."""
    system = {"darwin": "macos"}.get(sys.platform, sys.platform)
    machine = {"amd64": "x86_64", "aarch64": "arm64"}.get(platform.machine().lower(), platform.machine().lower())
    return f"ezra-{system}_{machine}"


def source_hash() -> str:
    digest = hashlib.sha256(f"{sys.version}\0{platform.machine()}\0".encode())
    inputs = (sorted((ROOT / "ezra").rglob("*.py")) + sorted((ROOT / "ezra").rglob("*.sql"))
              + sorted((ROOT / "ezra" / "web" / "static").iterdir())
              + [ROOT / name for name in ("ezra.spec", "setup.cfg", "scripts/build-binary.sh")])
    for path in inputs:
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def reason_not_to_build() -> str | None:
    """Why PyInstaller cannot build with this Python, or None."""
    if sys.platform not in ("linux", "darwin"):
        return f"binaries are built on Linux and macOS only, not {sys.platform}"
    if not (sysconfig.get_config_var("Py_ENABLE_SHARED") or sysconfig.get_config_var("PYTHONFRAMEWORK")):
        return (f"{sys.executable} has no shared libpython, which PyInstaller needs: use a Python built "
                "with --enable-shared (python.org, Debian, pyenv with PYTHON_CONFIGURE_OPTS=--enable-shared)")
    try:
        import ensurepip  # noqa: F401  (python -m venv needs it to install pip)
    except ImportError:
        return f"{sys.executable} cannot make a virtualenv (no ensurepip): apt-get install python3-venv"
    missing = [tool for tool in ("objcopy", "strip") if not shutil.which(tool)]
    if sys.platform == "linux" and missing:
        return f"PyInstaller needs binutils on Linux ({', '.join(missing)} not found): apt-get install binutils"
    return None


def build_binary() -> Path:
    """The binary for the current sources, from the cache or built now."""
    name, digest = binary_name(), source_hash()
    target = CACHE / digest / name
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs at once build once
        if target.exists():
            return target
        staging = CACHE / f"{digest}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        started = time.monotonic()
        result = subprocess.run(
            ["bash", "scripts/build-binary.sh"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, timeout=BUILD_TIMEOUT,
            env=dict(os.environ, PYTHON=sys.executable, DIST_DIR=str(staging), WORK_DIR=str(CACHE / "work")))
        if result.returncode != 0 or not (staging / name).exists():
            pytest.fail(f"scripts/build-binary.sh failed ({result.returncode}):\n{result.stdout[-6000:]}")
        for old in CACHE.iterdir():  # keep one binary: the current one
            if old.is_dir() and old.name not in ("work", staging.name):
                shutil.rmtree(old, ignore_errors=True)
        staging.rename(CACHE / digest)
        print(f"built {target} in {time.monotonic() - started:.0f}s")
        return target


@pytest.fixture(scope="module")
def binary() -> Path:
    if os.environ.get("EZRA_SKIP_BINARY"):
        pytest.skip("EZRA_SKIP_BINARY is set")
    given = os.environ.get("EZRA_BINARY")
    if given:
        path = Path(given).resolve()
        assert path.is_file(), f"EZRA_BINARY={given} is not a file"
        return path
    reason = reason_not_to_build()
    if reason:
        pytest.skip(f"cannot build the binary here: {reason}")
    return build_binary()


@pytest.fixture
def isolated(binary, tmp_path):
    """The binary copied alone into an empty directory outside the source tree."""
    directory = tmp_path / "ezra-home"
    directory.mkdir()
    exe = directory / "ezra"
    shutil.copy2(binary, exe)
    assert ROOT not in exe.resolve().parents
    return exe


class BinaryServer:
    """The binary running with an empty environment, in its own directory."""

    def __init__(self, exe: Path, *args: str):
        self.log_path = exe.parent / f"ezra-{time.monotonic_ns()}.log"  # one per start: ports differ
        self.log_file = open(self.log_path, "w")
        self.started = time.monotonic()
        self.proc = subprocess.Popen([str(exe), "--port", "0", *args], cwd=exe.parent, env={},
                                     stdin=subprocess.DEVNULL, stdout=self.log_file, stderr=subprocess.STDOUT)
        try:
            self.port = wait_until(self._port_in_log, timeout=30, message="the binary to listen")
        except BaseException:
            self.stop(signal.SIGKILL)
            raise
        self.start_up = time.monotonic() - self.started

    def _port_in_log(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"the binary exited with {self.proc.returncode}:\n{self.log()}")
        match = LISTENING.search(self.log())
        if match and self._port_open(int(match.group(1))):
            return int(match.group(1))
        return None

    @staticmethod
    def _port_open(port: int) -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self, sig=signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.log_file.close()
        return code


def run(exe: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), *args], cwd=exe.parent, env={}, capture_output=True, text=True, timeout=60)


def mapped_files(pid: int) -> set[str]:
    """Files mapped by a process and its children (Linux)."""
    files = set()
    pids = [pid] + [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    for each in pids:
        for line in Path(f"/proc/{each}/maps").read_text().splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/"):
                files.add(parts[5])
    return files


def test_size(binary):
    assert binary.stat().st_size <= MAX_SIZE, f"{binary.stat().st_size / 1e6:.1f} MB"


def test_version_and_help_in_an_empty_environment(isolated):
    version = run(isolated, "--version")
    assert (version.returncode, version.stdout.strip()) == (0, f"ezra {ezra.__version__}"), version
    help_ = run(isolated, "--help")
    assert help_.returncode == 0, help_
    for action in build_parser()._actions:
        for flag in action.option_strings:
            assert flag in help_.stdout, f"{flag} missing from the binary's --help"


def test_push_pop_and_sigterm_outside_the_source_tree(isolated):
    server = BinaryServer(isolated)
    try:
        assert server.start_up <= MAX_START_UP, f"start-up took {server.start_up:.2f}s"
        if sys.platform == "linux":
            # Nothing is loaded from the Python that built it: every library comes from the binary.
            base = os.path.realpath(sys.base_prefix)
            leaked = {path for path in mapped_files(server.proc.pid)
                      if path.startswith((base, str(ROOT))) or ("libpython" in path and "/_MEI" not in path)}
            assert not leaked, leaked
        r = redis.Redis(port=server.port, socket_timeout=10)
        first = r.xadd("emails", {"to": "ada@example.com"})
        second = r.xadd("emails", {"to": "grace@example.com"})
        [[queue, tasks]] = r.xreadgroup("workers", "w1", {"emails": ">"}, count=1)
        assert tasks == [(first, {b"to": b"ada@example.com"})]
        assert r.xack("emails", "workers", first) == 1
        r.close()
        ping = run(isolated, "ping", "--port", str(server.port))
        assert (ping.returncode, ping.stdout.strip()) == (0, f"ezra at 127.0.0.1:{server.port}: PONG"), ping
    finally:
        code = server.stop(signal.SIGTERM)
    assert code == 0, server.log()
    assert "stopped cleanly" in server.log()
    assert (isolated.parent / "data" / "ezra.db").is_file()  # the default ./data, in the working directory

    again = BinaryServer(isolated)  # the task that was not popped is still there
    try:
        r = redis.Redis(port=again.port, socket_timeout=10)
        assert [task_id for task_id, _ in r.xrange("emails")] == [first, second]
        assert r.xlen("emails") == 1
        r.close()
    finally:
        assert again.stop(signal.SIGINT) == 0, again.log()


def test_ping_fails_when_nothing_listens(isolated):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free_port = sock.getsockname()[1]
    ping = run(isolated, "ping", "--port", str(free_port), "--timeout", "1")
    assert ping.returncode == 1 and "cannot reach" in ping.stderr, ping


def test_metrics_and_dashboard_in_the_binary(isolated):
    """The --http-port listener works from the one file: prometheus_client, pywsgi and the
    dashboard's static files are inside it."""
    server = BinaryServer(isolated, "--http-port", "0")
    try:
        match = re.search(r"dashboard on (http://[^ ]+:\d+)/", server.log())
        assert match, server.log()
        redis.Redis(port=server.port, socket_timeout=10).xadd("emails", {"to": "ada@example.com"})
        pages = {path: urllib.request.urlopen(match.group(1) + path, timeout=10).read()
                 for path in ("/metrics", "/", "/static/dashboard.css")}
        assert b'ezra_pushes_total{queue="emails"} 1.0' in pages["/metrics"]
        assert b'data-queue="emails"' in pages["/"]
        assert b"--push" in pages["/static/dashboard.css"]
    finally:
        assert server.stop(signal.SIGTERM) == 0, server.log()


def test_tls_in_the_binary(isolated, certificates):
    """ssl is inside the one file: the server speaks TLS and `ezra ping` reaches it over TLS."""
    c = certificates
    server = BinaryServer(isolated, "--tls-cert-file", str(c / "server.pem"), "--tls-key-file", str(c / "server.key"))
    try:
        client = redis.Redis(host="localhost", port=server.port, ssl=True, ssl_ca_certs=str(c / "ca.pem"),
                             socket_timeout=10)
        assert client.xadd("secure", {"n": "1"})
        client.close()
        ping = run(isolated, "ping", "--port", str(server.port), "--tls-cert-file", str(c / "server.pem"))
        assert ping.returncode == 0, ping
    finally:
        assert server.stop(signal.SIGTERM) == 0, server.log()


def test_a_schedule_in_a_zone_fires_from_the_binary_without_system_zone_data(isolated):
    """Schedules (issue 26): cronsim and the zone data (tzdata) travel inside the binary."""
    log_path = isolated.parent / "ezra.log"
    with open(log_path, "w") as log:
        # PYTHONTZPATH at a directory with no zones: Europe/Paris can only come from the bundled tzdata
        proc = subprocess.Popen(
            [str(isolated), "--port", "0", "--schedule",
             "tick ticks '* * * * * *' TZ Europe/Paris SLOT-FIELD slot FIELDS job tick"],
            cwd=isolated.parent, env={"PYTHONTZPATH": str(isolated.parent)}, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT)
        try:
            def port():
                assert proc.poll() is None, log_path.read_text()
                match = LISTENING.search(log_path.read_text())
                return match and int(match.group(1))
            client = redis.Redis(port=wait_until(port, timeout=30, message="the binary to listen"),
                                 socket_timeout=10, retry=None)
            wait_until(lambda: client.xlen("ticks") >= 2, timeout=30, message="two firings")
            (_, fields), *_ = client.xrange("ticks")
            assert fields[b"job"] == b"tick" and fields[b"slot"].endswith((b"+01:00", b"+02:00"))
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(20) == 0, log_path.read_text()
