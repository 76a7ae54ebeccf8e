#!/usr/bin/env python3
"""Where EZRA's CPU goes per task, stage by stage: a measuring aid beside bench.py.

    python scripts/stages.py                 # cycle (push, claim, ack): 3 requests per commit
    python scripts/stages.py --per-commit 150 --tasks 30000   # as cycle-batched: 50 of each per commit

It drives the real request path in-process, without sockets: RESP frames go
through the reader, `dispatch`, the broker and its SQL, the writer's commit and
fsync at the end of each loop turn, and the encoder, exactly as a connection
runs them. Each stage is timed with the thread's CPU clock around the
functions that make it up (the wrappers cost ~0.3 µs a call, counted in
"commands"). What bench.py's server CPU per task adds on top of the total here
is the network and the event loop: recv/send system calls, waking greenlets,
epoll.

Stages:
    parse     RequestReader.next_command (RESP frame -> arguments)
    commands  dispatch, the command handlers and the broker, less the rest below
    sql       the statements (Database methods), less commits
    commit    BEGIN and COMMIT (WAL frames, locks)
    fsync     fdatasync of the WAL (its CPU; its wall time is the disk's)
    encode    replies to RESP bytes
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gevent  # noqa: E402

from ezra import commands, resp, storage  # noqa: E402
from ezra.broker import Broker  # noqa: E402
from ezra.config import Settings  # noqa: E402
from ezra.session import ServerState, Session  # noqa: E402

clock = time.thread_time
spent: dict[str, float] = {}
_stack: list[str] = []  # stages under way: a stage's time is not counted again in the one around it


def timed(stage: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _stack.append(stage)
        started = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            elapsed = clock() - started
            _stack.pop()
            spent[stage] = spent.get(stage, 0.0) + elapsed
            if _stack:  # the enclosing stage did not spend this
                spent[_stack[-1]] = spent.get(_stack[-1], 0.0) - elapsed
    return wrapper


def instrument() -> None:
    resp.RequestReader.next_command = timed("parse", resp.RequestReader.next_command)
    commands.dispatch = timed("commands", commands.dispatch)
    resp.encode = timed("encode", resp.encode)
    for name in ("begin", "commit"):
        setattr(storage.Database, name, timed("commit", getattr(storage.Database, name)))
    storage.Database.sync_wal = timed("fsync", storage.Database.sync_wal)
    for name in ("insert_task", "claim", "ack", "claim_own", "in_flight_attempts", "set_outcome", "insert_queue"):
        setattr(storage.Database, name, timed("sql", getattr(storage.Database, name)))


def frame(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=10000)
    ap.add_argument("--per-commit", type=int, default=3,
                    help="requests per loop turn (cycle-4x4 commits 1-3; cycle-batched ~150)")
    ap.add_argument("--durability", default="full", choices=("full", "normal"))
    a = ap.parse_args()
    instrument()
    data = tempfile.mkdtemp(prefix="ezra-stages-")
    settings = Settings(data_dir=data, durability=a.durability)
    broker = Broker(storage.open_database(data), settings)
    state = ServerState(broker, settings)
    session = Session(state, "stages:1", lambda event, timeout: event.wait(timeout), lambda: None)
    reader = resp.RequestReader(max_bulk_len=settings.max_task_size)
    payload = b"x" * 200
    per_kind = max(a.per_commit // 3, 1)

    def run(frames: list[bytes]) -> list[bytes]:
        """One loop turn: every command, then the replies (the turn's commit runs at the first wait)."""
        replies = []
        for data in frames:
            reader.feed(data)
            replies.append(commands.dispatch(session, reader.next_command()))
        out = []
        for reply in replies:
            if type(reply) is commands.Deferred:
                reply = reply.resolve()
            out.append(resp.encode(reply, 2))
        return out

    def cycle(tasks: int) -> None:
        queued: list[bytes] = []
        for _ in range(0, tasks, per_kind):
            # The acks of the last turn's claims, new pushes, then a claim of them: one commit (and
            # one fsync) per turn, as cycle-4x4's turns mostly are.
            frames = [frame(b"XACK", b"q", b"g", *queued)] if queued else []
            frames += [frame(b"XADD", b"q", b"*", b"payload", payload) for _ in range(per_kind)]
            frames.append(frame(b"XREADGROUP", b"GROUP", b"g", b"w1", b"COUNT", b"%d" % per_kind,
                                b"STREAMS", b"q", b">"))
            replies = run(frames)
            queued = [line for line in replies[-1].split(b"\r\n") if line[:1].isdigit() and b"-" in line]
        if queued:
            run([frame(b"XACK", b"q", b"g", *queued)])

    cycle(min(2000, a.tasks))  # warm up: caches, the first pages of the file
    spent.clear()
    started = clock()
    cycle(a.tasks)
    total = clock() - started
    measured = sum(spent.values())
    rows = sorted(spent.items(), key=lambda item: -item[1])
    print(f"{a.tasks} tasks, {a.per_commit} requests per commit, durability {a.durability}, "
          f"{broker.writer.batches} commits, {broker.writer.fsyncs} fsyncs")
    print("| stage | CPU µs/task | share |")
    print("|---|---:|---:|")
    for stage, seconds in rows + [("other (loop turns, waits, harness)", total - measured)]:
        print(f"| {stage} | {seconds / a.tasks * 1e6:.1f} | {seconds / total:.0%} |")
    print(f"| total | {total / a.tasks * 1e6:.1f} | 100% |")
    broker.stop()
    broker.db.close()


if __name__ == "__main__":
    gevent.spawn(main).join()
