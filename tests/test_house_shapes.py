"""Issue 25, items 3 and 4: reply shapes are built in commands/ only, from the broker's plain values,
and the wire bytes stay Redis's (the RESP2 and RESP3 bytes of the reshaped replies, literally)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import redis

from ezra.broker import Broker
from ezra.config import Settings
from ezra.protocol.resp import PairsMap
from ezra.storage import open_database
from ezra.protocol.task_fields import stored
from support_resp import RespConnection
from support_broker import push_one, claim_committed


@pytest.fixture
def broker(tmp_path):
    b = Broker(open_database(str(tmp_path / "data")), Settings(data_dir=str(tmp_path)))
    yield b
    b.stop()
    b.db.close()


def plain(value) -> bool:
    """Built of Python's own types only: no reply type of resp.py anywhere inside."""
    if isinstance(value, PairsMap):
        return False
    if isinstance(value, dict):
        return type(value) is dict and all(plain(k) and plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value) in (list, tuple) and all(plain(item) for item in value)
    return value is None or type(value) in (bytes, str, int, float, bool)


def test_the_broker_answers_plain_rows(broker):
    first = push_one(broker, b"q", stored([b"f", b"v"]))
    push_one(broker, b"q", stored([b"f", b"w"]))
    claimed = claim_committed(broker, [b"q"], b"w1", 1, False)
    assert plain(claimed) and list(claimed) == [b"q"]
    (row,) = claimed[b"q"]
    assert b"%d-%d" % row[:2] == first and row[2] == stored([b"f", b"v"])  # the task row as storage reads it
    cursor, taken = broker.leases.autoclaim(b"q", b"w2", 0, (0, 0), 10, False).wait()
    assert cursor == (0, 0) and [task[:2] for task in taken] == [row[:2]] and plain(taken)
    assert broker.leases.take_over(b"q", b"w2", 0, [row[:2]], None, None, None, False, True).wait() == [row[:2]]
    idle = claim_committed(broker, [b"q"], b"w3", 10, False, claim_idle=0)
    assert plain(idle) and [task[3:] for task in idle[b"q"]][1:] == [(0, 0)]  # the new task: idle 0, 0 deliveries
    looked = broker.views.look([(b"q", (b"q", False), (0, 0))], 10).wait()
    assert plain(looked) and len(looked[b"q"]) == 2
    assert plain(broker.tasks.range(b"q", False, (0, 0), (2 ** 63 - 1, 0), 10, False).wait())
    info = broker.admin.stream_info(b"q", 10).wait()  # a dataclass of the broker's own, of plain values
    assert plain(dataclasses.asdict(info)) and info.last_id == info.last[:2] and not hasattr(info, "__getitem__")


def as_resp3(conn: RespConnection) -> None:
    assert conn.call(["HELLO", "3"]).startswith(b"%")


ENTRY = b"*2\r\n$3\r\n1-1\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n"


@pytest.mark.parametrize("resp3", [False, True], ids=["resp2", "resp3"])
def test_the_reshaped_replies_keep_their_bytes(shared_server, queue, resp3):
    conn = RespConnection(shared_server.port)
    try:
        if resp3:
            as_resp3(conn)
        assert conn.call(["XADD", queue, "1-1", "f", "v"]) == b"$3\r\n1-1\r\n"
        name = queue.encode()
        key = b"$%d\r\n%s\r\n" % (len(name), name)
        read = conn.call(["XREADGROUP", "GROUP", "g", "w1", "COUNT", "1", "BLOCK", "10", "STREAMS", queue, ">"])
        head = b"%1\r\n" if resp3 else b"*1\r\n*2\r\n"
        assert read == head + key + b"*1\r\n" + ENTRY
        assert conn.call(["XRANGE", queue, "-", "+"]) == b"*1\r\n" + ENTRY
        assert conn.call(["XREAD", "STREAMS", queue, "0"]) == head + key + b"*1\r\n" + ENTRY
        assert conn.call(["XREADGROUP", "GROUP", "g", "w1", "STREAMS", queue, "0"]) == head + key + b"*1\r\n" + ENTRY
        assert conn.call(["XCLAIM", queue, "g", "w2", "0", "1-1", "JUSTID"]) == b"*1\r\n$3\r\n1-1\r\n"
        assert conn.call(["XAUTOCLAIM", queue, "g", "w1", "0", "0"]) == b"*3\r\n$3\r\n0-0\r\n*1\r\n" + ENTRY + b"*0\r\n"
        claim = conn.call(["XREADGROUP", "GROUP", "g", "w2", "CLAIM", "0", "STREAMS", queue, ">"])
        assert claim.startswith(head + key + b"*1\r\n*4\r\n$3\r\n1-1\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n:")
        assert claim.endswith(b"\r\n:3\r\n")  # delivered 3 times before: XREADGROUP > and 0, XAUTOCLAIM
    finally:
        conn.close()


def test_lifecycle_is_the_state_machine_alone():
    """Issue 25 item 4: the id grammar (parse, format, compare, '*' '-' '+' '$' '>') is stream_ids.py's."""
    from ezra import lifecycle
    from ezra.protocol import stream_ids

    grammar = ("format_id", "parse_id", "parse_range_bound", "parse_after_id", "new_id", "push_id",
               "previous_id", "MAX_ID_PART", "ABOVE_ALL", "xread_id", "xreadgroup_id", "SINCE_NOW")
    assert [name for name in grammar if hasattr(lifecycle, name)] == []
    assert all(hasattr(stream_ids, name) for name in grammar)


SUBCOMMAND_SYNTAX = "unknown subcommand or wrong number of arguments for '{}'. Try XGROUP HELP."
NEEDS_KEY = "The XGROUP subcommand requires the key to exist"
# What Redis 7.0.15 answers (recorded), checked in its order: the options, the key, then the id.
XGROUP_REFUSED = [
    (["CREATE", "{q}", "g", "bad", "MKSTREAM"], "Invalid stream ID"),
    (["CREATE", "{q}", "g", "$", "MKSTREAM", "BOGUS"], SUBCOMMAND_SYNTAX.format("CREATE")),
    (["CREATE", "{q}", "g", "$", "MKSTREAM", "ENTRIESREAD"], SUBCOMMAND_SYNTAX.format("CREATE")),
    (["CREATE", "{q}", "g", "$", "MKSTREAM", "ENTRIESREAD", "x"], "value is not an integer or out of range"),
    (["CREATE", "{q}", "g", "$", "MKSTREAM", "ENTRIESREAD", "-5"], "value for ENTRIESREAD must be positive or -1"),
    (["CREATE", "{q}", "g", "bad", "MKSTREAM", "ENTRIESREAD", "x"], "value is not an integer or out of range"),
    (["CREATE", "{q}", "g", "-", "MKSTREAM"], "Invalid stream ID"),
    (["CREATE", "{q}", "g", "bad"], NEEDS_KEY),
    (["SETID", "{q}", "g", "0"], NEEDS_KEY),
    (["SETID", "{q}", "g", "bad"], NEEDS_KEY),
    (["SETID", "{q}", "g", "$", "BOGUS"], SUBCOMMAND_SYNTAX.format("SETID")),
    (["SETID", "{q}", "g", "0", "ENTRIESREAD", "x"], "value is not an integer or out of range"),
]


@pytest.mark.parametrize("words, error", XGROUP_REFUSED, ids=[" ".join(w) for w, _ in XGROUP_REFUSED])
def test_xgroup_checks_every_argument_before_it_creates_the_queue(r, queue, words, error):
    """Issue 25 item 4: XGROUP CREATE ... MKSTREAM created the queue, then ignored a bad id or option."""
    with pytest.raises(redis.ResponseError, match=re.escape(error)):
        r.execute_command("XGROUP", *[word.replace("{q}", queue) for word in words])
    assert r.exists(queue) == 0


def test_xgroup_takes_what_redis_takes(r, queue):
    assert r.execute_command("XGROUP", "CREATE", queue, "g", "$", "ENTRIESREAD", "3", "MKSTREAM") in (b"OK", "OK", True)
    assert r.execute_command("XGROUP", "SETID", queue, "g", "0", "ENTRIESREAD", "-1") in (b"OK", "OK", True)
    with pytest.raises(redis.ResponseError, match="Invalid stream ID"):
        r.execute_command("XGROUP", "SETID", queue, "g", "bad")
    with pytest.raises(redis.ResponseError, match="Invalid stream ID"):
        r.execute_command("XGROUP", "CREATE", queue, "g", "bad")  # the key exists: the id's error


def drawn_moves() -> set[tuple]:
    """The (from, to) pairs of lifecycle.py's transition table, read from its docstring."""
    from ezra import lifecycle

    lines = lifecycle.__doc__.split("    transition   from", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    targets: dict[str, list] = {}
    pairs = set()

    def states(text: str) -> list:
        return [lifecycle.GONE if word == "-" else word for word in re.split(r"\s*\|\s*", text.strip())]

    for line in lines:
        name, froms, to, *_ = re.split(r"\s{2,}", line.strip())
        to = to.split("(", 1)[0].strip()
        targets[name] = targets[to[2:]] if to.startswith("= ") else states(to)
        pairs |= {(a, b) for a in states(froms) for b in targets[name]}
    assert set(a for pair in pairs for a in pair) <= {*lifecycle.COUNTED, lifecycle.GONE}, pairs
    return pairs


def test_the_moves_of_the_counts_are_the_drawing():
    """Issue 25 item 5: lifecycle.MOVES (what QueueState.move allows) is the docstring's table;
    in-flight to in-flight (renew, take over, claim own) changes no count, so it is no move."""
    from ezra import lifecycle

    assert drawn_moves() - {(lifecycle.IN_FLIGHT, lifecycle.IN_FLIGHT)} == set(lifecycle.MOVES)


def test_a_move_not_drawn_is_refused_and_counts_nothing():
    from ezra.broker.queues import Queues
    from ezra.errors import StateGuardFailed
    from ezra.lifecycle import AVAILABLE, DONE, GONE

    queue = Queues(None).new(b"q")
    queue.move(GONE, AVAILABLE, 3)
    with pytest.raises(StateGuardFailed, match="done -> available"):
        queue.move(DONE, AVAILABLE)
    assert queue.counts[AVAILABLE] == 3 and queue.counts[DONE] == 0


def test_counts_change_only_through_queue_state_move():
    """No `counts[state] += n` by hand in the broker: QueueState.move is the one place (and
    `unmove`, its undo for a rolled-back batch)."""
    from pathlib import Path

    broker = Path(__file__).resolve().parent.parent / "ezra" / "broker"
    by_hand = [f"{path.name}:{n}" for path in sorted(broker.glob("*.py"))
               for n, line in enumerate(path.read_text().splitlines(), 1)
               if re.search(r"counts\[[^\]]+\]\s*[-+]=", line) and "def move" not in line]
    assert by_hand == ["queues.py:%d" % n for n in core_move_lines()]


def core_move_lines() -> list[int]:
    from pathlib import Path

    core = (Path(__file__).resolve().parent.parent / "ezra" / "broker" / "queues.py").read_text().splitlines()
    lines = []
    for verb in ("def move(", "def unmove("):
        start = next(n for n, line in enumerate(core, 1) if verb in line)
        lines += [n for n, line in enumerate(core, 1) if n > start and re.search(r"counts\[[^\]]+\]\s*[-+]=", line)][:2]
    return lines


def test_one_integer_reader_for_the_arguments():
    """Issue 25 item 4: commands, options, trimming and settings read integers with integers.to_int
    alone (client.py reads replies with to_int64; resp.py's frame lengths are the protocol's)."""
    from pathlib import Path

    package = Path(__file__).resolve().parent.parent / "ezra"
    readers = sorted(str(path.relative_to(package)) for path in package.rglob("*.py")
                     if re.search(r"\bto_int64\b|\bint\(arg", path.read_text())
                     and path.parent.name in ("commands", "settings") and path.name in (
                         "args.py", "queue.py", "ops.py", "connection.py", "keys.py", "schedule.py",
                         "options.py", "trimming.py", "queue_settings.py", "schedule_settings.py"))
    assert readers == []
