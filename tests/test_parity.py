"""Redis parity: scripted scenarios of the portable subset, run against EZRA and a real
redis-server, every reply compared byte for byte, in RESP2 and in RESP3.

A step is a command on a named connection (`p` the producer, `w1`/`w2` workers). Its two
replies must be equal, except where the step carries a `Differ`: an intended difference,
with its reason and both servers' exact replies asserted (so a difference that goes away,
or changes, fails too). Idle times (milliseconds since delivery) are masked as `:<idle>`.

The intended differences are written to build/compat/parity.json for
scripts/compat_table.py (docs/compatibility.md). The graduation test at the end runs the
examples/ Python producer and worker, unchanged, against redis-server.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

from ezra import errors
from support_compat import run_examples
from support_resp import RespConnection, blocked_clients, encode_command
from support_servers import ROOT, EzraProcess, wait_until

COMPAT = ROOT / "build" / "compat"
REDIS_VERSION: list[str] = []
DIFFERENCES: dict[tuple, dict] = {}  # (scenario's position, step) -> difference
RUN: dict = {}


# ------------------------------------------------------------------ servers

@pytest.fixture(scope="module")
def redis_port(redis_server_port):
    """The real redis-server (conftest), with its version recorded for the compatibility table."""
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
    REDIS_VERSION.append(re.search(r"v=(\S+)", version).group(1))
    return redis_server_port


@pytest.fixture(scope="module", autouse=True)
def parity_json():
    """build/compat/parity.json: the intended differences seen in this run, and the graduation.

    Not under pytest-xdist: a worker sees only some scenarios, and its file would replace the whole one."""
    yield
    if (not DIFFERENCES and "graduation" not in RUN) or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    COMPAT.mkdir(parents=True, exist_ok=True)
    (COMPAT / "parity.json").write_text(json.dumps(
        {"redis_version": REDIS_VERSION[0] if REDIS_VERSION else None,
         "scenarios": RUN.get("scenarios", []), "graduation": RUN.get("graduation"),
         "differences": [DIFFERENCES[k] for k in sorted(DIFFERENCES)]}, indent=1) + "\n")


@pytest.fixture(scope="module")
def ezra_port(tmp_path_factory):
    server = EzraProcess(tmp_path_factory.mktemp("parity") / "data").start()
    yield server.port
    assert server.stop() == 0, server.log()


# ------------------------------------------------------------------ scenarios

@dataclass
class Differ:
    """An intended difference: both servers' exact replies ({2: .., 3: ..} or one for both),
    with `{k}` standing for the scenario's key. A reply may be a `Prefix`."""
    reason: str
    ezra: object
    redis: object


class Prefix(str):
    """A reply that must start with this text (error texts that quote arguments)."""


@dataclass
class Step:
    conn: str
    args: list[str]
    differ: Differ | None = None
    wake: list | None = None  # (conn, args): sent once this (blocking) step waits; its reply must be equal


def S(conn, *args, differ=None, wake=None):
    return Step(conn, list(args), differ, wake)


NIL = {2: "*-1\r\n", 3: "_\r\n"}  # XREADGROUP: nothing to read


def read1(task_id: str, n: str) -> dict:
    """An XREADGROUP reply: one entry `task_id` {n: n} of the scenario's key."""
    entry = f"*1\r\n*2\r\n${len(task_id)}\r\n{task_id}\r\n*2\r\n$1\r\nn\r\n$1\r\n{n}\r\n"
    return {2: "*1\r\n*2\r\n${klen}\r\n{k}\r\n" + entry, 3: "%1\r\n${klen}\r\n{k}\r\n" + entry}


def groups(consumers: int, pending: int, last: str, read: int, lag: int) -> dict:
    """XINFO GROUPS for one group `g` (Redis 7.0's fields)."""
    fields = (f"$4\r\nname\r\n$1\r\ng\r\n$9\r\nconsumers\r\n:{consumers}\r\n$7\r\npending\r\n:{pending}\r\n"
              f"$17\r\nlast-delivered-id\r\n${len(last)}\r\n{last}\r\n$12\r\nentries-read\r\n:{read}\r\n"
              f"$3\r\nlag\r\n:{lag}\r\n")
    return {2: "*1\r\n*12\r\n" + fields, 3: "*1\r\n%6\r\n" + fields}


def pending_entries(*entries: tuple[str, str, int]) -> str:
    """XPENDING's extended form: (id, worker, deliveries) per entry, idle masked."""
    return f"*{len(entries)}\r\n" + "".join(
        f"*4\r\n${len(i)}\r\n{i}\r\n${len(w)}\r\n{w}\r\n:<idle>\r\n:{d}\r\n" for i, w, d in entries)


def unknown(command: str) -> Prefix:
    return Prefix(f"-ERR unknown command '{command}', with args beginning with: ")


XLEN_DONE = "XLEN counts the tasks not done yet (available, delayed, in flight); Redis counts entries"
CONSUMERS = ("EZRA keeps no registry of consumers: XINFO GROUPS counts the workers holding tasks "
             "(Redis counts every consumer that ever read)")
EXACT_REFUSED = "-" + errors.EXACT_TRIM_REFUSED.message + "\r\n"
REDELIVERY = "a task given back (XNACK, XDEL, an expired lease) is delivered again by `>`; Redis only by id 0/XCLAIM"


SCENARIOS: dict[str, list[Step]] = {
    "cycle": [
        S("p", "XGROUP", "CREATE", "{k}", "g", "0", "MKSTREAM"),
        S("p", "XADD", "{k}", "1-1", "n", "1"),
        S("p", "XADD", "{k}", "1-2", "n", "2"),
        S("p", "XADD", "{k}", "1-3", "n", "3", "body", "three"),
        S("p", "XLEN", "{k}"),
        S("w1", "XREADGROUP", "GROUP", "g", "w1", "COUNT", "2", "STREAMS", "{k}", ">"),
        S("w2", "XREADGROUP", "GROUP", "g", "w2", "STREAMS", "{k}", ">"),
        S("w2", "XREADGROUP", "GROUP", "g", "w2", "STREAMS", "{k}", ">"),
        S("p", "XPENDING", "{k}", "g"),
        S("p", "XPENDING", "{k}", "g", "-", "+", "10"),
        S("p", "XPENDING", "{k}", "g", "-", "+", "10", "w1"),
        S("w1", "XREADGROUP", "GROUP", "g", "w1", "STREAMS", "{k}", "0"),
        S("w1", "XREADGROUP", "GROUP", "g", "w1", "COUNT", "1", "STREAMS", "{k}", "1-1"),
        S("p", "XPENDING", "{k}", "g", "-", "+", "10"),
        S("w1", "XACK", "{k}", "g", "1-1", "1-2"),
        S("w1", "XACK", "{k}", "g", "1-1"),
        S("w1", "XREADGROUP", "GROUP", "g", "w1", "STREAMS", "{k}", "0"),
        S("p", "XLEN", "{k}", differ=Differ(XLEN_DONE, ":1\r\n", ":3\r\n")),
        S("p", "XRANGE", "{k}", "-", "+"),
        S("p", "XRANGE", "{k}", "-", "+", "COUNT", "1"),
        S("p", "XRANGE", "{k}", "(1-1", "+"),
        S("p", "XINFO", "GROUPS", "{k}", differ=Differ(CONSUMERS, groups(1, 1, "1-3", 3, 0),
                                                       groups(2, 1, "1-3", 3, 0))),
        S("w2", "XACK", "{k}", "g", "1-3"),
        S("p", "XPENDING", "{k}", "g"),
        S("p", "XLEN", "{k}", differ=Differ(XLEN_DONE, ":0\r\n", ":3\r\n")),
        S("p", "XINFO", "GROUPS", "{k}", differ=Differ(CONSUMERS, groups(0, 0, "1-3", 3, 0),
                                                       groups(2, 0, "1-3", 3, 0))),
    ],
    "blocking": [
        S("p", "XGROUP", "CREATE", "{k}", "g", "$", "MKSTREAM"),
        S("w1", "XREADGROUP", "GROUP", "g", "w1", "COUNT", "1", "BLOCK", "5000", "STREAMS", "{k}", ">",
          wake=["p", "XADD", "{k}", "5-1", "n", "1"]),
        S("w1", "XREADGROUP", "GROUP", "g", "w1", "COUNT", "1", "BLOCK", "100", "STREAMS", "{k}", ">"),
        S("w2", "XREADGROUP", "GROUP", "g", "w2", "BLOCK", "0", "STREAMS", "{k}", ">",
          wake=["p", "XADD", "{k}", "5-2", "n", "2"]),
        S("w1", "XACK", "{k}", "g", "5-1"),
        S("w2", "XACK", "{k}", "g", "5-2"),
        S("p", "XPENDING", "{k}", "g"),
    ],
    "claims": [
        S("p", "XGROUP", "CREATE", "{k}", "g", "0", "MKSTREAM"),
        S("p", "XADD", "{k}", "7-1", "n", "1"),
        S("p", "XADD", "{k}", "7-2", "n", "2"),
        S("p", "XADD", "{k}", "7-3", "n", "3"),
        S("w1", "XREADGROUP", "GROUP", "g", "w1", "COUNT", "3", "STREAMS", "{k}", ">"),
        S("w2", "XCLAIM", "{k}", "g", "w2", "0", "7-1"),
        S("w2", "XCLAIM", "{k}", "g", "w2", "3600000", "7-2"),
        S("w2", "XCLAIM", "{k}", "g", "w2", "0", "7-2", "JUSTID"),
        S("p", "XPENDING", "{k}", "g", "-", "+", "10"),
        S("w2", "XCLAIM", "{k}", "g", "w2", "0", "7-1"),
        S("p", "XPENDING", "{k}", "g", "-", "+", "10", differ=Differ(
            "XCLAIM by the task's owner is a heartbeat: it renews the lease without counting a "
            "delivery (Redis counts one)",
            pending_entries(("7-1", "w2", 2), ("7-2", "w2", 1), ("7-3", "w1", 1)),
            pending_entries(("7-1", "w2", 3), ("7-2", "w2", 1), ("7-3", "w1", 1)))),
        S("w2", "XAUTOCLAIM", "{k}", "g", "w2", "0", "0-0", "COUNT", "1"),
        S("w2", "XAUTOCLAIM", "{k}", "g", "w2", "3600000", "0-0"),
        S("w2", "XAUTOCLAIM", "{k}", "g", "w1", "0", "0-0", "COUNT", "10", "JUSTID"),
        S("p", "XPENDING", "{k}", "g"),
        S("w1", "XACK", "{k}", "g", "7-1", "7-2", "7-3"),
        S("p", "XPENDING", "{k}", "g"),
        S("p", "XINFO", "GROUPS", "{k}", differ=Differ(CONSUMERS, groups(0, 0, "7-3", 3, 0),
                                                       groups(2, 0, "7-3", 3, 0))),
    ],
    "exact_trim_refused": [
        S("p", "XADD", "{k}", "MAXLEN", "10", "9-1", "n", "1", differ=Differ(
            "exact trimming (MAXLEN n, MAXLEN = n, MINID [=] id) could drop unfinished tasks: refused, "
            "by XADD and XTRIM alike, with a pointer to ~", EXACT_REFUSED, "$3\r\n9-1\r\n")),
        S("p", "XLEN", "{k}", differ=Differ("the refused XADD stored nothing", ":0\r\n", ":1\r\n")),
        S("p", "XTRIM", "{k}", "MAXLEN", "=", "0", differ=Differ(
            "exact trimming could drop unfinished tasks: refused", EXACT_REFUSED, ":1\r\n")),
        S("p", "XLEN", "{k}"),
    ],
    "approximate_trim": [
        S("p", "XGROUP", "CREATE", "{k}", "g", "0", "MKSTREAM"),
        S("p", "XADD", "{k}", "1-1", "n", "1"),
        S("p", "XADD", "{k}", "1-2", "n", "2"),
        S("p", "XADD", "{k}", "1-3", "n", "3"),
        S("w1", "XREADGROUP", "GROUP", "g", "w1", "COUNT", "2", "STREAMS", "{k}", ">"),
        S("w1", "XACK", "{k}", "g", "1-1"),
        S("p", "XADD", "{k}", "MAXLEN", "~", "10", "1-4", "n", "4"),
        S("p", "XTRIM", "{k}", "MAXLEN", "~", "0", differ=Differ(
            "approximate trimming removes done tasks only, oldest first (here 1-1); Redis drops whole "
            "nodes of entries, pending or never read", ":1\r\n", ":4\r\n")),
        S("p", "XLEN", "{k}", differ=Differ("the in-flight 1-2 and the unread 1-3 and 1-4 were kept",
                                            ":3\r\n", ":0\r\n")),
        S("w1", "XACK", "{k}", "g", "1-2"),
    ],
    "implicit_group": [
        S("p", "XADD", "{k}", "9-1", "n", "1"),
        S("w1", "XREADGROUP", "GROUP", "g", "w1", "STREAMS", "{k}", ">", differ=Differ(
            "each queue has one implicit group: no XGROUP CREATE needed (Redis: NOGROUP)",
            read1("9-1", "1"),
            Prefix("-NOGROUP No such key '{k}' or consumer group 'g' in XREADGROUP with GROUP option"))),
        S("w1", "XREADGROUP", "GROUP", "g", "w1", "STREAMS", "{k}-missing", ">", differ=Differ(
            "a queue nobody pushed to reads as empty: workers may start before producers",
            NIL, Prefix("-NOGROUP No such key '{k}-missing' or consumer group 'g'"))),
    ],
    "xdel_is_a_failure": [
        S("p", "XGROUP", "CREATE", "{k}", "g", "0", "MKSTREAM"),
        S("p", "XADD", "{k}", "9-1", "n", "1"),
        S("w1", "XREADGROUP", "GROUP", "g", "w1", "STREAMS", "{k}", ">"),
        S("w1", "XDEL", "{k}", "9-1"),
        S("p", "XLEN", "{k}", differ=Differ("XDEL is a failure report: the task is kept for a retry",
                                            ":1\r\n", ":0\r\n")),
        S("w2", "XREADGROUP", "GROUP", "g", "w2", "STREAMS", "{k}", ">",
          differ=Differ(REDELIVERY, read1("9-1", "1"), NIL)),
        S("p", "XPENDING", "{k}", "g", "-", "+", "10", differ=Differ(
            "after XDEL the retry belongs to its new worker (Redis keeps the deleted id pending)",
            pending_entries(("9-1", "w2", 2)), pending_entries(("9-1", "w1", 1)))),
        S("w2", "XACK", "{k}", "g", "9-1"),
        S("p", "XPENDING", "{k}", "g"),
    ],
    "xdel_cancels_a_waiting_task": [  # issue 45 item 6: a task nobody holds is deleted, as on Redis
        S("p", "XGROUP", "CREATE", "{k}", "g", "0", "MKSTREAM"),
        S("p", "XADD", "{k}", "9-1", "n", "1"),
        S("p", "XADD", "{k}", "9-2", "n", "2"),
        S("p", "XDEL", "{k}", "9-1"),
        S("p", "XLEN", "{k}"),
        S("p", "XRANGE", "{k}", "-", "+"),
        S("w1", "XREADGROUP", "GROUP", "g", "w1", "STREAMS", "{k}", ">"),
        S("w1", "XACK", "{k}", "g", "9-2"),
        S("p", "XPENDING", "{k}", "g"),
    ],
    "xnack": [
        S("p", "XGROUP", "CREATE", "{k}", "g", "0", "MKSTREAM"),
        S("p", "XADD", "{k}", "9-1", "n", "1"),
        S("w1", "XREADGROUP", "GROUP", "g", "w1", "STREAMS", "{k}", ">"),
        S("w1", "XNACK", "{k}", "g", "9-1", differ=Differ(
            "XNACK is Redis 8.8's command (short form = FAIL); Redis 7 does not have it",
            ":1\r\n", unknown("XNACK"))),
        S("w2", "XREADGROUP", "GROUP", "g", "w2", "STREAMS", "{k}", ">",
          differ=Differ(REDELIVERY, read1("9-1", "1"), NIL)),
        S("w2", "XACK", "{k}", "g", "9-1"),
        S("p", "XPENDING", "{k}", "g"),
    ],
    "transactions": [
        S("p", "XGROUP", "CREATE", "{k}", "g", "0", "MKSTREAM"),
        S("p", "EXEC"),
        S("p", "DISCARD"),
        S("p", "MULTI"),
        S("p", "XADD", "{k}", "7-1", "n", "1"),
        S("p", "XADD", "{k}", "7-2", "n", "2"),
        S("p", "MULTI"),
        S("p", "XLEN", "{k}"),
        S("p", "EXEC"),
        S("p", "MULTI"),
        S("p", "XADD", "{k}", "7-1", "n", "1"),
        S("p", "XADD", "{k}", "7-3", "n", "3"),
        S("p", "EXEC"),
        S("p", "MULTI"),
        S("p", "XADD", "{k}", "7-4", "n"),
        S("p", "XADD", "{k}", "7-5", "n", "5"),
        S("p", "EXEC"),
        S("p", "MULTI"),
        S("p", "XADD", "{k}", "7-6", "n", "6"),
        S("p", "DISCARD"),
        S("p", "XLEN", "{k}"),
        S("w1", "MULTI"),
        S("w1", "XREADGROUP", "GROUP", "g", "w1", "COUNT", "2", "BLOCK", "1000", "STREAMS", "{k}", ">"),
        S("w1", "XACK", "{k}", "g", "7-1"),
        S("w1", "XREADGROUP", "GROUP", "g", "w1", "COUNT", "2", "STREAMS", "{k}", ">"),
        S("w1", "XREADGROUP", "GROUP", "g", "w1", "BLOCK", "0", "STREAMS", "{k}", ">"),
        S("w1", "EXEC"),
        S("p", "XPENDING", "{k}", "g"),
    ],
    "flow_control": [  # issue 47: what Redis does instead of EZRA's priorities and limits
        S("p", "XGROUP", "CREATE", "{k}", "g", "0", "MKSTREAM"),
        S("p", "XADD", "{k}", "9-1", "n", "1"),
        S("p", "XADD", "{k}", "9-3", "n", "3"),
        S("p", "XADD", "{k}", "PRIORITY", "0", "9-4", "n", "4", differ=Differ(
            "XADD PRIORITY is EZRA's (0 served first); Redis reads the word as the id and refuses it",
            "$3\r\n9-4\r\n", Prefix("-ERR Invalid stream ID"))),
        S("w1", "XREADGROUP", "GROUP", "g", "w1", "COUNT", "1", "STREAMS", "{k}", ">", differ=Differ(
            "the most urgent task is claimed first, pushed last; Redis hands a stream's entries out in id order",
            read1("9-4", "4"), read1("9-1", "1"))),
        S("p", "XCFGSET", "{k}", "MAX-IN-FLIGHT", "1", differ=Differ(
            "XCFGSET is Redis 8.6's command with EZRA's settings; Redis 7 does not have it",
            "+OK\r\n", unknown("XCFGSET"))),
        S("w2", "XREADGROUP", "GROUP", "g", "w2", "COUNT", "1", "STREAMS", "{k}", ">", differ=Differ(
            "MAX-IN-FLIGHT 1: a task is in flight, so nothing more is handed out; Redis has no such limit",
            NIL, read1("9-3", "3"))),
    ],
    "lease_timeout": [
        S("p", "XGROUP", "CREATE", "{k}", "g", "0", "MKSTREAM"),
        S("p", "XCFGSET", "{k}", "VISIBILITY-TIMEOUT", "0.2", differ=Differ(
            "XCFGSET is Redis 8.6's command with EZRA's settings; Redis 7 does not have it",
            "+OK\r\n", unknown("XCFGSET"))),
        S("p", "XADD", "{k}", "9-2", "n", "2"),
        S("w1", "XREADGROUP", "GROUP", "g", "w1", "STREAMS", "{k}", ">"),
        # Blocks until the lease expires on EZRA; Redis answers null when the block times out.
        S("w2", "XREADGROUP", "GROUP", "g", "w2", "BLOCK", "3000", "STREAMS", "{k}", ">",
          differ=Differ(REDELIVERY, read1("9-2", "2"), NIL)),
        S("p", "XPENDING", "{k}", "g", "-", "+", "10", differ=Differ(
            "an expired lease counted an attempt and the task went to the next reader",
            pending_entries(("9-2", "w2", 2)), pending_entries(("9-2", "w1", 1)))),
        S("w2", "XACK", "{k}", "g", "9-2"),
        S("p", "XPENDING", "{k}", "g"),
    ],
}


# ------------------------------------------------------------------ the harness

IDLE = re.compile(rb"(\*4\r\n\$\d+\r\n[^\r]*\r\n\$\d+\r\n[^\r]*\r\n):\d+\r\n")


def mask(reply: bytes, args: list[str]) -> bytes:
    """Idle times (XPENDING's extended form) vary: `:<idle>`."""
    if args[0] == "XPENDING" and len(args) > 3:
        return IDLE.sub(rb"\1:<idle>\r\n", reply)
    return reply


def connect(port: int, protocol: int) -> dict:
    conns = {}
    for name in ("p", "w1", "w2"):
        conn = RespConnection(port, timeout=10)
        if protocol == 3:
            assert conn.call(["HELLO", "3"]).startswith(b"%")
        conns[name] = conn
    return conns


def run(port: int, protocol: int, key: str, steps: list[Step]) -> list[bytes]:
    conns = connect(port, protocol)
    fill = lambda args: [a.replace("{k}", key) for a in args]
    replies = []
    try:
        for step in steps:
            conn = conns[step.conn]
            if step.wake:
                conn.send(encode_command(fill(step.args)))
                waker = conns[step.wake[0]]
                wait_until(lambda: blocked_clients(waker) >= 1, message="the reader to block")
                replies.append(waker.call(fill(step.wake[1:])))
                replies.append(mask(conn.read_reply(), step.args))
            else:
                replies.append(mask(conn.call(fill(step.args)), step.args))
    finally:
        for conn in conns.values():
            conn.close()
    return replies


def expected(value, protocol: int, key: str):
    if isinstance(value, dict):
        value = value[protocol]
    text = value.replace("{k}", key).replace("{klen}", str(len(key)))
    return Prefix(text) if isinstance(value, Prefix) else text.encode("latin-1")


def matches(want, got: bytes) -> bool:
    return got.startswith(want.encode("latin-1")) if isinstance(want, Prefix) else got == want


def labels(steps: list[Step]) -> list[tuple[str, Step]]:
    out = []
    for step in steps:
        if step.wake:
            out.append((" ".join(step.wake[1:]) + "  (while " + step.conn + " blocks)", None))
        out.append((" ".join(step.args), step))
    return out


def shown(reply: bytes, key: str) -> str:
    """A reply for the docs, with the scenario's key written `q` (its bulk length too)."""
    text = reply.decode("latin-1")
    return text.replace(f"${len(key)}\r\n{key}\r\n", "$1\r\nq\r\n").replace(key, "q")


@pytest.mark.parametrize("protocol", [2, 3], ids=["resp2", "resp3"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_parity(ezra_port, redis_port, scenario, protocol):
    key = f"par:{scenario}:{protocol}"
    steps = SCENARIOS[scenario]
    got_redis = run(redis_port, protocol, key, steps)
    got_ezra = run(ezra_port, protocol, key, steps)
    problems = []
    assert len(got_redis) == len(got_ezra) == len(labels(steps))
    for index, ((label, step), want, got) in enumerate(zip(labels(steps), got_redis, got_ezra)):
        differ = step.differ if step else None
        if differ is None:
            if want != got:
                problems.append(f"{label}\n   redis: {want!r}\n   ezra:  {got!r}")
            continue
        ezra_want, redis_want = expected(differ.ezra, protocol, key), expected(differ.redis, protocol, key)
        if not matches(redis_want, want) or not matches(ezra_want, got):
            problems.append(f"{label} [intended: {differ.reason}]\n   redis: {want!r} (expected {redis_want!r})"
                            f"\n   ezra:  {got!r} (expected {ezra_want!r})")
        entry = DIFFERENCES.setdefault((list(SCENARIOS).index(scenario), index), {
            "scenario": scenario, "command": label.replace("{k}", "q"), "reason": differ.reason})
        entry[f"redis_resp{protocol}"] = shown(want, key)
        entry[f"ezra_resp{protocol}"] = shown(got, key)
    assert not problems, "\n".join(problems)
    RUN.setdefault("scenarios", []).append(f"{scenario} (RESP{protocol}): {len(steps)} steps")


# ------------------------------------------------------------------ graduation

def test_graduation_examples_run_on_redis(redis_port):
    """examples/python's producer and worker, unchanged, process tasks on redis-server."""
    RUN["graduation"] = "fail"
    examples = ROOT / "examples" / "python"
    queue = "graduation"
    run_examples(redis_port, [sys.executable, str(examples / "producer.py")],
                 [sys.executable, str(examples / "worker.py")], queue, dict(os.environ))
    probe = RespConnection(redis_port)
    assert probe.call(["XPENDING", queue, "workers"]).startswith(b"*4\r\n:0\r\n")
    assert probe.call(["XLEN", queue]) == b":10\r\n"  # Redis keeps acked entries
    probe.close()
    RUN["graduation"] = "pass"
