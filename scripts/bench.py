#!/usr/bin/env python3
"""Benchmark EZRA against redis-server, beanstalkd and the floor, side by side on loopback.

    python scripts/bench.py                      # everything, medians of 3 runs
    python scripts/bench.py --servers ezra,floor,redis-always --workloads cycle-4x4,many-clients --runs 5
    python scripts/bench.py --smoke --json /tmp/x.json   # tiny run, EZRA and the floor only

Every server is started fresh for every (workload, run) on a free port in a
temporary data dir, and stopped with SIGTERM afterwards.  Producers and workers
are separate processes using redis-py + hiredis (a tiny raw-socket client for
beanstalkd; many-clients drives its connections from epoll loops, see ManyConn).
Every workload checks that each task was acknowledged exactly once and that
nothing is left pending.  The script installs nothing.

Servers: ezra (--durability full), ezra-normal, ezra-metrics (full, /metrics
scraped every second), floor (scripts/floor_server.py: the yardstick, the request
path alone on EZRA's stack; every server-CPU row gets a "/ floor CPU" row),
redis-always and redis-everysec (AOF), beanstalkd (binlog).

Workloads (all but latency, backlog and footprint also report server CPU µs per task):
  cycle-4x4           4 producers and 4 workers, one task per command
  cycle-batched       2 producers pipelining 50 XADDs, 2 workers claiming and acking 50
  many-clients        32 producers and 32 workers on 64 connections, one round trip per
                      command (XADD; XREADGROUP COUNT 1 BLOCK, then XACK)
  push-drain          4 producers push everything, then 4 workers drain it (-batched: 50 at a time)
  latency             1 paced producer (--latency-rate), 2 workers: push->pop and push->ack
  idle-waiters        cycle-4x4 while --idle-conns readers block on other queues
  backlog             --backlog-n tasks queued: RSS, disk, restart time, drain at the head
  footprint           idle RSS, and RSS per connection opened and after sitting idle
  rb-xadd             redis-benchmark -c 50 XADD q * f v (10x --tasks XADDs; a C client, so the
                      server is what is measured; from redis-tools)
  rb-xadd-p16         the same with -P 16 (16 pipelined XADDs per connection)
  priority-mixed      cycle-batched with a random PRIORITY (0-9) on every task (EZRA only)
  partitions-10k      tasks over 10,000 partitions (PARTITION-LIMIT 1) pushed, then drained by 8
                      workers claiming 50: at --tasks and at --backlog-n queued (EZRA only)
  fairness            one partition with 100,000 queued, then 50 with 10 each: claims until every
                      one of the 50's first tasks was handed out, at most 100 (EZRA only)
  results             cycle-batched with a 200-byte XACK ... RESULT on every ack (50 pipelined), and
                      each producer waiting for its 50 tasks' results with XRESULT BLOCK, one per
                      task (pipelined), before its next 50 (EZRA only)
  fan-in-1000, waiting-1m   XADD AFTER (EZRA only), see scripts/bench_dependencies.py
  raw-1x1, celery, dramatiq, taskiq, xadd-litestream   see scripts/bench_frameworks.py
"""
import argparse
import base64
import json
import math
import multiprocessing as mp
import os
import platform
import queue as queue_mod
import resource
import selectors
import shlex
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import hiredis
import redis

import bench_dependencies  # XADD AFTER's rows (scripts/bench_dependencies.py)
import bench_frameworks  # the frameworks' and Litestream's rows (scripts/bench_frameworks.py)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOST = "127.0.0.1"
GROUP = "g"
PAYLOAD_BYTES = 200
FOOTPRINT_IDLE_S = 3.0  # footprint: how long the connections sit idle before "RSS per idle conn"
BACKLOG_DRAIN = 5000  # tasks drained at the head of the backlog (and from an empty queue)
now = time.monotonic  # CLOCK_MONOTONIC: comparable across processes on Linux
ALL_WORKLOADS = ["cycle-4x4", "cycle-batched", "many-clients", "push-drain", "push-drain-batched",
                 "latency", "idle-waiters", "backlog", "footprint", "rb-xadd", "rb-xadd-p16",
                 "priority-mixed", "partitions-10k", "fairness", "results"] + list(bench_dependencies.WORKLOADS) \
    + list(bench_frameworks.WORKLOADS)
TOOL_WORKLOADS = {"rb-xadd": "redis-benchmark", "rb-xadd-p16": "redis-benchmark"}  # skipped without the tool
ALIASES = {"push-only": "push-drain", "drain": "push-drain"}
BEANSTALK_WORKLOADS = {"cycle-4x4", "push-drain", "latency"}
FLOOR = "floor"  # scripts/floor_server.py: the yardstick for server CPU per task (see its docstring)
MANY_PRODUCERS = MANY_WORKERS = 32  # many-clients: connections, each with one command in flight
MANY_PROCS = 2  # many-clients: processes per role, each driving 16 of those connections
INSTALL_HINT = "apt-get install redis-server beanstalkd"


# --------------------------------------------------------------------------- clients
def encode(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Resp:
    """Raw RESP connection for setup and checks (fill, admin, idle waiters): exact replies."""

    def __init__(self, port, timeout=30):
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.reader = hiredis.Reader()

    def send(self, cmds):
        self.sock.sendall(b"".join(encode(*c) for c in cmds))

    def read(self, n=1):
        out = []
        while len(out) < n:
            r = self.reader.gets()
            if r is False:
                data = self.sock.recv(1 << 16)
                if not data:
                    raise ConnectionError("server closed the connection")
                self.reader.feed(data)
            else:
                out.append(r)
        return out

    def call(self, *args):
        self.send([args])
        return self.read(1)[0]

    def close(self):
        self.sock.close()


class RedisQueue:
    """The measured client for RESP servers: redis-py + hiredis, one connection."""

    def __init__(self, port, q):
        self.r = redis.Redis(host=HOST, port=port, socket_timeout=30, driver_info=None)
        self.q = q

    def push(self, payloads):
        if len(payloads) == 1:
            return [self.r.xadd(self.q, {"d": payloads[0]})]
        pipe = self.r.pipeline(transaction=False)
        for p in payloads:
            pipe.xadd(self.q, {"d": p})
        return pipe.execute()

    def pop(self, consumer, count, block_ms):
        reply = self.r.xreadgroup(GROUP, consumer, {self.q: ">"}, count=count, block=block_ms)
        return [(mid, fields[b"d"]) for mid, fields in reply[0][1]] if reply else []

    def ack(self, ids):
        return self.r.xack(self.q, GROUP, *ids)


class BeanQueue:
    """Minimal beanstalkd client: put / reserve-with-timeout / delete / stats-tube."""

    def __init__(self, port, q):
        self.sock = socket.create_connection((HOST, port), timeout=30)
        self.buf = b""
        for line in (b"use " + q.encode(), b"watch " + q.encode(), b"ignore default"):
            self.cmd(line)

    def _line(self):
        while b"\r\n" not in self.buf:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("beanstalkd closed the connection")
            self.buf += data
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _body(self, n):
        while len(self.buf) < n + 2:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("beanstalkd closed the connection")
            self.buf += data
        body, self.buf = self.buf[:n], self.buf[n + 2:]
        return body

    def cmd(self, line):
        self.sock.sendall(line + b"\r\n")
        return self._line()

    def push(self, payloads):
        ids = []
        for p in payloads:
            self.sock.sendall(b"put 1024 0 60 %d\r\n%s\r\n" % (len(p), p))
            reply = self._line()
            if not reply.startswith(b"INSERTED "):
                raise RuntimeError("put -> %r" % reply)
            ids.append(reply.split()[1])
        return ids

    def pop(self, consumer, count, block_ms):
        reply = self.cmd(b"reserve-with-timeout %d" % max(1, math.ceil(block_ms / 1000)))
        if reply.startswith(b"RESERVED "):
            _, jid, n = reply.split()
            return [(jid, self._body(int(n)))]
        if reply in (b"TIMED_OUT", b"DEADLINE_SOON"):
            return []
        raise RuntimeError("reserve-with-timeout -> %r" % reply)

    def ack(self, ids):
        return sum(self.cmd(b"delete " + jid) == b"DELETED" for jid in ids)

    def stats_tube(self, q):
        head = self.cmd(b"stats-tube " + q.encode())
        if head == b"NOT_FOUND":  # beanstalkd drops a tube once it is empty and unwatched
            return {}
        if not head.startswith(b"OK "):
            raise RuntimeError("stats-tube -> %r" % head)
        body = self._body(int(head.split()[1])).decode()
        return dict(l.split(": ", 1) for l in body.splitlines() if ": " in l)

    def close(self):
        self.sock.close()


def make_client(proto, port, q):
    return (RedisQueue if proto == "resp" else BeanQueue)(port, q)


def payload(seq, t=0.0):
    """200 bytes: seq, send time, then random base64 padding (so disk sizes are not flattered by
    compression)."""
    head = b"%d %.6f " % (seq, t)
    return head + base64.b64encode(os.urandom(PAYLOAD_BYTES))[:PAYLOAD_BYTES - len(head)]


# --------------------------------------------------------------------------- servers
def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def rss_bytes(pid):
    """VmRSS of the server process itself (not of forked children such as Redis's AOF rewrite,
    whose copy-on-write pages would be counted twice)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))


def cpu_seconds(pid):
    """utime + stime of the server process, plus those of its children it has reaped."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


class Scraper(threading.Thread):
    """GETs /metrics every SCRAPE_EVERY seconds while a server runs (ezra-metrics): the cost
    of being watched, at 15x Prometheus's default scrape rate."""

    SCRAPE_EVERY = 1.0

    def __init__(self, url):
        super().__init__(daemon=True)
        self.url, self.stopping, self.scrapes, self.errors = url, threading.Event(), 0, []

    def run(self):
        while not self.stopping.wait(self.SCRAPE_EVERY):
            try:
                with urllib.request.urlopen(self.url, timeout=10) as response:
                    response.read()
                self.scrapes += 1
            except OSError as e:
                self.errors.append(repr(e))

    def stop(self):
        self.stopping.set()
        self.join(15)
        if self.errors:
            raise RuntimeError(f"/metrics scrapes failed: {self.errors[:3]}")


class Server:
    """One server process on a fresh temp data dir; can be restarted on the same dir."""

    def __init__(self, name, proto, argv_fn):
        self.name, self.proto, self.argv_fn = name, proto, argv_fn
        self.tmp = tempfile.mkdtemp(prefix=f"ezra-bench-{name}-")
        self.data = os.path.join(self.tmp, "data")
        os.mkdir(self.data)
        self.port, self.proc, self.t_popen, self._admin = free_port(), None, None, None
        self.metrics_url, self.scraper = None, None

    def start(self):
        log = open(os.path.join(self.tmp, "server.log"), "ab")
        self.t_popen = now()
        argv = self.argv_fn(self.port, self.data)
        if "--http-port" in argv:
            self.metrics_url = f"http://{HOST}:{argv[argv.index('--http-port') + 1]}/metrics"
        self.proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        return self.t_popen

    def wait_ready(self, timeout=30):
        deadline, last = now() + timeout, None
        while now() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                if self.proto == "resp":
                    c = Resp(self.port, timeout=5)
                    last = c.call("PING")
                    c.close()
                    if last == b"PONG":
                        if self.metrics_url:
                            self.scraper = Scraper(self.metrics_url)
                            self.scraper.start()
                        return
                else:
                    make_client("beanstalk", self.port, "default").close()
                    return
            except OSError as e:
                last = e
            time.sleep(0.01)  # poll interval, bounded by the deadline
        raise RuntimeError(f"{self.name} not ready after {timeout}s (last: {last!r}): {self.log_tail()}")

    def admin(self):
        if self._admin is None:
            self._admin = Resp(self.port) if self.proto == "resp" else BeanQueue(self.port, "default")
        return self._admin

    def stop(self, timeout=20):
        if self.scraper is not None:
            scraper, self.scraper = self.scraper, None
            scraper.stop()
        if self._admin:
            self._admin.close()
            self._admin = None
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def cleanup(self):
        try:
            self.stop()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def log_tail(self, n=15):
        try:
            with open(os.path.join(self.tmp, "server.log"), errors="replace") as f:
                return " | ".join(f.read().splitlines()[-n:])
        except OSError:
            return ""


def server_specs(args):
    ezra = shlex.split(args.ezra_cmd) if args.ezra_cmd else [sys.executable, "-m", "ezra"]

    # max clients: room for the 10,000 footprint connections (both default to 10,000)
    def ezra_fn(durability, *extra):
        return lambda p, d: ezra + ["--port", str(p), "--data-dir", d, "--durability", durability,
                                    "--log-level", "warning", "--max-clients", "12000", *extra]

    def redis_fn(fsync):
        return lambda p, d: ["redis-server", "--port", str(p), "--bind", HOST, "--dir", d,
                             "--appendonly", "yes", "--appendfsync", fsync, "--save", "",
                             "--maxclients", "12000"]

    return {  # name: (protocol, argv builder, binary that must be on PATH)
        "ezra": ("resp", ezra_fn("full"), None),
        "ezra-normal": ("resp", ezra_fn("normal"), None),
        # full durability with the HTTP listener on and /metrics scraped every second (issue 8)
        "ezra-metrics": ("resp", lambda p, d: ezra_fn("full", "--http-port", str(free_port()))(p, d), None),
        # the yardstick: the same stack as EZRA's with nothing but the request path (scripts/floor_server.py)
        FLOOR: ("resp", lambda p, d: [sys.executable, os.path.join(REPO, "scripts", "floor_server.py"),
                                      "--port", str(p), "--data-dir", d], None),
        "redis-always": ("resp", redis_fn("always"), "redis-server"),
        "redis-everysec": ("resp", redis_fn("everysec"), "redis-server"),
        "beanstalkd": ("beanstalk", lambda p, d: ["beanstalkd", "-l", HOST, "-p", str(p),
                                                   "-b", d, "-f", "0"], "beanstalkd"),
    }


# --------------------------------------------------------------------------- processes
def producer_main(proto, port, q, lo, hi, batch, rate, barrier, deadline, resq):
    res = {"role": "producer", "sent": 0, "t_end": None, "errors": []}
    try:
        c = make_client(proto, port, q)
        barrier.wait(60)
        t0, seq = now(), lo
        while seq < hi and now() < deadline:
            if rate:  # paced: task k is due at t0 + k/rate
                delay = t0 + (seq - lo) / rate - now()
                if delay > 0:
                    time.sleep(delay)
            n = min(batch, hi - seq)
            ids = c.push([payload(s, now()) for s in range(seq, seq + n)])
            if len(ids) != n or not all(ids):
                raise RuntimeError(f"push of {n} tasks returned {ids[:3]!r}...")
            res["sent"] += n
            seq += n
        res["t_end"] = now()
        if seq < hi:
            res["errors"].append(f"producer deadline: sent {seq - lo} of {hi - lo}")
    except Exception as e:  # report, never hang the parent
        res["errors"].append(f"producer: {e!r}")
    resq.put(res)


def worker_main(proto, port, q, consumer, count, n_total, done, barrier, deadline, resq):
    res = {"role": "worker", "seqs": [], "acked": 0, "pop_lat": [], "ack_lat": [], "t_end": None, "errors": []}
    try:
        c = make_client(proto, port, q)
        barrier.wait(60)
        for _ in range(4 * n_total + 10_000):  # bounded in count and time
            if done.value >= n_total or now() >= deadline:
                break
            items = c.pop(consumer, count, 1000)
            if not items:
                continue
            t_pop = now()
            n = c.ack([mid for mid, _ in items])
            t_ack = now()
            if n != len(items):
                res["errors"].append(f"ack of {len(items)} ids returned {n!r}")
            for _, p in items:
                seq, ts = p.split(b" ", 2)[:2]
                res["seqs"].append(int(seq))
                res["pop_lat"].append(t_pop - float(ts))
                res["ack_lat"].append(t_ack - float(ts))
            res["acked"] += n
            res["t_end"] = t_ack
            with done.get_lock():
                done.value += len(items)
    except Exception as e:
        res["errors"].append(f"worker {consumer}: {e!r}")
    resq.put(res)


def fill_main(proto, port, q, lo, hi, batch, barrier, deadline, resq):
    """Untimed setup: raw pipelined XADDs, in seq order."""
    res = {"role": "fill", "sent": 0, "t_end": None, "errors": []}
    try:
        c = Resp(port, timeout=120)
        barrier.wait(60)
        in_flight = 0  # keep two batches in flight: encode the next while the server works
        for s in list(range(lo, hi, batch)) + [hi]:
            if now() >= deadline:
                raise RuntimeError(f"fill deadline after {res['sent']} tasks")
            e = min(s + batch, hi)
            if e > s:
                c.send([("XADD", q, "*", "d", payload(i)) for i in range(s, e)])
            if in_flight:
                bad = [r for r in c.read(in_flight) if not isinstance(r, bytes)]
                if bad:
                    raise RuntimeError(f"XADD -> {bad[0]!r}")
                res["sent"] += in_flight
            in_flight = e - s
        res["t_end"] = now()
    except Exception as e:
        res["errors"].append(f"fill: {e!r}")
    resq.put(res)


# many-clients: MANY_PRODUCERS + MANY_WORKERS connections, each with one command in flight, as that
# many separate clients would have. redis-py's calls block, so it needs a process or a thread per
# connection: 64 processes (or 64 threads handing one GIL around) on a 2-core machine would measure
# the clients' scheduling more than the server. Instead MANY_PROCS processes per role each drive
# their connections from one epoll loop: they send the bytes redis-py sends (HELLO 3 first, as
# redis-py 8 does) and parse replies with hiredis as redis-py does; the server sees 64 clients.
class ManyConn:
    """One connection of a many-clients process: at most one reply outstanding."""

    def __init__(self, port):
        self.sock = socket.create_connection((HOST, port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader, self.seq = hiredis.Reader(), None
        hello = self.call(encode("HELLO", "3"))
        if not isinstance(hello, (dict, list)):
            raise RuntimeError(f"HELLO 3 -> {hello!r}")

    def send(self, data):
        self.sock.sendall(data)  # a command is far below the socket buffer: never waits

    def reply(self):
        """The reply, or False while it is incomplete; only called when the socket is readable."""
        data = self.sock.recv(1 << 16)
        if not data:
            raise ConnectionError("server closed the connection")
        self.reader.feed(data)
        return self.reader.gets()

    def call(self, data):
        self.send(data)
        reply = False
        while reply is False:
            reply = self.reply()
        return reply


def many_loop(conns, on_reply, deadline):
    """Call on_reply(conn, reply) for each reply until it has returned False for every connection."""
    sel, active = selectors.DefaultSelector(), len(conns)
    for c in conns:
        sel.register(c.sock, selectors.EVENT_READ, c)
    while active:
        left = deadline - now()
        if left <= 0:
            raise RuntimeError(f"deadline with {active} connections still busy")
        for key, _ in sel.select(min(left, 1.0)):
            reply = key.data.reply()
            if reply is not False and not on_reply(key.data, reply):
                sel.unregister(key.fileobj)
                active -= 1
    sel.close()


def many_producers_main(port, q, ranges, barrier, deadline, resq):
    """Each connection XADDs the tasks of its range one at a time, waiting for each reply."""
    res = {"role": "producer", "sent": 0, "t_end": None, "errors": []}
    try:
        conns = [ManyConn(port) for _ in ranges]
        barrier.wait(60)

        def push(c):
            c.send(encode("XADD", q, "*", "d", payload(c.seq, now())))

        def on_reply(c, reply):
            if not isinstance(reply, bytes):
                raise RuntimeError(f"XADD -> {reply!r}")
            res["sent"] += 1
            c.seq += 1
            if c.seq < c.hi:
                push(c)
                return True
            return False

        busy = []
        for c, (lo, hi) in zip(conns, ranges):
            c.seq, c.hi = lo, hi
            if lo < hi:
                push(c)
                busy.append(c)
        many_loop(busy, on_reply, deadline)
        res["t_end"] = now()
    except Exception as e:  # report, never hang the parent
        res["errors"].append(f"many producers: {e!r}")
    resq.put(res)


def many_workers_main(port, q, consumers, n_total, done, barrier, deadline, resq):
    """Each connection: XREADGROUP COUNT 1 BLOCK 1000, then XACK what it got, until all is acked."""
    res = {"role": "worker", "seqs": [], "acked": 0, "pop_lat": [], "ack_lat": [], "t_end": None, "errors": []}
    try:
        conns = [ManyConn(port) for _ in consumers]
        barrier.wait(60)
        pops = {c: encode("XREADGROUP", "GROUP", GROUP, name, "COUNT", "1", "BLOCK", "1000", "STREAMS", q, ">")
                for c, name in zip(conns, consumers)}

        def on_reply(c, reply):
            if c.seq is None:  # the reply to XREADGROUP: nothing after BLOCK, or one task
                if not reply:
                    if done.value >= n_total:
                        return False
                    c.send(pops[c])
                    return True
                (mid, fields), = reply[q.encode()] if isinstance(reply, dict) else reply[0][1]
                c.seq = int(fields[1].split(b" ", 1)[0])
                c.send(encode("XACK", q, GROUP, mid))
                return True
            if reply != 1:
                res["errors"].append(f"ack of 1 id returned {reply!r}")
            res["acked"] += reply if isinstance(reply, int) else 0
            res["seqs"].append(c.seq)
            res["t_end"], c.seq = now(), None
            with done.get_lock():
                done.value += 1
                finished = done.value >= n_total
            if not finished:
                c.send(pops[c])
            return not finished

        for c in conns:
            c.send(pops[c])
        many_loop(conns, on_reply, deadline)
    except Exception as e:
        res["errors"].append(f"many workers: {e!r}")
    resq.put(res)


def run_procs(srv, specs, timeout, n_total=0):
    """Start one process per (func, args), release them together, collect results.

    Returns (results, elapsed to the last t_end, server CPU seconds, errors)."""
    ctx = mp.get_context("fork")
    resq, done, barrier = ctx.Queue(), ctx.Value("q", 0), ctx.Barrier(len(specs) + 1)
    deadline = now() + timeout
    counted = (worker_main, many_workers_main, results_worker_main)  # these stop when `done` reaches n_total
    procs = [ctx.Process(target=f, args=a + (barrier, deadline, resq) if f not in counted
                         else a + (n_total, done, barrier, deadline, resq), daemon=True) for f, a in specs]
    for p in procs:
        p.start()
    results, errors = [], []
    cpu0 = cpu_seconds(srv.proc.pid)
    try:
        barrier.wait(60)
    except threading.BrokenBarrierError:
        errors.append("client processes did not start")
    t0 = now()
    for _ in procs:
        try:
            results.append(resq.get(timeout=max(1.0, deadline - now() + 15)))
        except queue_mod.Empty:
            errors.append("a client process did not report")
            break
    cpu = cpu_seconds(srv.proc.pid) - cpu0
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.terminate()
            p.join(5)
    for r in results:
        errors.extend(r["errors"])
    ends = [r["t_end"] for r in results if r["t_end"]]
    return results, (max(ends) - t0 if ends else float("nan")), cpu, errors


def phase(srv, q, n, producers=0, batch=1, rate=0, workers=0, count=1, timeout=120):
    """Producers and/or workers on one queue; return measurements and worker results."""
    specs = []
    for k in range(producers):
        lo, hi = n * k // producers, n * (k + 1) // producers
        specs.append((producer_main, (srv.proto, srv.port, q, lo, hi, batch, rate)))
    for k in range(workers):
        specs.append((worker_main, (srv.proto, srv.port, q, f"w{k}", count)))
    return tally(srv, specs, n, workers > 0, timeout)


def tally(srv, specs, n, workers, timeout):
    """Run the client processes of specs (n tasks; workers: whether any ack) and sum up what they did."""
    results, elapsed, cpu, errors = run_procs(srv, specs, timeout, n_total=n)
    wres = [r for r in results if r["role"] == "worker"]
    acked, sent = sum(r["acked"] for r in wres), sum(r.get("sent", 0) for r in results)
    done = max(1, acked if workers else sent)  # what was actually done, even after a deadline
    return {"rate": done / elapsed if elapsed > 0 else 0.0, "cpu_us": cpu * 1e6 / done, "elapsed": elapsed,
            "seqs": [s for r in wres for s in r["seqs"]], "acked": acked, "sent": sent,
            "pop_lat": [x for r in wres for x in r["pop_lat"]],
            "ack_lat": [x for r in wres for x in r["ack_lat"]], "errors": errors}


def fill(srv, q, lo, hi, timeout):
    results, elapsed, _, errors = run_procs(srv, [(fill_main, ("resp", srv.port, q, lo, hi, 1000))], timeout)
    if errors or sum(r["sent"] for r in results) != hi - lo:
        raise RuntimeError(f"fill of {q} failed: {errors}")
    return (hi - lo) / elapsed


# --------------------------------------------------------------------------- checks
def create_group(srv, q):
    if srv.proto == "resp":
        reply = srv.admin().call("XGROUP", "CREATE", q, GROUP, "0", "MKSTREAM")
        if reply != b"OK" and "BUSYGROUP" not in str(reply):
            raise RuntimeError(f"XGROUP CREATE {q} {GROUP} 0 MKSTREAM -> {reply!r}")


def check_acks(m, expected, errors):
    """Every expected task acked exactly once, by XACK count and by payload sequence number."""
    errors.extend(m["errors"])
    seqs = m["seqs"]
    if m["acked"] != len(expected):
        errors.append(f"acked {m['acked']} tasks, expected {len(expected)}")
    if len(seqs) != len(set(seqs)):
        errors.append(f"{len(seqs) - len(set(seqs))} tasks delivered more than once")
    if set(seqs) != set(expected):
        errors.append(f"delivered set differs: {len(set(expected) - set(seqs))} missing, "
                      f"{len(set(seqs) - set(expected))} unexpected")


def check_pending(srv, q, errors, all_consumed=True):
    """Nothing pending (XPENDING summary count == 0) and, if all_consumed, nothing undelivered."""
    a = srv.admin()
    if srv.proto == "beanstalk":
        st = a.stats_tube(q)
        left = {k: st.get(k) for k in ("current-jobs-ready", "current-jobs-reserved",
                                        "current-jobs-delayed", "current-jobs-buried") if st.get(k, "0") != "0"}
        if left:
            errors.append(f"stats-tube {q}: {left}")
        return
    reply = a.call("XPENDING", q, GROUP)
    if not (isinstance(reply, list) and reply and reply[0] == 0):
        errors.append(f"XPENDING {q} {GROUP} -> {reply!r} (expected count 0)")
    if all_consumed:
        reply = a.call("XREADGROUP", "GROUP", GROUP, "checker", "COUNT", "1", "STREAMS", q, ">")
        if reply:
            errors.append(f"undelivered task left in {q}: XREADGROUP -> {str(reply)[:200]}")


def pct(xs, p):
    xs = sorted(xs)
    return xs[max(0, math.ceil(p * len(xs)) - 1)] * 1000 if xs else float("nan")


def open_conns(port, n, first_cmds=None):
    """n raw connections, in batches so the accept queue never overflows.  With first_cmds
    (a function i -> command) the command is sent and not read; otherwise PING is answered."""
    socks = []
    for start in range(0, n, 200):
        batch = [socket.create_connection((HOST, port), timeout=30) for _ in range(start, min(n, start + 200))]
        for i, s in enumerate(batch, start):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close
            s.sendall(encode(*first_cmds(i)) if first_cmds else b"*1\r\n$4\r\nPING\r\n")
        if not first_cmds:
            for s in batch:
                reply = s.recv(64)
                while reply and not reply.endswith(b"\r\n"):
                    reply += s.recv(64) or b"\r\n"
                if reply != b"+PONG\r\n":
                    raise RuntimeError(f"PING on connection -> {reply!r}")
        socks.extend(batch)
    return socks


def unexpected_data(socks):
    for s in socks:
        s.setblocking(False)
        try:
            data = s.recv(256, socket.MSG_PEEK)
            return data or b"<closed by server>"
        except BlockingIOError:
            continue
    return None


# --------------------------------------------------------------------------- workloads
def wl_cycle(srv, a, q, producers=4, batch=1, workers=4, count=1):
    create_group(srv, q)
    m, errors = phase(srv, q, a.tasks, producers, batch, 0, workers, count, a.timeout), []
    check_acks(m, range(a.tasks), errors)
    check_pending(srv, q, errors)
    return {"tasks/s": m["rate"], "server CPU µs/task": m["cpu_us"]}, errors


def wl_cycle_batched(srv, a, q):
    return wl_cycle(srv, a, q, producers=2, batch=50, workers=2, count=50)


def wl_many_clients(srv, a, q):
    """MANY_PRODUCERS producers and MANY_WORKERS workers, one round trip per command (see ManyConn)."""
    create_group(srv, q)
    n, errors = a.tasks, []
    ranges = [(n * k // MANY_PRODUCERS, n * (k + 1) // MANY_PRODUCERS) for k in range(MANY_PRODUCERS)]
    names = [f"w{k}" for k in range(MANY_WORKERS)]
    specs = ([(many_producers_main, (srv.port, q, ranges[i::MANY_PROCS])) for i in range(MANY_PROCS)]
             + [(many_workers_main, (srv.port, q, names[i::MANY_PROCS])) for i in range(MANY_PROCS)])
    m = tally(srv, specs, n, True, a.timeout)
    check_acks(m, range(n), errors)
    check_pending(srv, q, errors)
    return {"tasks/s": m["rate"], "server CPU µs/task": m["cpu_us"]}, errors


def wl_push_drain(srv, a, q, producers=4, batch=1, workers=4, count=1):
    create_group(srv, q)
    errors = []
    p = phase(srv, q, a.tasks, producers=producers, batch=batch, timeout=a.timeout)
    errors.extend(p["errors"])
    if p["sent"] != a.tasks:
        errors.append(f"pushed {p['sent']} of {a.tasks}")
    d = phase(srv, q, a.tasks, workers=workers, count=count, timeout=a.timeout)
    check_acks(d, range(a.tasks), errors)
    check_pending(srv, q, errors)
    return {"push-only tasks/s": p["rate"], "push-only server CPU µs/task": p["cpu_us"],
            "drain tasks/s": d["rate"], "drain server CPU µs/task": d["cpu_us"]}, errors


def wl_push_drain_batched(srv, a, q):
    return wl_push_drain(srv, a, q, producers=2, batch=50, workers=2, count=50)


def wl_latency(srv, a, q):
    create_group(srv, q)
    n, errors = a.latency_tasks, []
    m = phase(srv, q, n, producers=1, rate=a.latency_rate, workers=2, timeout=a.timeout + n / a.latency_rate)
    check_acks(m, range(n), errors)
    check_pending(srv, q, errors)
    return {"push->pop p50 ms": pct(m["pop_lat"], 0.5), "push->pop p99 ms": pct(m["pop_lat"], 0.99),
            "push->ack p50 ms": pct(m["ack_lat"], 0.5), "push->ack p99 ms": pct(m["ack_lat"], 0.99),
            "achieved tasks/s": m["rate"]}, errors


def wl_idle_waiters(srv, a, q):
    n, adm = a.idle_conns, srv.admin()
    names = [f"{q}-idle-{i}" for i in range(n)]
    adm.send([("XGROUP", "CREATE", name, GROUP, "0", "MKSTREAM") for name in names])
    bad = [r for r in adm.read(n) if r != b"OK" and "BUSYGROUP" not in str(r)]
    if bad:
        raise RuntimeError(f"XGROUP CREATE <idle queue> -> {bad[0]!r}")
    socks = open_conns(srv.port, n, lambda i: ("XREADGROUP", "GROUP", GROUP, f"idle{i}", "COUNT", "1",
                                               "BLOCK", "0", "STREAMS", names[i], ">"))
    try:
        deadline, blocked = now() + 30, None
        while now() < deadline:  # confirm through INFO where the server has it
            info = adm.call("INFO", "clients")
            if not isinstance(info, bytes) or b"blocked_clients:" not in info:
                adm.call("PING")  # no INFO: at least one round trip after all the sends
                break
            blocked = int(info.split(b"blocked_clients:")[1].split(b"\r\n")[0])
            if blocked >= n:
                break
            time.sleep(0.01)
        if blocked is not None and blocked < n:
            raise RuntimeError(f"only {blocked} of {n} idle waiters blocked")
        metrics, errors = wl_cycle(srv, a, q)
        data = unexpected_data(socks)
        if data:
            errors.append(f"an idle waiter on another queue received {data[:120]!r}")
        return metrics, errors
    finally:
        for s in socks:
            s.close()


def wl_backlog(srv, a, q):
    errors, metrics, h = [], {}, min(a.tasks, BACKLOG_DRAIN, a.backlog_n - 1)
    small = q + "-small"  # the "empty queue": only the h tasks to drain
    create_group(srv, small)
    fill(srv, small, 0, h, a.timeout)
    m = phase(srv, small, h, workers=4, timeout=a.timeout)
    check_acks(m, range(h), errors)
    check_pending(srv, small, errors)
    create_group(srv, q)
    metrics["fill tasks/s (pipelined)"] = fill(srv, q, 0, a.backlog_n, max(a.timeout, a.backlog_n / 2000))
    metrics["RSS MB (backlog queued)"] = rss_bytes(srv.proc.pid) / 2**20
    metrics["data dir MB"] = dir_bytes(srv.data) / 2**20  # while running (e.g. with the WAL)
    srv.stop()
    t0, deadline, c, last = srv.start(), now() + a.timeout, None, None
    while now() < deadline:  # poll until the first task is served (not a fixed sleep)
        try:
            c = c or Resp(srv.port)
            last = c.call("XREADGROUP", "GROUP", GROUP, "probe", "COUNT", "1", "STREAMS", q, ">")
            if isinstance(last, list) and last:
                break
        except OSError as e:
            c, last = None, e
        if srv.proc.poll() is not None:
            raise RuntimeError(f"server exited after restart: {srv.log_tail()}")
        time.sleep(0.002)
    else:
        raise RuntimeError(f"no task served within {a.timeout}s of restart; last reply {last!r}")
    metrics["restart -> first task s"] = now() - t0
    mid, fields = last[0][1][0]
    first = int(fields[1].split(b" ", 1)[0])
    if first != 0:
        errors.append(f"first task after restart has seq {first}, expected 0 (FIFO)")
    if c.call("XACK", q, GROUP, mid) != 1:
        errors.append("XACK of the probe task did not return 1")
    c.close()
    metrics["RSS MB after restart"] = rss_bytes(srv.proc.pid) / 2**20
    m2 = phase(srv, q, h, workers=4, timeout=a.timeout)
    # workers may take up to 3 tasks beyond h; the probe took seq 0: expect exactly seqs 1..k
    check_acks(m2, range(1, 1 + max(h, len(m2["seqs"]))), errors)
    check_pending(srv, q, errors, all_consumed=False)
    metrics["drain tasks/s (empty queue)"] = m["rate"]
    metrics["drain tasks/s (head of backlog)"] = m2["rate"]
    metrics["head/empty drain ratio"] = m2["rate"] / m["rate"] if m["rate"] else float("nan")
    return metrics, errors


def wl_footprint(srv, a, q):
    """Idle RSS, and RSS per connection: just opened (each answered a PING), and after sitting idle
    for FOOTPRINT_IDLE_S (EZRA parks a connection idle for 1-2 s: its greenlet ends)."""
    before = rss_bytes(srv.proc.pid)
    socks = open_conns(srv.port, a.footprint_conns)
    try:
        opened = rss_bytes(srv.proc.pid)
        time.sleep(FOOTPRINT_IDLE_S)  # the measurement is "after this long idle", for every server
        idle = rss_bytes(srv.proc.pid)
    finally:
        for s in socks:
            s.close()
    return {"idle RSS MB": before / 2**20,
            "RSS KB per conn (just opened)": (opened - before) / a.footprint_conns / 1024,
            "RSS KB per idle conn": (idle - before) / a.footprint_conns / 1024}, []


def wl_redis_benchmark(srv, a, q, pipeline=1):
    """redis-benchmark's XADD, the tool users reach for first: -c 50 [-P 16], 10x --tasks XADDs."""
    n, errors = a.tasks * 10, []
    argv = ["redis-benchmark", "-h", HOST, "-p", str(srv.port), "-c", "50", "-n", str(n), "-P", str(pipeline),
            "--csv", "XADD", q, "*", "f", "v"]
    cpu0 = cpu_seconds(srv.proc.pid)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=a.timeout)
    cpu = cpu_seconds(srv.proc.pid) - cpu0
    rows = [line.split('","') for line in proc.stdout.splitlines() if line.startswith('"XADD')]
    if proc.returncode != 0 or not rows:
        raise RuntimeError(f"redis-benchmark failed ({proc.returncode}): {proc.stdout[-300:]} {proc.stderr[-300:]}")
    stored = srv.admin().call("XLEN", q)
    if stored != n and "unknown command" not in str(stored):  # the floor has no XLEN
        errors.append(f"XLEN {q} is {stored!r} after {n} XADDs")
    return {"tasks/s": float(rows[0][1].strip('"')), "server CPU µs/task": cpu * 1e6 / n}, errors



# --------------------------------------------------------------------------- flow control (EZRA only)
# Issue 47: XADD PRIORITY / PARTITION and the claim order they make. Redis and the floor have neither:
# these rows run on EZRA servers alone.
FLOW_WORKLOADS = {"priority-mixed", "partitions-10k", "fairness", "results", *bench_dependencies.WORKLOADS}
FLOW_PARTITIONS = 10_000  # partitions-10k: the tasks spread over this many partitions, PARTITION-LIMIT 1
FAIR_BIG, FAIR_OTHERS, FAIR_EACH = 100_000, 50, 10  # fairness: one partition's backlog, then the others'


def flow_producer_main(port, q, lo, hi, batch, kind, barrier, deadline, resq):
    """Pipelined XADDs of tasks lo..hi-1, `batch` a round trip, each with PRIORITY (kind "priority":
    0-9, random, seeded by the task's number) or PARTITION (kind "partition": number % FLOW_PARTITIONS)."""
    res = {"role": "producer", "sent": 0, "t_end": None, "errors": []}
    try:
        c = Resp(port, timeout=120)
        barrier.wait(60)
        for start in range(lo, hi, batch):
            if now() >= deadline:
                raise RuntimeError(f"producer deadline after {res['sent']} tasks")
            seqs = range(start, min(start + batch, hi))
            if kind == "priority":
                c.send([("XADD", q, "PRIORITY", (s * 2654435761) % 10, "*", "d", payload(s, now())) for s in seqs])
            else:
                c.send([("XADD", q, "PARTITION", f"p{s % FLOW_PARTITIONS}", "*", "d", payload(s, now())) for s in seqs])
            bad = [r for r in c.read(len(seqs)) if not isinstance(r, bytes)]
            if bad:
                raise RuntimeError(f"XADD -> {bad[0]!r}")
            res["sent"] += len(seqs)
        res["t_end"] = now()
    except Exception as e:
        res["errors"].append(f"flow producer: {e!r}")
    resq.put(res)


def wl_priority_mixed(srv, a, q):
    """cycle-batched with a random priority (0-9) on every task."""
    create_group(srv, q)
    n, errors = a.tasks, []
    specs = [(flow_producer_main, (srv.port, q, n * k // 2, n * (k + 1) // 2, 50, "priority")) for k in range(2)]
    specs += [(worker_main, (srv.proto, srv.port, q, f"w{k}", 50)) for k in range(2)]
    m = tally(srv, specs, n, True, a.timeout)
    check_acks(m, range(n), errors)
    check_pending(srv, q, errors)
    return {"tasks/s": m["rate"], "server CPU µs/task": m["cpu_us"]}, errors


def wl_partitions_10k(srv, a, q):
    """Tasks over FLOW_PARTITIONS partitions (PARTITION-LIMIT 1) pushed first, then drained by 8 workers
    claiming 50 at a time: the drain at --tasks and at --backlog-n tasks queued, so that a claim's cost
    shows whether it grows with what is queued."""
    metrics, errors = {}, []
    for n, label in ((a.tasks, "at --tasks"), (a.backlog_n, "at --backlog-n")):
        queue = f"{q}-{n}"
        create_group(srv, queue)
        srv.admin().call("XCFGSET", queue, "PARTITION-LIMIT", 1)
        pushed = tally(srv, [(flow_producer_main, (srv.port, queue, 0, n, 1000, "partition"))], n, False,
                       a.timeout + n / 5000)
        errors.extend(pushed["errors"])
        drained = phase(srv, queue, n, workers=8, count=50, timeout=a.timeout + n / 5000)
        check_acks(drained, range(n), errors)
        check_pending(srv, queue, errors)
        metrics[f"drain tasks/s {label}"] = drained["rate"]
        metrics[f"drain server CPU µs/task {label}"] = drained["cpu_us"]
    return metrics, errors


def wl_fairness(srv, a, q):
    """One partition with FAIR_BIG tasks queued, then FAIR_OTHERS partitions with FAIR_EACH each: how many
    claims (COUNT 1, each acked) until every one of the others' first tasks was handed out (<= 100)."""
    create_group(srv, q)
    errors, c = [], Resp(srv.port, timeout=120)
    for start in range(0, FAIR_BIG, 1000):
        c.send([("XADD", q, "PARTITION", "big", "*", "d", f"big {i}") for i in range(start, min(start + 1000, FAIR_BIG))])
        c.read(min(1000, FAIR_BIG - start))
    firsts = set()
    for p in range(FAIR_OTHERS):
        for i in range(FAIR_EACH):
            task_id = c.call("XADD", q, "PARTITION", f"tenant{p}", "*", "d", f"tenant{p} {i}")
            if i == 0:
                firsts.add(task_id)
    claims, waiting = 0, set(firsts)
    while waiting and claims < FAIR_BIG:
        reply = c.call("XREADGROUP", "GROUP", GROUP, "w", "COUNT", 1, "STREAMS", q, ">")
        if not reply:
            errors.append(f"nothing to claim after {claims} claims")
            break
        task_id = reply[0][1][0][0]
        claims += 1
        waiting.discard(task_id)
        c.call("XACK", q, GROUP, task_id)
    if waiting:
        errors.append(f"{len(waiting)} partitions' first tasks not handed out after {claims} claims")
    elif claims > 100:
        errors.append(f"the last partition's first task came at claim {claims}, after the first 100")
    return {"claims until every partition's first task": claims}, errors

# --------------------------------------------------------------------------- results (EZRA only)
# Issue 49: XACK ... RESULT, XRESULT BLOCK. Redis has neither.
RESULT = b"r" * PAYLOAD_BYTES  # the result every worker keeps with its ack


def results_producer_main(port, q, lo, hi, batch, barrier, deadline, resq):
    """Pipelined XADDs of `batch` tasks, then one XRESULT ... BLOCK per task of them (pipelined: each
    answers when its task is done), each checked to be done with its result; then the next batch."""
    res = {"role": "producer", "sent": 0, "t_end": None, "errors": []}
    try:
        c = Resp(port, timeout=120)
        barrier.wait(60)
        for start in range(lo, hi, batch):
            if now() >= deadline:
                raise RuntimeError(f"producer deadline after {res['sent']} tasks")
            seqs = range(start, min(start + batch, hi))
            c.send([("XADD", q, "*", "d", payload(s, now())) for s in seqs])
            ids = c.read(len(seqs))
            c.send([("XRESULT", q, task_id, "BLOCK", 60_000) for task_id in ids])
            for reply in c.read(len(seqs)):
                outcome = dict(zip(reply[::2], reply[1::2])) if isinstance(reply, list) else {}
                if outcome.get(b"state") != b"done" or outcome.get(b"result") != RESULT:
                    raise RuntimeError(f"XRESULT BLOCK -> {reply!r}")
            res["sent"] += len(seqs)
        res["t_end"] = now()
    except Exception as e:
        res["errors"].append(f"results producer: {e!r}")
    resq.put(res)


def results_worker_main(port, q, consumer, count, n_total, done, barrier, deadline, resq):
    """Claims `count` tasks at a time and acks each with XACK ... RESULT (pipelined), as worker_main counts."""
    res = {"role": "worker", "seqs": [], "acked": 0, "pop_lat": [], "ack_lat": [], "t_end": None, "errors": []}
    try:
        c = Resp(port, timeout=120)
        barrier.wait(60)
        while done.value < n_total and now() < deadline:
            reply = c.call("XREADGROUP", "GROUP", GROUP, consumer, "COUNT", count, "BLOCK", 1000, "STREAMS", q, ">")
            if not reply:
                continue
            items = reply[0][1]
            c.send([("XACK", q, GROUP, task_id, "RESULT", RESULT) for task_id, _ in items])
            acked = c.read(len(items))
            if acked != [1] * len(items):
                res["errors"].append(f"XACK ... RESULT of {len(items)} tasks -> {acked[:3]!r}")
            res["seqs"] += [int(fields[1].split(b" ", 1)[0]) for _, fields in items]
            res["acked"] += len(items)
            res["t_end"] = now()
            with done.get_lock():
                done.value += len(items)
    except Exception as e:
        res["errors"].append(f"results worker {consumer}: {e!r}")
    resq.put(res)


def wl_results(srv, a, q):
    """cycle-batched's shape with results: 2 producers (50 a batch, then XRESULT BLOCK for each), 2 workers
    claiming 50 and acking each with a 200-byte RESULT."""
    create_group(srv, q)
    n, errors = a.tasks, []
    specs = [(results_producer_main, (srv.port, q, n * k // 2, n * (k + 1) // 2, 50)) for k in range(2)]
    specs += [(results_worker_main, (srv.port, q, f"w{k}", 50)) for k in range(2)]
    m = tally(srv, specs, n, True, a.timeout)
    check_acks(m, range(n), errors)
    check_pending(srv, q, errors)
    return {"tasks/s": m["rate"], "server CPU µs/task": m["cpu_us"]}, errors


WORKLOADS = {"cycle-4x4": wl_cycle, "cycle-batched": wl_cycle_batched, "many-clients": wl_many_clients,
             "push-drain": wl_push_drain,
             "push-drain-batched": wl_push_drain_batched, "latency": wl_latency,
             "idle-waiters": wl_idle_waiters, "backlog": wl_backlog, "footprint": wl_footprint,
             "rb-xadd": wl_redis_benchmark, "rb-xadd-p16": lambda srv, a, q: wl_redis_benchmark(srv, a, q, 16),
             "priority-mixed": wl_priority_mixed, "partitions-10k": wl_partitions_10k, "fairness": wl_fairness,
             "results": wl_results, **bench_dependencies.WORKLOADS, **bench_frameworks.WORKLOADS}


# --------------------------------------------------------------------------- driver
DEFAULTS = {"servers": f"ezra,ezra-normal,{FLOOR},redis-always,redis-everysec,beanstalkd",
            "workloads": ",".join(ALL_WORKLOADS), "tasks": 10000, "runs": 3, "backlog_n": 1_000_000,
            "latency_tasks": 3000, "idle_conns": 1000, "footprint_conns": 10000, "timeout": 120.0}
SMOKE = {"servers": f"ezra,{FLOOR}", "tasks": 200, "runs": 1, "backlog_n": 2000, "latency_tasks": 200,
         "idle_conns": 50, "footprint_conns": 200, "timeout": 60.0}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", help="comma list of ezra,ezra-normal,ezra-metrics,floor,redis-always,"
                    "redis-everysec,beanstalkd (default: all but ezra-metrics)")
    ap.add_argument("--workloads", help=f"comma list of {','.join(ALL_WORKLOADS)} (default: all; "
                    "push-only and drain are aliases of push-drain)")
    ap.add_argument("--tasks", type=int, help="tasks per throughput workload (default 10000)")
    ap.add_argument("--runs", type=int, help="runs per (server, workload); medians are reported (default 3)")
    ap.add_argument("--backlog-n", type=int, help="tasks queued in the backlog workload (default 1000000)")
    ap.add_argument("--latency-tasks", type=int, help="tasks in the latency workload (default 3000)")
    ap.add_argument("--latency-rate", type=float, default=1000.0, help="paced producer rate (default 1000/s)")
    ap.add_argument("--idle-conns", type=int, help="blocked idle waiters (default 1000)")
    ap.add_argument("--footprint-conns", type=int, help="idle connections for footprint (default 10000)")
    ap.add_argument("--timeout", type=float, help="deadline of each measured phase, s (default 120)")
    ap.add_argument("--ezra-cmd", help="command that starts EZRA (default: python -m ezra, cwd = repo root); "
                    "--port/--data-dir/--durability/--log-level/--max-clients are appended")
    ap.add_argument("--json", default="bench-results.json", help="where to write the results")
    ap.add_argument("--smoke", action="store_true", help="tiny run: EZRA and the floor only, 1 run, small N")
    a = ap.parse_args(argv)
    for k, v in {**DEFAULTS, **(SMOKE if a.smoke else {})}.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.latency_tasks = min(a.latency_tasks, max(a.tasks, 1))
    a.servers = [s for s in a.servers.split(",") if s]
    a.workloads = list(dict.fromkeys(ALIASES.get(w, w) for w in a.workloads.split(",") if w))
    return ap, a


def raise_fd_limit(need):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, need))  # works as root
            return need
        except (ValueError, OSError):
            need = hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    return max(soft, need)


def machine_info():
    def out(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=REPO).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
    with open("/proc/cpuinfo") as f:
        cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), platform.processor())
    return {"nproc": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
            "python": platform.python_version(), "redis-py": redis.__version__, "hiredis": hiredis.__version__,
            "redis-server": shutil.which("redis-server") and out(["redis-server", "--version"])
            or "no redis-server", "beanstalkd": shutil.which("beanstalkd") and out(["beanstalkd", "-v"])
            or "no beanstalkd",
            "ezra git": out(["git", "describe", "--always", "--dirty"]) or "no commit"}


def run_one(name, spec, wl, run, a):
    proto, argv_fn, _ = spec
    srv, t = Server(name, proto, argv_fn), now()
    try:
        srv.start()
        srv.wait_ready()
        metrics, errors = WORKLOADS[wl](srv, a, f"{wl}-r{run}")
    except Exception as e:
        metrics, errors = {}, [f"{type(e).__name__}: {e}"]
    try:
        if srv.proc and srv.proc.poll() is not None and not any("exited" in e for e in errors):
            errors.append(f"server exited with {srv.proc.returncode}: {srv.log_tail()}")
    finally:
        srv.cleanup()
    return {"server": name, "workload": wl, "run": run + 1, "ok": not errors, "errors": errors[:10],
            "metrics": metrics, "seconds": round(now() - t, 2)}


def lower_is_better(metric):
    return (metric.endswith((" ms", " s")) or any(u in metric for u in ("µs", "MB", "KB"))
            or metric.startswith("claims until"))


def summarize(records, servers):
    rows, ok = {}, {}
    for r in records:
        ok[r["workload"], r["server"]] = ok.get((r["workload"], r["server"]), True) and r["ok"]
        for k, v in r["metrics"].items():
            if isinstance(v, (int, float)) and not math.isnan(v):
                rows.setdefault((r["workload"], k), {}).setdefault(r["server"], []).append(v)
    base = next((s for s in servers if s.startswith("ezra")), servers[0] if servers else None)
    summary = []
    for (wl, metric), vals in rows.items():
        med = {s: statistics.median(vals[s]) for s in servers if s in vals}
        ratios = {p: med[base] / med[p] for p in med if p != base and med.get(base) is not None and med[p]}
        summary.append({"workload": wl, "metric": metric, "better": "lower" if lower_is_better(metric)
                        else "higher", "median": med, "ratio": ratios, "runs": vals,
                        "ok": {s: ok[wl, s] for s in med}})
        if metric.endswith("CPU µs/task") and med.get(FLOOR):  # each server's CPU as a multiple of the floor's
            summary.append({"workload": wl, "metric": metric.replace("µs/task", "/ floor CPU"),
                            "better": "lower", "median": {s: med[s] / med[FLOOR] for s in med},
                            "ratio": {}, "runs": {}, "ok": {s: ok[wl, s] for s in med}})
    idle, cyc = (next((r for r in summary if r["workload"] == w and r["metric"] == "tasks/s"), None)
                 for w in ("idle-waiters", "cycle-4x4"))
    if idle and cyc:
        med = {s: 100 * idle["median"][s] / cyc["median"][s] for s in idle["median"] if cyc["median"].get(s)}
        summary.append({"workload": "idle-waiters", "metric": "% of cycle-4x4 tasks/s", "better": "higher",
                        "median": med, "ratio": {}, "runs": {}, "ok": idle["ok"]})
    summary.sort(key=lambda r: ALL_WORKLOADS.index(r["workload"]))  # stable: metric order kept
    return base, summary


def fmt(v):
    return "–" if v is None else f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def markdown(summary, servers, base, info, command, a):
    shown = [s for s in servers if any(s in r["median"] for r in summary)]
    peers = [s for s in shown if s != base]
    lines = ["## EZRA benchmark", "", f"Command: `{command}`", "",
             "Machine: {nproc} CPUs ({cpu}), Linux {kernel}, Python {python}, redis-py {redis-py}, "
             "hiredis {hiredis}, {redis-server}, {beanstalkd}, EZRA {ezra git}".format(**info), "",
             f"Medians of {a.runs} run(s); {a.tasks} tasks per throughput workload, {PAYLOAD_BYTES}-byte "
             f"payloads; backlog {a.backlog_n:,} tasks; {a.idle_conns} idle waiters; {a.footprint_conns} "
             f"idle connections for footprint. Ratio = {base}/peer. ✗ = a correctness check failed "
             "(details in the JSON)." + (f" `/ floor CPU` rows: each server's CPU per task as a multiple of "
                                         f"`{FLOOR}`'s (scripts/floor_server.py, the yardstick: the least "
                                         "EZRA's stack allows)." if FLOOR in shown else ""), ""]
    head = ["workload", "metric", "better"] + shown + [f"{base}/{p}" for p in peers]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * 3 + "---:|" * (len(head) - 3)]
    for r in summary:
        cells = [(f"{r['median'][s]:.2f}×" if r["metric"].endswith("/ floor CPU") and s in r["median"]
                  else fmt(r["median"].get(s))) + ("" if r["ok"].get(s, True) else " ✗") for s in shown]
        ratios = [f"{r['ratio'][p]:.2f}×" if p in r["ratio"] else "–" for p in peers]
        lines.append("| " + " | ".join([r["workload"], r["metric"], r["better"]] + cells + ratios) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap, a = parse_args(argv)
    specs = server_specs(a)
    bad = [s for s in a.servers if s not in specs] + [w for w in a.workloads if w not in WORKLOADS]
    if bad or a.tasks < 1 or a.runs < 1 or a.backlog_n < 2:
        ap.error(f"unknown or invalid: {bad or 'numbers'}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that finally: stops the servers
    limit = raise_fd_limit(max(a.footprint_conns, a.idle_conns) + 1000)
    if limit < max(a.footprint_conns, a.idle_conns) + 1000:
        a.footprint_conns = min(a.footprint_conns, limit - 1000)
        a.idle_conns = min(a.idle_conns, limit - 1000)
        print(f"fd limit {limit}: using {a.footprint_conns} footprint / {a.idle_conns} idle connections",
              file=sys.stderr)
    servers = []
    for s in a.servers:
        binary = specs[s][2]
        if binary and not shutil.which(binary):
            print(f"{binary} not found on PATH: skipping {s}. Get it with: {INSTALL_HINT}", file=sys.stderr)
        else:
            servers.append(s)
    if not servers:
        print("no server to benchmark", file=sys.stderr)
        return 1
    for wl in [w for w in a.workloads if w in TOOL_WORKLOADS and not shutil.which(TOOL_WORKLOADS[w])]:
        print(f"{TOOL_WORKLOADS[wl]} not found on PATH: skipping {wl} (apt-get install redis-tools)",
              file=sys.stderr)
        a.workloads.remove(wl)
    command, info, records = "python " + shlex.join(sys.argv), machine_info(), []
    for run in range(a.runs):
        for wl in a.workloads:
            for s in servers:
                if specs[s][0] == "beanstalk" and wl not in BEANSTALK_WORKLOADS:
                    continue
                if not bench_frameworks.runs_on(wl, s) or (wl in FLOW_WORKLOADS and not s.startswith("ezra")):
                    continue
                rec = run_one(s, specs[s], wl, run, a)
                records.append(rec)
                shown = ", ".join(f"{k}={fmt(v)}" for k, v in list(rec["metrics"].items())[:2])
                print(f"[run {run + 1}/{a.runs}] {wl} @ {s}: {shown} {'ok' if rec['ok'] else 'FAILED'} "
                      f"({rec['seconds']:.1f}s){'' if rec['ok'] else ' ' + '; '.join(rec['errors'][:3])}",
                      file=sys.stderr, flush=True)
    base, summary = summarize(records, servers)
    print(markdown(summary, servers, base, info, command, a))
    failed = [r for r in records if not r["ok"]]
    for r in failed:
        print(f"\nFAILED {r['workload']} @ {r['server']} run {r['run']}: " + "; ".join(r["errors"]))
    with open(a.json, "w") as f:
        json.dump({"command": command, "machine": info, "args": vars(a), "base": base,
                   "summary": summary, "records": records}, f, indent=1, ensure_ascii=False)
    print(f"\nJSON written to {a.json}", file=sys.stderr)
    return 1 if failed or not records else 0


if __name__ == "__main__":
    sys.exit(main())
