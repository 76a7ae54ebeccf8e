"""What the framework apps share: where EZRA is, and the lines their tasks print."""

from __future__ import annotations

import json
import os
import sys

PORT = int(os.environ["EZRA_PORT"])
QUEUE = os.environ["QUEUE"]
URL = f"redis://127.0.0.1:{PORT}"


def line(word: str, n) -> None:
    """"<WORD> <n> <pid>" in one write() to fd 1 (Celery replaces sys.stdout with a logger):
    a worker's processes share one log file."""
    sys.stdout.flush()
    os.write(sys.__stdout__.fileno(), b"%s %d %d\n" % (word.encode(), n, os.getpid()))


def report(**summary) -> None:
    print(json.dumps(summary), flush=True)
