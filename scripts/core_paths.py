"""The Python between XADD's, XREADGROUP's, XACK's and XNACK's handlers and their SQL, timed alone.

    python scripts/core_paths.py                          # this tree: µs per push, claim, ack, nack
    python scripts/core_paths.py --trees /tmp/old,. --rounds 7   # two trees in alternation, medians

Calls `Broker.push`, `Broker.claim`, `Broker.ack` and `Tasks.fail` as the handlers do, TURN to
a loop turn, on a fresh
data dir (durability full), and times only those calls with the thread's CPU clock: the
writer's submit, the broker's transaction script, storage's parameter building and the
statement itself (the same SQL in every tree), not the commit or the fsync, which run after
the turn. stages.py's rows carry its wrappers' cost (about 0.5 µs a wrapped call), so a cut
that removes a call moves them more than the work; this has no wrapper. Each round is a
process of its own; with --trees the trees alternate, round by round.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

TURN = 50  # commands per loop turn, as a pipelined client's read


def measure(tasks: int) -> dict:
    """One round in this process: median ns per push, per ack and per nack over the turns."""
    import gevent
    from ezra import storage
    from ezra.broker import Broker
    from ezra.config import Settings

    try:
        from ezra.protocol.task_fields import stored
    except ImportError:  # --trees may name a tree from before the package's folders
        from ezra.task_fields import stored

    data = tempfile.mkdtemp(prefix="ezra-core-paths-")
    broker = Broker(storage.open_database(data), Settings(data_dir=data, durability="full"))
    gc.freeze()
    clock, fields, figures = time.thread_time_ns, stored([b"field", b"v" * 20]), {}  # as XADD stores them

    try:  # this tree's routes: a push is a run of one, a claim a Claim
        from ezra.broker.waiters import Claim

        one_claim = Claim([b"q"], b"worker-1", 1, False)

        def push(fields):
            return broker.tasks.push(b"q", [fields])

        def pushed_id(request):
            return request.result[0]

        def claim():
            return broker.claim(one_claim)
    except ImportError:  # --trees may name a tree from before them
        def push(fields):
            return broker.push(b"q", b"*", fields, False, 0, None, None, 0, False, None, None, None)

        def pushed_id(request):
            return request.result

        def claim():
            return broker.claim_now([b"q"], b"worker-1", 1, False)

    def run():
        push_ns, ack_ns, ids = [], [], []
        for _ in range(0, tasks, TURN):
            started = clock()
            requests = [push(fields) for _ in range(TURN)]
            push_ns.append(clock() - started)
            requests[-1].wait()  # the turn's commit and fsync, untimed
            ids += [tuple(map(int, pushed_id(request).split(b"-"))) for request in requests]
        # XREADGROUP ... COUNT 1 ... > of each, as a worker's pipelined claims.
        claim_ns = []
        for _ in range(0, len(ids), TURN):
            started = clock()
            requests = [claim() for _ in range(TURN)]
            claim_ns.append(clock() - started)
            requests[-1].wait()
            if not all(request is not None and len(request.result[b"q"]) == 1 for request in requests):
                raise SystemExit("a claim found no task available")
        for start in range(0, len(ids), TURN):
            started = clock()
            requests = [(broker.tasks.ack if hasattr(broker.tasks, "ack") else broker.ack)(b"q", [task_id]) for task_id in ids[start:start + TURN]]
            ack_ns.append(clock() - started)
            requests[-1].wait()
            if not all(request.result in (1, [1]) for request in requests):
                raise SystemExit("an ack found no task in flight")
        # XNACK of each of as many tasks again, pushed and claimed untimed (default mode: a counted
        # failure; back to available, or delayed by the server's backoff).
        ids = []
        for _ in range(0, tasks, TURN):
            requests = [push(fields) for _ in range(TURN)]
            requests[-1].wait()
            ids += [tuple(map(int, pushed_id(request).split(b"-"))) for request in requests]
            requests = [claim() for _ in range(TURN)]
            requests[-1].wait()
        # --trees may name a tree where XNACK's verb is the Broker's `nack` (before issue 46 item 2)
        nack = getattr(broker, "nack", None) or broker.tasks.fail
        nack_ns = []
        for start in range(0, len(ids), TURN):
            started = clock()
            requests = [nack(b"q", [task_id]) for task_id in ids[start:start + TURN]]
            nack_ns.append(clock() - started)
            requests[-1].wait()
            if not all(request.result == 1 for request in requests):
                raise SystemExit("a nack found no task in flight")
        figures.update(push=statistics.median(push_ns) / TURN, claim=statistics.median(claim_ns) / TURN,
                       ack=statistics.median(ack_ns) / TURN, nack=statistics.median(nack_ns) / TURN)

    gevent.spawn(run).get()  # a failure in the round is raised here, not left as no figures
    broker.stop()
    broker.db.close()
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=5000, help="pushes, then claims, acks and nacks, per round")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--trees", help="comma list of trees to alternate (each round runs each tree once)")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a round, as JSON
    a = ap.parse_args()
    if a.one:
        print(json.dumps(measure(a.tasks)))
        return
    trees = (a.trees or os.getcwd()).split(",")
    runs = {tree: {"push": [], "claim": [], "ack": [], "nack": []} for tree in trees}
    for _ in range(a.rounds):
        for tree in trees:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", "--tasks", str(a.tasks)],
                                 cwd=tree, env={**os.environ, "PYTHONPATH": os.path.abspath(tree)},
                                 capture_output=True, text=True, check=True).stdout
            for kind, ns in json.loads(out.splitlines()[-1]).items():
                runs[tree][kind].append(ns)
    for tree, kinds in runs.items():
        print(tree, "  ".join(f"{kind} {statistics.median(ns) / 1000:.2f} µs ({' '.join(f'{n / 1000:.2f}' for n in ns)})"
                             for kind, ns in kinds.items()))
    print("load average", " ".join(f"{x:.1f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
