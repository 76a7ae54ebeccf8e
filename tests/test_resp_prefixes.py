"""resp.encode's header tables: the same bytes as formatting each header, at and past the tables' end."""

from __future__ import annotations

import pytest

from ezra.protocol.resp import PREFIXED, PairsMap, encode


def bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


@pytest.mark.parametrize("size", [0, 1, PREFIXED - 1, PREFIXED, PREFIXED + 1])
def test_bulks_and_arrays_around_the_tables_end(size):
    value = b"v" * size
    assert encode(value, 2) == bulk(value)
    assert encode([value, [value]], 3) == b"*2\r\n" + bulk(value) + b"*1\r\n" + bulk(value)
    items = [b"x"] * size
    assert encode(items, 2) == b"*%d\r\n" % size + bulk(b"x") * size


def test_a_claims_reply_in_both_protocols():
    reply = PairsMap({b"q": [[b"1-0", [b"f", b"v"]]]})
    entry = b"*1\r\n*2\r\n" + bulk(b"1-0") + b"*2\r\n" + bulk(b"f") + bulk(b"v")
    assert encode(reply, 3) == b"%1\r\n" + bulk(b"q") + entry
    assert encode(reply, 2) == b"*1\r\n*2\r\n" + bulk(b"q") + entry
