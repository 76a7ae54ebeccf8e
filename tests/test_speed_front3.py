"""The front's cheaper steps (issue 22, round three, second pass): what each cut must keep.

The parser's batch, the connection's one pass over a read's commands and dispatch's
common case are faster paths to the same results: these tests check the results (what
is left buffered, the replies, the counters) against the careful paths and the real
server. Speed itself is measured by scripts/stages.py and scripts/bench.py, never here.
"""

from __future__ import annotations

import pytest

from ezra.resp import BATCH_PARTS, RequestReader


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
