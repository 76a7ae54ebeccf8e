"""What test_worker_libs*.py and the framework tests share: the rows of
build/compat/worker_libs.json (one list, WORKER_LIBS_RESULTS, for all three modules), the
venvs' requirements, and reading EZRA's refusals out of a library's output."""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from support_compat import record_results


WORKER_LIBS_RESULTS: list[dict] = []  # test_worker_libs*.py's rows, in build/compat/worker_libs.json
VENV_REQUIREMENTS = ["celery[redis]>=5.4,<6", "rq>=2,<4", "faststream[redis]>=0.6,<0.8",
                     "taskiq-redis>=1.2,<2", "dramatiq[redis]>=2,<3", "huey[redis]>=3,<4"]
# arq pins redis<6 and saq[redis] redis<8, while taskiq-redis needs redis>=8 and Celery's kombu
# redis>=6.4: these two get a venv of their own. saq imports typing_extensions without requiring it.
VENV_REDIS5_REQUIREMENTS = ["arq>=0.26,<1", "saq[redis]>=0.26,<1", "typing_extensions"]


def record_worker_libs() -> None:
    """Merge the rows so far (of any of the three modules) into build/compat/worker_libs.json."""
    record_results("worker_libs", WORKER_LIBS_RESULTS, key=lambda e: (e["library"], e["version"]))


class Row:
    """One library's line in the README: it starts as a failure until the test says otherwise."""

    def __init__(self, library: str, version: str):
        self.entry = dict(library=library, version=version, status="fail (test did not finish)",
                          notes="", when=time.strftime("%Y-%m-%d %H:%M:%S"))
        WORKER_LIBS_RESULTS.append(self.entry)

    def done(self, status: str, notes: str) -> None:
        self.entry.update(status=status, notes=notes)


PIPELINED = re.compile(r"(Command # \d+ \(\S+) [^)]*\)")  # redis-py: "Command # 1 (LLEN q-…) of pipeline"


def short(message: str) -> str:
    """An error for the README's table, without what varies from run to run (the arguments,
    the list of supported commands): "unknown command 'SET', with args beginning with: … (EZRA
    is a task queue; … Keys other than queues (strings, …) are outside a streams-only queue: …)"."""
    head, hint, rest = PIPELINED.sub(r"\1 …)", message).partition(" (EZRA is a task queue;")
    command, args, _ = head.partition(" with args beginning with:")
    why = rest.partition(". ")[2].partition(":")[0]
    return (command + (" with args beginning with: …" if args else "")
            + (f" (EZRA is a task queue; … {why}: …)" if why else " (EZRA is a task queue; …)" if hint else ""))


# EZRA's error for a command outside the queue (errors.unknown_command): the command, then the
# reason when it is one of the kinds a streams-only queue lacks.
REFUSAL = re.compile(r"unknown command '([^']+)', with args beginning with: .*?\(EZRA is a task queue; "
                     r"supported: [A-Z_ ]+(?:\. (.+?) are outside a streams-only queue: "
                     r"a library built on them cannot run on EZRA)?\)", re.S)


def first_refusal(text: str) -> tuple[str, str | None, str]:
    """The first of EZRA's refusals in what a library showed its user: (command, reason, error)."""
    match = REFUSAL.search(text or "")
    assert match, f"no EZRA error in:\n{(text or '')[-3000:]}"
    return match.group(1).upper(), match.group(2), match.group(0)


def refusals(text: str) -> dict[str, str | None]:
    """Every command refused in a worker's log, with EZRA's reason."""
    return {command.upper(): reason for command, reason in reversed(REFUSAL.findall(text))}


def dist_version(python, distribution: str) -> str:
    """The installed version of a distribution in another interpreter (build/venv-*)."""
    return subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({distribution!r}))"],
                          capture_output=True, text=True, check=True).stdout.strip()


def run_json(command: list[str], timeout: float = 60, **kwargs) -> dict:
    """Run a scenario script; its last stdout line that is a JSON object is its summary."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])


def walrus_database(port: int):
    try:
        import walrus
    except ImportError:
        pytest.skip("walrus is not installed (pip install -e '.[test]')")
    return walrus, walrus.Database(port=port)
