"""The batched path's shortcuts (issue 22) give what the general code gives.

Each shortcut does in one C step what a loop did per task: a run of ids, a claim's slice of the
available order, a run of pushes put on it, an XACK's many ids, a field and its value stored, a
read of one whole frame parsed from the read itself.
Each is checked here against the general code it stands in for, edge cases included.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ezra import errors
from ezra.protocol import stream_ids
from ezra.broker.available import AvailableOrder
from ezra.protocol.resp import ErrorReply, bulk_array, read_bulk_array
from ezra.protocol.request_reader import BulkTooLarge, ProtocolError, RequestReader
from ezra.protocol.stream_ids import MAX_ID_PART


def one_by_one(args):
    """parse_id of each, or the error the first bad one raises."""
    try:
        return [stream_ids.parse_id(arg) for arg in args]
    except ErrorReply as exc:
        return type(exc), exc.message


def at_once(args):
    try:
        return stream_ids.parse_ids(args)
    except ErrorReply as exc:
        return type(exc), exc.message


@pytest.mark.parametrize("args", [
    [b"1-0", b"2-5", b"1796319258949-17"],
    [b"05-3", b"1-2", b"3-4"],                        # a leading zero: parse_id takes it
    [b"1" * 18 + b"-" + b"9" * 18, b"1-1", b"2-2"],   # the largest the match takes
    [b"1" * 19 + b"-0", b"1-1", b"2-2"],              # 19 digits: Redis's rules, one by one
    [b"9" * 20 + b"-0", b"1-1", b"2-2"],              # past 2**63: the id error
    [b"1-2 3-4", b"5-6", b"7-8"],                     # a space inside one argument
    [b"1", b"2-3", b"4-5"],                           # no seq
    [b"1-", b"2-3", b"4-5"], [b"-1", b"2-3", b"4-5"], [b"a-b", b"1-1", b"2-2"], [b"1-1", b"", b"2-2"],
    [b"+1-1", b"2-2", b"3-3"], [b" 1-1", b"2-2", b"3-3"],
])
def test_an_xack_of_many_ids_reads_each_as_parse_id(args):
    assert at_once(args) == one_by_one(args)


@given(st.lists(st.from_regex(rb"\A[0-9 +-]{0,22}\Z"), min_size=1, max_size=12))
def test_parse_ids_is_parse_id_of_each(args):
    assert at_once(args) == one_by_one(args)


@pytest.mark.parametrize("last, now, n", [
    ((0, 0), 5, 3), ((5, 0), 5, 3), ((5, 7), 4, 50), ((9, MAX_ID_PART - 3), 9, 3), ((9, MAX_ID_PART - 3), 9, 4),
    ((9, MAX_ID_PART), 9, 2),
])
def test_a_run_of_new_ids_is_new_id_of_each(last, now, n):
    expected, previous = [], last
    for _ in range(n):
        try:
            previous = stream_ids.new_id(None, previous, now)
        except errors.CommandError:
            expected = None  # past the largest seq: the run falls back to new_id of each
            break
        expected.append(previous)
    run = stream_ids.new_ids(n, last, now)
    if run is None:  # declined only where the seqs would run past their largest in last's ms
        assert now <= last[0] and last[1] + n > MAX_ID_PART
    else:
        ms, seqs = run
        assert [(ms, seq) for seq in seqs] == expected


def order_with(tail, returns=(), taken=0, complete=True):
    order = AvailableOrder(tail, complete)
    for rowid in returns:
        order.add(rowid)
    for _ in range(taken):
        order.take_one()
    return order


def drained(order):
    out = []
    while (rowid := order.take_one()) is not None:
        out.append(rowid)
    return out


@pytest.mark.parametrize("tail, returns, taken, pushed", [
    ([], [], 0, range(1, 4)), ([1, 2, 3], [], 0, range(4, 9)), ([1, 2, 3], [], 3, range(4, 6)),
    ([5, 9], [], 0, range(7, 10)),        # below the tail's last (a stale entry above): one by one
    ([5, 9], [2], 0, range(10, 12)), ([], [], 0, range(0)), ([1, 2], [], 0, [8, 4, 6]),
])
def test_a_run_of_pushes_joins_the_order_as_each_push_would(tail, returns, taken, pushed):
    bulk, each = order_with(tail, returns, taken), order_with(tail, returns, taken)
    bulk.add_pushed(pushed)
    for rowid in pushed:
        each.add(rowid)
    assert drained(bulk) == drained(each)


@pytest.mark.parametrize("tail, returns, taken, n", [
    ([1, 2, 3, 4], [], 0, 2), ([1, 2, 3, 4], [], 1, 10), ([5, 6, 7], [2, 6], 0, 4), ([], [], 0, 3),
    (list(range(1, 10_000)), [], 5000, 50),  # past COMPACT_AFTER: the tail is cut after the slice
])
def test_a_claims_slice_takes_what_take_one_would(tail, returns, taken, n):
    sliced, each = order_with(tail, returns, taken), order_with(tail, returns, taken)
    expected = [rowid for rowid in (each.take_one() for _ in range(n)) if rowid is not None]
    assert sliced.take(n) == expected
    assert drained(sliced) == drained(each)


@pytest.mark.parametrize("items", [[b"f", b"v"], [b"", b""], [b"job", b"x" * 5000], [b"a", b"1", b"b", b"2"], [b"x"]])
def test_a_field_and_its_value_are_stored_as_any_fields(items):
    assert read_bulk_array(bulk_array(items)) == items
    general = b"*%d\r\n" % len(items) + b"".join(b"$%d\r\n%s\r\n" % (len(item), item) for item in items)
    assert bulk_array(items) == general


def test_a_workers_repeated_claim_is_read_once_and_claims_as_the_first(tmp_path):
    """XREADGROUP as a worker repeats it is read once per connection (Session.last_claim): each
    repeat claims the next task as a fresh read would, a changed argument is read anew (and an
    invalid one refused), and a claim that is not the plain shape is never remembered."""
    from ezra.broker import Broker
    from ezra.commands import dispatch, resolved
    from ezra.config import Settings
    from ezra.protocol.resp import NULL_ARRAY, ErrorReply, WrittenMap
    from ezra.front.session import ServerState, Session
    from ezra.storage import open_database

    settings = Settings(data_dir=str(tmp_path), durability="normal")
    broker = Broker(open_database(str(tmp_path / "data")), settings)
    front = SimpleNamespace(wait=lambda event, seconds: event.wait(seconds), flush=lambda: None)
    session = Session(ServerState(broker, settings), "test:1", front)

    def send(*words):
        try:
            return resolved(dispatch(session, [word.encode() for word in words]))
        except ErrorReply as exc:
            return exc

    def claimed(reply):
        assert type(reply) is WrittenMap, reply
        return reply[0][1]  # the entries, written

    claim = ("XREADGROUP", "GROUP", "g", "w1", "COUNT", "1", "BLOCK", "10", "STREAMS", "jobs", ">")
    try:
        send("XGROUP", "CREATE", "jobs", "g", "0", "MKSTREAM")
        ids = [send("XADD", "jobs", "*", "n", str(n)) for n in range(4)]
        first = claimed(send(*claim))
        assert session.last_claim is not None and session.last_claim[1][0].worker == b"w1"
        second = claimed(send(*claim))  # the remembered reading
        assert ids[0] in first and ids[1] in second and first != second
        assert session.workers == {b"w1"}
        other = claimed(send(*claim[:3], "w2", *claim[4:]))  # another worker: read anew
        assert ids[2] in other and session.last_claim[1][0].worker == b"w2"
        assert session.workers == {b"w1", b"w2"}
        refused = send(*claim[:5], "-x", *claim[6:])
        assert isinstance(refused, ErrorReply) and session.last_claim[1][0].worker == b"w2"
        noack = ("XREADGROUP", "GROUP", "g", "w3", "COUNT", "1", "NOACK", "STREAMS", "jobs", ">")
        assert ids[3] in claimed(send(*noack))
        assert session.last_claim[1][0].worker == b"w2"  # NOACK is not the remembered shape
        assert send(*claim[:3], "w2", *claim[4:6], *claim[8:]) is NULL_ARRAY  # no BLOCK, nothing left
    finally:
        broker.stop()
        broker.db.close()


@pytest.mark.parametrize("rows", [
    [(5, 0, bulk_array([b"f", b"v"]), 1)],
    [(1796319258949, 17, bulk_array([b"a", b"1", b"b", b"x" * 300]), 2)],
    [(7, 3, '["f", "v"]', 1)],  # a row stored as JSON (before schema 9, schedules, hand edits)
    [(5, 0, bulk_array([b"f", b"v"]), 1), (5, 1, bulk_array([b"g", b"w"]), 1)],
    # many rows, written by one format in C until a row stored as JSON sends them the long way
    [(5, 0, bulk_array([b"f", b"v"]), 1), (5, 1, '["g", "w"]', 1), (6, 0, bulk_array([b"h", b"x" * 200]), 1)],
    [(5, 0, '["f", "v"]', 1), (5, 1, bulk_array([b"g", b"w"]), 1)],
    [(5, n, bulk_array([b"n", b"%d" % n]), 1) for n in range(50)] + [(6, 0, '["last", "json"]', 1)],
])
def test_a_claims_entries_are_written_as_encode_writes_them(rows):
    """written_entries (one row by one format) is the RESP of entries(rows), in RESP2 and RESP3."""
    from ezra.commands.replies import entries, written_entries
    from ezra.protocol.resp import encode

    for proto in (2, 3):
        assert written_entries(rows) == encode(entries(rows), proto)


# -- a read that is one whole frame (RequestReader.take)

def frame(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(arg), arg) for arg in args)


ARGUMENTS = st.one_of(st.sampled_from([b"XADD", b"q", b"*", b"f", b"a\r\nb", b"", b"\r\n", b"x" * 40]),
                      st.binary(max_size=12))
# Whole frames, frames with a header that lies, inline commands and bytes of any kind
PIECES = st.one_of(st.lists(ARGUMENTS, min_size=1, max_size=5).map(lambda args: frame(*args)),
                   st.sampled_from([b"*2\r\n$1\r\na\r\n$3\r\nb\r\n", b"*1\r\n$9\r\nabc\r\n", b"PING x\r\n",
                                    b"*0\r\n", b"\r\n", b"*3\r\n", b"$2\r\n", b"*1\r\n$50\r\n"]),
                   st.binary(max_size=8))


def commands_read(reader, reads: list[bytes], take: bool) -> list:
    """Each read given to the reader as the connection gives it, and every command it yields, or
    how it failed: `take` (the connection's), or feed and next_commands (the general path)."""
    out = []
    try:
        for data in reads:
            if take:
                commands = reader.take(data)
                if commands and type(commands) is tuple:  # the promise the connection acts on: nothing more to read
                    assert not reader.mid_frame() and not reader.next_commands()
            else:
                reader.feed(data)
                commands = reader.next_commands()
            while commands:
                out.extend(commands)
                commands = reader.next_commands()
    except (ProtocolError, BulkTooLarge) as exc:
        out.append((type(exc), str(exc)))
    return out


def reader(max_bulk_len: int) -> RequestReader:
    return RequestReader(max_bulk_len=max_bulk_len, max_args=4, discard_limit=10 * max_bulk_len)


@settings(max_examples=400)
@given(st.lists(st.lists(PIECES, max_size=3).map(b"".join), max_size=6), st.sampled_from([20, 10_000]))
def test_a_read_taken_at_once_yields_what_feeding_it_yields(reads, max_bulk_len):
    assert commands_read(reader(max_bulk_len), reads, take=True) == commands_read(
        reader(max_bulk_len), reads, take=False)


@pytest.mark.parametrize("reads", [
    [frame(b"XADD", b"q", b"*", b"f", b"v")],                 # over max_args: the protocol error
    [frame(b"XADD", b"q" * 21)],                              # over the cap: read past and refused
    [frame(b"SET", b"a\r\nb")], [frame(b"PING") * 2],       # a CRLF inside; two frames
    [frame(b"PING")[:-1], b"\n" + frame(b"PING")],          # the rest of one, then one
    [b"*1\r\n$30\r\n" + b"y" * 10, b"y" * 20, b"\r\n", frame(b"PING")],  # read past over three reads
    [frame(b"PING", b"x" * 30)[:-1] + b"X", frame(b"PING")],  # no CRLF after the argument
])
def test_reads_at_the_edges_are_taken_as_fed(reads):
    assert commands_read(reader(20), reads, take=True) == commands_read(reader(20), reads, take=False)


def test_a_read_of_one_frame_is_taken_without_the_buffer_and_lets_the_last_one_go():
    reader = RequestReader(max_bulk_len=10_000)
    assert reader.take(frame(b"XADD", b"q", b"*", b"f", b"v")) == ([b"XADD", b"q", b"*", b"f", b"v"],)
    assert reader.held() == 0 and not reader.mid_frame()
    reader.take(frame(b"PING") + b"*1\r\n$4\r\nPI")  # half a frame: buffered, by the general path
    assert reader.mid_frame()
    assert reader.take(b"NG\r\n") == [[b"PING"]]
    assert reader.held() > 0  # parsed bytes, kept until the next read...
    assert reader.take(frame(b"PING")) == ([b"PING"],)
    assert reader.held() == 0  # ...which lets them go
