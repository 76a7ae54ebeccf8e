"""The reliability campaign's figures: `report(name, **figures)` writes
build/reliability/<name>.json and prints one line (shown with `pytest -s`): the README's
reliability figures come from these files, not from hand counting.

The campaign's strict RESP reply parser is the suite's one parser, in support_resp.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

REPORT_DIR = Path(__file__).resolve().parent.parent / "build" / "reliability"


def report(name: str, **figures) -> None:
    """Record a test's figures in build/reliability/<name>.json and print them on one line."""
    REPORT_DIR.mkdir(parents=True, exist_ok=True)
    figures = {"test": name, "finished": time.strftime("%Y-%m-%d %H:%M:%S"), **figures}
    (REPORT_DIR / f"{name}.json").write_text(json.dumps(figures, indent=1) + "\n")
    print(f"\nreliability {name}: " + ", ".join(f"{k}={v}" for k, v in figures.items() if k != "test"))
