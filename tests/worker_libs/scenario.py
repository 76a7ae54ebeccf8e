"""What the worker-library apps here share: where EZRA is, and how a producer reports.

Each `*_app.py` beside this file is one library's app as its README shows it: tasks that
print "DONE <n> <pid>", and produce(n), which pushes n tasks and prints one JSON line.
tests/test_worker_libs.py runs them in build/venv-worker-libs* (PYTHONPATH=this folder):
the producer with `python -c "import X_app; X_app.produce(n)"`, the workers with the
library's own command line.
"""

from __future__ import annotations

import json
import os
import sys

PORT = int(os.environ["EZRA_PORT"])
QUEUE = os.environ["QUEUE"]
URL = f"redis://127.0.0.1:{PORT}"


def done(n) -> None:
    # One write() per line: a library's worker processes share one log file, and print()
    # writes its pieces separately, so two workers' lines could interleave mid-line.
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), b"DONE %d %d\n" % (n, os.getpid()))


def failure(error: BaseException) -> str:
    return f"{type(error).__module__}.{type(error).__name__}: {error}"


def report(version: str, pushed: int, error: BaseException | None, **more) -> None:
    """The producer's summary: how many pushes returned, and the error that stopped it."""
    print(json.dumps(dict(version=version, pushed=pushed, error=error and failure(error), **more)))
