"""ezra/settings/options.py, the one option parser the commands declare their options for."""

from __future__ import annotations

import pytest

from ezra import errors
from ezra.settings.options import STOP, Custom, Flag, Options, Refuse, Stop, Value, parse_options

READ_LIKE = Options(COUNT=Value(int), BLOCK=Value(int, default=-1), NOACK=Flag(), STREAMS=Stop())


def test_values_come_in_declared_order_with_defaults_and_the_index_where_they_stop():
    args = [b"XREADGROUP", b"block", b"5", b"NoAck", b"STREAMS", b"q", b">"]
    assert parse_options(args, 1, READ_LIKE) == ([None, 5, True], 4)
    assert parse_options([b"X", b"STREAMS"], 1, READ_LIKE) == ([None, -1, False], 1)


def test_a_repeated_option_keeps_its_last_value_as_in_redis():
    assert parse_options([b"COUNT", b"1", b"COUNT", b"7"], 0, READ_LIKE)[0][0] == 7


def test_an_unknown_word_or_a_word_missing_its_value_is_a_syntax_error():
    for args in ([b"LIMIT", b"1"], [b"COUNT"]):
        with pytest.raises(errors.CommandError) as caught:
            parse_options(args, 0, READ_LIKE)
        assert str(caught.value) == "ERR syntax error"


def test_a_converter_raises_the_commands_own_error():
    def positive(arg: bytes) -> int:
        if int(arg) <= 0:
            raise errors.CommandError("ERR COUNT must be > 0")
        return int(arg)

    with pytest.raises(errors.CommandError, match="COUNT must be > 0"):
        parse_options([b"COUNT", b"0"], 0, Options(COUNT=Value(positive)))


def test_stop_at_the_first_non_option_and_refused_and_custom_words():
    xadd_like = Options(NOMKSTREAM=Flag(), unknown=STOP)
    assert parse_options([b"NOMKSTREAM", b"*", b"f", b"v"], 0, xadd_like) == ([True], 1)

    refusing = Options(GROUP=Refuse(lambda: errors.CommandError("ERR use XREADGROUP")))
    with pytest.raises(errors.CommandError, match="use XREADGROUP"):
        parse_options([b"GROUP"], 0, refusing)

    def pairs(args, i, current):  # WORD a b: adds up over repeats
        return (current or []) + [(args[i + 1], args[i + 2])], i + 3

    summing = Options(SET=Custom(pairs, need=2))
    assert parse_options([b"SET", b"a", b"1", b"set", b"b", b"2"], 0, summing) == ([[(b"a", b"1"), (b"b", b"2")]], 6)


def test_words_that_are_not_python_names_come_in_a_dict():
    spec = Options({"VISIBILITY-TIMEOUT": Value(float)}, MAXLEN=Value(int), MINID=Value(int, default=0))
    assert parse_options([b"visibility-timeout", b"1.5", b"MAXLEN", b"3"], 0, spec)[0] == [1.5, 3, 0]
