"""Byte-exact replay of the redis-server 7.0.15 vectors in tests/vectors/ against EZRA.

Each vector is one case on one fresh connection: (RESP3 only) HELLO 3, the
setup commands (their replies must be the recorded ones), optionally a
`concurrent` command from a second connection while the request blocks, then
the request and exactly one reply. See tests/vectors/README.md for the format.

EZRA_VECTORS_AGAINST_REDIS=1 runs every vector against a real redis-server
instead and ignores the table below: every reply must then equal the vector
(shape for `variable` ones), which proves this harness reads and compares
correctly.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import pytest

from support_resp import AGGREGATE_TYPES, Incomplete, Reply, RespConnection, blocked_clients, parse_reply, raw
from support_servers import EzraProcess, wait_until
from ezra import errors

VECTORS = Path(__file__).resolve().parent / "vectors"
AGAINST_REDIS = os.environ.get("EZRA_VECTORS_AGAINST_REDIS") == "1"

# ---------------------------------------------------------------- the table
#
# Every case is in exactly one group (test_table_matches_the_vectors keeps it so):
#
#   EXACT     EZRA answers byte for byte as Redis 7.0.15.
#   VARIABLE  the vector's `variable` flag: the reply's shape is compared instead
#             (same RESP types, array lengths and map keys; numbers and ids may differ).
#   INTENDED  EZRA differs from Redis on purpose: EZRA's own reply is asserted instead.
#
# Two lists sit on top of the groups: cases EZRA cannot express (skipped) and
# commands not implemented yet (xfail; the vector's Redis reply is still compared).

EXACT = {  # EZRA answers byte for byte as Redis 7.0.15
    # connection
    "auth_nopass", "client_getname", "client_getname_unset", "client_maint_notifications",
    "client_setname", "client_setname_lower", "client_unknown_sub", "echo", "hello_4_noproto",
    "inline_ping", "ping", "ping_lowercase", "ping_msg", "quit", "select_0", "select_16",
    "select_nan", "wrong_arity",
    # XADD, XACK, XDEL, XLEN, XRANGE, XGROUP
    "xadd_explicit", "xadd_id_too_small", "xadd_id_zero", "xadd_invalid_id", "xadd_maxlen_approx",
    "xadd_nomkstream_missing", "xadd_odd_fieldvalues", "xadd_partial_id", "xadd_wrongtype",
    "xack", "xack_again", "xack_invalid_id", "xack_nokey", "xdel", "xdel_missing_id", "xdel_nokey",
    "xlen", "xlen_nokey", "xrange", "xrange_count", "xrange_exclusive", "xrange_nokey", "xrevrange",
    "xgroup_create", "xgroup_create_lower", "xgroup_create_nokey", "xgroup_createconsumer",
    "xgroup_delconsumer", "xgroup_destroy", "xgroup_setid",
    # XREADGROUP, XPENDING
    "xreadgroup_bad_block", "xreadgroup_bad_count", "xreadgroup_block_data",
    "xreadgroup_block_timeout", "xreadgroup_block_wakeup", "xreadgroup_count1",
    "xreadgroup_dollar_id", "xreadgroup_missing_streams", "xreadgroup_new", "xreadgroup_new_lower",
    "xreadgroup_noack", "xreadgroup_nodata_noblock", "xreadgroup_pending0",
    "xreadgroup_pending0_after_ack", "xreadgroup_pending0_block_ignored",
    "xreadgroup_pending0_other_consumer", "xreadgroup_two_streams", "xreadgroup_unbalanced",
    "xreadgroup_wrongtype", "xpending_extended_consumer", "xpending_extended_idle",
    "xpending_summary", "xpending_summary_empty",
    # XINFO, XCLAIM, XAUTOCLAIM
    "xinfo_stream_nokey", "xinfo_groups", "xinfo_help",
    "xautoclaim", "xautoclaim_count1_cursor", "xautoclaim_justid",
    "xautoclaim_nothing_idle", "xclaim", "xclaim_idle_not_met", "xclaim_justid",
}

VARIABLE = {
    "client_id": "client ids count connections since the server started",
    "hello_2": "the HELLO reply carries the client id (and server: 'ezra')",
    "hello_3": "the HELLO reply carries the client id (and server: 'ezra')",
    "hello_3_auth_nopass": "the HELLO reply carries the client id (and server: 'ezra')",
    "hello_3_setname": "the HELLO reply carries the client id (and server: 'ezra')",
    "hello_noargs": "the HELLO reply carries the client id (and server: 'ezra')",
    "info_server": "INFO text is the server's own figures",
    "xadd_star": "an auto id is the clock's milliseconds",
    "xinfo_consumers": "idle and inactive are milliseconds since the last read",
    "xpending_extended": "the idle time is milliseconds since delivery",
    "xreadgroup_redelivery_count": "the idle time is milliseconds since delivery",
}


class Hinted:
    """An unknown-command error: Redis's exact text, then EZRA's hint listing what it supports.

    `text` is Redis's wording (without CRLF); None means the vector's own reply.
    """

    def __init__(self, text: str | None = None):
        self.text = text


class SameAs:
    """The reply another vector of the same protocol pins down, byte for byte."""

    def __init__(self, case: str):
        self.case = case


class RedisFirst:
    """A map (flat array in RESP2) holding Redis's exact fields first, then EZRA's own."""


def one_stream(body: str) -> dict:
    """An XREADGROUP reply for one queue: RESP2 [[queue, entries]], RESP3 {queue: entries}."""
    return {2: "*1\r\n*2\r\n" + body, 3: "%1\r\n" + body}


# case -> (reason, EZRA's reply). A reply is latin-1 text (one for both protocols, or
# {2: ..., 3: ...}), `Hinted`, `SameAs` or `RedisFirst`. 'vN:' in key names stands for v2: / v3:.
INTENDED = {
    "client_setinfo_libname": ("CLIENT SETINFO is accepted, as Redis >= 7.2 does", "+OK\r\n"),
    "client_setinfo_libver": ("CLIENT SETINFO is accepted, as Redis >= 7.2 does", "+OK\r\n"),
    "select_1": ("EZRA has one database",
                 "-ERR EZRA has one database: only SELECT 0 is allowed\r\n"),
    "unknown_command": ("unknown commands get a hint after Redis's exact text", Hinted()),
    "unknown_command_noargs": ("unknown commands get a hint after Redis's exact text", Hinted()),
    "evalsha_noscript": ("SPEC 2: a command outside the queue subset is an unknown command",
                         Hinted("-ERR unknown command 'EVALSHA', with args beginning with: "
                                "'ffffffffffffffffffffffffffffffffffffffff' '0' ")),
    "xtrim_maxlen": ("exact trimming would drop unfinished work: refused (use ~, which trims done tasks)",
                     "-" + errors.EXACT_TRIM_REFUSED.message + "\r\n"),
    "xack_nogroup": ("SPEC 3: the group name is ignored (one implicit group), so the ack counts",
                     ":1\r\n"),
    "xreadgroup_nogroup": ("groups are implicit: a queue without a group is read as it is",
                           one_stream("$9\r\nvN:xrg_ng\r\n*1\r\n*2\r\n$3\r\n1-1\r\n"
                                      "*2\r\n$4\r\ntask\r\n$1\r\n1\r\n")),
    "xreadgroup_nokey": ("groups are implicit: a missing queue is an empty queue",
                         SameAs("xreadgroup_nodata_noblock")),
    "xpending_nogroup": ("groups are implicit: a missing group is an empty queue",
                         SameAs("xpending_summary_empty")),
    "xpending_nokey": ("groups are implicit: a missing queue is an empty queue",
                       SameAs("xpending_summary_empty")),
    "xgroup_create_busygroup": ("groups are implicit: creating one again is fine", "+OK\r\n"),
    "xinfo_stream": ("XINFO STREAM adds EZRA's counts and settings after Redis's fields",
                     RedisFirst()),
    "xinfo_stream_empty": ("XINFO STREAM adds EZRA's counts and settings after Redis's fields",
                           RedisFirst()),
    "xautoclaim_deleted": ("XDEL gave 1-1 back for retry (not deleted), so no id is reported deleted",
                           "*3\r\n$3\r\n0-0\r\n*1\r\n*2\r\n$3\r\n1-2\r\n*4\r\n$4\r\ntask\r\n"
                           "$1\r\n2\r\n$1\r\nx\r\n$1\r\ny\r\n*0\r\n"),
    "xautoclaim_nogroup": ("groups are implicit: a missing group is an empty queue",
                           SameAs("xautoclaim_nothing_idle")),
    "xreadgroup_pending0_deleted_entry": (
        "XDEL gave 1-1 back for retry (not deleted): only 1-2 is still this worker's",
        one_stream("$10\r\nvN:xrg_p0d\r\n*1\r\n*2\r\n$3\r\n1-2\r\n"
                   "*4\r\n$4\r\ntask\r\n$1\r\n2\r\n$1\r\nx\r\n$1\r\ny\r\n")),
}

NOT_IN_EZRA = {
    "xadd_wrongtype": "needs SET: EZRA keys are only queues, so WRONGTYPE cannot happen",
    "xreadgroup_wrongtype": "needs SET: EZRA keys are only queues, so WRONGTYPE cannot happen",
}

NOT_YET: dict[str, str] = {}  # commands not implemented yet (xfail): none left


# ---------------------------------------------------------------- the vectors

def load_vectors() -> list[dict]:
    vectors = []
    for proto in (2, 3):
        for path in sorted((VECTORS / f"resp{proto}").glob("*.json")):
            vector = json.loads(path.read_text())
            assert vector["proto"] == proto and path.stem == vector["case"], path
            vectors.append(vector)
    return vectors


ALL_VECTORS = load_vectors()
BY_KEY = {(v["proto"], v["case"]): v for v in ALL_VECTORS}


def params():
    for vector in ALL_VECTORS:
        case, marks = vector["case"], []
        if not AGAINST_REDIS:
            if case in NOT_IN_EZRA:
                marks.append(pytest.mark.skip(reason=NOT_IN_EZRA[case]))
            if case in NOT_YET:
                marks.append(pytest.mark.xfail(reason=NOT_YET[case], strict=False))
        yield pytest.param(vector, id=f"resp{vector['proto']}-{case}", marks=marks)


# ---------------------------------------------------------------- comparing shapes

def shape_differences(want: Reply, got: Reply, path: str = "reply") -> list[str]:
    """Where `got` is not shaped like `want`: RESP types, nulls, array lengths, map keys.

    Integers, bulk and verbatim text may differ (ids, idle times, INFO text);
    simple strings and errors are status words and must be equal.
    """
    if want.kind != got.kind:
        return [f"{path}: type {want.kind!r} expected, got {got.kind!r}"]
    if (want.value is None) != (got.value is None):
        return [f"{path}: {want.value!r} expected, got {got.value!r}"]
    if want.value is None:
        return []
    if want.kind in "+-" and want.value != got.value:
        return [f"{path}: {want.value!r} expected, got {got.value!r}"]
    if want.kind == "=" and want.value[:4] != got.value[:4]:
        return [f"{path}: verbatim format {want.value[:4]!r} expected, got {got.value[:4]!r}"]
    if want.kind in AGGREGATE_TYPES:
        if len(want.value) != len(got.value):
            return [f"{path}: {len(want.value)} items expected, got {len(got.value)}"]
        return [diff for i, (w, g) in enumerate(zip(want.value, got.value))
                for diff in shape_differences(w, g, f"{path}[{i}]")]
    if want.kind == "%":
        want_keys = [key for key, _ in want.value]
        got_keys = [key for key, _ in got.value]
        if want_keys != got_keys:
            return [f"{path}: map keys {want_keys} expected, got {got_keys}"]
        return [diff for (key, w), (_, g) in zip(want.value, got.value)
                for diff in shape_differences(w, g, f"{path}[{key.value!r}]")]
    return []


def assert_same_shape(want: bytes, got: bytes) -> None:
    differences = shape_differences(parse_reply(want)[0], parse_reply(got)[0])
    assert not differences, f"shape differs:\n  want {want!r}\n  got  {got!r}\n" + "\n".join(differences)


# ---------------------------------------------------------------- expected EZRA replies

def ezra_reply(expectation, vector: dict) -> bytes | Hinted | RedisFirst:
    """EZRA's reply for an intended difference, in the vector's protocol and key names."""
    proto = vector["proto"]
    if isinstance(expectation, SameAs):
        return raw(BY_KEY[proto, expectation.case]["reply"])
    if isinstance(expectation, (Hinted, RedisFirst)):
        return expectation
    if isinstance(expectation, dict):
        expectation = expectation[proto]
    return raw(expectation.replace("vN:", f"v{proto}:"))


def assert_redis_fields_first(want: bytes, got: bytes) -> None:
    redis_reply, ezra = parse_reply(want)[0], parse_reply(got)[0]
    assert ezra.kind == redis_reply.kind and len(ezra.value) > len(redis_reply.value), got
    assert ezra.value[:len(redis_reply.value)] == redis_reply.value, f"\n  want {want!r}...\n  got  {got!r}"


def assert_hinted(expected: Hinted, got: bytes, vector: dict) -> None:
    text = vector["reply"].removesuffix("\r\n") if expected.text is None else expected.text
    text = raw(text.replace("vN:", f"v{vector['proto']}:"))
    assert got.startswith(text), f"Redis's text expected first:\n  want {text!r}...\n  got  {got!r}"
    hint = got[len(text):]
    assert hint.startswith(b"(EZRA is a task queue; supported: ") and hint.endswith(b")\r\n"), got
    assert b"\r" not in hint[:-2] and b"\n" not in hint[:-2], got


# ---------------------------------------------------------------- servers

@pytest.fixture(scope="module")
def server_port(request, tmp_path_factory):
    """One EZRA server for every case (the port), or the shared redis-server.

    Like the capture (tests/vectors/README.md), every case runs once per server
    life: its keys are its own (`v2:<case>`, `v3:<case>`), on a fresh connection.
    """
    if AGAINST_REDIS:
        yield request.getfixturevalue("redis_server_port")
        return
    server = EzraProcess(tmp_path_factory.mktemp("vectors") / "data").start()
    yield server.port
    assert server.stop() == 0, server.log()


# ---------------------------------------------------------------- running a case

def send_when_blocked(port: int, concurrent: dict, sent_at: float, done: threading.Event,
                      failures: list) -> None:
    """The `concurrent` command, from a second connection once the request blocks.

    Polls the server's blocked_clients (and waits out delay_ms, the case's own
    timing) instead of sleeping and hoping the request got there first.
    """
    conn = RespConnection(port)
    try:
        delay = concurrent["delay_ms"] / 1000
        wait_until(lambda: done.is_set() or (blocked_clients(conn) > 0
                                             and time.monotonic() - sent_at >= delay),
                   message="the request to block")
        conn.call(concurrent["command"])
    except BaseException as exc:  # reported by the test's own thread
        failures.append(exc)
    finally:
        conn.close()


def is_quit(vector: dict) -> bool:
    args = vector["request_args"]  # None for an inline request
    return bool(args) and args[0].upper() == "QUIT"


def run_case(port: int, vector: dict) -> bytes:
    """Replay one vector on a fresh connection; the request's reply, as bytes."""
    conn = RespConnection(port)
    try:
        if vector["proto"] == 3:
            conn.call(["HELLO", "3"])
        for command, want in zip(vector["setup"], vector["setup_replies"], strict=True):
            got = conn.call(command)
            assert got == raw(want), f"setup {command}:\n  want {raw(want)!r}\n  got  {got!r}"
        request, concurrent = raw(vector["request"]), vector["concurrent"]
        if concurrent is None:
            conn.send(request)
            reply = conn.read_reply()
        else:
            done, failures = threading.Event(), []
            conn.send(request)
            helper = threading.Thread(target=send_when_blocked,
                                      args=(port, concurrent, time.monotonic(), done, failures))
            helper.start()
            try:
                reply = conn.read_reply()
            finally:
                done.set()
                helper.join()
            assert not failures, f"the concurrent command failed: {failures[0]!r}"
        assert conn.buffer == b"", f"bytes after the reply: {conn.buffer!r}"
        if is_quit(vector):
            assert conn.closed_by_server(), "QUIT must close the connection after +OK"
        return reply
    finally:
        conn.close()


@pytest.mark.parametrize("vector", list(params()))
def test_vector(server_port, vector):
    case, want = vector["case"], raw(vector["reply"])
    got = run_case(server_port, vector)
    if AGAINST_REDIS or case not in INTENDED:
        if vector["variable"]:
            assert_same_shape(want, got)
        else:
            assert got == want, f"\n  want {want!r}\n  got  {got!r}"
        return
    expected = ezra_reply(INTENDED[case][1], vector)
    if isinstance(expected, RedisFirst):
        assert_redis_fields_first(want, got)
    elif isinstance(expected, Hinted):
        assert_hinted(expected, got, vector)
    else:
        assert got == expected, f"\n  want {expected!r}\n  got  {got!r}\n  (Redis: {want!r})"


# ---------------------------------------------------------------- the table itself

def test_table_matches_the_vectors():
    """Each case is in one group; variable and skipped follow the vectors' own flags."""
    cases = [v["case"] for v in ALL_VECTORS if v["proto"] == 2]
    groups = [EXACT, set(VARIABLE), set(INTENDED)]
    for case in cases:
        assert sum(case in group for group in groups) == 1, case
    assert set().union(*groups, NOT_IN_EZRA, NOT_YET) <= set(cases)
    assert set(VARIABLE) == {v["case"] for v in ALL_VECTORS if v["variable"]}
    assert set(NOT_IN_EZRA) == {v["case"] for v in ALL_VECTORS if v["needs"]}
    for case, (reason, expectation) in INTENDED.items():
        assert reason and expectation is not None, case
        if isinstance(expectation, SameAs):
            assert all((proto, expectation.case) in BY_KEY for proto in (2, 3)), case


def test_each_case_has_keys_of_its_own():
    """The cases share one server (server_port): no two may touch the same key."""
    owner = {}
    for vector in ALL_VECTORS:
        commands = [*vector["setup"], vector["request_args"] or [],
                    vector["concurrent"]["command"] if vector["concurrent"] else []]
        prefix = f"v{vector['proto']}:"
        keys = {arg.split("::")[0] for command in commands for arg in command if arg.startswith(prefix)}
        for key in keys:
            assert owner.setdefault(key, vector["case"]) == vector["case"], (key, owner[key], vector["case"])
    assert len(owner) > 100


def test_vectors_are_complete():
    """The copy in tests/vectors holds every case the README lists."""
    readme = (VECTORS / "README.md").read_text()
    listed = set(re.findall(r"^\| (\w+) \| (2|2,3) \|", readme, re.M))
    assert len(listed) == 110
    for case, protos in listed:
        for proto in map(int, protos.split(",")):
            assert (proto, case) in BY_KEY, (proto, case)
    assert len(ALL_VECTORS) == 215


def test_shape_comparator():
    """The comparator lets numbers and ids differ, and nothing else."""
    assert_same_shape(b"%2\r\n$2\r\nid\r\n:7\r\n$4\r\nname\r\n$1\r\na\r\n",
                      b"%2\r\n$2\r\nid\r\n:123\r\n$4\r\nname\r\n$2\r\nbb\r\n")
    assert_same_shape(b"=8\r\ntxt:abcd\r\n", b"=5\r\ntxt:x\r\n")
    for want, got in [
        (b":1\r\n", b"$1\r\n1\r\n"),                      # type
        (b"*2\r\n:1\r\n:2\r\n", b"*1\r\n:1\r\n"),          # array length
        (b"%1\r\n$2\r\nid\r\n:1\r\n", b"%1\r\n$2\r\nix\r\n:1\r\n"),  # map key
        (b"$-1\r\n", b"$0\r\n\r\n"),                       # null
        (b"+OK\r\n", b"+KO\r\n"),                          # status word
        (b"-ERR a\r\n", b"-ERR b\r\n"),                    # error text
        (b"=5\r\ntxt:x\r\n", b"=5\r\nmkd:x\r\n"),          # verbatim format
    ]:
        with pytest.raises(AssertionError):
            assert_same_shape(want, got)


def test_reply_parser_waits_for_complete_replies():
    whole = b"*2\r\n%1\r\n+k\r\n$3\r\nabc\r\n_\r\n"
    for cut in range(len(whole)):
        with pytest.raises(Incomplete):
            parse_reply(whole[:cut])
    reply, end = parse_reply(whole + b":1\r\n")
    assert end == len(whole)
    assert reply == Reply("*", (Reply("%", ((Reply("+", b"k"), Reply("$", b"abc")),)),
                                Reply("_", None)))
