"""The front's cheaper steps (issue 22, round three, third pass): each fast path gives what the
general path gives.

Counts and ids are read by a digits-only shortcut before Redis's rules (integers.py,
stream_ids.parse_id). These tests run both on the same texts and compare. Speed itself is
measured by scripts/stages.py, never here.
"""

from __future__ import annotations

import itertools

import pytest

from ezra import errors
from ezra.protocol.integers import string2ll, string2ull, to_int, to_int64, to_uint64
from ezra.protocol.stream_ids import MAX_ID_PART, parse_id, parse_id_parts


def outcome(read, text):
    """What `read(text)` gives: ('value', n), or the kind of error it raised."""
    try:
        return "value", read(text)
    except ValueError:
        return "ValueError", None
    except errors.CommandError as exc:
        return "error", str(exc)


def integer_texts() -> list[bytes]:
    """Texts on every side of the shortcut's edges: lengths 0-21, leading zeros, signs, spaces, NUL."""
    texts = {b"", b"0", b"00", b"-0", b"+0", b"01", b" 1", b"1 ", b"1\0", b"\x001", b"1_0", b"-", b"+",
             b"\xd9\xa3", b"\xc2\xb2", b"0x1", b"1e3", b"-1", b"-01", b"\t7", b"+7"}
    for size in range(1, 22):
        for first, rest in ((b"1", b"0"), (b"9", b"9"), (b"0", b"1"), (b"5", b"7")):
            digits = first + rest * (size - 1)
            texts.update({digits, b"-" + digits, b"+" + digits, b" " + digits})
    for value in (2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, 2 ** 64, 10 ** 18 - 1, 10 ** 18, 10 ** 19 - 1, 10 ** 19):
        texts.update({b"%d" % value, b"-%d" % value, b"0%d" % value})
    return sorted(texts)


@pytest.mark.parametrize("text", integer_texts())
def test_counts_read_by_the_shortcut_as_by_string2ll(text):
    assert outcome(to_int64, text) == outcome(string2ll, text)
    general = outcome(string2ll, text)
    expected = general if general[0] == "value" else ("error", str(errors.NOT_INTEGER()))
    assert outcome(to_int, text) == expected


@pytest.mark.parametrize("text", integer_texts())
def test_id_parts_read_by_the_shortcut_as_by_string2ull(text):
    assert outcome(to_uint64, text) == outcome(string2ull, text)


def general_parse_id(arg: bytes, missing_seq: int = 0):
    """parse_id without its shortcut: Redis's reading, then EZRA's storable range."""
    stream_id = parse_id_parts(arg, missing_seq)
    if stream_id[0] > MAX_ID_PART or stream_id[1] > MAX_ID_PART:
        raise errors.INVALID_ID
    return stream_id


def id_texts() -> list[bytes]:
    parts = [b"", b"0", b"00", b"7", b"1764612345678", b"+5", b" 5", b"-", b"*", b"5\0",
             b"9" * 18, b"9" * 19, b"1" + b"0" * 18, b"%d" % MAX_ID_PART, b"%d" % (MAX_ID_PART + 1),
             b"%d" % (2 ** 64 - 1), b"%d" % 2 ** 64, b"0" * 25 + b"1"]
    texts = set(parts)
    for ms, seq in itertools.product(parts, repeat=2):
        texts.add(ms + b"-" + seq)
    texts.update({b"1-2-3", b"1--2", b"-1-2", b"1-" + b"0" * 130, b"x-1", b"1-x"})
    return sorted(texts)


@pytest.mark.parametrize("missing_seq", [0, 2 ** 63 - 1])
def test_ids_read_by_the_shortcut_as_by_redis_rules(missing_seq):
    for text in id_texts():
        assert outcome(lambda t: parse_id(t, missing_seq), text) == \
            outcome(lambda t: general_parse_id(t, missing_seq), text), text


# ---------------------------------------------------------------- XREADGROUP's claims written from the rows

def test_claims_written_from_the_rows_are_read_replys_bytes():
    """claimed_reply (the claim's hot path) against read_reply then encode (the general path): queue
    names, ids, fields and counts on both sides of the 1,024-long prefix tables, RESP2 and RESP3, alone
    and inside a list (an EXEC's replies)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from ezra.commands.replies import claimed_reply, read_reply
    from ezra.protocol.resp import encode
    from ezra.storage.schema import encode_fields

    sizes = st.sampled_from([0, 1, 5, 1023, 1024, 1500])
    field = st.one_of(sizes.map(lambda n: b"v" * n), st.binary(max_size=8), st.text(max_size=4).map(str.encode))
    row = st.tuples(st.integers(0, 2 ** 63 - 1), st.integers(0, 2 ** 63 - 1),
                    st.lists(field, max_size=6).map(encode_fields), st.integers(0, 9))
    found = st.dictionaries(sizes.map(lambda n: b"q" * max(n, 1)), st.lists(row, max_size=4), max_size=3)

    @settings(max_examples=300, deadline=None)
    @given(found, st.sampled_from([2, 3]))
    def check(found, proto):
        assert encode(claimed_reply(found), proto) == encode(read_reply(found), proto)
        assert encode([claimed_reply(found), 1], proto) == encode([read_reply(found), 1], proto)

    check()
    many = {b"q": [(1, n, encode_fields([b"f"] * 1030), 0) for n in range(1030)]}
    for proto in (2, 3):
        assert encode(claimed_reply(many), proto) == encode(read_reply(many), proto)


@pytest.mark.parametrize("resp3", [False, True])
def test_a_claim_on_the_wire_alone_and_inside_exec(ezra_factory, resp3):
    """The real server: XREADGROUP's claim, as workers send it, and the same inside MULTI/EXEC."""
    from support import RespConnection

    server = ezra_factory()
    conn = RespConnection(server.port)
    if resp3:
        conn.call(["HELLO", "3"])
    for n in (1, 2):
        assert conn.call(["XADD", "q", f"5-{n}", "f", f"v{n}", "payload", "x" * 1100]) == b"$3\r\n5-%d\r\n" % n
    header = b"%1\r\n" if resp3 else b"*1\r\n*2\r\n"

    def claimed(n: int) -> bytes:
        return header + b"$1\r\nq\r\n*1\r\n*2\r\n$3\r\n5-%d\r\n*4\r\n$1\r\nf\r\n$2\r\nv%d\r\n$7\r\npayload\r\n" \
            b"$1100\r\n%s\r\n" % (n, n, b"x" * 1100)

    claim = ["XREADGROUP", "GROUP", "g", "w", "COUNT", "1", "BLOCK", "1000", "STREAMS", "q", ">"]
    assert conn.call(claim) == claimed(1)
    assert conn.call(["MULTI"]) == b"+OK\r\n"
    assert conn.call(claim) == b"+QUEUED\r\n"
    assert conn.call(["EXEC"]) == b"*1\r\n" + claimed(2)
    assert conn.call(claim[:6] + claim[8:]) == (b"_\r\n" if resp3 else b"*-1\r\n"), "nothing left, no BLOCK"


# ---------------------------------------------------------------- pipelined claims, counted by their bytes

def pipelined_claims(client, count: int, protocol: int) -> tuple[list, int]:
    """`count` XREADGROUPs '>' in one pipeline (as workers send them): the tasks claimed, commits made."""
    before = client.info("persistence")["commit_batches"]
    pipe = client.pipeline(transaction=False)
    for _ in range(count):
        pipe.xreadgroup("g", "w1", {"q": ">"}, count=1, block=1000)
    replies = pipe.execute()
    commits = client.info("persistence")["commit_batches"] - before - 1  # INFO's own read commits nothing
    claimed = []
    for reply in replies:
        claimed += reply[b"q"][0] if protocol == 3 else reply[0][1]
    return claimed, commits + 1


@pytest.mark.parametrize("protocol", [2, 3], ids=["resp2", "resp3"])
def test_pipelined_claims_of_small_tasks_share_one_commit(ezra_factory, protocol):
    """50 pipelined claims of small tasks: one commit, one send. They counted as a large read each
    (READS_PER_FLUSH = 8), so 50 made 7 commits (20: 3, on 244e3b2)."""
    server = ezra_factory()
    client = server.client(protocol)
    used = []
    # The reaper commits a pass of its own every 0.1 s, and on a loaded machine a read's 3 ms slice
    # (wall time) can run out mid-pipeline: up to ten tries, until one is a single commit.
    while len(used) < 10 and 1 not in used:
        pipe = client.pipeline(transaction=False)
        for i in range(20):
            pipe.xadd("q", {"n": str(i)})
        pushed = pipe.execute()
        claimed, commits = pipelined_claims(client, 20, protocol)
        used.append(commits)
        assert [task_id for task_id, _ in claimed] == pushed
        assert [fields[b"n"] for _, fields in claimed] == [str(i).encode() for i in range(20)]
        assert client.xack("q", "g", *pushed) == 20
    assert min(used) == 1, f"20 pipelined claims took {used} commits"


def test_pipelined_claims_of_large_tasks_are_still_sent_in_parts(ezra_factory):
    """What a connection holds before it sends stays bounded: claims of 800 KB tasks count as 0.8 of
    a read each, so 20 of them are sent (and committed) in 2 parts at least."""
    server = ezra_factory()
    client = server.client(2)
    payload = "x" * 800_000
    pipe = client.pipeline(transaction=False)
    for i in range(20):
        pipe.xadd("q", {"n": str(i), "payload": payload})
    pushed = pipe.execute()
    claimed, commits = pipelined_claims(client, 20, 2)
    assert [task_id for task_id, _ in claimed] == pushed
    assert all(fields[b"payload"] == payload.encode() for _, fields in claimed)
    assert commits >= 2, "READS_PER_FLUSH bounds claims by their bytes"


def test_a_blocked_claims_written_reply_counts_among_the_large_replies():
    """A blocked XREADGROUP answers with its claims written (not a Deferred): the connection counts
    it among the replies that may be large, as it counted the PairsMap before (READS_PER_FLUSH)."""
    from ezra.commands.replies import claimed_reply, read_reply
    from ezra.front.connection import LARGE
    from ezra.storage.schema import encode_fields

    found = {b"q": [(1, 2, encode_fields([b"f", b"v"]), 0)]}
    assert isinstance(read_reply(found), LARGE)
    assert isinstance(claimed_reply(found), LARGE)
