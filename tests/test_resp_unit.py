"""ezra/protocol/request_reader.py and ezra/protocol/resp.py without a server: the request reader and the reply encoder."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ezra.protocol.request_reader import BULK_HEADERS, ProtocolError, RequestReader
from ezra.protocol.resp import (NULL_ARRAY, OK, ErrorReply, Mapped, PairsMap, SimpleString, Verbatim, encode,
                                encode_in_pieces, is_long)
from reliability import report

CASES = {"round_trip": 0, "random_frames": 0}  # property-test examples run: the README's fuzz figures
LONG_RUN = os.environ.get("EZRA_RESP_FUZZ_EXAMPLES")  # examples per property test, for a long run


def examples(default: int) -> int:
    return int(LONG_RUN) if LONG_RUN else default


@pytest.fixture(scope="module", autouse=True)
def report_cases():
    yield
    if all(CASES.values()):  # both property tests ran
        report("resp_unit_fuzz", round_trip_cases=CASES["round_trip"], random_frame_cases=CASES["random_frames"])


def multibulk(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def commands_in(data: bytes, reader: RequestReader | None = None) -> list[list[bytes]]:
    """Every complete command in `data`, fed at once."""
    reader = reader or RequestReader(max_bulk_len=1024)
    reader.feed(data)
    found = []
    while (command := reader.next_command()) is not None:
        found.append(command)
    return found


def first_error(data: bytes, **caps) -> str:
    """The message of the ProtocolError that `data` must cause."""
    reader = RequestReader(**{"max_bulk_len": 1024, **caps})
    reader.feed(data)
    with pytest.raises(ProtocolError) as raised:
        while reader.next_command() is not None:
            pass
    return str(raised.value)


# ---------------------------------------------------------------- multibulk

def test_multibulk_fed_one_byte_at_a_time():
    data = multibulk(b"XADD", b"q", b"*", b"field", b"va\r\nlue")
    reader = RequestReader(max_bulk_len=1024)
    for byte in data[:-1]:
        reader.feed(bytes([byte]))
        assert reader.next_command() is None
    reader.feed(data[-1:])
    assert reader.next_command() == [b"XADD", b"q", b"*", b"field", b"va\r\nlue"]
    assert reader.next_command() is None
    assert reader.buffered() == 0


TWO_COMMANDS = multibulk(b"ECHO", b"hello world") + multibulk(b"PING")


@pytest.mark.parametrize("cut", range(len(TWO_COMMANDS) + 1))
def test_multibulk_split_anywhere(cut):
    reader = RequestReader(max_bulk_len=1024)
    found = commands_in(TWO_COMMANDS[:cut], reader) + commands_in(TWO_COMMANDS[cut:], reader)
    assert found == [[b"ECHO", b"hello world"], [b"PING"]]


def test_pipelined_commands_come_out_in_order():
    data = multibulk(b"PING") + multibulk(b"ECHO", b"a") + b"PING x\r\n" + multibulk(b"XLEN", b"q")
    assert commands_in(data) == [[b"PING"], [b"ECHO", b"a"], [b"PING", b"x"], [b"XLEN", b"q"]]


def test_empty_and_binary_arguments():
    assert commands_in(multibulk(b"ECHO", b"")) == [[b"ECHO", b""]]
    assert commands_in(multibulk(b"ECHO", bytes(range(256)))) == [[b"ECHO", bytes(range(256))]]


def test_star_zero_and_star_minus_one_are_ignored():
    assert commands_in(b"*0\r\n*-1\r\n" + multibulk(b"PING")) == [[b"PING"]]


def test_buffered_counts_unparsed_bytes():
    reader = RequestReader(max_bulk_len=1024)
    reader.feed(b"*1\r\n$4\r\nPI")
    assert reader.next_command() is None
    assert reader.buffered() == len(b"$4\r\nPI")  # the count is parsed, the bulk waits


# ---------------------------------------------------------------- inline

@pytest.mark.parametrize("line, command", [
    (b"PING\r\n", [b"PING"]),
    (b"PING\n", [b"PING"]),
    (b"  ECHO \t hi  \r\n", [b"ECHO", b"hi"]),
    (b'SET "a b" \'c d\'\r\n', [b"SET", b"a b", b"c d"]),
    (b'ECHO ""\r\n', [b"ECHO", b""]),
    (b'ECHO "a\\nb\\rc\\td"\r\n', [b"ECHO", b"a\nb\rc\td"]),
    (b'ECHO "say \\"hi\\" \\\\o/"\r\n', [b"ECHO", b'say "hi" \\o/']),
    (b"ECHO 'a\\nb'\r\n", [b"ECHO", b"a\\nb"]),  # no escapes in single quotes
    (b'ECHO "a\\qb"\r\n', [b"ECHO", b"aqb"]),  # an unknown escape is the character itself
])
def test_inline_commands(line, command):
    assert commands_in(line) == [command]


# As Redis 7.0.15 splits them (sdssplitargs; checked with ECHO over nc): \xHH, \b and
# \a in double quotes, \' in single quotes, and \0 is a plain '0'.
@pytest.mark.parametrize("line, command", [
    (b'ECHO "\\x41\\x7a"\r\n', [b"ECHO", b"Az"]),
    (b'ECHO "a\\0b"\r\n', [b"ECHO", b"a0b"]),
    (b'ECHO "\\b\\a"\r\n', [b"ECHO", b"\x08\x07"]),
    (b"ECHO 'it\\'s'\r\n", [b"ECHO", b"it's"]),
])
def test_inline_escapes_as_redis(line, command):
    assert commands_in(line) == [command]


def test_blank_lines_are_ignored():
    assert commands_in(b"\r\n\n   \r\nPING\r\n\r\n") == [[b"PING"]]


def test_inline_line_waits_for_its_newline():
    reader = RequestReader(max_bulk_len=1024)
    reader.feed(b"ECHO hel")
    assert reader.next_command() is None
    reader.feed(b"lo\r\n")
    assert reader.next_command() == [b"ECHO", b"hello"]


@pytest.mark.parametrize("line", [b'ECHO "abc\r\n', b"ECHO 'abc\r\n", b'ECHO "a"b\r\n', b"ECHO 'a'b\r\n"])
def test_unbalanced_quotes(line):
    assert first_error(line) == "Protocol error: unbalanced quotes in request"


def test_inline_line_too_long():
    assert first_error(b"PING " + b"x" * 100, max_inline_len=64) == "Protocol error: too big inline request"


# ---------------------------------------------------------------- caps and broken frames

def test_count_above_max_args_fails_before_the_arguments():
    assert commands_in(b"*4\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n$1\r\nd\r\n",
                       RequestReader(max_bulk_len=10, max_args=4)) == [[b"a", b"b", b"c", b"d"]]
    assert first_error(b"*5\r\n", max_args=4) == "Protocol error: invalid multibulk length"
    assert first_error(b"*2147483647\r\n") == "Protocol error: invalid multibulk length"


def test_bulk_above_max_bulk_len_fails_before_the_payload():
    assert commands_in(multibulk(b"x" * 10), RequestReader(max_bulk_len=10)) == [[b"x" * 10]]
    assert first_error(b"*1\r\n$11\r\n", max_bulk_len=10) == "Protocol error: invalid bulk length"
    assert first_error(b"*1\r\n$999999999999\r\n") == "Protocol error: invalid bulk length"


def test_a_length_line_that_never_ends_is_refused():
    assert first_error(b"*" + b"9" * 40) == "Protocol error: invalid multibulk length"
    assert first_error(b"*1\r\n$" + b"9" * 40) == "Protocol error: invalid bulk length"


@pytest.mark.parametrize("data, error", [
    (b"*x\r\n", "Protocol error: invalid multibulk length"),
    (b"*\r\n", "Protocol error: invalid multibulk length"),
    (b"*1\r\n$x\r\n", "Protocol error: invalid bulk length"),
    (b"*1\r\n$\r\n", "Protocol error: invalid bulk length"),
    (b"*1\r\n$-1\r\n", "Protocol error: invalid bulk length"),
    (b"*1\r\nPING\r\n", "Protocol error: expected '$', got 'P'"),
    (b"*1\r\n$3\r\nfooXY", "Protocol error: bulk string not terminated by CRLF"),
    (b"*2\r\n$3\r\nfoo\r\n$3\r\nbar\n\n", "Protocol error: bulk string not terminated by CRLF"),
])
def test_broken_frames(data, error):
    assert first_error(data) == error


# Redis parses lengths with string2ll: plain decimal digits only. Python's int()
# also takes a sign, surrounding spaces, underscores and leading zeros.
@pytest.mark.parametrize("data, error", [
    (b"*+1\r\n$4\r\nPING\r\n", "Protocol error: invalid multibulk length"),
    (b"* 1\r\n$4\r\nPING\r\n", "Protocol error: invalid multibulk length"),
    (b"*1 \r\n$4\r\nPING\r\n", "Protocol error: invalid multibulk length"),
    (b"*0_1\r\n$4\r\nPING\r\n", "Protocol error: invalid multibulk length"),
    (b"*01\r\n$4\r\nPING\r\n", "Protocol error: invalid multibulk length"),
    (b"*1\r\n$+4\r\nPING\r\n", "Protocol error: invalid bulk length"),
    (b"*1\r\n$ 4\r\nPING\r\n", "Protocol error: invalid bulk length"),
    (b"*1\r\n$0_4\r\nPING\r\n", "Protocol error: invalid bulk length"),
    (b"*1\r\n$04\r\nPING\r\n", "Protocol error: invalid bulk length"),
])
def test_lengths_are_plain_decimal_as_redis(data, error):
    assert first_error(data) == error


def test_bulk_waits_for_payload_and_crlf():
    reader = RequestReader(max_bulk_len=1024)
    reader.feed(b"*1\r\n$3\r\nfoo")
    assert reader.next_command() is None
    reader.feed(b"\r")
    assert reader.next_command() is None
    reader.feed(b"\n")
    assert reader.next_command() == [b"foo"]


# ---------------------------------------------------------------- property: round trip

@settings(max_examples=examples(300), deadline=None)
@given(commands=st.lists(st.lists(st.binary(max_size=40), min_size=1, max_size=6), min_size=1, max_size=5),
       chunk_sizes=st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=30))
def test_multibulk_round_trips_in_any_chunks(commands, chunk_sizes):
    CASES["round_trip"] += 1
    data = b"".join(multibulk(*command) for command in commands)
    reader = RequestReader(max_bulk_len=64)
    found, pos, i = [], 0, 0
    while pos < len(data):
        size = chunk_sizes[i % len(chunk_sizes)]
        reader.feed(data[pos:pos + size])
        pos, i = pos + size, i + 1
        while (command := reader.next_command()) is not None:
            found.append(command)
    assert found == commands
    assert reader.buffered() == 0


def parse_in_chunks(data: bytes, chunk: int) -> tuple[list, str | None]:
    """The commands found and the protocol error, if any; any other exception escapes."""
    reader = RequestReader(max_bulk_len=16, max_args=8, max_inline_len=64)
    found = []
    try:
        for start in range(0, len(data), chunk):
            reader.feed(data[start:start + chunk])
            while (command := reader.next_command()) is not None:
                found.append(command)
    except ProtocolError as exc:
        return found, str(exc)
    return found, None


RESP_TOKENS = st.sampled_from([b"*", b"$", b"\r\n", b"\n", b"\r", b"0", b"1", b"3", b"-1", b"17",
                               b"PING", b" ", b'"', b"'", b"\\", b"x", b"99999999999"])


@settings(max_examples=examples(500), deadline=None)
@given(data=st.lists(RESP_TOKENS, max_size=40).map(b"".join), chunk=st.integers(1, 8))
def test_any_bytes_give_commands_or_a_protocol_error(data, chunk):
    CASES["random_frames"] += 1
    whole, whole_error = parse_in_chunks(data, max(len(data), 1))
    pieces, pieces_error = parse_in_chunks(data, chunk)
    # Caps on lines still without their end depend on chunking (as in Redis); else the same.
    if whole_error is None and pieces_error is None:
        assert pieces == whole


# ---------------------------------------------------------------- the batch fast path

def test_arguments_holding_crlf_and_headers_parse_as_sent():
    # The fast path splits at CRLF: an argument that looks like more frame must not fool it.
    tricky = [b"XADD", b"q\r\n$1\r\nx", b"*", b"f", b"\r\n", b"$3\r\nabc\r\n", b"$", b"\r\n\r\n"]
    assert commands_in(multibulk(*tricky) + multibulk(b"PING")) == [tricky, [b"PING"]]


@pytest.mark.parametrize("size", [len(BULK_HEADERS) - 40, len(BULK_HEADERS) - 20, len(BULK_HEADERS),
                                  len(BULK_HEADERS) + 10])
def test_frames_around_the_batch_table_end(size):
    # Arguments the batch's header table covers, and ones just past it (_whole_frame's).
    commands = [[b"XADD", b"q", b"*", b"f", b"v" * (size - 30 - i)] for i in range(4)]
    data = b"".join(multibulk(*command) for command in commands)
    assert commands_in(data, RequestReader(max_bulk_len=2 * len(BULK_HEADERS))) == commands


def test_batch_keeps_the_caps():
    assert first_error(multibulk(b"XADD", b"v" * 100), max_bulk_len=50) == "Protocol error: invalid bulk length"
    assert first_error(multibulk(*[b"x"] * 12), max_args=10) == "Protocol error: invalid multibulk length"


class StepByStepReader(RequestReader):
    """The reader with both fast paths off."""
    __slots__ = ()

    def _batch(self):
        return None

    def _whole_frame(self):
        return None


def commands_or_error(reader: RequestReader, data: bytes) -> list[list[bytes]] | str:
    """The commands `reader` finds in `data`, or the first error's text."""
    reader.feed(data)
    found = []
    try:
        while (command := reader.next_command()) is not None:
            found.append(command)
    except ProtocolError as exc:
        return str(exc)
    return found


CRLF_HEAVY = st.lists(st.sampled_from([b"\r\n", b"$", b"*", b"1", b"0", b"\r", b"\n", b"x"]), max_size=12).map(b"".join)


@settings(max_examples=examples(300), deadline=None)
@given(commands=st.lists(st.lists(CRLF_HEAVY, min_size=1, max_size=5), min_size=1, max_size=4),
       tail=st.lists(RESP_TOKENS, max_size=6).map(b"".join))
def test_fast_paths_agree_with_the_step_by_step_reader(commands, tail):
    data = b"".join(multibulk(*command) for command in commands) + tail
    assert (commands_or_error(RequestReader(max_bulk_len=64), data)
            == commands_or_error(StepByStepReader(max_bulk_len=64), data))


# ---------------------------------------------------------------- encode

@pytest.mark.parametrize("value, resp2, resp3", [
    (b"hi", b"$2\r\nhi\r\n", b"$2\r\nhi\r\n"),
    (b"", b"$0\r\n\r\n", b"$0\r\n\r\n"),
    (b"a\r\nb", b"$4\r\na\r\nb\r\n", b"$4\r\na\r\nb\r\n"),
    ("h\u00e9", b"$3\r\nh\xc3\xa9\r\n", b"$3\r\nh\xc3\xa9\r\n"),
    (42, b":42\r\n", b":42\r\n"),
    (-7, b":-7\r\n", b":-7\r\n"),
    (0, b":0\r\n", b":0\r\n"),
    (True, b":1\r\n", b":1\r\n"),
    (None, b"$-1\r\n", b"_\r\n"),
    (NULL_ARRAY, b"*-1\r\n", b"_\r\n"),
    ([], b"*0\r\n", b"*0\r\n"),
    ([b"a", 1, None], b"*3\r\n$1\r\na\r\n:1\r\n$-1\r\n", b"*3\r\n$1\r\na\r\n:1\r\n_\r\n"),
    ((b"a", [b"b", []]), b"*2\r\n$1\r\na\r\n*2\r\n$1\r\nb\r\n*0\r\n",
     b"*2\r\n$1\r\na\r\n*2\r\n$1\r\nb\r\n*0\r\n"),
    ({}, b"*0\r\n", b"%0\r\n"),
    ({"proto": 3, "modules": []}, b"*4\r\n$5\r\nproto\r\n:3\r\n$7\r\nmodules\r\n*0\r\n",
     b"%2\r\n$5\r\nproto\r\n:3\r\n$7\r\nmodules\r\n*0\r\n"),
    (PairsMap({b"q": [[b"1-1", [b"f", b"v"]]]}),
     b"*1\r\n*2\r\n$1\r\nq\r\n*1\r\n*2\r\n$3\r\n1-1\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n",
     b"%1\r\n$1\r\nq\r\n*1\r\n*2\r\n$3\r\n1-1\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n"),
    (PairsMap({b"a": [], b"b": []}), b"*2\r\n*2\r\n$1\r\na\r\n*0\r\n*2\r\n$1\r\nb\r\n*0\r\n",
     b"%2\r\n$1\r\na\r\n*0\r\n$1\r\nb\r\n*0\r\n"),
    (SimpleString("PONG"), b"+PONG\r\n", b"+PONG\r\n"),
    (OK, b"+OK\r\n", b"+OK\r\n"),
    (Verbatim("# Server\r\nx:1\r\n"), b"$15\r\n# Server\r\nx:1\r\n\r\n",
     b"=19\r\ntxt:# Server\r\nx:1\r\n\r\n"),
    (ErrorReply("ERR no such key"), b"-ERR no such key\r\n", b"-ERR no such key\r\n"),
    (ErrorReply("ERR a\r\nb\nc"), b"-ERR a  b c\r\n", b"-ERR a  b c\r\n"),
    ([ErrorReply("ERR x"), OK], b"*2\r\n-ERR x\r\n+OK\r\n", b"*2\r\n-ERR x\r\n+OK\r\n"),
    ([0, None, None, NULL_ARRAY], b"*4\r\n:0\r\n$-1\r\n$-1\r\n*-1\r\n", b"*4\r\n:0\r\n_\r\n_\r\n_\r\n"),
])
def test_encode(value, resp2, resp3):
    assert encode(value, 2) == resp2
    assert encode(value, 3) == resp3


def test_encode_refuses_unknown_types():
    with pytest.raises(TypeError):
        encode(1.5, 2)


@pytest.mark.parametrize("proto", [2, 3])
def test_a_claim_of_one_queue_is_written_as_the_map_of_any_queues(proto):
    """encode's shortcut for XREADGROUP's usual reply (one queue's claims, commands/replies.py)
    writes what the general map of written pairs writes, and what a PairsMap of entries writes."""
    from ezra.commands.replies import claimed_reply
    from ezra.protocol.resp import _encode
    rows = [(1764612345678, 0, b"*2\r\n$1\r\nd\r\n$2\r\nhi\r\n", 1), (1764612345678, 1, b"*0\r\n", 2)]
    shortcut = encode(claimed_reply({b"jobs": rows}), proto)
    general = []
    _encode(claimed_reply({b"jobs": rows}), proto == 3, general)
    assert shortcut == b"".join(general)
    entries = PairsMap({b"jobs": [[b"1764612345678-0", [b"d", b"hi"]], [b"1764612345678-1", []]]})
    assert shortcut == encode(entries, proto)


@pytest.mark.parametrize("proto", [2, 3])
def test_a_long_array_in_pieces_is_its_encoding(proto):
    """The connection writes a long read's reply a piece at a time (letting others in between):
    joined, the pieces are the reply's bytes as encode writes them whole."""
    value = [[b"%d-0" % i, [b"f", b"v" * (i % 7), b"n", str(i).encode()]] for i in range(1234)]
    value += [None, 5, b"x" * 300, {b"k": [1, 2]}, SimpleString("OK"), [], NULL_ARRAY]
    for items in (1, 7, 500, 5000):
        assert b"".join(encode_in_pieces(value, proto, items)) == encode(value, proto)
    # Made while written (a long XRANGE's entries): the same bytes as the list made first, nested too
    rows = list(range(1234))
    make = lambda i: [b"%d-0" % i, [b"n", str(i).encode()]]  # noqa: E731
    made = [make(i) for i in rows]
    for items in (1, 500, 5000):
        assert b"".join(encode_in_pieces(Mapped(rows, make), proto, items)) == encode(made, proto)
    assert encode([Mapped(rows, make), 1], proto) == encode([made, 1], proto)
    # Maps with long arrays inside, at any depth (XINFO STREAM FULL, XSCHEDULE LIST)
    full = {"length": 3, "entries": Mapped(rows, make), "groups": [{"name": b"g", "pending": made}], "x": None}
    whole = encode({**full, "entries": made}, proto)
    assert is_long(full, 500) and is_long(Mapped([], make), 500) and not is_long({"entries": made[:10]}, 500)
    for items in (1, 7, 500, 5000):
        assert b"".join(encode_in_pieces(full, proto, items)) == whole
