"""ezra/lifecycle.py without a server: the attempts rule, ids, range bounds, dead views."""

from __future__ import annotations

import pytest

from ezra import errors
from ezra.errors import CommandError
from ezra.lifecycle import AVAILABLE, DEAD, FAIL, FATAL, SILENT, after_failure, lease_deadline, split_queue
from ezra.protocol.stream_ids import ABOVE_ALL, MAX_ID_PART, new_id, parse_id, parse_range_bound, push_id

MAX = MAX_ID_PART


def error_of(call, *args) -> str:
    with pytest.raises(CommandError) as raised:
        call(*args)
    return raised.value.message


# ---------------------------------------------------------------- after_failure

@pytest.mark.parametrize("attempts, mode, outcome", [
    # FAIL: the attempt counts; dead once the task has had its max attempts (3 here).
    (1, FAIL, (AVAILABLE, 1)),
    (2, FAIL, (AVAILABLE, 2)),
    (3, FAIL, (DEAD, 3)),
    (4, FAIL, (DEAD, 4)),
    # SILENT: the attempt is given back, never dead, never below 0.
    (1, SILENT, (AVAILABLE, 0)),
    (3, SILENT, (AVAILABLE, 2)),
    (4, SILENT, (AVAILABLE, 3)),
    (0, SILENT, (AVAILABLE, 0)),
    # FATAL: dead at once, attempts kept.
    (1, FATAL, (DEAD, 1)),
    (3, FATAL, (DEAD, 3)),
])
def test_after_failure(attempts, mode, outcome):
    assert after_failure(attempts, 3, mode) == outcome


def test_after_failure_defaults_to_fail():
    assert after_failure(2, 3) == (AVAILABLE, 2)
    assert after_failure(1, 1) == (DEAD, 1)


def test_lease_deadline():
    assert lease_deadline(1_000, 30) == 31_000
    assert lease_deadline(1_000, 0.25) == 1_250


# ---------------------------------------------------------------- new_id

def xadd_id(arg: bytes, last, now):
    """The id XADD gives a push asking for `arg`: read once (push_id), then made (new_id)."""
    return new_id(push_id(arg), last, now)


def test_star_takes_the_clock_when_it_is_ahead():
    assert xadd_id(b"*", (5, 7), now=6) == (6, 0)
    assert xadd_id(b"*", (0, 0), now=1_700_000_000_000) == (1_700_000_000_000, 0)


@pytest.mark.parametrize("now", [5, 4, 0])
def test_star_with_the_clock_equal_or_behind_takes_the_next_seq(now):
    assert xadd_id(b"*", (5, 7), now) == (5, 8)


def test_star_carries_into_ms_when_seq_is_exhausted():
    assert xadd_id(b"*", (5, MAX), now=5) == (6, 0)


def test_star_after_the_last_possible_id():
    assert error_of(xadd_id, b"*", (MAX, MAX), 0) == (
        "ERR The stream has exhausted the last possible ID, unable to add more items")


@pytest.mark.parametrize("requested, last, expected", [
    (b"6-*", (5, 7), (6, 0)),
    (b"5-*", (5, 7), (5, 8)),
    (b"5-*", (0, 0), (5, 0)),
    (b"0-*", (0, 0), (0, 1)),
])
def test_ms_star(requested, last, expected):
    assert xadd_id(requested, last, now=1) == expected


def test_ms_star_below_the_last_id():
    assert error_of(xadd_id, b"4-*", (5, 7), 100) == errors.ID_TOO_SMALL.message


def test_explicit_ids():
    assert xadd_id(b"5-8", (5, 7), now=0) == (5, 8)
    assert xadd_id(b"6-0", (5, 7), now=0) == (6, 0)
    assert xadd_id(b"9", (5, 7), now=0) == (9, 0)  # a missing seq is 0
    assert xadd_id(b"1-1", (0, 0), now=0) == (1, 1)


@pytest.mark.parametrize("requested", [b"5-7", b"5-6", b"4-9", b"5", b"0-1"])
def test_explicit_id_equal_or_smaller(requested):
    assert error_of(xadd_id, requested, (5, 7), 0) == (
        "ERR The ID specified in XADD is equal or smaller than the target stream top item")


@pytest.mark.parametrize("requested", [b"0-0", b"0"])
def test_explicit_id_zero(requested):
    assert error_of(xadd_id, requested, (0, 0), 0) == "ERR The ID specified in XADD must be greater than 0-0"


@pytest.mark.parametrize("requested", [
    b"abc", b"", b"-", b"1-", b"-1", b"1-x", b"1-2-3", b"1 ", b"1_0", b"0x1", b"1.5", b"x-*", b"-*",
    b"*-1", str(MAX + 1).encode(),  # "+1" and " 1" are ids to Redis (string2ull): test_integers_unit
])
def test_garbage_ids(requested):
    assert error_of(xadd_id, requested, (0, 0), 0) == (
        "ERR Invalid stream ID specified as stream command argument")


def test_parse_id():
    assert parse_id(b"5-3") == (5, 3)
    assert parse_id(b"5") == (5, 0)
    assert parse_id(b"5", missing_seq=9) == (5, 9)
    assert parse_id(b"%d-%d" % (MAX, MAX)) == (MAX, MAX)


# ---------------------------------------------------------------- parse_range_bound

@pytest.mark.parametrize("arg, is_start, bound", [
    (b"-", True, (0, 0)),
    (b"-", False, (0, 0)),
    (b"+", True, (MAX, MAX)),
    (b"+", False, (MAX, MAX)),
    (b"5-3", True, (5, 3)),
    (b"5-3", False, (5, 3)),
    (b"5", True, (5, 0)),        # a start without seq is the first id of that ms
    (b"5", False, (5, MAX)),     # an end without seq is the last id of that ms
    (b"(5-3", True, (5, 4)),     # exclusive start: the next id
    (b"(5-3", False, (5, 2)),    # exclusive end: the previous id
    (b"(5-0", False, (4, MAX)),
    (b"(5-%d" % MAX, True, (6, 0)),
    (b"(5", True, (5, 1)),       # as Redis: (5 means after 5-0
    (b"(5", False, (5, MAX)),    # 5-(2**64-2) in Redis's id space: EZRA's last id of ms 5
    (b"18446744073709551615-18446744073709551615", False, (MAX, MAX)),  # Redis's largest id
    (b"18446744073709551615", False, (MAX, MAX)),
    (b"(18446744073709551615", False, (MAX, MAX)),
    (b"(18446744073709551615-18446744073709551615", False, (MAX, MAX)),
    (b"18446744073709551615", True, ABOVE_ALL),  # above every id EZRA stores: an empty range
    (b"5-18446744073709551615", True, (6, 0)),
])
def test_parse_range_bound(arg, is_start, bound):
    assert parse_range_bound(arg, is_start) == bound


def test_exclusive_bounds_at_the_ends_of_the_id_space():
    assert parse_range_bound(b"(%d-%d" % (MAX, MAX), True) == ABOVE_ALL  # Redis's ids go on to 2**64-1
    last = b"(18446744073709551615-18446744073709551615"
    assert error_of(parse_range_bound, last, True) == "ERR invalid start ID for the interval"
    assert error_of(parse_range_bound, b"(0-0", False) == "ERR invalid end ID for the interval"


@pytest.mark.parametrize("arg", [b"(", b"(-", b"(+", b"x", b"(x", b"1-x", b""])
def test_bad_range_bounds(arg):
    assert error_of(parse_range_bound, arg, True) == errors.INVALID_ID.message


# ---------------------------------------------------------------- split_queue

@pytest.mark.parametrize("name, split", [
    (b"q::dead", (b"q", True)),
    (b"q", (b"q", False)),
    (b"::dead", (b"::dead", False)),  # nothing before the suffix: a queue of that name
    (b"a::dead::dead", (b"a::dead", True)),
    (b"q::deadx", (b"q::deadx", False)),
    (b"q:dead", (b"q:dead", False)),
])
def test_split_queue(name, split):
    assert split_queue(name) == split
