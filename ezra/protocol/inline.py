"""Inline commands, as typed into `nc` or `telnet`: a line split the way Redis splits it.

request_reader.py's RequestReader finds the line; this splits it. Spaces and tabs separate
arguments; double quotes group and take backslash escapes (\\n, \\r, \\t, \\b, \\a, \\xHH);
single quotes group and take only \\'.
"""

from __future__ import annotations


class UnbalancedQuotes(ValueError):
    """A quote that does not close, or closes with no space after it (Redis refuses both)."""


INLINE_ESCAPES = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("b"): 8, ord("a"): 7}
HEX_DIGITS = b"0123456789abcdefABCDEF"


def split_inline(line: bytes) -> list[bytes]:
    """Split an inline command like Redis: spaces separate, quotes group."""
    args: list[bytes] = []
    i, n = 0, len(line)
    while True:
        while i < n and line[i] in b" \t":
            i += 1
        if i >= n:
            return args
        if line[i] in b"\"'":
            quote, i, arg = line[i], i + 1, bytearray()
            while True:
                if i >= n:
                    raise UnbalancedQuotes
                c = line[i]
                if c == quote:
                    i += 1
                    break
                if c == 0x5C and quote == 0x27 and line[i + 1:i + 2] == b"'":  # \' in '...'
                    c, i = 0x27, i + 1
                elif c == 0x5C and quote == 0x22 and i + 1 < n:  # backslash escape in "..."
                    i += 1
                    hex_digits = line[i + 1:i + 3]
                    if line[i] == 0x78 and len(hex_digits) == 2 and all(d in HEX_DIGITS for d in hex_digits):
                        c, i = int(hex_digits, 16), i + 2  # \xHH
                    else:
                        c = INLINE_ESCAPES.get(line[i], line[i])
                arg.append(c)
                i += 1
            if i < n and line[i] not in b" \t":
                raise UnbalancedQuotes
            args.append(bytes(arg))
        else:
            start = i
            while i < n and line[i] not in b" \t":
                i += 1
            args.append(line[start:i])
