"""The front's cheaper steps (issue 22, round three, second pass): what each cut must keep.

The parser's batch, the connection's one pass over a read's commands and dispatch's
common case are faster paths to the same results: these tests check the results (what
is left buffered, the replies, the counters) against the careful paths and the real
server. Speed itself is measured by scripts/stages.py and scripts/bench.py, never here.
"""

from __future__ import annotations

import pytest

from ezra.protocol.request_reader import BATCH_PARTS, RequestReader


def multibulk(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


XADD = multibulk(b"XADD", b"q", b"*", b"payload", b"x" * 200)


def drain(reader: RequestReader) -> list:
    found = []
    while (command := reader.next_command()) is not None:
        found.append(command)
    return found


@pytest.mark.parametrize("cut", [1, 7, len(XADD) - 3, len(XADD) - 1])
def test_a_batch_ending_in_half_a_frame_keeps_exactly_that_half(cut):
    """The batch's end is counted from the window's end: the bytes left are the partial frame's."""
    reader = RequestReader(max_bulk_len=1024)
    reader.feed(XADD * 5 + XADD[:cut])
    assert reader.next_command() is not None
    assert reader.buffered() == cut, "the batch took the 5 whole frames, and only them"
    assert len(drain(reader)) == 4
    reader.feed(XADD[cut:])
    assert drain(reader) == [[b"XADD", b"q", b"*", b"payload", b"x" * 200]]
    assert reader.buffered() == 0


def test_a_batch_ended_by_an_inline_command_leaves_it_whole():
    reader = RequestReader(max_bulk_len=1024)
    reader.feed(XADD * 3 + b"PING hello\r\n" + XADD)
    assert drain(reader) == [[b"XADD", b"q", b"*", b"payload", b"x" * 200]] * 3 + [[b"PING", b"hello"]] + \
        [[b"XADD", b"q", b"*", b"payload", b"x" * 200]]
    assert reader.buffered() == 0


def test_a_batch_cut_by_the_split_limit_resumes_at_the_next_frame():
    """More CRLFs than BATCH_PARTS: the unsplit rest is counted as one part, and the next batch starts at a frame."""
    frames = [multibulk(b"XACK", b"q", b"g", b"%d-0" % i) for i in range(BATCH_PARTS // 7 + 50)]
    reader = RequestReader(max_bulk_len=1024)
    reader.feed(b"".join(frames))
    assert drain(reader) == [[b"XACK", b"q", b"g", b"%d-0" % i] for i in range(len(frames))]
    assert reader.buffered() == 0


@pytest.mark.parametrize("where", [0, 3, 40])
def test_an_argument_that_looks_like_frames_is_one_argument(where):
    """The batch walks frames by their `*N` first, and checks the arguments' `$<len>` after: an
    argument holding CRLFs and what looks like a frame must fail that check, and stay one argument."""
    sneaky = b"v\r\n*1\r\n$4\r\nPING"
    commands = [[b"XADD", b"q", b"*", b"n", b"%d" % i] for i in range(50)]
    commands.insert(where, [b"XADD", b"q", b"*", b"n", sneaky])
    reader = RequestReader(max_bulk_len=1024)
    reader.feed(b"".join(multibulk(*command) for command in commands))
    assert drain(reader) == commands
    assert reader.buffered() == 0



class CountingCounts(dict):
    """request_reader.FRAME_COUNTS, counting the batch's steps: one lookup per frame it walks."""

    lookups = 0

    def get(self, key, default=None):
        CountingCounts.lookups += 1
        return super().get(key, default)


def test_frames_that_fail_the_batch_do_not_make_it_walk_the_window_again_and_again(monkeypatch):
    """A window that fails the one-go check is read frame by frame until a window passes whole. Without
    that, every look-alike frame made the batch walk the rest of the window first: 200 frames, half of
    them built so, took 30,245 steps (quadratic) at 7fab414; 766 now."""
    import ezra.protocol.request_reader as request_reader

    monkeypatch.setattr(request_reader, "FRAME_COUNTS", CountingCounts(request_reader.FRAME_COUNTS))
    CountingCounts.lookups = 0
    sneaky = multibulk(b"XADD", b"q", b"*", b"n", b"v\r\n*1\r\n$4\r\nPING")
    plain = multibulk(b"XACK", b"q", b"g", b"1-1")
    reader = RequestReader(max_bulk_len=1024)
    reader.feed((sneaky + plain) * 100)
    commands = drain(reader)
    assert len(commands) == 200 and commands[0][4] == b"v\r\n*1\r\n$4\r\nPING"
    assert CountingCounts.lookups < 10 * len(commands), CountingCounts.lookups


# ---------------------------------------------------------------- the connection's one pass over a read


def test_a_pipeline_stops_at_quit_in_the_same_read(ezra_factory):
    """The read's parsed commands are run from one list: QUIT still ends it, nothing after it runs."""
    from support import RespConnection

    server = ezra_factory()
    conn = RespConnection(server.port)
    pushes = b"".join(multibulk(b"XADD", b"q", b"*", b"n", b"%d" % i) for i in range(5))
    conn.send(pushes + multibulk(b"QUIT") + pushes)
    replies = [conn.read_reply() for _ in range(6)]
    assert all(reply.startswith(b"$") for reply in replies[:5]), replies
    assert replies[5] == b"+OK\r\n"
    assert conn.closed_by_server()
    assert server.client().xlen("q") == 5


def test_hello_mid_pipeline_switches_the_replies_after_it(ezra_factory):
    """Each reply is encoded in the protocol of its command's moment, in one read of many commands."""
    from support import RespConnection, parse_reply

    server = ezra_factory()
    conn = RespConnection(server.port)
    conn.send(multibulk(b"XADD", b"q", b"*", b"n", b"1") + multibulk(b"XPENDING", b"q", b"g")
              + multibulk(b"HELLO", b"3") + multibulk(b"XPENDING", b"q", b"g") + multibulk(b"PING"))
    pushed, pending2, hello, pending3, pong = (conn.read_reply() for _ in range(5))
    assert pushed.startswith(b"$")
    assert pending2.startswith(b"*4\r\n:0\r\n") and b"_\r\n" not in pending2, "RESP2 nulls before HELLO"
    assert parse_reply(hello)[0].kind == "%", "HELLO 3 answers in RESP3 already"
    assert pending3 == b"*4\r\n:0\r\n_\r\n_\r\n_\r\n", "RESP3 nulls after it"
    assert pong == b"+PONG\r\n"


def test_every_command_of_a_pipeline_is_counted(ezra_factory):
    """INFO's total_commands_processed counts each command of a pipelined read, the INFO itself included."""
    server = ezra_factory()
    client = server.client()
    before = client.info("stats")["total_commands_processed"]
    pipe = client.pipeline(transaction=False)
    for i in range(120):
        pipe.xadd("q", {"n": str(i)})
    pipe.info("stats")
    *ids, info = pipe.execute()
    assert len(ids) == 120
    assert info["total_commands_processed"] - before == 120 + 1, "the pushes and this INFO (the first counted itself)"


# ---------------------------------------------------------------- dispatch's common case, run inlined


@pytest.fixture
def probe_command():
    """A command of the test's own in the table (removed after): its handler is the test's to set."""
    from ezra.commands import COMMANDS

    behaviour = {}

    def handler(session, args):
        return behaviour["run"](args)

    COMMANDS[b"FRONT3PROBE"] = (handler, -1, "front3probe")
    yield behaviour
    del COMMANDS[b"FRONT3PROBE"]


def a_session():
    import tempfile

    from ezra.config import Settings
    from ezra.front.session import ServerState, Session

    return Session(ServerState(None, Settings(data_dir=tempfile.mkdtemp())), "127.0.0.1:1", None)


def test_the_fast_path_answers_a_handlers_bug_as_an_internal_error_and_logs_it(probe_command):
    from loguru import logger

    from ezra.commands import dispatch
    from ezra.protocol.resp import ErrorReply

    def bug(args):
        raise ZeroDivisionError("a handler's bug")

    probe_command["run"] = bug
    logged = []
    sink = logger.add(lambda message: logged.append(message), level="ERROR")
    try:
        reply = dispatch(a_session(), [b"FRONT3PROBE", b"x"])
    finally:
        logger.remove(sink)
    assert isinstance(reply, ErrorReply) and "internal error" in reply.message.lower(), reply
    assert len(logged) == 1 and "FRONT3PROBE" in logged[0] and "ZeroDivisionError" in logged[0]


def test_the_fast_path_returns_a_handlers_error_without_its_traceback(probe_command):
    from ezra.commands import dispatch
    from ezra.protocol.resp import ErrorReply

    def refuse(args):
        raise ErrorReply("ERR refused on purpose")

    probe_command["run"] = refuse
    session = a_session()
    reply = dispatch(session, [b"FRONT3PROBE"])
    assert isinstance(reply, ErrorReply) and reply.message == "ERR refused on purpose"
    assert reply.__traceback__ is None, "a traceback would keep the command's arguments alive"
    assert session.state.total_commands == 1
    probe_command["run"] = lambda args: b"ok"
    assert dispatch(session, [b"front3probe", b"a", b"b"]) == b"ok", "a name in lower case takes the same path"
    assert session.state.total_commands == 2


# ---------------------------------------------------------------- replies written in place


def reference_encode(value, resp3: bool) -> bytes:
    """RESP as the protocol's text spells it, one call per value: what encode's in-place paths must equal."""
    from ezra.protocol.resp import PairsMap

    if isinstance(value, bytes):
        return b"$%d\r\n%s\r\n" % (len(value), value)
    if isinstance(value, int):
        return b":%d\r\n" % value
    if value is None:
        return b"_\r\n" if resp3 else b"$-1\r\n"
    if isinstance(value, list):
        return b"*%d\r\n" % len(value) + b"".join(reference_encode(item, resp3) for item in value)
    assert isinstance(value, PairsMap)
    if resp3:
        return b"%%%d\r\n" % len(value) + b"".join(
            reference_encode(k, resp3) + reference_encode(v, resp3) for k, v in value.items())
    return b"*%d\r\n" % len(value) + b"".join(
        b"*2\r\n" + reference_encode(k, resp3) + reference_encode(v, resp3) for k, v in value.items())


def test_claim_shaped_replies_are_written_byte_for_byte():
    """XREADGROUP's reply {queue: [[id, [field, value...]]...]}, with keys, ids and lists on both
    sides of the 1,024-long prefix tables, in RESP2 and RESP3."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from ezra.protocol.resp import PairsMap, encode

    sizes = st.sampled_from([0, 1, 5, 1023, 1024, 1500])
    leaf = st.one_of(sizes.map(lambda n: b"v" * n), st.integers(-5, 10**12), st.none())
    entry = st.lists(st.one_of(leaf, st.lists(leaf, max_size=6)), max_size=4)
    reply = st.dictionaries(sizes.map(lambda n: b"q" * max(n, 1)), st.lists(entry, max_size=4), max_size=3)

    @settings(max_examples=300, deadline=None)
    @given(reply, st.sampled_from([2, 3]))
    def check(value, proto):
        value = PairsMap(value)
        assert encode(value, proto) == reference_encode(value, proto == 3)
        assert encode([value], proto) == reference_encode([value], proto == 3)

    check()
    long_entry = [b"1-1", [b"f"] * 1030]
    assert encode([long_entry] * 1030, 2) == reference_encode([long_entry] * 1030, False)
