"""Fixtures that start the real server (`python -m ezra`) on a free port in a temp dir.

Fixtures only: the helpers they are built from live in the support_*.py modules."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import uuid

import pytest

from support_compat import python_venv
from support_disk import tmpfs
from support_queue import broker_on_clock
from support_servers import ROOT, EzraProcess, make_certificates, start_redis_server
from support_worker_libs import VENV_REQUIREMENTS


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


@pytest.fixture
def clocked_broker(tmp_path):
    """A Broker in process on a real ezra.db, on a clock the test moves (`broker.clock_`)."""
    broker = broker_on_clock(tmp_path)
    yield broker
    broker.stop()
    broker.db.close()


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory):
    """One server for the tests that use their own queue names."""
    server = EzraProcess(tmp_path_factory.mktemp("shared") / "data",
                         "--visibility-timeout", "30", "--max-attempts", "3").start()
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture(scope="session")
def redis_server_port(tmp_path_factory):
    """A real, empty redis-server on a free port, no persistence (skipped if not installed)."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; scripts/test.sh does)")
    proc, port = start_redis_server(tmp_path_factory.mktemp("redis"))
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


@pytest.fixture(scope="session")
def certificates(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, all signed by the CA."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed (scripts/test.sh installs it from Debian)")
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def small_fs(tmp_path):
    """A 16 MB tmpfs as a data directory (disk full); skips where it cannot be mounted."""
    yield from tmpfs(tmp_path / "fs", "16m")


@pytest.fixture(scope="module")
def venv_python():
    """build/venv-worker-libs's python, with the worker libraries (test_worker_libs*.py)."""
    return python_venv("venv-worker-libs", VENV_REQUIREMENTS)
