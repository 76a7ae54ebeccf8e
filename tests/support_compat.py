"""The compatibility matrix's plumbing: its rows in build/compat/*.json, virtual environments
for other redis-py versions and libraries, and the Node.js clients in build/node."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support_servers import ROOT


NODE_SRC = ROOT / "tests" / "node"
NODE_DIR = ROOT / "build" / "node"
COMPAT = ROOT / "build" / "compat"


def record_results(name: str, results: list[dict], key=None) -> None:
    """Merge this run's results into build/compat/<name>.json (keyed by client, version,
    protocol and settings, or by `key`, so a partial run keeps the other rows)."""
    key = key or KEY
    COMPAT.mkdir(parents=True, exist_ok=True)
    path = COMPAT / f"{name}.json"
    with open(COMPAT / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # pytest-xdist workers merge one after the other
        table = {}
        if path.exists():
            table = {key(e): e for e in json.loads(path.read_text())}
        for entry in results:
            table[key(entry)] = entry
        path.write_text(json.dumps(sorted(table.values(), key=key), indent=1) + "\n")


def KEY(entry: dict) -> tuple:
    return entry["client"], entry["version"], entry["protocol"], entry["settings"].split(", node")[0]


@contextlib.contextmanager
def building(name: str):
    """Held while build/<name> is checked and made: pytest-xdist workers (-n 4) that need it at
    once wait for the first to finish, rather than install over each other."""
    (ROOT / "build").mkdir(exist_ok=True)
    with open(ROOT / "build" / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def python_venv(name: str, requirements: list[str]) -> Path:
    with building(name):
        return make_python_venv(name, requirements)


def make_python_venv(name: str, requirements: list[str]) -> Path:
    """build/<name>/bin/python, a virtual environment with `requirements`, made on first use.

    Another redis-py (or a library pinning one) cannot share this interpreter, so it gets
    its own venv and the test runs it in a subprocess. Skips with the reason when pip cannot
    install (offline). A stamp file remembers what was installed, so a change rebuilds it."""
    venv = ROOT / "build" / name
    python, stamp = venv / "bin" / "python", venv / "ezra-requirements.txt"
    wanted = "\n".join(requirements) + "\n"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    shutil.rmtree(venv, ignore_errors=True)
    for what, step in (("python -m venv", [sys.executable, "-m", "venv", str(venv)]),
                       ("pip install " + " ".join(requirements),
                        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *requirements])):
        result = subprocess.run(step, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            pytest.skip(f"could not make build/{name}: {what} failed: {result.stderr[-500:]}")
    stamp.write_text(wanted)
    return python


def node_modules() -> Path:
    """build/node/node_modules from tests/node/package-lock.json (npm ci when missing)."""
    if shutil.which("node") is None:
        pytest.skip("Node.js is not installed (apt-get install nodejs npm; scripts/test.sh does)")
    with building("node"):
        return make_node_modules()


def make_node_modules() -> Path:
    modules = NODE_DIR / "node_modules"
    lock = NODE_SRC / "package-lock.json"
    installed_lock = NODE_DIR / "package-lock.json"
    if not modules.is_dir() or not installed_lock.exists() or installed_lock.read_bytes() != lock.read_bytes():
        if shutil.which("npm") is None:
            pytest.skip("npm is not installed and build/node/node_modules is missing "
                        "(apt-get install npm; scripts/test.sh runs npm ci)")
        NODE_DIR.mkdir(parents=True, exist_ok=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copy(NODE_SRC / name, NODE_DIR / name)
        result = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR,
                                capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            installed_lock.unlink()  # not installed: the next test tries again
            pytest.skip(f"npm ci failed in build/node (offline?): {result.stderr[-500:]}")
    return modules


def node_env() -> dict:
    return dict(os.environ, NODE_PATH=str(node_modules()))


def node_version(package: str) -> str:
    return json.loads((node_modules() / package / "package.json").read_text())["version"]


def run_examples(port: int, producer: list[str], worker: list[str], queue: str, env: dict) -> None:
    """The producer pushes 10, two workers stop after 5 each; every task done exactly once."""
    env = dict(env, QUEUE=queue, MAX_TASKS="5", IDLE_TIMEOUT="10")
    workers = [subprocess.Popen(worker + [str(port)], stdout=subprocess.PIPE, text=True,
                                env=dict(env, WORKER_NAME=f"w{i}")) for i in (1, 2)]
    pushed = subprocess.run(producer, capture_output=True, text=True, timeout=60,
                            env=dict(env, EZRA_PORT=str(port), TASKS="10"))
    assert pushed.returncode == 0, pushed.stderr
    ids = [line.split()[1] for line in pushed.stdout.splitlines()]
    done = []
    for proc in workers:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        lines = out.splitlines()
        assert len(lines) == 5, out
        done += [line.split()[1] for line in lines]
    assert len(ids) == 10 and sorted(done) == sorted(ids)
