"""Issue 21 item 13: integers and stream ids are read exactly as redis-server reads them.

Every form below goes to EZRA and to the installed redis-server in the same command; an
error must be the same error, byte for byte, and a success a success (the replies of read
bounds are compared whole). Python's int() read "+5", "1_0", " 5" and "05" where Redis
refuses them; ids up to Redis's 2**64-1 were refused as read bounds.
"""

from __future__ import annotations

import re
import uuid

import pytest

from support_servers import EzraProcess, wait_until
from ezra.protocol.integers import to_int64, to_uint64
from ezra.protocol.request_reader import BulkTooLarge, ProtocolError, RequestReader
from support_resp import RespConnection, encode_command

# Integer forms: all but the last few are refused by Redis's string2ll.
INTEGER_FORMS = ["05", "-0", "+5", "1_0", " 5", "5 ", "9223372036854775808", "-9223372036854775809",
                 "0x10", "1e3", "1.0", "", "\xb2", "5\x00", "00", "5", "0", "-1", "9223372036854775807"]

# Each command with the integer under test as {n}; q has entries 1-1 and 2-1 and the group g.
INTEGER_COMMANDS = [
    "XRANGE {q} - + COUNT {n}",
    "XREVRANGE {q} + - COUNT {n}",
    "XREADGROUP GROUP g w COUNT {n} STREAMS {q} 0",
    "XREAD COUNT {n} STREAMS {q} 0",
    "XREAD COUNT 1 BLOCK {n} STREAMS {q} 0",  # entries are there: a valid BLOCK returns at once
    "XTRIM {q} MAXLEN ~ {n} LIMIT 0",
    "XTRIM {q} MAXLEN ~ 1000 LIMIT {n}",
    "XCLAIM {q} g w {n} 1-1",
    "XCLAIM {q} g w 0 1-1 IDLE {n}",
    "XCLAIM {q} g w 0 1-1 TIME {n}",
    "XCLAIM {q} g w 0 1-1 RETRYCOUNT {n}",
    "XAUTOCLAIM {q} g w {n} 0",
    "XAUTOCLAIM {q} g w 0 0 COUNT {n}",
    "XPENDING {q} g - + {n}",
    "XPENDING {q} g IDLE {n} - + 10",
    "XINFO STREAM {q} FULL COUNT {n}",
    "SELECT {n}",
    "HELLO {n}",
]
# Intended differences: (command, form) -> EZRA's reply, asserted with Redis's own.
DIFFERENCES = {
    ("SELECT {n}", "5"): b"-ERR EZRA has one database: only SELECT 0 is allowed\r\n",
    ("SELECT {n}", "9223372036854775807"): b"-ERR DB index is out of range\r\n",  # Redis: an int32 range text
}
# Forms whose success would change what the next commands see are not sent.
MUTATING = {("XTRIM {q} MAXLEN ~ {n} LIMIT 0", form) for form in ("0", "5", "00")}
SWITCHING = {"HELLO {n}"}  # a valid HELLO switches the protocol: only its refusals are compared

# Id forms as read bounds: Redis reads each part with string2ull (strtoull after string2ll),
# so "+1", " 1" and "05" are ids; the largest is 2**64-1 in each part.
MAX = "18446744073709551615"
ID_FORMS = ["+1", " 1", "05", "-0", "1 ", "0x1", "1_0", "1-", "-", "+", "(", "(-", "(+", "5--01",
            "+0001-+0001", MAX, f"{MAX}-{MAX}", f"({MAX}", f"({MAX}-{MAX}", "18446744073709551616",
            "9223372036854775807-9223372036854775807", "(9223372036854775807-9223372036854775807",
            "9223372036854775808", "(0-0", "(1", "1-18446744073709551615", "0" * 127 + "1", " " * 127 + "1"]
ID_COMMANDS = [
    "XRANGE {q} {id} +",
    "XRANGE {q} - {id}",
    "XREVRANGE {q} {id} -",
    "XREVRANGE {q} + {id}",
    "XPENDING {q} g {id} + 10",
    "XPENDING {q} g - {id} 10",
]


@pytest.fixture(scope="module")
def ezra_server(tmp_path_factory):
    server = EzraProcess(tmp_path_factory.mktemp("grammar") / "data").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def ezra_port(ezra_server):
    return ezra_server.port


def call(conn: RespConnection, command: str, **values) -> bytes:
    """One command, split at spaces before the values go in (a value may hold a space)."""
    words = [word.format(**values) for word in command.split(" ")]
    conn.send(encode_command(words))
    return conn.read_reply()


def prepare(conn: RespConnection, queue: str) -> None:
    for entry in ("1-1", "2-1"):
        assert call(conn, "XADD {q} {id} f v", q=queue, id=entry).startswith(b"$")
    assert call(conn, "XGROUP CREATE {q} g 0", q=queue).startswith(b"+OK")


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def both(request, ezra_port, redis_server_port):
    """A connection to each server, in the same protocol, and a fresh queue on both."""
    queue = f"grammar-{uuid.uuid4().hex[:8]}"
    conns = RespConnection(ezra_port, protocol=request.param), RespConnection(redis_server_port, protocol=request.param)
    for conn in conns:
        prepare(conn, queue)
    yield queue, conns
    for conn in conns:
        conn.close()


def test_every_integer_form_is_read_as_redis_reads_it(both):
    queue, (ezra, redis_server) = both
    mismatches = []
    for command in INTEGER_COMMANDS:
        for form in INTEGER_FORMS:
            if (command, form) in MUTATING:
                continue
            expected = call(redis_server, command, q=queue, n=form)
            if command in SWITCHING and not expected.startswith(b"-"):
                continue
            got = call(ezra, command, q=queue, n=form)
            if (command, form) in DIFFERENCES:
                assert got == DIFFERENCES[command, form] and got != expected, (command, form, expected)
                continue
            same = got == expected if expected.startswith(b"-") else not got.startswith(b"-")
            if not same:
                mismatches.append((command.format(q="q", n=form), expected[:80], got[:80]))
    assert not mismatches, "\n".join(map(repr, mismatches))


def test_every_id_form_as_a_read_bound_is_read_as_redis_reads_it(both):
    queue, (ezra, redis_server) = both
    call(ezra, "XREADGROUP GROUP g w STREAMS {q} >", q=queue)
    call(redis_server, "XREADGROUP GROUP g w STREAMS {q} >", q=queue)
    mismatches = []
    for command in ID_COMMANDS:
        for form in ID_FORMS:
            expected = call(redis_server, command, q=queue, id=form)
            got = call(ezra, command, q=queue, id=form)
            if command.startswith("XPENDING") and not expected.startswith(b"-"):
                # idle times differ: compare the ids of the pending entries
                expected, got = pending_ids(expected), pending_ids(got)
            if got != expected:
                mismatches.append((command.format(q="q", id=form), expected[:120], got[:120]))
    assert not mismatches, "\n".join(map(repr, mismatches))


def test_minid_reads_ids_as_redis_does(both):
    """XTRIM's MINID (a strict id: no '-' or '+'): the same refusals; what each server removes
    differs on purpose (EZRA trims done tasks only), so successes are compared as successes."""
    queue, (ezra, redis_server) = both
    mismatches = []
    for form in ID_FORMS + ["5-*", "*"]:
        expected = call(redis_server, "XTRIM {q} MINID ~ {id}", q=queue, id=form)
        got = call(ezra, "XTRIM {q} MINID ~ {id}", q=queue, id=form)
        if (got != expected) if expected.startswith(b"-") else got.startswith(b"-"):
            mismatches.append((form, expected[:120], got[:120]))
    assert not mismatches, "\n".join(map(repr, mismatches))


# In ascending order: each accepted one is the queue's last id for the next.
PUSH_IDS = ["+5-1", " 6", "07-0", "8-+1", "9 ", "1_0-1", "0x10", "-11", "12-", "+13-*", " 14-*", "15-01",
            "16-18446744073709551616", "0-0"]


def test_push_ids_are_read_as_redis_reads_them(both):
    queue, (ezra, redis_server) = both
    mismatches = []
    for form in PUSH_IDS:
        expected = call(redis_server, "XADD {q} {id} f v", q=queue, id=form)
        got = call(ezra, "XADD {q} {id} f v", q=queue, id=form)
        if got != expected:
            mismatches.append((form, expected[:120], got[:120]))
    assert not mismatches, "\n".join(map(repr, mismatches))


def pending_ids(reply: bytes) -> list[bytes]:
    return [line for line in reply.split(b"\r\n") if line[:1].isdigit() and b"-" in line]


def test_the_largest_redis_id_is_a_read_bound(both):
    """The issue's own commands: Redis returns the entries, EZRA said "Invalid stream ID"."""
    queue, (ezra, redis_server) = both
    for command in (f"XRANGE {{q}} - {MAX}-{MAX}", f"XREVRANGE {{q}} {MAX} -", f"XRANGE {{q}} - ({MAX}",
                    "XRANGE {q} - + COUNT 0", "XRANGE {q} - + COUNT -1", "XREVRANGE {q} + - COUNT -1"):
        expected = call(redis_server, command, q=queue)
        assert call(ezra, command, q=queue) == expected, command
    assert call(ezra, f"XRANGE {{q}} - {MAX}-{MAX}", q=queue).count(b"$1\r\nf\r\n") == 2  # both entries


def test_ezra_settings_read_integers_as_redis_does(ezra_port):
    """XCFGSET and XNACK have no Redis twin: they refuse what Redis's integer reader refuses."""
    conn = RespConnection(ezra_port, protocol=2)
    queue = f"grammar-{uuid.uuid4().hex[:8]}"
    for form in ("+5", "05", "1_0", " 5", "-0", "0x10"):
        assert call(conn, "XCFGSET {q} MAX-ATTEMPTS {n}", q=queue, n=form) == (
            b"-ERR value is not an integer or out of range\r\n"), form
        assert call(conn, "XCFGSET {q} IDMP-MAXSIZE {n}", q=queue, n=form) == (
            b"-ERR value is not an integer or out of range\r\n"), form
    for form in ("1_0", " 5", "5 "):
        assert call(conn, "XCFGSET {q} VISIBILITY-TIMEOUT {n}", q=queue, n=form) == (
            b"-ERR value is not a valid number of seconds\r\n"), form
    assert call(conn, "XCFGSET {q} MAX-ATTEMPTS 5", q=queue) == b"+OK\r\n"
    conn.close()


# ---------------------------------------------------------------- the readers alone

@pytest.mark.parametrize("text, value", [
    (b"0", 0), (b"5", 5), (b"-5", -5), (b"9223372036854775807", 2 ** 63 - 1),
    (b"-9223372036854775808", -2 ** 63),
])
def test_to_int64_reads_what_string2ll_reads(text, value):
    assert to_int64(text) == value


@pytest.mark.parametrize("text", [
    b"", b"-", b"05", b"00", b"-0", b"+5", b"1_0", b" 5", b"5 ", b"5\n", b"0x10", b"1e3", b"1.0",
    b"9223372036854775808", b"-9223372036854775809", b"\xd9\xa3", b"5\x00", b"1" * 5000,
])
def test_to_int64_refuses_what_string2ll_refuses(text):
    with pytest.raises(ValueError):
        to_int64(text)


@pytest.mark.parametrize("text, value", [
    (b"5", 5), (b"05", 5), (b"+5", 5), (b" 5", 5), (b"\t+05", 5), (b"-01", 2 ** 64 - 1), (b"-0", 0),
    (b"18446744073709551615", 2 ** 64 - 1), (b"5\x00junk", 5), (b"0" * 200 + b"7", 7),
])
def test_to_uint64_reads_what_string2ull_reads(text, value):
    assert to_uint64(text) == value


@pytest.mark.parametrize("text", [b"", b"-1", b"5 ", b"+", b" ", b"0x1", b"1_0", b"18446744073709551616",
                                  b"-18446744073709551616", b"1.5"])
def test_to_uint64_refuses_what_string2ull_refuses(text):
    with pytest.raises(ValueError):
        to_uint64(text)


# ---------------------------------------------------------------- item 14: arguments over --max-task-size

SMALL_LIMIT = 1000  # --max-task-size of the server below: an argument over 1000 + 64 KiB is read past


@pytest.fixture(scope="module")
def small_limit_server(tmp_path_factory):
    server = EzraProcess(tmp_path_factory.mktemp("small-limit") / "data", "--max-task-size", str(SMALL_LIMIT)).start()
    yield server
    server.stop()


def too_large(size: int, limit: int) -> bytes:
    return b"-ERR task too large: an argument of %d bytes, the limit is %d (--max-task-size)\r\n" % (size, limit)


@pytest.mark.parametrize("protocol", [2, 3], ids=["resp2", "resp3"])
def test_an_argument_over_the_cap_is_read_past_and_refused_clearly(small_limit_server, protocol):
    """Before: `-ERR Protocol error: invalid bulk length` and the connection closed, nothing logged."""
    conn = RespConnection(small_limit_server.port, protocol=protocol)
    queue = f"big-{uuid.uuid4().hex[:8]}"
    big = b"x" * 200_000
    frame = b"*5\r\n$4\r\nXADD\r\n$%d\r\n%s\r\n$1\r\n*\r\n$1\r\nf\r\n$%d\r\n%s\r\n" % (
        len(queue), queue.encode(), len(big), big)
    conn.send(frame + encode_command(["PING"]) + encode_command(["XLEN", queue]))
    assert conn.read_reply() == too_large(len(big), SMALL_LIMIT)
    assert conn.read_reply() == b"+PONG\r\n"  # the connection goes on, the next commands run
    assert conn.read_reply() == b":0\r\n"     # nothing was stored
    # just over the limit, within the slack: the task limit's own error, as before
    assert call(conn, "XADD {q} * f {v}", q=queue, v="y" * (SMALL_LIMIT + 1)).startswith(
        b"-ERR task too large: %d bytes in fields" % (SMALL_LIMIT + 2))  # f and its value
    # inside MULTI it aborts the EXEC, as any refused command does
    assert call(conn, "MULTI") == b"+OK\r\n"
    conn.send(frame)
    assert conn.read_reply() == too_large(len(big), SMALL_LIMIT)
    assert call(conn, "EXEC").startswith(b"-EXECABORT")
    conn.close()
    assert "refused a command from" in small_limit_server.log()


@pytest.mark.parametrize("protocol", [2, 3], ids=["resp2", "resp3"])
def test_an_argument_over_the_hard_cap_gets_a_clear_error_then_the_close(small_limit_server, protocol):
    """600 MB, over the 512 MB EZRA reads past: refused at its header, without reading it."""
    conn = RespConnection(small_limit_server.port, protocol=protocol)
    size = 600 * 1024 * 1024
    conn.send(b"*3\r\n$4\r\nXADD\r\n$1\r\nq\r\n$%d\r\nxxxx" % size)
    assert conn.read_reply() == (
        b"-ERR task too large: an argument of %d bytes, the limit is %d (--max-task-size); above %d bytes the "
        b"connection is closed\r\n" % (size, SMALL_LIMIT, 512 * 1024 * 1024))
    assert conn.closed_by_server()
    conn.close()
    wait_until(lambda: "closing client" in small_limit_server.log() and "bytes EZRA reads past" in
               small_limit_server.log(), message="the log line")


def peak_rss(pid: int) -> int:
    status = open(f"/proc/{pid}/status").read()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024


def test_a_100_mb_field_with_the_default_limit_is_read_past_without_being_kept(ezra_port, ezra_server):
    """The issue's 100 MB field (--max-task-size 1 MiB): the clear error, the connection kept,
    and the server's peak memory does not grow by the field (its bytes are never buffered)."""
    before = peak_rss(ezra_server.proc.pid)
    conn = RespConnection(ezra_port, timeout=120)
    size, chunk = 100 * 1024 * 1024, b"z" * (1024 * 1024)
    conn.send(b"*5\r\n$4\r\nXADD\r\n$5\r\nhuge1\r\n$1\r\n*\r\n$1\r\nf\r\n$%d\r\n" % size)
    for _ in range(size // len(chunk)):
        conn.send(chunk)
    conn.send(b"\r\n" + encode_command(["XLEN", "huge1"]))
    assert conn.read_reply() == too_large(size, 1024 * 1024)
    assert conn.read_reply() == b":0\r\n"
    conn.close()
    assert peak_rss(ezra_server.proc.pid) - before < 20 * 1024 * 1024  # measured: 0.3 MiB


@pytest.mark.parametrize("piece", [1, 7, 4096, 1 << 20])
def test_the_reader_reads_past_an_argument_however_it_arrives(piece):
    """RequestReader alone: fed in pieces of `piece` bytes, a frame with a 100 KB argument over a
    1 KB cap raises BulkTooLarge once it ends; nothing of it is kept; the next command follows."""
    reader = RequestReader(max_bulk_len=1024, discard_limit=1 << 20)
    data = (b"*3\r\n$4\r\nXADD\r\n$100000\r\n" + b"x" * 100_000 + b"\r\n$1\r\nq\r\n"
            + encode_command(["PING"]))
    outcomes = []
    for start in range(0, len(data), piece):
        reader.feed(data[start:start + piece])
        while True:
            try:
                command = reader.next_command()
            except BulkTooLarge as exc:
                outcomes.append(("too large", exc.size, exc.fatal))
                continue
            if command is None:
                break
            outcomes.append(command)
        assert reader.buffered() <= max(piece, 64), "bytes of the argument were kept"
    assert outcomes == [("too large", 100_000, False), [b"PING"]]


def test_the_reader_refuses_what_it_reads_past_without_its_crlf():
    reader = RequestReader(max_bulk_len=10, discard_limit=1000)
    reader.feed(b"*1\r\n$20\r\n" + b"x" * 20 + b"XX")
    with pytest.raises(ProtocolError, match="not terminated by CRLF"):
        reader.next_command()


def test_the_reader_closes_over_its_discard_limit_and_before_auth():
    reader = RequestReader(max_bulk_len=10, discard_limit=1000)
    reader.feed(b"*1\r\n$1001\r\n")
    with pytest.raises(BulkTooLarge) as raised:
        reader.next_command()
    assert raised.value.fatal and raised.value.size == 1001
    unauthenticated = RequestReader(max_bulk_len=10, unauthenticated=True)
    unauthenticated.feed(b"*1\r\n$11\r\n")
    with pytest.raises(ProtocolError, match="unauthenticated bulk length"):
        unauthenticated.next_command()
