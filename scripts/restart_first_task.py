"""The first task after a kill -9 with a large lanes queue: how long a restart takes to serve it,
and the server's peak and final RSS.

    python scripts/restart_first_task.py                      # 1,000,000 tasks over 10,000 partitions, 3 runs
    python scripts/restart_first_task.py --tasks 100000 --runs 5 --ezra-cmd "env PYTHONPATH=<tree> python3 -P -m ezra"

The file is made once: the tasks pushed in pipelines with PRIORITY (n % 10) and PARTITION
(n % --partitions), 100 of them claimed, then the server killed (-9). Each run starts a server
on a copy of that directory and times, from the start of its process, the port taking
connections and the first XREADGROUP's reply (the most urgent, oldest task); then reads its
VmHWM and VmRSS.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], data_dir: str, port: int) -> tuple[subprocess.Popen, redis.Redis]:
    proc = subprocess.Popen([*cmd, "--port", str(port), "--data-dir", data_dir],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, socket_timeout=60)
    deadline = time.monotonic() + 120
    while True:
        try:
            client.ping()
            return proc, client
        except redis.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start (exit {proc.poll()})")
            time.sleep(0.01)


def memory_mb(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith(field + ":"))


def fill(cmd: list[str], data_dir: str, tasks: int, partitions: int) -> None:
    proc, client = start(cmd, data_dir, free_port())
    for first in range(0, tasks, 5000):
        pipe = client.pipeline(transaction=False)
        for n in range(first, min(first + 5000, tasks)):
            pipe.execute_command("XADD", "big", "PRIORITY", n % 10, "PARTITION", f"p{n % partitions}", "*", "n", n)
        pipe.execute()
    client.xgroup_create("big", "g", "0")
    client.xreadgroup("g", "w", {"big": ">"}, count=100)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ezra-cmd", default=f"{sys.executable} -m ezra", help="how to start EZRA")
    a = ap.parse_args()
    cmd = shlex.split(a.ezra_cmd)
    with tempfile.TemporaryDirectory(prefix="ezra-restart-") as tmp:
        source = os.path.join(tmp, "killed")
        fill(cmd, source, a.tasks, a.partitions)
        rows = []
        for run in range(a.runs):
            copy = os.path.join(tmp, f"run{run}")
            shutil.copytree(source, copy)
            started = time.perf_counter()
            proc, client = start(cmd, copy, free_port())
            port_open = time.perf_counter() - started
            reply = client.xreadgroup("g", "w", {"big": ">"}, count=1)
            first_task = time.perf_counter() - started
            assert reply[0][1][0][1] == {b"n": b"0"}, reply
            rows.append((port_open, first_task, memory_mb(proc.pid, "VmHWM"), memory_mb(proc.pid, "VmRSS")))
            proc.terminate()
            proc.wait()
            shutil.rmtree(copy)
    print(f"{a.tasks:,} tasks over {a.partitions:,} partitions, kill -9, {a.runs} restarts:")
    print("| run | port open s | first task s | peak RSS MB | RSS MB |\n|---|---:|---:|---:|---:|")
    for run, (port_open, first_task, peak, rss) in enumerate(rows, 1):
        print(f"| {run} | {port_open:.2f} | {first_task:.2f} | {peak:.0f} | {rss:.0f} |")
    print(f"| median | {statistics.median(r[0] for r in rows):.2f} | {statistics.median(r[1] for r in rows):.2f} "
          f"| {statistics.median(r[2] for r in rows):.0f} | {statistics.median(r[3] for r in rows):.0f} |")


if __name__ == "__main__":
    main()
