"""Command options, declared once per command and read by one parser.

A command declares the option words it accepts as an `Options` table next to it,
XREADGROUP's for instance:

    READ_OPTIONS = Options(COUNT=Value(to_int), BLOCK=Value(block_timeout), CLAIM=Value(claim_min_idle),
                           NOACK=Flag(), STREAMS=Stop())

and `parse_options(args, i, READ_OPTIONS)` reads args[i:] against it. It returns
(values, i): one value per declaration, in the order they are declared (each option's
default when it is not given), and the index where it stopped: the end of args, a
`Stop` word (not consumed), or, with `unknown=STOP`, the first word that is not an
option (XADD's id). Words are matched in any case; an option given twice keeps its
last value, as in Redis. Words declared with the same object share one value (MAXLEN,
MINID and LIMIT fill one TrimArgs), as does a declaration made with `shares=`.

An option needs `need` arguments after its word (a value: 1); a known word without
them counts as unknown, as the hand-written loops had it. An unknown word raises
`unknown(word)`: Redis's generic "ERR syntax error" unless the command has a text of its
own (HELLO, XCLAIM). Converters raise the command's own errors for bad values.

This module imports only errors: queue_settings.py (XCFGSET and the config file's
`queue` lines) uses it as the commands do.
"""

from __future__ import annotations

from .. import errors

# The kinds of option, as the parser branches on them (most common first).
VALUE, FLAG, CUSTOM, STOP_HERE, REFUSED = range(5)
STOP = None  # `unknown=STOP`: the options end at the first word that is not one (XADD's id)


def syntax_error(word: bytes) -> errors.CommandError:
    return errors.SYNTAX()


class Option:
    """One option's declaration: its kind, what reads it, the arguments it needs, its default."""

    __slots__ = ("kind", "how", "need", "default", "shares")

    def __init__(self, kind: int, how, need: int, default=None, shares: Option | None = None):
        self.kind, self.how, self.need, self.default, self.shares = kind, how, need, default, shares


class Value(Option):
    """WORD value: `convert(value)` (it raises the command's error for a bad one).

    need: the arguments that must follow WORD, 1 unless something else must come after
    the value (XADD's DELAY needs 2: a value, then at least the id)."""

    __slots__ = ()

    def __init__(self, convert, default=None, need: int = 1):
        super().__init__(VALUE, convert, need, default)


class Flag(Option):
    """WORD alone: the value becomes `value` (True)."""

    __slots__ = ()

    def __init__(self, value=True, default=False):
        super().__init__(FLAG, value, 0, default)


class Custom(Option):
    """WORD followed by anything: `take(args, i, current)` -> (value, index after it); args[i] is WORD
    and `current` the value so far (None at first), so repeated words can add up or be refused."""

    __slots__ = ()

    def __init__(self, take, need: int = 1, default=None, shares: Option | None = None):
        super().__init__(CUSTOM, take, need, default, shares)


class Stop(Option):
    """WORD ends the options (XREADGROUP's STREAMS); parse_options returns its index."""

    __slots__ = ()

    def __init__(self, need: int = 0):
        super().__init__(STOP_HERE, None, need)


class Refuse(Option):
    """WORD is a mistake with an error of its own here (XREAD's GROUP): raise `error`."""

    __slots__ = ()

    def __init__(self, error, need: int = 0):
        super().__init__(REFUSED, error, need)


class Options:
    """A command's option words -> how each is read; built once, at import.

    Words that are no Python names (VISIBILITY-TIMEOUT) come in a dict, before the keywords."""

    __slots__ = ("words", "defaults", "unknown")

    def __init__(self, declared: dict[str, Option] | None = None, /, *, unknown=syntax_error, **words: Option):
        slots: dict[int, int] = {}  # id(declaration) -> its value's index
        self.defaults: list = []
        self.words: dict[bytes, tuple] = {}
        self.unknown = unknown
        for word, option in {**(declared or {}), **words}.items():
            slot = -1
            if option.kind in (VALUE, FLAG, CUSTOM):
                owner = option.shares or option
                slot = slots.get(id(owner))
                if slot is None:
                    slot = slots[id(owner)] = len(self.defaults)
                    self.defaults.append(owner.default)
            self.words[word.encode()] = (slot, option.need, option.kind, option.how)


def parse_options(args: list[bytes], i: int, spec: Options) -> tuple[list, int]:
    """Read the options at args[i:]: (their values in declaration order, the index where they end)."""
    values = spec.defaults.copy()
    words = spec.words
    n = len(args)
    while i < n:
        entry = words.get(args[i].upper())
        if entry is None or i + entry[1] >= n:
            if spec.unknown is STOP:
                break
            raise spec.unknown(args[i])
        slot, _, kind, how = entry
        if kind == VALUE:
            values[slot] = how(args[i + 1])
            i += 2
        elif kind == FLAG:
            values[slot] = how
            i += 1
        elif kind == CUSTOM:
            values[slot], i = how(args, i, values[slot])
        elif kind == STOP_HERE:
            break
        else:
            raise how()
    return values, i
