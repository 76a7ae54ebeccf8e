#!/usr/bin/env python3
"""The budget per command: where EZRA's and the floor's CPU goes, stage by stage, measured the same way.

    python scripts/stages.py                        # both servers, interleaved, 3 rounds, medians
    python scripts/stages.py --servers ezra --per-turn 50 --tasks 20000
    python scripts/stages.py --real                 # the real servers: perf stat, strace -c, bytes written
    python scripts/stages.py --front --per-turn 50  # EZRA's front alone, handlers stubbed (callgrind: see front_only)
    python scripts/stages.py --bytecodes            # Python bytecodes executed per command, by module: no noise
    python scripts/stages.py --bytecodes --batched --per-turn 50  # cycle-batched's shape, per task
    python scripts/stages.py --bytecodes --by-function --per-turn 1  # a row per function, not per module

In-process (the default): each server's own connection loop (EZRA's Connection.serve,
the floor's Floor.handle) runs on a fake socket: the request path exactly, without the
network. Three phases, one task per command: N XADDs, N claims (XREADGROUP GROUP g w
COUNT 1 BLOCK 1000 STREAMS q >, the shape workers send), N XACKs of one id. With
`--per-turn 1` each read holds one command (a commit, and an fsync for XADD and XACK,
per command); with `--per-turn 50` a pipeline of 50 (one commit and fsync for them).

Each stage is the exclusive CPU time (the thread's clock; `--clock wall` for
time.perf_counter_ns) inside the functions that make it up, over every call; a
stage nested in another is not counted again in the outer one. The wrappers'
own cost (a wrapped call of nothing, measured at start: what it adds to its own
stage and to its caller's) is moved to "instrumentation". "total (uninstrumented)"
is the same phase run with nothing wrapped: the true cost.
The SQL and commit rows time the very same sqlite3 calls for both servers (a
proxy on the connection), and fsync is os.fdatasync for both.

`--bytecodes` runs the same phases once, untimed, with an opcode tracer: the Python bytecodes each
server executes per command, by module (EZRA) or function (the floor), the harness's own left out.
The counts do not move with the machine's load, so a cut of a few percent shows where a timed run
cannot see it. `--marks` runs the phases once, untimed and untraced, with os.getppid() before and
after each: under `valgrind --tool=callgrind --dump-before=getppid` (the real python binary, not a
pyenv shim) dumps 2, 4 and 6 are the first server's XADD, claim and ack phases (8, 10, 12 the
second's), and their instruction counts (`summary:` lines) per command are the CPU work in user
space, C included, as deterministic (two runs agree within 0.2%).

`--real` starts each server (python -m ezra --durability full, scripts/floor_server.py),
drives the same phases from a raw-socket client and reports per command the server's
CPU (perf stat -e cpu-clock), system calls (strace -c -f, a run of its own: it slows
the server) and bytes written (/proc/PID/io write_bytes: WAL frames, checkpoints).
"""
from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "scripts"))

import gevent  # noqa: E402
import greenlet  # noqa: E402
import hiredis  # noqa: E402

import floor_server  # noqa: E402
from ezra import commands, storage  # noqa: E402
from ezra.front import connection, gate, session as session_mod  # noqa: E402
from ezra.protocol import request_reader, resp, stream_ids  # noqa: E402
from ezra.app import GC_THRESHOLD  # noqa: E402
from ezra.broker import Broker  # noqa: E402
from ezra.broker import claims as claims_mod, core as core_mod, in_flight as in_flight_mod, tasks as tasks_mod  # noqa: E402
from ezra.broker import transitions as transitions_mod  # noqa: E402
from ezra.commands import queue as queue_cmds, replies as replies_mod  # noqa: E402
from ezra.config import Settings  # noqa: E402
from ezra.storage import database as database_mod  # noqa: E402
from ezra.writer import writer as writer_mod  # noqa: E402
from ezra.writer.writer import Writer  # noqa: E402

KINDS = ("XADD", "XREADGROUP", "XACK")
PAYLOAD = b"x" * 200
PUSH_OPTIONS: list = []  # --priorities: each XADD's own options, taken in turn (EZRA only)
WAITS = "waits for the commit/fsync"
ROW_ORDER = ("connection loop", "parse", "dispatch", "handler", "options", "worker name", "id",
             "writer", "broker", "storage (Python)", "fields", "SQL", "commit", "fsync", "encode",
             WAITS, "event loop, switches (rest)", "instrumentation")


def frame(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def command_frames(kind: str, ids: list[bytes], tasks: int = 1) -> list[bytes]:
    """One command of `kind`; a claim or an ack of `tasks` tasks (XREADGROUP COUNT, XACK's ids)."""
    if kind == "XADD":
        if PUSH_OPTIONS:
            options = PUSH_OPTIONS.pop()
            PUSH_OPTIONS.insert(0, options)
            return [frame(b"XADD", b"q", *options, b"*", b"payload", PAYLOAD)]
        return [frame(b"XADD", b"q", b"*", b"payload", PAYLOAD)]
    if kind == "XREADGROUP":
        return [frame(b"XREADGROUP", b"GROUP", b"g", b"w1", b"COUNT", b"%d" % tasks, b"BLOCK", b"1000",
                      b"STREAMS", b"q", b">")]
    return [frame(b"XACK", b"q", b"g", *(ids.pop() for _ in range(tasks)))]


def claimed_ids(replies: list) -> list[bytes]:
    """The ids in XREADGROUP replies (RESP2: [[queue, [[id, fields], ...]]])."""
    return [task[0] for reply in replies if isinstance(reply, list) for _, tasks in reply for task in tasks]


# --------------------------------------------------------------------------- the clock and the wrappers

REST = "event loop, switches (rest)"


class Meter:
    """Exclusive time per stage, per greenlet; wrappers installed on the servers' functions, taken off again.

    Every event (a wrapped call's start or end, a greenlet switch) charges the time since the
    last event to the stage on top of the running greenlet's stack (REST if none): a
    greenlet switched out inside a stage (a reply waiting for the commit) is not charged
    for what the others do meanwhile."""

    def __init__(self, clock):
        self.clock = clock
        self.spent: dict[str, int] = {}
        self.stacks: dict = {}  # greenlet -> the stages under way in it
        self.stack: list[str] = self._stack_of(greenlet.getcurrent())
        self.last = clock()
        self.patched: list[tuple] = []
        self.overhead = 0  # ns a wrapped call costs its caller: measured by calibrate()
        self.inside = 0  # ns it adds to its own stage (a wrapped call of nothing): measured too
        self.thread = threading.get_ident()  # the event loop's: calls made on other threads are not timed
        self.elsewhere = 0  # ...and counted here

    def _stack_of(self, glet) -> list[str]:
        stack = self.stacks.get(glet)
        if stack is None:
            stack = self.stacks[glet] = []
        return stack

    def _charge(self, now: int) -> None:
        stage = self.stack[-1] if self.stack else REST
        self.spent[stage] = self.spent.get(stage, 0) + now - self.last
        self.last = now

    def trace(self, event, args) -> None:
        """greenlet.settrace's callback: the time so far was the origin's; the target runs now."""
        if event in ("switch", "throw"):
            self._charge(self.clock())
            self.stack = self._stack_of(args[1])

    def reset(self) -> None:
        self.spent.clear()
        self.last = self.clock()

    def timed(self, stage: str, fn):
        meter, clock = self, self.clock

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if threading.get_ident() != meter.thread:  # the fsync thread (slow disk): another clock
                meter.elsewhere += 1
                return fn(*args, **kwargs)
            meter._charge(clock())
            stack = meter.stack
            stack.append(stage)
            try:
                return fn(*args, **kwargs)
            finally:
                meter._charge(clock())
                stack.pop()
                spent = meter.spent
                if meter.inside:  # the clock's own cost, charged to this stage: moved
                    spent[stage] -= meter.inside
                    spent["instrumentation"] = spent.get("instrumentation", 0) + meter.inside
                if stack and meter.overhead:  # the wrapper's own cost, charged to the caller: moved
                    spent[stack[-1]] -= meter.overhead
                    spent["instrumentation"] = spent.get("instrumentation", 0) + meter.overhead
        return wrapper

    def wrap(self, owner, name: str, stage: str) -> None:
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        self.patched.append((owner, name, original))
        setattr(owner, name, self.timed(stage, original))

    def unwrap_all(self) -> None:
        for owner, name, original in reversed(self.patched):
            if isinstance(owner, dict):  # the command tables
                owner[name] = original
            else:
                setattr(owner, name, original)
        self.patched.clear()

    def calibrate(self) -> None:
        """The cost a wrapped call adds to its caller's stage: an outer wrapper around 10,000 inner ones."""
        inner = self.timed("calibration inner", lambda: None)
        outer = self.timed("calibration outer", lambda: [inner() for _ in range(10000)])
        plain = lambda: None  # noqa: E731
        samples = []
        for _ in range(5):
            self.reset()
            outer()
            started = self.clock()
            [plain() for _ in range(10000)]
            baseline = self.clock() - started
            samples.append(((self.spent["calibration outer"] - baseline) / 10000,
                            self.spent["calibration inner"] / 10000))
        self.overhead = max(int(statistics.median(outer for outer, _ in samples)), 0)
        self.inside = max(int(statistics.median(inner for _, inner in samples)), 0)
        self.reset()


class TimedConnection:
    """A stand-in for the sqlite3 connection: the same calls, timed as SQL or commit by their text."""

    def __init__(self, conn, meter: Meter):
        self._conn = conn
        self._execute = meter.timed("SQL", conn.execute)
        self._executemany = meter.timed("SQL", conn.executemany)
        self._commit = meter.timed("commit", conn.execute)

    def execute(self, sql, *args):
        if sql in ("BEGIN", "BEGIN IMMEDIATE", "COMMIT"):
            return self._commit(sql, *args)
        return self._execute(sql, *args)

    def executemany(self, sql, *args):
        return self._executemany(sql, *args)

    def __getattr__(self, name):
        return getattr(self._conn, name)


def instrument_common(meter: Meter) -> None:
    meter.wrap(os, "fdatasync", "fsync")


def instrument_ezra(meter: Meter, broker) -> None:
    instrument_common(meter)
    meter.wrap(connection.Connection, "serve", "connection loop")
    meter.wrap(connection.Connection, "_run_buffered_commands", "connection loop")
    meter.wrap(connection.Connection, "flush", "connection loop")
    meter.wrap(request_reader.RequestReader, "next_commands", "parse")
    meter.wrap(request_reader.RequestReader, "take", "parse")
    meter.wrap(connection, "dispatch", "dispatch")
    meter.wrap(connection, "encode", "encode")
    for name in (b"XADD", b"XREADGROUP", b"XACK"):
        fn, arity, lower = commands.COMMANDS[name]
        meter.patched.append((commands.COMMANDS, name, commands.COMMANDS[name]))
        commands.COMMANDS[name] = (meter.timed("handler", fn), arity, lower)
    for name in ("parse_options", "to_int", "block_timeout"):
        meter.wrap(queue_cmds, name, "options")
    meter.wrap(session_mod.Session, "use_worker", "worker name")
    meter.wrap(writer_mod.Request, "wait", WAITS)
    for name in ("new_id", "format_id", "parse_id", "push_id"):
        meter.wrap(stream_ids, name, "id")
    meter.wrap(queue_cmds, "ids_of", "id")
    for name in ("submit", "call", "_open_batch", "_end_turn", "_committed", "_fsync_inline"):
        meter.wrap(Writer, name, "writer")
    for name in ("claim", "_after_batch"):
        meter.wrap(core_mod.Broker, name, "broker")
    for transaction in (tasks_mod.Tasks.push, tasks_mod.Tasks.ack, claims_mod.Claims.claim):
        meter.wrap(transaction, "body", "broker")  # the body a @transaction submits (writer/transactions.py)
    for name in ("queue", "claim_rows", "serve_waiters"):
        meter.wrap(transitions_mod.Transitions, name, "broker")
    meter.wrap(claims_mod.Claims, "nothing_to_claim", "broker")
    for name in ("insert_plain", "insert_task", "claim", "begin", "commit"):
        meter.wrap(database_mod.Database, name, "storage (Python)")
    for name in ("claimed", "ended", "all_ended"):  # the leases kept in memory (schema 12)
        meter.wrap(in_flight_mod.InFlight, name, "broker")
    meter.wrap(broker.db, "sync_wal", "storage (Python)")  # the WAL file's own method, bound per database
    meter.wrap(broker.db, "ack", "storage (Python)")  # acks.ack, bound per database
    meter.wrap(queue_cmds, "claimed_reply", "encode")  # XREADGROUP's claims, written from the rows
    meter.wrap(queue_cmds, "read_reply", "encode")  # the claims' entries, built in the command (issue 25)
    meter.wrap(queue_cmds, "stored", "fields")  # XADD's fields in their stored form (task_fields.py)
    meter.wrap(replies_mod, "as_resp", "fields")  # a claim of a task stored as JSON (older rows)
    meter.patched.append((broker.db, "conn", broker.db.conn))
    broker.db.conn = TimedConnection(broker.db.conn, meter)


def instrument_floor(meter: Meter, floor) -> None:
    instrument_common(meter)
    meter.wrap(floor_server.Floor, "handle", "connection loop")
    meter.patched.append((floor_server, "hiredis", hiredis))
    floor_server.hiredis = TimedHiredis(meter)
    for name in ("xadd", "xreadgroup", "xack"):
        meter.patched.append((floor.commands, name.upper().encode(), floor.commands[name.upper().encode()]))
        floor.commands[name.upper().encode()] = meter.timed("handler", getattr(floor, name))
    meter.wrap(floor_server.Floor, "claim", "handler")
    meter.wrap(floor_server.Floor, "wake_one", "handler")
    for name in ("stream_id", "parse_id"):
        meter.wrap(floor_server, name, "id")
    meter.wrap(floor_server.Store, "next_id", "id")
    for name in ("bulk", "error"):
        meter.wrap(floor_server, name, "encode")
    for name in ("write", "commit"):
        meter.wrap(floor_server.Store, name, "writer")
    meter.wrap(floor_server.Store, "wait", WAITS)
    meter.patched.append((floor.store, "db", floor.store.db))
    floor.store.db = TimedConnection(floor.store.db, meter)


class TimedHiredis:
    """floor_server's `hiredis`, with a Reader whose gets() is timed as parse."""

    ProtocolError = hiredis.ProtocolError

    def __init__(self, meter: Meter):
        timed = meter.timed

        class Reader:
            def __init__(self):
                reader = hiredis.Reader()
                self.feed = reader.feed
                self.gets = timed("parse", reader.gets)
        self.Reader = Reader


# --------------------------------------------------------------------------- a fake socket for each loop

class FakeSocket:
    """The client's side: recv hands the connection the next read, send takes its replies."""

    def __init__(self, reads, meter: Meter):
        self._reads = reads  # a generator: the next read's bytes (b"" to hang up), given the last replies
        self._replies = hiredis.Reader()
        self._timed_read = meter.timed("harness", self._next_read)  # left out of every stage and total
        self._timed_feed = meter.timed("harness", self._replies.feed)
        self._sock = self
        # Always readable: the connection's wait on the read watcher (start it, switch to the hub,
        # stop it) returns at once, as gevent's wait did here before (see _wait): no switch.
        self._read_event = self.hub = self

    def _next_read(self):
        replies = []
        reply = self._replies.gets()
        while reply is not False:
            replies.append(reply)
            reply = self._replies.gets()
        return self._reads.send(replies)

    def recv(self, size, flags=0):
        return self._timed_read()

    def send(self, data):
        self._timed_feed(data)
        return len(data)

    sendall = send

    def _wait(self, *args):  # always readable; the rest does nothing
        pass

    setsockopt = close = start = stop = switch = _wait


def reads_for(kind: str, n: int, per_turn: int, ids: list[bytes], claimed: list[bytes], batched: bool = False):
    """A generator of reads: n tasks' commands of `kind`, per_turn of them in each read (`batched`:
    a claim or an ack is one command for the read's per_turn tasks, as cycle-batched's workers send)."""
    replies = yield
    for start in range(0, n, per_turn):
        claimed += claimed_ids(replies)
        tasks = min(per_turn, n - start)
        if batched and kind != "XADD":
            replies = yield b"".join(command_frames(kind, ids, tasks))
        else:
            replies = yield b"".join(f for _ in range(tasks) for f in command_frames(kind, ids))
    claimed += claimed_ids(replies)
    yield b""


# --------------------------------------------------------------------------- one phase of one server

def run_server(server: str, a, instrumented: bool, counter: OpcodeCounter | None = None,
               marks: bool = False) -> dict:
    """The three phases on a fresh data dir: {kind: {stage: ns per command}} (+ "total"); with a
    counter, {kind: {code: bytecodes per command}} instead (see OpcodeCounter)."""
    meter = Meter(time.thread_time_ns if a.clock == "cpu" else time.perf_counter_ns)
    data = tempfile.mkdtemp(prefix=f"ezra-stages-{server}-")
    try:
        if server == "ezra":
            settings = Settings(data_dir=data, durability="full")
            broker = Broker(storage.open_database(data), settings)
            state = session_mod.ServerState(broker, settings)
            throttle = gate.Gate(settings)  # what app.py gives each connection (the AuthThrottle before it)
            target = broker
        else:
            floor = floor_server.Floor(floor_server.Store(os.path.join(data, "floor.db")))
            target = floor
        if server == "ezra":  # the collector as each process sets it: app.py's for EZRA, Python's for the floor
            gc.freeze()
            gc.set_threshold(GC_THRESHOLD, 20, 20)
        else:
            gc.set_threshold(700, 10, 10)
        if instrumented:
            meter.calibrate()
            (instrument_ezra if server == "ezra" else instrument_floor)(meter, target)

        def phase(kind: str, n: int, per_turn: int, ids: list[bytes]) -> tuple[int, list[bytes]]:
            claimed: list[bytes] = []
            reads = reads_for(kind, n, per_turn, ids, claimed, a.batched)
            next(reads)
            sock = FakeSocket(reads, meter)
            started = meter.clock()
            if server == "ezra":
                connection.Connection(state, sock, "127.0.0.1:1", throttle).serve()
            else:
                floor.handle(sock, ("127.0.0.1", 1))
            return meter.clock() - started, claimed

        results = {}
        try:
            phase("XADD", a.warmup, a.per_turn, [])  # warm up: caches, the file's first pages
            warm = phase("XREADGROUP", a.warmup, a.per_turn, [])[1]
            phase("XACK", a.warmup, a.per_turn, warm)
            ids: list[bytes] = []
            if instrumented:
                greenlet.settrace(meter.trace)
            for kind in KINDS:
                meter.reset()
                if marks:
                    os.getppid()  # a phase's mark for callgrind (see --marks in the module doc)
                if counter is not None:
                    counter.start()
                elapsed, claimed = phase(kind, a.tasks, a.per_turn, ids)
                if counter is not None:
                    counter.stop()
                if marks:
                    os.getppid()
                if kind == "XREADGROUP":
                    if len(claimed) != a.tasks:
                        raise RuntimeError(f"{server}: {len(claimed)} of {a.tasks} tasks claimed")
                    ids = claimed
                if meter.elsewhere:
                    print(f"{server} {kind}: {meter.elsewhere} timed calls ran on another thread (fsyncs moved "
                          "to the thread while the disk was slow): not timed", file=sys.stderr)
                    meter.elsewhere = 0
                spent = dict(meter.spent)
                total = elapsed - spent.pop("harness", 0)
                spent.pop("calibration inner", None), spent.pop("calibration outer", None)
                rows = {stage: ns / a.tasks for stage, ns in spent.items()}
                rows["total"] = total / a.tasks
                results[kind] = rows if counter is None else counter.per_command(a.tasks)
        finally:
            greenlet.settrace(None)
            meter.unwrap_all()
            if server == "ezra":
                broker.stop()
                broker.db.close()
            else:
                floor.store.close()
        return results
    finally:
        shutil.rmtree(data, ignore_errors=True)


def in_process(a) -> None:
    runs: dict[tuple, list[float]] = {}  # (server, kind, stage) -> µs per command, one per round
    for r in range(a.rounds):
        for server in a.servers:
            for instrumented in (True, False):
                result = run_server(server, a, instrumented)
                for kind, rows in result.items():
                    if not instrumented:
                        rows = {"total (uninstrumented)": rows["total"]}
                    for stage, ns in rows.items():
                        runs.setdefault((server, kind, stage), []).append(ns / 1000)
            print(f"round {r + 1}/{a.rounds} {server}: " + ", ".join(
                f"{k} {statistics.median(runs[server, k, 'total (uninstrumented)']):.1f} µs" for k in KINDS),
                file=sys.stderr, flush=True)
    print(f"Per command, µs of {'CPU' if a.clock == 'cpu' else 'wall'} time, {a.per_turn} command(s) per "
          f"read, {a.tasks} commands per phase, medians of {a.rounds} interleaved round(s)\n")
    print_table("stage", (*ROW_ORDER, "total", "total (uninstrumented)"), runs, a.servers, 1)
    save_json(a, runs)


def print_table(first: str, rows, figures: dict, servers: list[str], digits: int) -> None:
    """A markdown table of medians: a line per row that has figures, a column per (command, server)."""
    head = [first] + [f"{kind} {server}" for kind in KINDS for server in servers]
    print("| " + " | ".join(head) + " |")
    print("|---|" + "---:|" * (len(head) - 1))
    for row in rows:
        cells = [figures.get((server, kind, row)) for kind in KINDS for server in servers]
        if any(cells):
            print("| " + " | ".join([row] + ["–" if not values else f"{statistics.median(values):.{digits}f}"
                                             for values in cells]) + " |")


def save_json(a, runs: dict) -> None:
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"|".join(key): values for key, values in runs.items()}, f, indent=1, ensure_ascii=False)


# --------------------------------------------------------------------------- bytecodes, counted

class OpcodeCounter:
    """Python bytecodes executed while started, per code object (file and function), in every
    greenlet of this thread (sys.settrace is the thread's; each new frame turns its opcode events
    on). This script's own code (the fake socket, the reads it makes) is left out."""

    def __init__(self, by_function: bool = False):
        self.counts: dict[tuple[str, str], int] = {}
        self._harness = os.path.abspath(__file__)
        self.by_function = by_function  # rows of module:function, not of modules

    def start(self) -> None:
        self.counts = {}
        sys.settrace(self._call)

    def stop(self) -> None:
        sys.settrace(None)

    def _call(self, frame, event, arg):
        if frame.f_code.co_filename == self._harness:
            return None
        frame.f_trace_opcodes = True
        return self._opcode

    def _opcode(self, frame, event, arg):
        if event == "opcode":
            key = (frame.f_code.co_filename, frame.f_code.co_name)
            self.counts[key] = self.counts.get(key, 0) + 1
        return self._opcode

    def per_command(self, n: int) -> dict[str, float]:
        """{module (EZRA's, relative to the repo) or floor function: bytecodes per command}."""
        rows: dict[str, float] = {}
        for (path, function), count in self.counts.items():
            rel = os.path.relpath(path, REPO) if path.startswith(REPO) else "(gevent, standard library)"
            row = f"floor: {function}" if rel == "scripts/floor_server.py" else (
                f"{rel}:{function}" if self.by_function else rel)
            rows[row] = rows.get(row, 0) + count / n
        return rows


def bytecodes(a) -> None:
    """--bytecodes: one untimed run of each server's phases with an OpcodeCounter."""
    figures: dict[tuple, list[float]] = {}
    for server in a.servers:
        for kind, rows in run_server(server, a, False, OpcodeCounter(a.by_function)).items():
            figures[server, kind, "total"] = [sum(rows.values())]
            for row, count in rows.items():
                figures[server, kind, row] = [count]
    rows = sorted({row for (_, _, row) in figures if row != "total"},
                  key=lambda row: -max(figures.get((server, kind, row), [0])[0]
                                       for server in a.servers for kind in KINDS))
    print(f"Python bytecodes executed per command, {a.per_turn} command(s) per read, {a.tasks} commands "
          f"per phase (the harness's own left out)\n")
    print_table("module or function", (*rows, "total"), figures, a.servers, 0)
    save_json(a, figures)


# --------------------------------------------------------------------------- the real servers

def start_server(server: str, data: str, port: int) -> subprocess.Popen:
    if server == "ezra":
        argv = [sys.executable, "-m", "ezra", "--port", str(port), "--data-dir", data,
                "--durability", "full", "--log-level", "warning"]
    else:
        argv = [sys.executable, os.path.join(REPO, "scripts", "floor_server.py"), "--port", str(port),
                "--data-dir", data]
    proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(frame(b"PING"))
                if s.recv(64) == b"+PONG\r\n":
                    return proc
        except OSError:
            time.sleep(0.02)  # polled until the deadline
    proc.kill()
    raise RuntimeError(f"{server} did not answer PING on {port}")


class Client:
    """A raw RESP client: sends a read's worth of commands, reads that many replies."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()

    def run(self, frames: list[bytes]) -> list:
        self.sock.sendall(b"".join(frames))
        replies = []
        while len(replies) < len(frames):
            reply = self.reader.gets()
            if reply is False:
                self.reader.feed(self.sock.recv(1 << 16))
            else:
                replies.append(reply)
        return replies


def drive(port: int, kind: str, n: int, per_turn: int, ids: list[bytes], batched: bool = False) -> list[bytes]:
    client, claimed = Client(port), []
    for start in range(0, n, per_turn):
        tasks = min(per_turn, n - start)
        if batched and kind != "XADD":
            frames = command_frames(kind, ids, tasks)
        else:
            frames = [f for _ in range(tasks) for f in command_frames(kind, ids)]
        claimed += claimed_ids(client.run(frames))
    client.sock.close()
    return claimed


def write_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("write_bytes:"))


def cpu_times(pid: int) -> tuple[float, float]:
    """The process's (user, system) CPU seconds so far, every thread's (/proc/PID/stat, clock ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def attach(tool: str, pid: int, out: str) -> subprocess.Popen:
    if tool == "perf":
        argv = ["perf", "stat", "-e", "cpu-clock", "-x", ",", "-o", out, "-p", str(pid)]
    else:
        argv = ["strace", "-c", "-f", "-o", out, "-p", str(pid)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # both attach asynchronously and say nothing when they are ready
    return proc


def detach(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    proc.wait(30)


def parse_tool(tool: str, out: str) -> dict:
    with open(out) as f:
        text = f.read()
    if tool == "perf":
        msec = next(float(line.split(",")[0]) for line in text.splitlines() if "cpu-clock" in line)
        return {"cpu-clock µs": msec * 1000}
    calls = {}
    for line in text.splitlines():
        m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", line)
        if m and m.group(2) != "total":
            calls[m.group(2)] = int(m.group(1))
    return calls


def real(a) -> None:
    figures: dict[tuple, list[float]] = {}  # (server, kind, what) -> per command, one per round
    for r in range(a.rounds):
        for server in a.servers:
            for tool in ("perf", "strace"):
                data, port = tempfile.mkdtemp(prefix=f"ezra-stages-real-{server}-"), free_port()
                proc = start_server(server, data, port)
                try:
                    drive(port, "XADD", a.warmup, a.per_turn, [], a.batched)
                    warm = drive(port, "XREADGROUP", a.warmup, a.per_turn, [], a.batched)
                    drive(port, "XACK", a.warmup, a.per_turn, warm, a.batched)
                    ids: list[bytes] = []
                    for kind in KINDS:
                        out = os.path.join(data, f"{tool}-{kind}.txt")
                        written, times = write_bytes(proc.pid), cpu_times(proc.pid)
                        tracer = attach(tool, proc.pid, out)
                        claimed = drive(port, kind, a.tasks, a.per_turn, ids, a.batched)
                        detach(tracer)
                        if kind == "XREADGROUP":
                            ids = claimed
                        for what, value in parse_tool(tool, out).items():
                            figures.setdefault((server, kind, what), []).append(value / a.tasks)
                        if tool == "perf":
                            figures.setdefault((server, kind, "bytes written"), []).append(
                                (write_bytes(proc.pid) - written) / a.tasks)
                            # user and kernel, from /proc (10 ms ticks: give a phase some 100,000 tasks)
                            for what, before, after in zip(("user µs", "system µs"), times, cpu_times(proc.pid)):
                                figures.setdefault((server, kind, what), []).append((after - before) * 1e6 / a.tasks)
                finally:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(30)
                    shutil.rmtree(data, ignore_errors=True)
            print(f"round {r + 1}/{a.rounds} {server} done", file=sys.stderr, flush=True)
    for (server, kind, what), values in list(figures.items()):  # every system call, summed per round
        if what not in ("cpu-clock µs", "bytes written", "user µs", "system µs"):
            calls = figures.setdefault((server, kind, "system calls, all"), [0.0] * len(values))
            for i, value in enumerate(values):
                calls[i] += value
    shown = {w for (_, _, w), values in figures.items() if statistics.median(values) >= 0.05}
    whats = sorted(shown, key=lambda w: (w != "cpu-clock µs", w != "user µs", w != "system µs", w != "bytes written",
                                         w != "system calls, all", w))
    print(f"Real servers, per command: {a.per_turn} command(s) per read, {a.tasks} per phase, "
          f"medians of {a.rounds} round(s); system calls from strace -c -f (its own run; those under 0.05 "
          "per command not shown)\n")
    print_table("per command", whats, figures, a.servers, 2)
    save_json(a, figures)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- the front alone

class StubRequest:
    """What a stubbed handler's Deferred waits for: its reply at once (no writer, no commit)."""

    __slots__ = ("durable", "result")

    def __init__(self, result, durable: bool):
        self.result, self.durable = result, durable

    def wait(self):
        return self.result


def front_only(a) -> None:
    """EZRA's front alone: Connection.serve on the fake socket, the three handlers stubbed.

    Each stub answers what its command would (an id, a claim's one-entry reply, a count) as
    a Deferred, so the figure is the parser, the loop, dispatch, encode and flush with
    nothing of the broker. os.getppid() is called between phases: under
    `valgrind --tool=callgrind --dump-before=getppid` each dump is one phase, and its
    instruction count per command does not move with the machine's load.
    """
    entry_id = b"1764612345678-0"
    replies = {"XADD": (entry_id, True), "XREADGROUP": (resp.PairsMap({b"q": [[entry_id, [b"payload", PAYLOAD]]]}),
                                                          False), "XACK": (1, True)}
    for name in KINDS:
        fn, arity, lower = commands.COMMANDS[name.encode()]
        result, durable = replies[name]
        commands.COMMANDS[name.encode()] = (
            lambda session, args, result=result, durable=durable: commands.Deferred(StubRequest(result, durable)),
            arity, lower)
    settings = Settings(data_dir=tempfile.mkdtemp(prefix="ezra-stages-front-"))
    state, throttle = session_mod.ServerState(None, settings), gate.Gate(settings)
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 20, 20)
    frames = {kind: command_frames(kind, [entry_id])[0] for kind in KINDS}

    def phase(kind: str, n: int) -> float:
        reads = iter([frames[kind] * a.per_turn] * (n // a.per_turn))
        sock = FakeSocket(None, Meter(time.thread_time_ns))
        sock.recv = lambda size, flags=0: next(reads, b"")
        sock.send = len
        started = time.thread_time_ns()
        connection.Connection(state, sock, "127.0.0.1:1", throttle).serve()
        return (time.thread_time_ns() - started) / n / 1000

    for kind in KINDS:
        phase(kind, a.warmup)
    figures = {kind: [] for kind in KINDS}
    for _ in range(a.rounds):
        for kind in KINDS:
            os.getppid()  # a phase's mark for callgrind (see above)
            figures[kind].append(phase(kind, a.tasks))
    os.getppid()
    print(f"EZRA's front alone (handlers stubbed), µs of CPU per command, {a.per_turn} per read, "
          f"{a.tasks} per phase, medians of {a.rounds}: " + ", ".join(
              f"{kind} {statistics.median(values):.2f}" for kind, values in figures.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default="ezra,floor", help="comma list of ezra,floor (default both)")
    ap.add_argument("--tasks", type=int, default=5000, help="commands per phase (default 5000)")
    ap.add_argument("--per-turn", type=int, default=1, help="commands per read: 1 one at a time, 50 pipelined")
    ap.add_argument("--batched", action="store_true",
                    help="cycle-batched's shape: each read's --per-turn tasks claimed by one XREADGROUP COUNT "
                         "and acked by one XACK of their ids (figures are then per task); pushes pipelined")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    ap.add_argument("--warmup", type=int, default=500, help="commands of each kind before measuring")
    ap.add_argument("--clock", default="cpu", choices=("cpu", "wall"),
                    help="cpu: time.thread_time_ns (default; a loaded machine's other work is left out); "
                         "wall: time.perf_counter_ns")
    ap.add_argument("--real", action="store_true", help="the real servers: perf stat, strace -c, bytes written")
    ap.add_argument("--json", help="also write every round's figures here: {server|kind|row: [per round]}")
    ap.add_argument("--bytecodes", action="store_true",
                    help="Python bytecodes per command by module, counted (one untimed run; see the module doc)")
    ap.add_argument("--marks", action="store_true",
                    help="one untimed run with os.getppid() around each phase, for callgrind (see the module doc)")
    ap.add_argument("--by-function", action="store_true",
                    help="with --bytecodes: a row per function of EZRA's modules, not per module")
    ap.add_argument("--front", action="store_true",
                    help="EZRA's front alone: the loop, parser, dispatch and encode, handlers stubbed")
    ap.add_argument("--priorities", action="store_true",
                    help="every XADD with PRIORITY 0-9 in turn (priority-mixed's pushes; EZRA only)")
    a = ap.parse_args()
    if a.priorities:
        PUSH_OPTIONS.extend([b"PRIORITY", b"%d" % (i * 7 % 10)] for i in range(10))
    a.servers = [s for s in a.servers.split(",") if s]
    if a.real:
        real(a)
    elif a.front:
        front_only(a)
    elif a.bytecodes:
        gevent.spawn(bytecodes, a).join()
    elif a.marks:
        for server in a.servers:
            gevent.spawn(run_server, server, a, False, None, True).join()
        print(f"phases marked for callgrind: {', '.join(a.servers)}, each XADD, XREADGROUP, XACK")
    else:
        gevent.spawn(in_process, a).join()


if __name__ == "__main__":
    main()
