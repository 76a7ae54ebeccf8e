"""RequestReader's batch path: a pipeline's frames parsed in one go, with every cap kept."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ezra.protocol.request_reader import BATCH_PARTS, BATCH_WINDOW, BulkTooLarge, ProtocolError, RequestReader


def multibulk(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


class StepByStepReader(RequestReader):
    """The reader with every fast path off: what the batch must agree with."""
    __slots__ = ()

    def _batch(self):
        return None

    def _whole_frame(self):
        return None


def read_all(reader: RequestReader, data: bytes, chunk: int) -> list:
    """Feed `data` in pieces of `chunk` bytes: the commands, BulkTooLarge sizes and the protocol error, in order."""
    found = []
    for start in range(0, len(data), chunk):
        reader.feed(data[start:start + chunk])
        while True:
            try:
                command = reader.next_command()
            except BulkTooLarge as exc:
                found.append(("too large", exc.size))
                if exc.fatal:
                    return found
                continue
            except ProtocolError as exc:
                found.append(("error", str(exc)))
                return found
            if command is None:
                break
            found.append(command)
    return found


def test_a_pipeline_is_parsed_in_one_go():
    commands = [[b"XADD", b"q", b"*", b"f", b"%d" % i] for i in range(50)]
    reader = RequestReader(max_bulk_len=1024)
    reader.feed(b"".join(multibulk(*command) for command in commands))
    assert reader.next_command() == commands[0]
    assert reader.buffered() == 0, "the other 49 wait parsed, their bytes released"
    assert [reader.next_command() for _ in range(49)] == commands[1:]
    assert reader.next_command() is None


@pytest.mark.parametrize("shift", [0, 1, 2, 5, 17, 30])
def test_frames_across_the_window_end_whole_and_byte_by_byte(shift):
    # Enough frames to pass the window, shifted so its end falls on every part of a frame.
    commands = [[b"XADD", b"q", b"*", b"f", b"x" * (shift + i % 7)] for i in range(BATCH_WINDOW // 30)]
    data = b"".join(multibulk(*command) for command in commands)
    assert len(data) > BATCH_WINDOW
    assert read_all(RequestReader(max_bulk_len=1024), data, len(data)) == commands
    assert read_all(RequestReader(max_bulk_len=1024), data[:3000], 1) == read_all(
        StepByStepReader(max_bulk_len=1024), data[:3000], 1)


@pytest.mark.parametrize("arguments", [BATCH_PARTS // 2 - 2, BATCH_PARTS // 2, BATCH_PARTS // 2 + 1])
def test_frames_across_the_split_limit(arguments):
    # The window is split into BATCH_PARTS pieces at most: a frame across that end waits for the next batch.
    commands = [[b"XADD"] + [b""] * arguments, [b"PING"], [b"ECHO", b"\r\n"], [b"PING"]]
    data = b"".join(multibulk(*command) for command in commands)
    assert read_all(RequestReader(max_bulk_len=1024, max_args=4096), data, len(data)) == commands


def test_a_bad_frame_mid_pipeline_answers_the_frames_before_it():
    data = multibulk(b"PING") + multibulk(b"ECHO", b"a") + b"*2\r\n$1\r\nx\r\n:1\r\n" + multibulk(b"PING")
    assert read_all(RequestReader(max_bulk_len=1024), data, len(data)) == [
        [b"PING"], [b"ECHO", b"a"], ("error", "Protocol error: expected '$', got ':'")]


def test_an_argument_over_the_cap_mid_pipeline_is_read_past():
    data = multibulk(b"PING") + multibulk(b"XADD", b"v" * 3000) + multibulk(b"ECHO", b"b")
    reader = RequestReader(max_bulk_len=1000, discard_limit=10_000)
    assert read_all(reader, data, len(data)) == [[b"PING"], ("too large", 3000), [b"ECHO", b"b"]]


def test_caps_lifted_by_auth_apply_to_the_frames_after_it():
    many = [b"x"] * 12
    data = multibulk(b"AUTH", b"pw") + multibulk(*many) + multibulk(b"ECHO", b"y" * 200)
    reader = RequestReader(max_bulk_len=100, max_args=10, unauthenticated=True)
    reader.feed(data)
    assert reader.next_command() == [b"AUTH", b"pw"]
    reader.lift_caps(max_bulk_len=1024, max_args=1024)
    assert reader.next_command() == many
    assert reader.next_command() == [b"ECHO", b"y" * 200]


def test_caps_still_hold_before_auth():
    data = multibulk(b"PING") + multibulk(*[b"x"] * 12)
    reader = RequestReader(max_bulk_len=100, max_args=10, unauthenticated=True)
    assert read_all(reader, data, len(data)) == [[b"PING"], ("error", "Protocol error: unauthenticated multibulk length")]


ARGUMENT = st.one_of(st.binary(max_size=24), st.sampled_from([b"\r\n", b"$3\r\nabc", b"*1\r\n", b"$", b"\r"]))


@settings(max_examples=300, deadline=None)
@given(commands=st.lists(st.lists(ARGUMENT, min_size=1, max_size=7), min_size=1, max_size=12),
       tail=st.sampled_from([b"", b"*", b"*2\r\n$1\r\nx", b"*0\r\n", b"PING\r\n", b"*1\r\n$99\r\n"]),
       chunk=st.integers(1, 64))
def test_batch_agrees_with_the_step_by_step_reader(commands, tail, chunk):
    # Small caps, so frames over them (too many arguments, one too long) come mid-batch.
    data = b"".join(multibulk(*command) for command in commands) + tail
    caps = {"max_bulk_len": 16, "max_args": 5, "discard_limit": 20}
    for size in (len(data), chunk):
        assert read_all(RequestReader(**caps), data, size) == read_all(StepByStepReader(**caps), data, size)
