"""Smoke run of scripts/bench.py (tiny N, EZRA and the floor only) so the benchmark cannot rot.

No timing assertion: only that it runs, that every correctness check passed and that the
throughput figures are there and non-zero.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a whole benchmark run, about 35 s: not in `pytest -m "not slow"`

ROOT = Path(__file__).resolve().parent.parent


def test_bench_smoke(tmp_path):
    out = tmp_path / "x.json"
    proc = subprocess.run([sys.executable, "scripts/bench.py", "--smoke", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| workload | metric |" in proc.stdout

    result = json.loads(out.read_text())
    for server in ("ezra", "floor"):  # the floor is the yardstick: scripts/floor_server.py
        records = [r for r in result["records"] if r["server"] == server]
        assert {r["workload"] for r in records} >= {"cycle-4x4", "cycle-batched", "push-drain", "latency"}, result
    for r in result["records"]:
        assert r["ok"] is True and r["errors"] == [], r
        for metric, value in r["metrics"].items():
            if metric.endswith("tasks/s"):
                assert value > 0, (r["workload"], metric, value)
    ratio = next(r for r in result["summary"] if r["workload"] == "cycle-4x4"
                 and r["metric"] == "server CPU / floor CPU")
    assert ratio["median"]["floor"] == 1.0 and ratio["median"]["ezra"] > 0, ratio
