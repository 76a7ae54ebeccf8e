"""Reading the Redis wire format: `RequestReader` turns bytes from a client into commands (lists
of bytes), from RESP multibulk frames or inline lines as typed into `nc`.

Every declared length is checked against a cap *before* anything is allocated for it: a hostile
`*2147483647` costs nothing. An argument over the cap is read past (`BulkTooLarge`), or ends the
connection (`ProtocolError`). Writing replies is resp.py's.
"""

from __future__ import annotations

import functools
import re
from itertools import chain

from .inline import UnbalancedQuotes, split_inline

class ProtocolError(Exception):
    """A frame the server cannot parse; the connection is closed after the reply."""


class BulkTooLarge(Exception):
    """An argument of `size` bytes, over the reader's cap (`limit`).

    Up to its `discard_limit` the reader reads past it, keeping none of its bytes, and raises this once the
    whole command has been read (`fatal` False: the connection goes on with the next command); above, at
    the argument's header (`fatal`: the stream cannot be followed further than the client is trusted to send)."""

    def __init__(self, size: int, limit: int, fatal: bool):
        super().__init__(size, limit, fatal)
        self.size, self.limit, self.fatal = size, limit, fatal


SKIPPED = object()  # in place of an argument whose bytes were discarded


class RequestReader:
    """Incremental parser of client requests with caps on every length."""

    __slots__ = ("max_bulk_len", "discard_limit", "max_args", "max_inline_len", "unauthenticated", "_buf",
                 "_pos", "_args", "_due", "_skip", "_skipping", "_too_large", "_ready", "_bulk_headers", "_careful",
                 "_frame_splits")
    MAX_ARGS = 1024 * 1024

    def __init__(self, max_bulk_len: int, max_args: int = MAX_ARGS, max_inline_len: int = 64 * 1024,
                 unauthenticated: bool = False, discard_limit: int = 0):
        """`discard_limit`: an argument over `max_bulk_len` but not over this is read past (BulkTooLarge
        once its command is read); above it, or without one, the frame is an error that closes."""
        self.max_bulk_len = max_bulk_len
        self.discard_limit = max(discard_limit, max_bulk_len)
        self.max_args = max_args
        self.max_inline_len = max_inline_len
        self.unauthenticated = unauthenticated  # the caps are the pre-AUTH ones: errors say so, as Redis
        self._buf = bytearray()
        self._pos = 0
        # A multibulk frame being read: the arguments so far and how many are due.
        self._args: list[bytes] | None = None
        self._due = 0
        # An argument being read past: bytes still to drop as they arrive, then its CRLF.
        self._skip = 0
        self._skipping = False
        self._too_large = 0  # the largest argument of this frame that was read past
        self._ready: list[list[bytes]] = []  # commands parsed by `_batch` for next_command, last first
        self._bulk_headers = bulk_headers(max_bulk_len)
        self._frame_splits = frame_splits(max_args)
        self._careful = False  # a window held a frame that was not as it seemed: frame by frame for now

    def feed(self, data: bytes) -> None:
        """Add bytes received from the socket (bytes of an argument being read past are dropped here)."""
        if self._skip:
            if len(data) <= self._skip:
                self._skip -= len(data)
                return
            data = data[self._skip:]
            self._skip = 0
        if self._pos:
            del self._buf[:self._pos]
            self._pos = 0
        self._buf += data

    def lift_caps(self, max_bulk_len: int, max_args: int, discard_limit: int = 0) -> None:
        """The client authenticated: its frames may be as large as anyone's."""
        self.max_bulk_len = max_bulk_len
        self.discard_limit = max(discard_limit, max_bulk_len)
        self.max_args = max_args
        self.unauthenticated = False
        self._bulk_headers = bulk_headers(max_bulk_len)
        self._frame_splits = frame_splits(max_args)

    def buffered(self) -> int:
        """Bytes received but not yet parsed (for the slow-client caps)."""
        return len(self._buf) - self._pos

    def held(self) -> int:
        """Bytes the buffer holds, parsed or not (what dropping the reader frees)."""
        return len(self._buf)

    def mid_frame(self) -> bool:
        """Part of a command has arrived and the rest has not (the frame timeout applies)."""
        return self._args is not None or self._pos < len(self._buf)

    def take(self, data: bytes) -> list[list[bytes]] | tuple:
        """`feed(data)`, then `next_commands()`. A read that is one whole frame, with nothing
        buffered before it (a client that awaits each reply, as most do), is split from `data`
        itself: neither copied into the buffer nor out of it. The check is `_batch`'s, exact.
        That one command comes as a tuple `(args,)`: it tells the caller nothing is left to
        read (no `next_commands` call to learn it); other reads' commands come as a list."""
        if self._pos >= len(self._buf) and self._args is None and not self._ready:
            # Split only as far as a frame of TAKE_ARGS arguments goes: a pipeline's read is split
            # once, by _batch, and a larger frame takes that path too.
            parts = data.split(b"\r\n", TAKE_SPLITS)
            splits = self._frame_splits.get(parts[0])
            if splits is not None and len(parts) == splits + 1 and not parts[-1]:  # all, nothing after
                args = parts[2:-1:2]
                try:
                    exact = parts[1:-1:2] == list(map(self._bulk_headers.__getitem__, map(len, args)))
                except IndexError:  # an argument over the cap, or too long for the table
                    exact = False
                if exact:
                    if self._pos:  # the last frame's bytes, parsed: let them go
                        self._buf.clear()
                        self._pos = 0
                    return (args,)
        self.feed(data)
        return self.next_commands()

    def next_commands(self) -> list[list[bytes]] | tuple:
        """The batch's commands, in order, or the next one the careful paths read; empty until more bytes
        arrive. The connection's loop: one call per read of a pipeline, not one per command."""
        if self._ready:  # left by next_command
            ready, self._ready = self._ready, []
            ready.reverse()
            return ready
        if self._args is None:
            if self._pos >= len(self._buf):
                return NOTHING  # all read (one command per read: the second call, every time)
            frames = self._batch()
            if frames:
                return frames
        args = self._one_command()
        return NOTHING if args is None else [args]

    def next_command(self) -> list[bytes] | None:
        """The next complete command, or None until more bytes arrive."""
        if self._ready:
            return self._ready.pop()
        if self._args is None:
            if self._pos >= len(self._buf):
                return None
            frames = self._batch()
            if frames:
                frames.reverse()
                first = frames.pop()
                self._ready = frames  # last first: each call pops one
                return first
        return self._one_command()

    def _one_command(self) -> list[bytes] | None:
        """Where the batch stops: a whole frame in one go, else the step-by-step reader (errors, caps)."""
        if self._args is None:
            args = self._whole_frame()
            if args is not None:
                return args
        while True:
            if self._args is None:
                if self._pos >= len(self._buf):
                    return None
                if self._buf[self._pos] != 0x2A:  # not '*': an inline command
                    cmd = self._read_inline()
                    if cmd is None or cmd:
                        return cmd
                    continue  # a blank line is ignored, as Redis does
                count = self._read_length(b"multibulk", self.max_args)
                if count is None:
                    return None
                if count <= 0:
                    continue  # '*0' and '*-1' are ignored, as Redis does
                self._args, self._due = [], count
            while self._due:
                if self._skipping:
                    if not self._skipped_past():
                        return None
                    self._due -= 1
                    continue
                arg = self._read_bulk()
                if arg is None:
                    return None
                if arg is not SKIPPED:
                    self._args.append(arg)
                self._due -= 1
            args, self._args = self._args, None
            if self._too_large:
                size, self._too_large = self._too_large, 0
                raise BulkTooLarge(size, self.max_bulk_len, fatal=False)
            return args

    def _batch(self) -> list[list[bytes]] | None:
        """Fastest path: every whole frame within the next BATCH_WINDOW bytes, split in one C call.

        A pipeline brings dozens of commands of a few short arguments in one read: the window is split
        at CRLF once, and the frames' headers checked against their arguments' lengths by table lookups
        (no Python step per argument). The check is exact (`*N` and `$<len>` as Redis writes them): an
        argument that holds a CRLF, a bad header or anything over a cap ends the batch there, and
        `_whole_frame` or the step-by-step reader decides on that frame (caps lifted by an AUTH before
        it apply: the frames before it run first).
        """
        buf, pos = self._buf, self._pos
        if pos >= len(buf) or buf[pos] != 0x2A:  # not '*'
            return None
        window = (bytes(buf) if not pos and len(buf) <= BATCH_WINDOW  # one copy: no memoryview as after a feed
                  else bytes(memoryview(buf)[pos:pos + BATCH_WINDOW]))  # (a bytearray slice is a second copy)
        parts = window.split(b"\r\n", BATCH_PARTS)
        complete = len(parts) - 1  # the last part has no CRLF after it yet (or is the unsplit rest)
        count = FRAME_COUNTS.get(parts[0])
        if count is not None and 2 * count + 1 >= complete:  # one frame at most (one command per read)
            i = 1 + 2 * count
            if i > complete or count > self.max_args:
                return None
            frames = [parts[2:i:2]]
            try:
                if parts[1:i:2] != list(map(self._bulk_headers.__getitem__, map(len, frames[0]))):
                    return None
            except IndexError:
                return None
        elif self._careful:  # until a window passes whole: a client that mixes in such frames costs no walk more
            frames, i, self._careful = self._checked_frames(parts, complete)
        else:
            # Walk the frames by their `*N` alone, then check every argument's `$<len>` in one go:
            # one comparison for the window, not a list and a comparison per frame.
            counts, max_args = FRAME_COUNTS, self.max_args
            frames, headers, i = [], [], 0
            while i < complete:
                count = counts.get(parts[i])
                if count is None or count > max_args:
                    break
                end = i + 1 + 2 * count
                if end > complete:
                    break
                frames.append(parts[i + 2:end:2])
                headers += parts[i + 1:end:2]
                i = end
            try:
                exact = headers == list(map(self._bulk_headers.__getitem__, map(len, ALL_ARGUMENTS(frames))))
            except IndexError:  # an argument over the cap, or too long for the table
                exact = False
            if not exact:  # some frame is not as it seems (an argument holding a CRLF...): up to it only
                frames, i, self._careful = self._checked_frames(parts, complete)
        if not frames:
            return None
        # Where the batch ends, from the window's end: the parts after it are few (only the rest when
        # the read ended at a frame's end: no sum then), where summing the ones before cost a step each.
        self._pos = pos + len(window) - (len(parts[i]) if i == complete else
                                         sum(map(len, parts[i:])) + 2 * (complete - i))
        return frames

    def _checked_frames(self, parts: list[bytes], complete: int) -> tuple[list[list[bytes]], int, bool]:
        """The frames before the first not as the batch reads them, each checked; True if one stopped it."""
        counts, max_args, header_of = FRAME_COUNTS, self.max_args, self._bulk_headers.__getitem__
        frames, i = [], 0
        while i < complete:
            count = counts.get(parts[i])
            if count is None or count > max_args:
                return frames, i, True
            end = i + 1 + 2 * count
            if end > complete:
                break
            args = parts[i + 2:end:2]
            try:
                if parts[i + 1:end:2] != list(map(header_of, map(len, args))):
                    return frames, i, True
            except IndexError:
                return frames, i, True
            frames.append(args)
            i = end
        return frames, i, False

    def _whole_frame(self) -> list[bytes] | None:
        """Fast path: a complete, well-formed multibulk frame in one go, else None. Anything unusual
        (incomplete, malformed, over a cap) returns None and the step-by-step reader below handles it,
        errors included. Headers are matched by compiled patterns (a C call each, not a find, a slice
        and a strict int check)."""
        match = MULTIBULK_HEADER(self._buf, self._pos)  # a well-formed `*N` within the caps
        if match is None or int(match.group(1)) > self.max_args:
            return None
        count, pos = int(match.group(1)), match.end()
        buf, n, max_bulk_len, args = self._buf, len(self._buf), self.max_bulk_len, []
        for _ in range(count):
            match = BULK_HEADER(buf, pos)
            if match is None:
                return None
            start = match.end()
            stop = start + int(match.group(1))
            if stop - start > max_bulk_len or stop + 2 > n or buf[stop] != 13 or buf[stop + 1] != 10:
                return None
            args.append(bytes(buf[start:stop]))
            pos = stop + 2
        self._pos = pos
        return args

    def _read_line(self, limit: int, error: str) -> bytes | None:
        end = self._buf.find(b"\r\n", self._pos)
        if end < 0:
            if len(self._buf) - self._pos > limit:
                raise ProtocolError(error)
            return None
        line = bytes(self._buf[self._pos:end])
        self._pos = end + 2
        return line

    def _read_length(self, kind: bytes, cap: int) -> int | None:
        start = self._pos
        error = f"Protocol error: invalid {kind.decode()} length"
        line = self._read_line(32, error)
        if line is None:
            return None
        try:
            value = strict_int(line[1:])
        except ValueError:
            value = None
        if value is None or value > cap:
            self._pos = start
            if value is not None and self.unauthenticated:
                error = f"Protocol error: unauthenticated {kind.decode()} length"
            raise ProtocolError(error)
        return value

    def _read_bulk(self) -> bytes | None:
        if self._pos >= len(self._buf):
            return None
        if self._buf[self._pos] != 0x24:  # '$'
            got = chr(self._buf[self._pos])
            raise ProtocolError(f"Protocol error: expected '$', got '{got}'")
        start = self._pos
        try:
            size = self._read_length(b"bulk", self.discard_limit)
        except ProtocolError:
            self._refuse_huge_bulk()
            raise
        if size is None:
            return None
        if size < 0:
            raise ProtocolError("Protocol error: invalid bulk length")
        if size > self.max_bulk_len:
            return self._skip_bulk(size)
        end = self._pos + size
        if len(self._buf) < end + 2:
            self._pos = start  # re-read the header once the payload is in
            return None
        if self._buf[end:end + 2] != b"\r\n":
            raise ProtocolError("Protocol error: bulk string not terminated by CRLF")
        value = bytes(self._buf[self._pos:end])
        self._pos = end + 2
        return value

    def _refuse_huge_bulk(self) -> None:
        """A bulk header over the discard limit: BulkTooLarge (fatal) if it is a length at all."""
        if self.unauthenticated or self.discard_limit == self.max_bulk_len:
            return  # nothing is read past: the plain protocol error, as Redis
        line_end = self._buf.find(b"\r\n", self._pos)
        if line_end < 0:
            return
        try:
            size = strict_int(bytes(self._buf[self._pos + 1:line_end]))
        except ValueError:
            return
        if size > self.discard_limit:
            raise BulkTooLarge(size, self.max_bulk_len, fatal=True)

    def _skip_bulk(self, size: int):
        """Read past an argument over the cap: drop what is buffered of it and the rest as it comes."""
        self._too_large = max(self._too_large, size)
        available = len(self._buf) - self._pos
        if available >= size:
            self._pos += size
        else:
            self._skip = size - available
            self._pos = len(self._buf)
        self._skipping = True
        return SKIPPED if self._skipped_past() else None

    def _skipped_past(self) -> bool:
        """The argument being read past is behind us, its CRLF included (False: more bytes are due)."""
        if self._skip or len(self._buf) - self._pos < 2:
            return False
        if self._buf[self._pos:self._pos + 2] != b"\r\n":
            raise ProtocolError("Protocol error: bulk string not terminated by CRLF")
        self._pos += 2
        self._skipping = False
        return True

    def _read_inline(self) -> list[bytes] | None:
        end = self._buf.find(b"\n", self._pos)
        if end < 0:
            if len(self._buf) - self._pos > self.max_inline_len:
                raise ProtocolError("Protocol error: too big inline request")
            return None
        line = bytes(self._buf[self._pos:end]).rstrip(b"\r")
        self._pos = end + 1
        try:
            return split_inline(line)
        except UnbalancedQuotes:
            raise ProtocolError("Protocol error: unbalanced quotes in request") from None


ALL_ARGUMENTS = chain.from_iterable  # the frames' arguments as one run, for one check
NOTHING = ()  # next_commands' "no command yet": no list made for it
BATCH_WINDOW = 64 * 1024  # bytes of frames parsed at once by RequestReader._batch (a read's worth)
# Pieces it splits the window into, at most: 80 pipelined claims' worth. A window of CRLFs alone
# would be 32K pieces, every time a frame built to fail the batch after them arrived.
BATCH_PARTS = 2048
# `*N` for the counts `_batch` handles, and `$<len>` by length for the arguments it handles (larger
# ones take `_whole_frame`): a table lookup per argument instead of formatting or parsing a number.
FRAME_COUNTS = {b"*%d" % count: count for count in range(1, 1025)}
# `take`'s: the most arguments it splits a read for (XREADGROUP's 10, XADD's with 5 fields and 2
# options), and `*N` to the CRLFs a whole frame of N arguments holds (its parts are one more).
TAKE_ARGS = 16
TAKE_SPLITS = 2 * TAKE_ARGS + 1
FRAME_SPLITS = {b"*%d" % count: 2 * count + 1 for count in range(1, TAKE_ARGS + 1)}
BULK_HEADERS = [b"$%d" % size for size in range(4096)]


def bulk_headers(max_bulk_len: int) -> list[bytes]:
    """The headers `_batch` accepts under the cap: the shared table unless the cap is below its end."""
    return BULK_HEADERS if max_bulk_len >= len(BULK_HEADERS) - 1 else BULK_HEADERS[:max_bulk_len + 1]


@functools.lru_cache(maxsize=4)
def frame_splits(max_args: int) -> dict[bytes, int]:
    """FRAME_SPLITS for the frames under the cap (the shared table unless the cap is below its end):
    a frame over it misses and takes the careful path, which refuses it."""
    if max_args >= TAKE_ARGS:
        return FRAME_SPLITS
    return {b"*%d" % count: 2 * count + 1 for count in range(1, max_args + 1)}


# Lengths as Redis writes them (no sign, no leading zero), at most as many digits as a cap can need.
MULTIBULK_HEADER = re.compile(rb"\*([1-9][0-9]{0,9})\r\n").match
BULK_HEADER = re.compile(rb"\$(0|[1-9][0-9]{0,17})\r\n").match


def strict_int(text) -> int:
    """A length as Redis reads it: plain decimal, no sign but '-', no spaces or leading zeros."""
    value = int(text)
    if b"%d" % value != text:
        raise ValueError(text)
    return value
