"""kill -9 loop: producers and workers run while the server is killed and restarted.

Invariants: every XADD that got a reply is eventually acknowledged (zero loss);
a task whose XACK answered 1 is never delivered again; nothing is left in
flight; attempts never exceed max attempts + restarts. EZRA_CRASH_CYCLES sets
the number of kills (default 8 here; `EZRA_CRASH_CYCLES=30` for the long run).
"""

from __future__ import annotations

import os
import json
import random
import sqlite3
import threading
import time

import redis

from reliability import report
from support_servers import NO_RETRY, wait_until

CYCLES = int(os.environ.get("EZRA_CRASH_CYCLES", "8"))
NETWORK_ERRORS = (redis.ConnectionError, redis.TimeoutError, ConnectionError, OSError)


class Ledger:
    """What the clients saw, recorded under one lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.pushed: dict[bytes, bytes] = {}  # payload -> id, for pushes that got a reply
        self.acked: dict[bytes, float] = {}  # id -> when its XACK answered 1
        self.delivered_after_ack: list[bytes] = []
        self.max_attempts_seen = 0
        self.stop = threading.Event()


def producer(server, ledger: Ledger, name: str):
    n = 0
    client = None
    while not ledger.stop.is_set():
        payload = f"{name}-{n}".encode()
        try:
            client = client or redis.Redis(port=server.port, socket_timeout=5, **NO_RETRY)
            task_id = client.xadd("crash", {"p": payload})
        except NETWORK_ERRORS:
            client = None
            time.sleep(0.01)  # restarting: push the payload again (the first may have landed)
            continue
        with ledger.lock:
            ledger.pushed[payload] = task_id
        n += 1


def worker(server, ledger: Ledger, name: str, done: threading.Event):
    client = None
    while not done.is_set():
        try:
            client = client or redis.Redis(port=server.port, socket_timeout=5, **NO_RETRY)
            asked = time.monotonic()
            reply = client.xreadgroup("g", name, {"crash": ">"}, count=5, block=200)
            for _, entries in reply or []:
                for task_id, fields in entries:
                    with ledger.lock:
                        # Asked for after its ack was answered: the server claimed a done task.
                        # (A reply read late from a killed server is an earlier delivery.)
                        if asked > ledger.acked.get(task_id, asked):
                            ledger.delivered_after_ack.append(task_id)
                    if client.xack("crash", "g", task_id) == 1:
                        with ledger.lock:
                            ledger.acked.setdefault(task_id, time.monotonic())
        except NETWORK_ERRORS:
            client = None
            time.sleep(0.01)


def test_kill9_loop_loses_nothing(ezra_factory):
    max_attempts = 1000
    server = ezra_factory("--visibility-timeout", "2", "--max-attempts", str(max_attempts))
    port_args = ["--port", str(server.port)]  # restarts keep the port, clients reconnect
    ledger = Ledger()
    done = threading.Event()
    threads = [threading.Thread(target=producer, args=(server, ledger, f"p{i}")) for i in range(2)]
    threads += [threading.Thread(target=worker, args=(server, ledger, f"w{i}", done)) for i in range(2)]
    for thread in threads:
        thread.start()
    rng = random.Random(1234)
    try:
        for cycle in range(CYCLES):
            target = len(ledger.pushed) + rng.randint(20, 200)
            wait_until(lambda: len(ledger.pushed) >= target, timeout=60, message=f"progress in cycle {cycle}")
            server.kill9()
            server.args = server.args[:4] + port_args if len(server.args) > 4 else server.args + port_args
            server.start()
    finally:
        ledger.stop.set()
        for thread in threads[:2]:
            thread.join(30)
    client = server.client()
    wait_until(lambda: client.xlen("crash") == 0 and client.xpending("crash", "g")["pending"] == 0,
               timeout=120, message="workers to drain the queue")
    done.set()
    for thread in threads[2:]:
        thread.join(30)

    db = sqlite3.connect(server.data_dir / "ezra.db")
    rows = db.execute("SELECT id, fields, state, attempts FROM tasks_readable WHERE queue = 'crash'").fetchall()
    db.close()
    done_payloads = {json.loads(fields)[1].encode() for _, fields, state, _ in rows if state == "done"}
    # An XACK whose reply was cut by the kill may have been applied: the database says.
    lost = set(ledger.pushed) - done_payloads
    assert not lost, f"{len(lost)} pushes that got a reply are not done: {sorted(lost)[:5]}"
    pushed_ids = {task_id for task_id in ledger.pushed.values()}
    assert pushed_ids <= {task_id.encode() for task_id, *_ in rows}, "every id a push returned exists"
    assert set(ledger.acked) <= {task_id.encode() for task_id, _, state, _ in rows if state == "done"}
    assert not ledger.delivered_after_ack, f"delivered after XACK answered 1: {ledger.delivered_after_ack[:5]}"
    assert client.xlen("crash::dead") == 0
    assert {state for _, _, state, _ in rows} == {"done"}, "nothing left available or in flight"
    assert max(attempts for *_, attempts in rows) <= max_attempts + CYCLES
    assert len(ledger.pushed) >= CYCLES * 20
    report("crash", kill9_cycles=CYCLES, pushes_replied=len(ledger.pushed), acks_replied_1=len(ledger.acked),
           tasks_checked=len(rows), lost=len(lost), delivered_after_ack=len(ledger.delivered_after_ack),
           max_attempts_seen=max(attempts for *_, attempts in rows))
