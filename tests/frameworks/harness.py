"""What tests/test_frameworks_*.py share: the frameworks' venv, their worker processes, and
the lines the apps beside this file print ("START|DONE|FAIL <n> <pid>")."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from support_compat import python_venv
from support_servers import ROOT, wait_until
from support_worker_libs import record_worker_libs, run_json

APPS = Path(__file__).resolve().parent
# The versions the docs name; ezra's extras (setup.cfg) ask for the same.
REQUIREMENTS = ["celery[redis]>=5.4,<6", "dramatiq>=1.17,<3", "taskiq-redis>=1.2,<2"]


def framework_python() -> Path:
    """build/venv-frameworks/bin/python: Celery, Dramatiq and taskiq-redis (made on first use)."""
    return python_venv("venv-frameworks", REQUIREMENTS)


def app_env(server, queue: str, **more: str) -> dict:
    """The apps see EZRA's port and their queue, and import this worktree's ezra."""
    return dict(os.environ, EZRA_PORT=str(server.port), QUEUE=queue, PYTHONPATH=f"{APPS}{os.pathsep}{ROOT}",
                **more)


class Worker:
    """A framework's worker command line, in its own process group, its output in a file."""

    def __init__(self, command: list, env: dict, log: Path):
        self.log = log
        with open(log, "ab") as out:  # O_APPEND: each worker process's write lands whole at the end
            self.proc = subprocess.Popen([str(arg) for arg in command], stdout=out, stderr=subprocess.STDOUT,
                                         env=env, cwd=APPS, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def lines(self, word: str) -> list[tuple[int, int]]:
        """(n, pid) of each '<word> n pid' line."""
        return [(int(n), int(pid)) for n, pid in re.findall(rf"^{word} (\d+) (\d+)$", self.output(), re.M)]

    def kill(self) -> None:
        """SIGKILL to the whole process group: the main process and the pool it forked."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, sig=signal.SIGTERM, timeout: float = 60) -> int:
        """A graceful stop: `sig` to the main process, then wait for the whole group to exit."""
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        wait_until(lambda: not group_alive(self.proc.pid), timeout, message=f"the worker's pool to exit ({self.log})")
        return code


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


class Workers:
    """start(command, env): a Worker; whatever still runs is killed at the end (a fixture's body)."""

    def __init__(self, directory: Path):
        self.directory, self.started = directory, []

    def start(self, command: list, env: dict) -> Worker:
        self.started.append(Worker(command, env, self.directory / f"worker{len(self.started)}.log"))
        return self.started[-1]

    def kill_all(self) -> None:
        for worker in self.started:
            worker.kill()


def produce(python, app: str, call: str, env: dict) -> dict:
    """`import app; app.call` in the venv: the JSON line it prints."""
    return run_json([str(python), "-c", f"import {app}; {app}.{call}"], env=env, timeout=120, cwd=APPS)


def counts(client, queue: str) -> dict:
    """XINFO STREAM's task counts: available, delayed, in-flight, done, dead."""
    reply = client.execute_command("XINFO", "STREAM", queue)
    fields = dict(zip(reply[::2], reply[1::2]))
    return {key.decode(): fields[key] for key in (b"available", b"delayed", b"in-flight", b"done", b"dead")}


# ---------------------------------------------------------------- fixtures the test modules import

@pytest.fixture(scope="module")
def python():
    """The venv's interpreter (skips, with pip's reason, when it cannot be made)."""
    return framework_python()


@pytest.fixture
def workers(tmp_path):
    """workers.start(command, env): a Worker; whatever still runs is killed (SIGKILL) at the end."""
    started = Workers(tmp_path)
    yield started
    started.kill_all()


@pytest.fixture(scope="module")
def compat_json():
    """A module's Row()s land in build/compat/worker_libs.json (scripts/compat_table.py)."""
    yield
    record_worker_libs()


def blocked(client) -> int:
    return client.info("clients")["blocked_clients"]


def priorities(client, queue: str) -> list[int]:
    """XINFO TASKS' priority of each available task, in push (id) order."""
    tasks = [dict(zip(flat[::2], flat[1::2])) for flat in client.execute_command("XINFO", "TASKS", queue, "available")]
    return [task[b"priority"] for task in tasks]
