"""bench.py's rows for XADD AFTER (issue 49), EZRA only: Redis has no dependencies.

  fan-in-1000   one task after 1,000 (AFTER 1000, in another queue), a worker blocked on its queue
                (XREADGROUP BLOCK); the 1,000 claimed and 999 acked, then the last XACK: the time
                from sending it to its reply, and to the blocked worker receiving the dependent
                (goal: < 10 ms); FAN_IN_ROUNDS rounds, p50 and max
  waiting-1m    --backlog-n tasks each AFTER one task not done: RSS with them all waiting, the
                restart (kill -9) and RSS after it, then the one ack that releases them all (in its
                transaction): its time and the first claim after it

Each takes bench.py's Server (`srv`: port, proc, stop/start, wait_ready) and its options (`a`), and
returns (metrics, errors) as bench.py's rows do.
"""

from __future__ import annotations

import signal
import time

import redis

WORKLOADS_DOC = __doc__
FAN_IN = 1000
FAN_IN_ROUNDS = 20
GROUP = "g"
now = time.monotonic


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")) / 2**20


def client(srv, timeout: float = 900) -> redis.Redis:
    return redis.Redis(port=srv.port, protocol=2, socket_timeout=timeout)


def wl_fan_in_1000(srv, a, q):
    c, errors = client(srv), []
    deps, joined = q + "-deps", q + "-joined"
    c.xgroup_create(deps, GROUP, "0", mkstream=True)
    c.xgroup_create(joined, GROUP, "0", mkstream=True)
    blocked = client(srv)
    to_reply, to_worker = [], []
    for round_no in range(FAN_IN_ROUNDS):
        pipe = c.pipeline(transaction=False)
        for i in range(FAN_IN):
            pipe.xadd(deps, {"d": f"{round_no} {i}"})
        ids = pipe.execute()
        target = c.execute_command("XADD", joined, "AFTER", FAN_IN, *[part for i in ids for part in (deps, i)],
                                   "*", "d", f"joined {round_no}")
        claimed = [task_id for task_id, _ in c.xreadgroup(GROUP, "w", {deps: ">"}, count=FAN_IN)[0][1]]
        if c.xack(deps, GROUP, *claimed[:-1]) != FAN_IN - 1:
            errors.append(f"round {round_no}: the first {FAN_IN - 1} acks did not all count")
        conn = blocked.connection_pool.get_connection("XREADGROUP")
        conn.send_command("XREADGROUP", "GROUP", GROUP, "b", "COUNT", 1, "BLOCK", 10000, "STREAMS", joined, ">")
        time.sleep(0.05)  # the worker's XREADGROUP reaches the server and blocks (nothing to claim yet)
        t0 = now()
        if c.xack(deps, GROUP, claimed[-1]) != 1:
            errors.append(f"round {round_no}: the last ack did not count")
        to_reply.append((now() - t0) * 1000)
        got = conn.read_response()
        to_worker.append((now() - t0) * 1000)
        blocked.connection_pool.release(conn)
        if not got or got[0][1][0][0] != target:
            errors.append(f"round {round_no}: the blocked worker got {got!r}, not {target!r}")
        c.xack(joined, GROUP, target)
    to_reply.sort()
    to_worker.sort()
    if to_worker[len(to_worker) // 2] >= 10:
        errors.append(f"the dependent reached the blocked worker {to_worker[len(to_worker) // 2]:.1f} ms after the "
                      "last ack (median; goal < 10 ms)")
    return {"last ack -> worker has the dependent p50 ms": to_worker[len(to_worker) // 2],
            "last ack -> worker max ms": to_worker[-1],
            "last ack -> its reply p50 ms": to_reply[len(to_reply) // 2]}, errors


def wl_waiting_1m(srv, a, q):
    c, errors, metrics = client(srv), [], {}
    deps, joined, n = q + "-dep", q + "-waiting", a.backlog_n
    c.xgroup_create(joined, GROUP, "0", mkstream=True)
    dep = c.xadd(deps, {"d": "the one they wait for"})
    t0 = now()
    for start in range(0, n, 1000):
        pipe = c.pipeline(transaction=False)
        for i in range(start, min(start + 1000, n)):
            pipe.execute_command("XADD", joined, "AFTER", 1, deps, dep, "*", "d", f"{i} " + "x" * 190)
        pipe.execute()
    metrics["push tasks/s (AFTER 1, pipelined)"] = n / (now() - t0)
    metrics["RSS MB (all waiting)"] = rss_mb(srv.proc.pid)
    srv.proc.send_signal(signal.SIGKILL)  # every push was answered, so durable: kill -9 loses none
    srv.proc.wait()
    t0 = now()
    srv.start()
    srv.wait_ready()
    c = client(srv)
    metrics["restart (kill -9) -> serving s"] = now() - t0
    metrics["RSS MB after restart"] = rss_mb(srv.proc.pid)
    waiting = c.execute_command("XINFO", "STREAM", joined)
    waiting = dict(zip(waiting[::2], waiting[1::2])).get(b"waiting")
    if waiting != n:
        errors.append(f"{waiting!r} waiting after the restart, not {n}")
    if c.xreadgroup(GROUP, "w", {joined: ">"}, count=1):
        errors.append("a waiting task was claimable before its dependency was done")
    [[_, [(claimed, _)]]] = c.xreadgroup(GROUP, "w", {deps: ">"}, count=1)
    t0 = now()
    if c.xack(deps, GROUP, claimed) != 1:
        errors.append("the dependency's ack did not count")
    metrics["ack releasing them all s"] = now() - t0
    info = c.execute_command("XINFO", "STREAM", joined)
    info = dict(zip(info[::2], info[1::2]))
    if info.get(b"available") != n or b"waiting" in info:
        errors.append(f"after the release: {info.get(b'available')!r} available, {info.get(b'waiting')!r} waiting")
    first = c.xreadgroup(GROUP, "w", {joined: ">"}, count=1)
    metrics["RSS MB after the release"] = rss_mb(srv.proc.pid)
    if not first or not first[0][1][0][1][b"d"].startswith(b"0 "):
        errors.append(f"the first task claimed after the release is {first!r}, not the first pushed")
    return metrics, errors


WORKLOADS = {"fan-in-1000": wl_fan_in_1000, "waiting-1m": wl_waiting_1m}
