"""Command-layer fuzzing against a live server, over a raw socket and through redis-py.

Hypothesis draws sequences of commands from the server's command table with
random and mutated arguments (negative and huge counts, invalid ids, invalid
UTF-8 names, 0-byte and 1 MiB fields, wrong arities, mixed case) and sends
them; a second family mutates whole frames byte by byte (huge and negative
declared lengths, deep nesting). After every example:

- every reply is a well-formed RESP reply (tests/reliability.py parses it,
  strictly), and every error has a prefix and a message; no reply is
  `internal error` or a rolled-back batch, and the log has no traceback;
- the server process is alive and its peak RSS (VmHWM) stays under a bound;
- a separate healthy client still gets PONG and a push/claim/ack cycle on its
  own queue, and each task it pushed is delivered exactly once;
- counts never go negative, and the server's counts equal the database's.

Bounded for CI: EZRA_FUZZ_EXAMPLES (default 40) sets the raw family's
examples, the others scale with it. Runs are derandomized (the same examples
each run); set EZRA_FUZZ_SEED=<n> to explore others (the seed is printed).
Last, scripts/fuzz_atheris.py (coverage-guided, in process) runs for
EZRA_ATHERIS_RUNS inputs where atheris is installed. The figures of each run
go to build/reliability/ (tests/reliability.py).
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from redis.client import CaseInsensitiveDict

from reliability import report
from support_resp import Err, Incomplete, errors_in, parse_all, parse_value
from support_servers import EzraProcess, wait_until

pytestmark = pytest.mark.slow  # fuzzing (hypothesis, atheris): not in `pytest -m "not slow"`

EXAMPLES = int(os.environ.get("EZRA_FUZZ_EXAMPLES", "40"))
SEED = os.environ.get("EZRA_FUZZ_SEED")
RSS_LIMIT = int(os.environ.get("EZRA_FUZZ_RSS_MB", "600")) * 1024 * 1024
MIB = 1024 * 1024
HEALTHY = b"healthy"  # the healthy client's queue: the fuzzer never names it
REPLY_TIMEOUT = 30.0  # a reply slower than this is a stalled server
BLOCKED_GRACE = 1.5  # an XREADGROUP/XREAD ... BLOCK that may be legitimately waiting is hung up after this


def fuzz_settings(examples: int):
    """Bounded, reproducible hypothesis settings; EZRA_FUZZ_SEED explores other examples."""
    chosen = settings(max_examples=max(examples, 1), deadline=None, database=None,
                      derandomize=SEED is None, suppress_health_check=list(HealthCheck))

    def apply(test):
        test = chosen(test)
        return seed(int(SEED))(test) if SEED is not None else test
    return apply


# ---------------------------------------------------------------- argument pools

QUEUES = [b"fz", b"fz", b"fz2", b"fz::dead", b"::dead", b"", b"\xff\xfe", b"q\x00x", b"q'; DROP TABLE tasks;--",
          b"fz::dead::dead", b"\r\n*1\r\n$4\r\nPING\r\n"]
GROUPS = [b"g", b"g", b"", b"\xc3\x28"]
WORKERS = [b"w1", b"w2", b"", b"\xc3\x28", b"w" * 300]
NUMBERS = [b"-1", b"0", b"1", b"2", b"10", b"10000", b"10001", b"2147483648", b"9223372036854775807",
           b"9223372036854775808", b"-9223372036854775808", b"-9223372036854775809", b"18446744073709551616",
           b"9" * 400, b"-" + b"9" * 400, b"1e3", b"1.5", b"", b"abc", b" 1", b"+1", b"0x10", b"1_000", b"\xff"]
SECONDS = [b"0", b"0.05", b"1", b"-1", b"inf", b"-inf", b"nan", b"1e309", b"1e-300", b"315360001", b"abc",
           b"", b"FOREVER", b"OFF", b"DEFAULT", b"9" * 400]
BAD_IDS = [b"0", b"0-0", b"1-1", b"1", b"*", b">", b"$", b"-", b"+", b"(0", b"(1-1", b"(", b"1-", b"-1", b"-1-1",
           b"1-*", b"", b"abc", b"1.5", b"18446744073709551615-18446744073709551615",
           b"9223372036854775807-9223372036854775807", b"9223372036854775808-0", b"0-9223372036854775808",
           b"(9223372036854775807-9223372036854775807", b"(0-0", b"\xff"]
NASTY = [b"", b"\x00", b"\xff\xfe", b"-1", b"9" * 400, b"*", b"\r\n", b"STREAMS", b"IDS", b"COUNT", b"BLOCK",
         b"FULL", b"x" * 1000]
OPTION_WORDS = [b"COUNT", b"BLOCK", b"NOACK", b"CLAIM", b"STREAMS", b"IDS", b"FORCE", b"JUSTID", b"IDLE",
                b"TIME", b"RETRYCOUNT", b"LASTID", b"MKSTREAM", b"NOMKSTREAM", b"FULL", b"GROUP"]


class Known:
    """A task id the server returned earlier, picked when the command is sent (index modulo)."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __repr__(self):
        return f"Known({self.index})"


queues = st.one_of(st.sampled_from([b"fz", b"fz2"]), st.sampled_from(QUEUES))
groups = st.sampled_from(GROUPS)
workers = st.sampled_from(WORKERS)
numbers = st.one_of(st.integers(-3, 12).map(lambda n: b"%d" % n), st.integers(0, 5).map(lambda n: b"%d" % n),
                    st.sampled_from(NUMBERS))
seconds = st.sampled_from(SECONDS)
task_ids = st.one_of(st.integers(0, 200).map(Known), st.integers(0, 200).map(Known), st.sampled_from(BAD_IDS))
small_block = st.one_of(st.integers(1, 40).map(lambda n: b"%d" % n),
                        st.sampled_from([b"-1", b"abc", b"1.5", b"9223372036854775808", b"9" * 400]))
field_values = st.one_of(st.binary(max_size=20), st.sampled_from([b"", b"\x00", b"\xff" * 3]),
                         st.sampled_from([MIB - 64, MIB, MIB + 1]).map(lambda n: b"v" * n))


def opt(strategy):
    """A list of arguments, or none."""
    return st.one_of(st.just([]), strategy)


def words(*parts):
    """A strategy for the concatenation of parts (each a strategy of a list, or bytes)."""
    return st.tuples(*[p if isinstance(p, st.SearchStrategy) else st.just([p]) for p in parts]).map(
        lambda lists: [arg for part in lists for arg in part])


def one(strategy):
    return strategy.map(lambda arg: [arg])


def flat(lists_strategy):
    """A strategy of lists of argument lists, as one argument list."""
    return lists_strategy.map(lambda parts: [arg for part in parts for arg in part])


def ids_block(min_size=0):
    return st.lists(task_ids, min_size=min_size, max_size=4).flatmap(
        lambda ids: st.tuples(st.sampled_from([len(ids), len(ids) + 1, 0, -1]), st.just(ids)).map(
            lambda pair: [b"IDS", b"%d" % pair[0], *pair[1]]))


xadd = words(b"XADD", one(queues),
             flat(st.lists(st.one_of(st.just([b"NOMKSTREAM"]), words(b"DELAY", one(seconds)),
                                words(b"TTL", one(seconds)), words(b"IDMP", one(workers), one(st.binary(max_size=4))),
                                words(b"IDMPAUTO", one(workers)), st.just([b"MAXLEN", b"10"]),
                                st.just([b"MAXLEN", b"~", b"2"]), words(b"MINID", b"~", one(task_ids)),
                                words(b"LIMIT", one(numbers)), st.just([b"KEEPREF"])), max_size=3)),
             one(st.one_of(st.just(b"*"), st.just(b"*"), st.sampled_from(BAD_IDS))),
             st.lists(st.tuples(st.binary(max_size=8), field_values), min_size=0, max_size=3).map(
                 lambda pairs: [a for pair in pairs for a in pair]))
xreadgroup = words(b"XREADGROUP", b"GROUP", one(groups), one(workers),
                   opt(words(b"COUNT", one(numbers))), opt(words(b"BLOCK", one(small_block))),
                   opt(words(b"CLAIM", one(numbers))), opt(st.just([b"NOACK"])), b"STREAMS",
                   st.lists(st.tuples(queues, st.one_of(st.just(b">"), st.just(b">"), task_ids)),
                            min_size=1, max_size=3).map(lambda pairs: [q for q, _ in pairs] + [i for _, i in pairs]))
xread = words(b"XREAD", opt(words(b"COUNT", one(numbers))), opt(words(b"BLOCK", one(small_block))), b"STREAMS",
              st.lists(st.tuples(queues, st.one_of(st.sampled_from([b"$", b"+", b"0", b">"]), task_ids)),
                       min_size=1, max_size=3).map(lambda pairs: [q for q, _ in pairs] + [i for _, i in pairs]))
xack = words(b"XACK", one(queues), one(groups), st.lists(task_ids, min_size=1, max_size=4))
xnack = st.one_of(
    words(b"XNACK", one(queues), one(groups), one(st.sampled_from([b"FAIL", b"SILENT", b"FATAL", b"fail", b"BAD"])),
          ids_block(), opt(words(b"RETRYCOUNT", one(numbers))), opt(st.just([b"FORCE"]))),
    words(b"XNACK", one(queues), one(groups), st.lists(task_ids, min_size=1, max_size=3)))
xdel = words(b"XDEL", one(queues), st.lists(task_ids, min_size=1, max_size=3))
xlen = words(b"XLEN", one(queues))
xtrim = words(b"XTRIM", one(queues), one(st.sampled_from([b"MAXLEN", b"MINID", b"maxlen", b"NOPE"])),
              opt(one(st.sampled_from([b"~", b"~", b"="]))), one(st.one_of(numbers, task_ids)),
              opt(words(b"LIMIT", one(numbers))))
xrange_ = words(one(st.sampled_from([b"XRANGE", b"XREVRANGE"])), one(queues), one(task_ids), one(task_ids),
                opt(words(b"COUNT", one(numbers))))
xpending = st.one_of(words(b"XPENDING", one(queues), one(groups)),
                     words(b"XPENDING", one(queues), one(groups), opt(words(b"IDLE", one(numbers))),
                           one(task_ids), one(task_ids), one(numbers), opt(one(workers))))
xgroup = words(b"XGROUP", one(st.sampled_from([b"CREATE", b"SETID", b"CREATECONSUMER", b"DELCONSUMER",
                                               b"DESTROY", b"HELP", b"NOPE"])),
               one(queues), one(groups), opt(one(task_ids)), opt(st.just([b"MKSTREAM"])))
xinfo = st.one_of(words(b"XINFO", b"STREAM", one(queues), opt(words(b"FULL", opt(words(b"COUNT", one(numbers)))))),
                  words(b"XINFO", b"GROUPS", one(queues)), words(b"XINFO", b"CONSUMERS", one(queues), one(groups)),
                  st.just([b"XINFO", b"HELP"]), words(b"XINFO", one(st.binary(max_size=6))))
setting = st.one_of(
    words(one(st.sampled_from([b"VISIBILITY-TIMEOUT", b"RETENTION", b"RELEASE-ON-DISCONNECT"])), one(seconds)),
    words(one(st.sampled_from([b"MAX-ATTEMPTS", b"IDMP-DURATION", b"IDMP-MAXSIZE"])), one(numbers)),
    words(b"BACKOFF", one(st.sampled_from([b"FIXED", b"EXPONENTIAL", b"nope"])), one(seconds), opt(one(seconds))),
    words(b"PAUSED", one(st.sampled_from([b"1", b"0", b"DEFAULT", b"2", b"-1", b"yes"]))),
    st.just([b"NOPE", b"1"]))
xcfgset = words(b"XCFGSET", one(queues), flat(st.lists(setting, max_size=3)))
xclaim = words(b"XCLAIM", one(queues), one(groups), one(workers), one(numbers),
               st.lists(task_ids, min_size=1, max_size=3),
               flat(st.lists(st.one_of(words(one(st.sampled_from([b"IDLE", b"TIME", b"RETRYCOUNT"])), one(numbers)),
                                  st.just([b"FORCE"]), st.just([b"JUSTID"]), words(b"LASTID", one(task_ids))),
                        max_size=3)))
xautoclaim = words(b"XAUTOCLAIM", one(queues), one(groups), one(workers), one(numbers), one(task_ids),
                   opt(words(b"COUNT", one(numbers))), opt(st.just([b"JUSTID"])))
xackdel = words(b"XACKDEL", one(queues), one(groups),
                opt(one(st.sampled_from([b"KEEPREF", b"DELREF", b"ACKED"]))), ids_block())
xrequeue = st.one_of(words(b"XREQUEUE", one(queues), b"ALL"), words(b"XREQUEUE", one(queues), ids_block()))
client_ = st.one_of(words(b"CLIENT", b"SETNAME", one(st.sampled_from([b"fuzz", b"", b"a b", b"\xff"]))),
                    st.just([b"CLIENT", b"GETNAME"]), st.just([b"CLIENT", b"ID"]),
                    words(b"CLIENT", b"SETINFO", one(st.sampled_from([b"LIB-NAME", b"LIB-VER", b"X"])),
                          one(st.binary(max_size=5))),
                    words(b"CLIENT", one(st.sampled_from([b"LIST", b"KILL", b"", b"\xff"]))))
connection = st.one_of(
    words(b"PING", opt(one(st.binary(max_size=10)))), words(b"ECHO", one(st.binary(max_size=10))),
    words(b"SELECT", one(numbers)), words(b"AUTH", st.lists(st.binary(max_size=6), max_size=3)),
    words(b"INFO", st.lists(st.sampled_from([b"all", b"server", b"clients", b"queues", b"nope", b"\xff"]),
                            max_size=3)),
    words(b"COMMAND", opt(one(st.sampled_from([b"COUNT", b"LIST", b"DOCS", b"INFO", b"NOPE"]))),
          st.lists(st.sampled_from([b"xadd", b"get", b""]), max_size=2)),
    words(one(st.sampled_from([b"GET", b"SET", b"SUBSCRIBE", b"MULTI", b"EVAL", b"\xff\xfe", b"X" * 200])),
          st.lists(st.binary(max_size=6), max_size=3)))
hello = words(b"HELLO", opt(one(st.sampled_from([b"2", b"3", b"4", b"-1", b"abc"]))),
              opt(words(b"AUTH", one(st.sampled_from([b"default", b"x"])), one(st.binary(max_size=4)))),
              opt(words(b"SETNAME", one(st.sampled_from([b"fuzz", b"a b"])))))

# What redis-py can send without changing the connection under its feet (HELLO, QUIT).
COMMON = [xadd, xadd, xreadgroup, xreadgroup, xread, xack, xnack, xdel, xlen, xtrim, xrange_, xpending, xgroup, xinfo,
          xcfgset, xclaim, xautoclaim, xackdel, xrequeue, client_, connection]


@st.composite
def mutated(draw, base):
    """A command from `base`, then maybe: mixed case, an argument dropped, repeated, replaced, appended."""
    args = list(draw(base))
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):  # most commands go in as drawn
        op = draw(st.sampled_from(["case", "drop", "repeat", "replace", "append", "none", "none"]))
        at = draw(st.integers(0, max(len(args) - 1, 0)))
        if op == "case" and isinstance(args[at], bytes) and len(args[at]) < 64:
            mask = draw(st.integers(0, 2 ** len(args[at]) - 1))  # bit i: flip the case of byte i
            args[at] = bytes(c ^ 0x20 if mask >> i & 1 and chr(c).isalpha() else c for i, c in enumerate(args[at]))
        elif op == "drop" and len(args) > 1:
            del args[at]
        elif op == "repeat":
            args.insert(at, args[at])
        elif op == "replace" and at > 0:
            args[at] = draw(st.one_of(st.sampled_from(NASTY + OPTION_WORDS + NUMBERS), task_ids))
        elif op == "append":
            args.append(draw(st.sampled_from(NASTY + OPTION_WORDS)))
    return args


def raw_command():
    """A command for the raw socket: anything, HELLO and QUIT included."""
    return mutated(st.one_of(*COMMON, hello, st.just([b"QUIT"]), st.just([b"quit"])))


def client_command():
    return mutated(st.one_of(*COMMON))


# ---------------------------------------------------------------- the server and its healthy client

def frame(args: list[bytes]) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def may_block(args) -> bool:
    """An XREADGROUP or XREAD with BLOCK may legitimately wait (a mutated timeout, BLOCK 0)."""
    return (bool(args) and isinstance(args[0], bytes) and args[0].upper() in (b"XREADGROUP", b"XREAD")
            and any(isinstance(a, bytes) and a.upper() == b"BLOCK" for a in args))


class Fuzz:
    """The server under fuzz, its healthy client, and the figures of the run."""

    def __init__(self, server: EzraProcess):
        self.server = server
        self.healthy = server.client()
        self.known: list[bytes] = []  # ids the server returned: fuzzed commands use real tasks too
        self.healthy_ids: set[bytes] = set()
        self.log_checked = 0
        self.peak_rss = 0
        self.figures = dict.fromkeys(["raw_examples", "raw_commands", "resp2_examples", "resp2_commands",
                                      "resp3_examples", "resp3_commands", "frame_examples", "frame_bytes",
                                      "replies_parsed", "error_replies", "blocked_hang_ups",
                                      "health_checks", "healthy_tasks"], 0)

    def resolve(self, args) -> list[bytes]:
        return [(self.known[a.index % len(self.known)] if self.known else b"0-1") if isinstance(a, Known) else a
                for a in args]

    def note_reply(self, args: list[bytes], reply) -> None:
        """Check one reply: errors well formed, none internal; learn the ids XADD returned."""
        self.figures["replies_parsed"] += 1
        for error in errors_in(reply):
            self.figures["error_replies"] += 1
            text = error.message.decode("utf-8", "replace")
            assert "internal error" not in text and "storage error" not in text, (args[:6], text)
        if args[0].upper() == b"XADD" and isinstance(reply, bytes) and len(self.known) < 1000:
            self.known.append(reply)

    # ------------------------------------------------------------ invariants

    def check_health(self) -> None:
        """Alive, under the memory bound, serving the healthy client, counts consistent, log clean."""
        self.figures["health_checks"] += 1
        proc = self.server.proc
        assert proc.poll() is None, f"the server died ({proc.returncode}):\n{self.server.log()[-3000:]}"
        self.peak_rss = max(self.peak_rss, peak_rss(proc.pid))
        assert self.peak_rss < RSS_LIMIT, f"peak RSS {self.peak_rss >> 20} MiB over the bound"
        assert self.healthy.ping()
        self._healthy_cycle()
        self._check_log()

    def _healthy_cycle(self) -> None:
        """Push, claim, ack on the healthy queue: the pushed task comes back once, and only it."""
        payload = uuid.uuid4().hex.encode()
        task_id = self.healthy.xadd(HEALTHY, {"p": payload})
        assert task_id not in self.healthy_ids
        self.healthy_ids.add(task_id)
        got = self.healthy.xreadgroup("g", "healthy-worker", {HEALTHY: ">"}, count=10)
        assert got == [[HEALTHY, [(task_id, {b"p": payload})]]], got
        assert self.healthy.xack(HEALTHY, "g", task_id) == 1
        assert self.healthy.xlen(HEALTHY) == 0
        assert self.healthy.xpending(HEALTHY, "g")["pending"] == 0
        self.figures["healthy_tasks"] += 1

    def _check_log(self) -> None:
        log = self.server.log()
        new, self.log_checked = log[self.log_checked:], len(log)
        assert "Traceback" not in new and " ERROR " not in new, new[-4000:]

    def check_counts(self) -> None:
        """Counts are never negative and the server's equal the database's (polled: the reaper moves tasks)."""
        queues = {split_queue(name) for name in QUEUES} | {HEALTHY}
        names = sorted(name for name in queues if split_queue(name) == name)  # 'fz::dead' is only a view
        seen = {}

        def agree():
            served = {name: self.counts_served(name) for name in names}
            stored = stored_counts(self.server.data_dir / "ezra.db")
            seen.update(served=served, stored=stored)
            return all(counts == stored.get(name, {}) for name, counts in served.items())

        try:
            wait_until(agree, 10, 0.05, "the server's counts to equal the database's")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last seen: {seen}") from exc

    def counts_served(self, queue: bytes) -> dict:
        """XINFO STREAM's counts by state, checked against XLEN and XPENDING (empty if no such queue)."""
        try:
            info = self.healthy.execute_command("XINFO", "STREAM", queue)
        except redis.ResponseError as exc:
            assert "no such key" in str(exc), exc
            return {}
        info = dict(zip(info[::2], info[1::2]))
        assert all(v >= 0 for v in info.values() if isinstance(v, int)), info
        counts = {state: info[key] for state, key in STATE_FIELDS.items()}
        # The reaper may move a task between these reads: equal once in a row, or polled again.
        if self.healthy.xlen(queue) != counts["available"] + counts["delayed"] + counts["in_flight"]:
            return {"xlen": "moving"}
        if self.healthy.xlen(queue + b"::dead") != counts["dead"]:
            return {"dead": "moving"}
        if self.healthy.xpending(queue, "g")["pending"] != counts["in_flight"]:
            return {"pending": "moving"}
        return {state: n for state, n in counts.items() if n}


STATE_FIELDS = {"available": b"available", "delayed": b"delayed", "in_flight": b"in-flight", "done": b"done",
                "dead": b"dead"}


def split_queue(name: bytes) -> bytes:
    """The queue a name reads: 'q::dead' is q's dead-letter view."""
    return name[:-len(b"::dead")] if name.endswith(b"::dead") and len(name) > len(b"::dead") else name


def stored_counts(path) -> dict:
    """{queue name (bytes): {state: count}} read from the database file itself."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        rows = db.execute("SELECT queue, state, count(*) FROM tasks GROUP BY queue, state").fetchall()
    finally:
        db.close()
    counts: dict = {}
    for queue, state, n in rows:
        name = queue.encode() if isinstance(queue, str) else bytes(queue)
        counts.setdefault(name, {})[state] = n
    return counts


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory):
    # A short visibility timeout and few attempts: leases expire and tasks die while fuzzing.
    server = EzraProcess(tmp_path_factory.mktemp("fuzz") / "data", "--visibility-timeout", "0.5",
                         "--max-attempts", "3", "--client-frame-timeout", "5").start()
    state = Fuzz(server)
    state.healthy.execute_command("XCFGSET", HEALTHY, "VISIBILITY-TIMEOUT", "600")  # no expiry on a slow machine
    started = time.monotonic()
    try:
        state.check_health()
        yield state
        state.check_counts()
        # Every healthy task was delivered and acked once, and none comes back.
        assert state.healthy.xreadgroup("g", "healthy-worker", {HEALTHY: ">"}, count=10) == []
        done = {task_id for task_id, _ in state.healthy.xrange(HEALTHY, count=10000)}
        assert done == state.healthy_ids
        assert server.stop() == 0, server.log()[-3000:]
    finally:
        server.kill9()  # after a failure above (a no-op once stopped)
    report("fuzz_commands", **state.figures, seconds=round(time.monotonic() - started, 1),
           peak_rss_mib=round(state.peak_rss / MIB, 1), seed=SEED or "derandomized")


# ---------------------------------------------------------------- raw socket

class RawClient:
    """A plain socket and the strict parser: replies exactly as the server wrote them."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=REPLY_TIMEOUT)
        self.buf = b""
        self.resp3 = False

    def reply(self, timeout: float, resp3: bool = False):
        """The next reply; TimeoutError if none came in `timeout`, EOFError if the server closed."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value, pos = parse_value(self.buf, 0, self.resp3 or resp3)
                self.buf = self.buf[pos:]
                return value
            except Incomplete:
                pass
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no complete reply in {timeout}s; have {self.buf[:200]!r}")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 20)
            except socket.timeout:
                continue
            if not data:
                raise EOFError(f"closed by the server; unfinished reply {self.buf[:200]!r}")
            self.buf += data

    def close(self):
        self.sock.close()


def run_raw(fuzz: Fuzz, commands: list, pipelined: bool) -> None:
    client = RawClient(fuzz.server.port)
    try:
        sent = [fuzz.resolve(args) for args in commands]
        if pipelined and not any(may_block(args) for args in sent):
            client.sock.sendall(b"".join(frame(args) for args in sent))
            for args in sent:
                if not expect_reply(fuzz, client, args):
                    return
        else:
            for args in sent:
                client.sock.sendall(frame(args))
                if not expect_reply(fuzz, client, args):
                    return
    finally:
        client.close()


def expect_reply(fuzz: Fuzz, client: RawClient, args: list[bytes]) -> bool:
    """Read and check the reply to args; False when the connection is over (QUIT, a hang-up)."""
    fuzz.figures["raw_commands"] += 1
    name = args[0].upper()
    try:
        # HELLO's reply is already in the protocol it asked for.
        reply = client.reply(BLOCKED_GRACE if may_block(args) else REPLY_TIMEOUT, resp3=name == b"HELLO")
    except TimeoutError:
        assert may_block(args), f"no reply to {args[:6]!r} in {REPLY_TIMEOUT}s"
        fuzz.figures["blocked_hang_ups"] += 1  # waiting as told: hang up, the server must cope
        return False
    fuzz.note_reply(args, reply)
    if name == b"HELLO" and not isinstance(reply, Err):
        assert isinstance(reply, list) and reply, reply
        pairs = reply if isinstance(reply[0], tuple) else zip(reply[::2], reply[1::2])
        client.resp3 = dict(pairs)[b"proto"] == 3
    if name == b"QUIT" and reply == b"OK":
        # Closed; reset when pipelined commands after QUIT were left unread (as Redis does).
        with pytest.raises((EOFError, ConnectionResetError)):
            client.reply(REPLY_TIMEOUT)
        return False
    return True


@fuzz_settings(EXAMPLES)
@given(commands=st.lists(raw_command(), min_size=1, max_size=8), pipelined=st.booleans())
def test_raw_command_sequences(fuzz, commands, pipelined):
    fuzz.figures["raw_examples"] += 1
    run_raw(fuzz, commands, pipelined)
    fuzz.check_health()


# ---------------------------------------------------------------- redis-py, RESP2 and RESP3

def unparsed_client(port: int, protocol: int, timeout: float = REPLY_TIMEOUT) -> redis.Redis:
    """redis-py with its reply callbacks removed: its parser reads the wire, nothing reinterprets it."""
    client = redis.Redis(port=port, protocol=protocol, socket_timeout=timeout)
    client.response_callbacks = CaseInsensitiveDict({})
    return client


@pytest.mark.parametrize("protocol", [2, 3], ids=["resp2", "resp3"])
def test_redis_py_command_sequences(fuzz, protocol):
    key = f"resp{protocol}"

    @fuzz_settings(max(EXAMPLES // 2, 1))
    @given(commands=st.lists(client_command(), min_size=1, max_size=6))
    def run(commands):
        fuzz.figures[f"{key}_examples"] += 1
        client = unparsed_client(fuzz.server.port, protocol)
        # A read that may block as told gets its own connection, hung up after BLOCKED_GRACE.
        blocking = unparsed_client(fuzz.server.port, protocol, BLOCKED_GRACE)
        try:
            for args in commands:
                args = fuzz.resolve(args)
                fuzz.figures[f"{key}_commands"] += 1
                try:
                    reply = (blocking if may_block(args) else client).execute_command(*args)
                except (redis.ResponseError, redis.AuthenticationError) as exc:  # AUTH's error is the latter
                    reply = Err(str(exc).encode())
                    assert str(exc), args[:6]
                except redis.TimeoutError:
                    assert may_block(args), f"no reply to {args[:6]!r}"
                    fuzz.figures["blocked_hang_ups"] += 1
                    break
                fuzz.note_reply(args, to_err(reply))
        finally:
            client.close()
            blocking.close()
        fuzz.check_health()

    run()


def to_err(value):
    """redis-py returns nested errors as exception objects: as Err, for note_reply."""
    if isinstance(value, redis.ResponseError):
        return Err(str(value).encode())
    if isinstance(value, (list, tuple)):
        return [to_err(item) for item in value]
    return value


# ---------------------------------------------------------------- mutated frames

INTERESTING = [b"*", b"$", b"\r\n", b"\r", b"\n", b"-1", b"0", b"-", b"9999999999", b"2147483648", b"\x00",
               b" ", b'"', b"'", b"\\", b"*1\r\n", b"$4\r\nPING\r\n", b"*-1\r\n", b"$-2\r\n", b"%1\r\n", b"_\r\n"]


def base_frames():
    """Valid frames to mutate: commands as multibulk or as inline lines."""
    command = st.one_of(*COMMON).map(lambda args: [a if isinstance(a, bytes) else b"0-1" for a in args])
    small = command.filter(lambda args: sum(map(len, args)) < 4096)
    inline = small.map(lambda args: b" ".join(a for a in args if a and not any(c in a for c in b" \r\n\"'"))
                       + b"\r\n")
    return st.lists(st.one_of(small.map(frame), inline), min_size=1, max_size=3).map(b"".join)


class Frame(bytes):
    """Bytes whose repr stays short (a failing example may be 400 kB of nesting)."""

    def __repr__(self):
        text = bytes.__repr__(self)
        return text if len(text) < 400 else f"{text[:300]}...<{len(self)} bytes>...{text[-60:]}"


def mutated_frames():
    return raw_frames().map(Frame)


@st.composite
def raw_frames(draw):
    """Byte mutations of valid frames, huge or negative declared lengths, deep nesting."""
    kind = draw(st.sampled_from(["mutate", "mutate", "mutate", "nesting", "lengths"]))
    if kind == "nesting":
        depth = draw(st.sampled_from([2, 10, 1000, 100_000]))
        return b"*1\r\n" * depth + draw(st.sampled_from([b"$4\r\nPING\r\n", b"", b"*0\r\n", b"*-1\r\n"]))
    if kind == "lengths":
        header = draw(st.sampled_from([b"*", b"$"]))
        length = draw(st.sampled_from([b"2147483648", b"9223372036854775807", b"9223372036854775808",
                                       b"99999999999999999999", b"-2", b"-9223372036854775808", b"1048577",
                                       b"1114112", b"1048576", b"-0", b"1e6"]))
        prefix = b"*1\r\n" if header == b"$" else b""
        return prefix + header + length + b"\r\n" + draw(st.binary(max_size=32))
    data = bytearray(draw(base_frames()))
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "delete", "insert", "replace", "duplicate"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "delete" and data:
            del data[at:at + draw(st.integers(1, 4))]
        elif op == "insert":
            data[at:at] = draw(st.one_of(st.sampled_from(INTERESTING), st.binary(min_size=1, max_size=4)))
        elif op == "replace" and data:
            data[at:at + 1] = draw(st.sampled_from(INTERESTING))
        elif op == "duplicate" and data:
            data[at:at] = data[at:at + draw(st.integers(1, 40))]
    return bytes(data)


def send_frame_and_read_all(port: int, data: bytes) -> tuple[bytes, bool]:
    """Send data, half-close, read until the server closes; (received, reset by the server)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=REPLY_TIMEOUT)
    received, reset = b"", False
    try:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # EPIPE, ECONNRESET, ENOTCONN
            reset = True  # closed after a protocol error, before reading all of it
        deadline = time.monotonic() + (BLOCKED_GRACE if b"BLOCK" in data.upper() else REPLY_TIMEOUT)
        while True:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                chunk = sock.recv(1 << 20)
            except ConnectionResetError:
                return received, True
            except socket.timeout:
                assert b"BLOCK" in data.upper(), f"the server neither answered nor closed: {received[-200:]!r}"
                return received, True  # a blocked read, waiting as told: hang up
            if not chunk:
                return received, reset
            received += chunk
    finally:
        sock.close()


@fuzz_settings(EXAMPLES * 3)
@given(data=mutated_frames())
def test_mutated_frames(fuzz, data):
    fuzz.figures["frame_examples"] += 1
    fuzz.figures["frame_bytes"] += len(data)
    received, cut = send_frame_and_read_all(fuzz.server.port, data)
    # HELLO 3 may switch the connection to RESP3 midway: RESP3 types are allowed here.
    replies, rest = parse_all(received, resp3=True)
    assert not rest or cut, f"an unfinished reply before the server closed: {rest[:200]!r}"
    for reply in replies:
        fuzz.note_reply([b"?"], reply)
    protocol_errors = [i for i, r in enumerate(replies) if isinstance(r, Err) and b"Protocol error" in r.message]
    assert protocol_errors in ([], [len(replies) - 1]), "a protocol error closes the connection at once"
    fuzz.check_health()


def test_counts_agree_with_the_database_after_fuzzing(fuzz):
    fuzz.check_counts()


# ---------------------------------------------------------------- defects the fuzzing found

class Conversation(RawClient):
    """A raw connection that asks one command at a time and checks each reply like the fuzzer."""

    def __init__(self, fuzz: Fuzz):
        super().__init__(fuzz.server.port)
        self.fuzz = fuzz

    def ask(self, *args):
        args = [a if isinstance(a, bytes) else str(a).encode() for a in args]
        self.sock.sendall(frame(args))
        reply = self.reply(REPLY_TIMEOUT)
        self.fuzz.note_reply(args, reply)
        return reply


def test_found_integers_wider_than_64_bits_are_refused(fuzz):
    """They reached SQLite (OverflowError): the writer rolled back the whole batch, other clients' too."""
    talk = Conversation(fuzz)
    task = talk.ask("XADD", "regress-int", "*", "f", "v")
    talk.ask("XREADGROUP", "GROUP", "g", "w", "STREAMS", "regress-int", ">")
    [[pending_id, *_]] = talk.ask("XPENDING", "regress-int", "g", "IDLE", "-9223372036854775808", "-", "+", "10")
    assert pending_id == task  # a negative IDLE means any idle time, as in Redis
    for args in (("XPENDING", "regress-int", "g", "IDLE", "9" * 30, "-", "+", "10"),
                 ("XINFO", "STREAM", "regress-int", "FULL", "COUNT", "9223372036854775808"),
                 ("XREADGROUP", "GROUP", "g", "w", "BLOCK", "9" * 30, "STREAMS", "regress-int", ">"),
                 ("XAUTOCLAIM", "regress-int", "g", "w", "9" * 30, "0")):
        reply = talk.ask(*args)
        assert isinstance(reply, Err) and reply.message.startswith(b"ERR "), (args, reply)
    talk.close()
    fuzz.check_health()


def test_found_retrycount_near_2_63_does_not_overflow_the_next_delivery(fuzz):
    """attempts + 1 overflowed: the batch was rolled back (and in SQL it would have become a REAL)."""
    talk = Conversation(fuzz)
    task = talk.ask("XADD", "regress-retry", "*", "f", "v")
    talk.ask("XREADGROUP", "GROUP", "g", "w1", "STREAMS", "regress-retry", ">")
    assert talk.ask("XCLAIM", "regress-retry", "g", "w2", "0", task, "RETRYCOUNT", 2 ** 63 - 1) != []
    assert talk.ask("XCLAIM", "regress-retry", "g", "w3", "0", task, "JUSTID", "RETRYCOUNT", 2 ** 63 - 1) == [task]
    assert talk.ask("XCLAIM", "regress-retry", "g", "w1", "0", task)[0][0] == task  # a take-over: +1
    [[_, owner, _, deliveries]] = talk.ask("XPENDING", "regress-retry", "g", "-", "+", "10")
    assert owner == b"w1" and deliveries == 2 ** 31  # 2^31-1 (the most RETRYCOUNT means), then one more
    assert talk.ask("XNACK", "regress-retry", "g", "FAIL", "IDS", "1", task, "RETRYCOUNT", 2 ** 63 - 1) == 1
    assert talk.ask("XLEN", "regress-retry::dead") == 1
    talk.close()
    fuzz.check_health()


def test_found_xclaim_idle_near_2_63_keeps_idle_times_64_bit(fuzz):
    """Idle times above 2^63-1 came back: hiredis answers 'Bad integer value' and drops the connection."""
    talk = Conversation(fuzz)
    task = talk.ask("XADD", "regress-idle", "*", "f", "v")
    talk.ask("XREADGROUP", "GROUP", "g", "w", "STREAMS", "regress-idle", ">")
    talk.ask("XCLAIM", "regress-idle", "g", "w", "0", task, "IDLE", 2 ** 63 - 1)
    [[_, _, idle, _]] = talk.ask("XPENDING", "regress-idle", "g", "-", "+", "10")
    assert 0 <= idle < 60_000  # a delivery time before the epoch means now, as in Redis
    client = unparsed_client(fuzz.server.port, 3)  # hiredis when installed: it refuses wider integers
    assert client.execute_command("XINFO", "CONSUMERS", "regress-idle", "g")
    client.close()
    talk.close()
    fuzz.check_health()


# ---------------------------------------------------------------- atheris (coverage-guided, in process)

ATHERIS_RUNS = int(os.environ.get("EZRA_ATHERIS_RUNS", "5000"))


def test_atheris_reader_and_dispatch(tmp_path):
    """scripts/fuzz_atheris.py for a bounded number of inputs (skipped where atheris is not installed)."""
    if importlib.util.find_spec("atheris") is None:
        pytest.skip("atheris is not installed (pip install atheris): the coverage-guided run is skipped")
    script = Path(__file__).resolve().parent.parent / "scripts" / "fuzz_atheris.py"
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script), f"-atheris_runs={ATHERIS_RUNS}", "-seed=1",
                           f"-artifact_prefix={tmp_path}/"], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    runs = int(re.search(r"Done (\d+) (?:runs )?in", output).group(1))
    coverage = re.findall(r"cov: (\d+)", output)
    report("atheris", runs=runs, edges_covered=int(coverage[-1]) if coverage else None,
           seconds=round(time.monotonic() - started, 1))
    assert runs >= ATHERIS_RUNS


def test_found_a_queue_named_twice_shows_every_task_it_claims(fuzz):
    """XREADGROUP ... STREAMS q q > >: the reply is keyed by queue, so the tasks claimed for the first
    mention were leased and never shown (back only after the visibility timeout, an attempt spent)."""
    talk = Conversation(fuzz)
    pushed = [talk.ask("XADD", "regress-twice", "*", "n", n) for n in range(4)]
    reply = talk.ask("XREADGROUP", "GROUP", "g", "w", "COUNT", "1", "STREAMS",
                     "regress-twice", "regress-twice", ">", ">")
    shown = [entry[0] for _, entries in reply for entry in entries]
    [count, *_] = talk.ask("XPENDING", "regress-twice", "g")
    assert count == len(shown) == 1 and shown == pushed[:1], (reply, count)
    talk.close()
    fuzz.check_health()


def test_found_xinfo_full_count_0_is_capped_like_xrange(fuzz):
    """COUNT 0 (all, in Redis) loaded every task of the queue into memory for one reply."""
    pipe = fuzz.healthy.pipeline(transaction=False)
    for n in range(10_001):
        pipe.xadd("regress-full", {"n": n})
    pipe.execute()
    talk = Conversation(fuzz)
    for count in ("0", "20000"):
        reply = talk.ask("XINFO", "STREAM", "regress-full", "FULL", "COUNT", count)
        fields = dict(zip(reply[::2], reply[1::2]))
        assert fields[b"length"] == 10_001 and len(fields[b"entries"]) == 10_000, count
    talk.close()
    fuzz.check_health()


def test_a_reader_blocked_forever_that_hangs_up_leaves_nothing_leased(fuzz):
    """The fuzzer hangs up on reads that block as told (BLOCK 0): the server must notice, and a task
    pushed afterwards must not stay leased to the reader that is gone."""
    hang_ups = fuzz.figures["blocked_hang_ups"]
    run_raw(fuzz, [[b"XREADGROUP", b"GROUP", b"g", b"gone", b"BLOCK", b"0", b"STREAMS", b"regress-block", b">"]],
            pipelined=False)
    assert fuzz.figures["blocked_hang_ups"] == hang_ups + 1
    task = fuzz.healthy.xadd("regress-block", {"f": "v"})
    wait_until(lambda: fuzz.healthy.xpending("regress-block", "g")["pending"] == 0, 10,
               message="the task claimed for the gone reader to be given back")
    got = fuzz.healthy.xreadgroup("g", "other", {"regress-block": ">"}, count=10)
    assert got == [[b"regress-block", [(task, {b"f": b"v"})]]]
    fuzz.check_health()
