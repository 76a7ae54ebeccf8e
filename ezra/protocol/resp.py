"""The Redis wire format, and nothing else.

Command handlers return typed Python values; `encode` turns them into RESP3 bytes, or RESP2
where the two differ (reading the requests is request_reader.py's):

    Python value            RESP3                     RESP2
    bytes / str             $ bulk string             same
    int                     : integer                 same
    None                    _ null                    $-1 (null bulk)
    NULL_ARRAY              _ null                    *-1 (null array)
    list / tuple            * array                   same
    dict                    % map                     flat * array
    PairsMap                % map                     * array of [key, value] pairs
    WrittenMap              the same, its pairs' bytes written by the command
    Replies                 each item as a reply of its own, one after another
    SimpleString            + simple string           same
    Verbatim                = verbatim "txt:"         $ bulk string
    ErrorReply              - error                   same
"""

from __future__ import annotations

from .request_reader import BULK_HEADER, MULTIBULK_HEADER  # the same lengths read back from a stored array


class SimpleString(str):
    """A status reply such as +OK or +PONG."""


class Verbatim(str):
    """Text meant for humans (INFO): a verbatim string in RESP3, bulk in RESP2."""


class PairsMap(dict):
    """A map that RESP2 sends as an array of [key, value] pairs (XREAD/XREADGROUP)."""


class WrittenMap(tuple):
    """A PairsMap written already: ((a key's RESP bytes, its value's), ...) (XREADGROUP's claims)."""


class Replies(tuple):
    """Several replies, one after another: the commands of a pipeline worked as one (commands/runs.py)."""


class Mapped:
    """An array whose items are made as it is written: `make(row)` for each of `rows`. A long
    read's reply (XRANGE, XPENDING): the connection makes and writes it in pieces, letting the
    other clients in between two, where a list would be made whole first."""

    __slots__ = ("rows", "make")

    def __init__(self, rows: list, make):
        self.rows = rows
        self.make = make

    def __len__(self) -> int:
        return len(self.rows)


class ErrorReply(Exception):
    """An error reply. `message` starts with the Redis prefix (ERR, NOAUTH...)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def as_reply(self) -> "ErrorReply":
        """Caught to be sent: only the message is needed. Its traceback held every frame it was raised through,
        with their arguments (a refused 1 MB XADD's fields); the connection's frame holding the reply closed a
        cycle that only the collector frees."""
        self.__traceback__ = None
        return self


class _NullArray:
    """The null array: *-1 in RESP2 (XREADGROUP with nothing to return)."""

    def __repr__(self):
        return "NULL_ARRAY"


NULL_ARRAY = _NullArray()
OK = SimpleString("OK")


# Reply headers by length, built once: `out += (prefix, value, CRLF)` is a third of the cost of a
# `%` format per value, and a task's reply is mostly short values (ids, field names and values).
PREFIXED = 1024
BULK_PREFIXES = [b"$%d\r\n" % size for size in range(PREFIXED)]
ARRAY_PREFIXES = [b"*%d\r\n" % size for size in range(PREFIXED)]
CRLF = b"\r\n"


# The two commonest replies (a push's id, an ack's count), for the connection's own fast path:
# `BULK_REPLY % (len(value), value)`, `INTEGER_REPLY % n`, the frames `encode` writes for them.
BULK_REPLY = b"$%d\r\n%s\r\n"
INTEGER_REPLY = b":%d\r\n"


def bulk(value: bytes) -> bytes:
    """`value` as a RESP bulk string (RESP2 and RESP3 alike)."""
    if len(value) < PREFIXED:
        return BULK_PREFIXES[len(value)] + value + CRLF
    return BULK_REPLY % (len(value), value)


def entries_frame(rows, fields_frame) -> bytes:
    """Stream entries [id, [field, value, ...]] as one RESP array (the same in RESP2 and RESP3),
    from task rows (id_ms, id_seq, stored fields, ...): `fields_frame(stored)` gives each row's
    fields as a RESP array (a push's stored array is sent on as it is: task_fields.as_resp).
    Whatever `fields_frame` raises is raised: the caller leaves such rows out and writes again."""
    if len(rows) == 1:  # a worker's COUNT 1: one format, no list
        row = rows[0]
        task_id, fields = b"%d-%d" % (row[0], row[1]), row[2]
        return b"*1\r\n*2\r\n$%d\r\n%s\r\n%s" % (len(task_id), task_id,
                                                   fields if type(fields) is bytes else fields_frame(fields))
    out = [ARRAY_PREFIXES[len(rows)] if len(rows) < PREFIXED else b"*%d\r\n" % len(rows)]
    for row in rows:
        task_id = b"%d-%d" % (row[0], row[1])  # stream_ids.format_id(row[:2]), inlined: once per task
        fields = row[2]
        out += (b"*2\r\n", BULK_PREFIXES[len(task_id)], task_id, CRLF,
                fields if type(fields) is bytes else fields_frame(fields))
    return b"".join(out)


def bulk_array(items: list[bytes]) -> bytes:
    """The RESP array of bulk strings `items`: tasks.fields, sent on as it is in every reply
    (RESP2 and RESP3 alike, see task_fields.py). A field and its value: one format, no list."""
    if len(items) == 2:
        return b"*2\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(items[0]), items[0], len(items[1]), items[1])
    out = [ARRAY_PREFIXES[len(items)] if len(items) < PREFIXED else b"*%d\r\n" % len(items)]
    for item in items:
        size = len(item)
        out += (BULK_PREFIXES[size] if size < PREFIXED else b"$%d\r\n" % size, item, CRLF)
    return b"".join(out)


def read_bulk_array(data: bytes) -> list[bytes]:
    """bulk_array's items back; ValueError unless `data` is exactly one array of bulk strings."""
    header = MULTIBULK_HEADER(data)
    if header is None:
        raise ValueError("not a RESP array of bulk strings")
    items, pos = [], header.end()
    for _ in range(int(header.group(1))):
        bulk = BULK_HEADER(data, pos)
        if bulk is None:
            raise ValueError(f"no bulk string header at byte {pos}")
        start = bulk.end()
        pos = start + int(bulk.group(1))
        if data[pos:pos + 2] != CRLF:
            raise ValueError(f"bulk string not ended by CRLF at byte {pos}")
        items.append(data[start:pos])
        pos += 2
    if pos != len(data):
        raise ValueError(f"{len(data) - pos} bytes after the array")
    return items


def encode(value, proto: int) -> bytes:
    """Encode one reply for a connection speaking RESP `proto` (2 or 3)."""
    kind = type(value)
    if kind is bytes:  # the common replies (an id, a count) without a list and a join
        return b"$%d\r\n%s\r\n" % (len(value), value)
    if kind is int:
        return b":%d\r\n" % value
    if kind is WrittenMap and len(value) == 1:  # one queue's claims, XREADGROUP's usual reply: no list
        return (b"%1\r\n" if proto == 3 else b"*1\r\n*2\r\n") + b"".join(value[0])  # its key, its entries
    if kind is Replies:  # a run of pushes: their ids, an error seldom
        return b"".join([b"$%d\r\n%s\r\n" % (len(item), item) if type(item) is bytes else encode(item, proto)
                         for item in value])
    out: list[bytes] = []
    _encode(value, proto == 3, out)
    return b"".join(out)


def is_long(value, items: int) -> bool:
    """Is this reply written in pieces (encode_in_pieces)? A Mapped (its maker says it may be
    large), an array of more than `items` items, or a map holding either."""
    kind = type(value)
    if kind is Mapped:
        return True
    if kind is list:
        return len(value) > items
    return kind is dict and any(is_long(item, items) for item in value.values())


def encode_in_pieces(value, proto: int, items: int):
    """A long reply's encoding in pieces (the connection lets other clients in between two): its
    arrays cut every `items` items, its maps' values each apart. Joined, the pieces are
    `encode(value, proto)`."""
    yield from _pieces(value, proto == 3, items)


def _pieces(value, resp3: bool, items: int):
    kind = type(value)
    if kind is list or kind is Mapped:
        rows, make = (value.rows, value.make) if kind is Mapped else (value, None)
        yield ARRAY_PREFIXES[len(rows)] if len(rows) < PREFIXED else b"*%d\r\n" % len(rows)
        for start in range(0, len(rows), items):
            out: list[bytes] = []
            piece = rows[start:start + items]
            for item in (piece if make is None else map(make, piece)):
                if type(item) is dict or is_long(item, items):
                    yield b"".join(out)
                    out = []
                    yield from _pieces(item, resp3, items)
                else:
                    _encode(item, resp3, out)
            yield b"".join(out)
    elif kind is dict:  # as _encode_map writes a plain dict
        yield b"%%%d\r\n" % len(value) if resp3 else b"*%d\r\n" % (2 * len(value))
        for key, item in value.items():
            out = []
            _encode(key, resp3, out)
            yield b"".join(out)
            yield from _pieces(item, resp3, items)
    else:
        out = []
        _encode(value, resp3, out)
        yield b"".join(out)


def _encode(value, resp3: bool, out: list) -> None:
    kind = type(value)
    if kind is bytes:
        size = len(value)
        out += (BULK_PREFIXES[size] if size < PREFIXED else b"$%d\r\n" % size, value, CRLF)
    elif kind is int or kind is bool:  # True is written 1
        out.append(b":%d\r\n" % value)
    elif kind is list or kind is tuple:
        size = len(value)
        out.append(ARRAY_PREFIXES[size] if size < PREFIXED else b"*%d\r\n" % size)
        for item in value:
            if type(item) is bytes:  # a task's id and fields: no call per leaf
                size = len(item)
                out += (BULK_PREFIXES[size] if size < PREFIXED else b"$%d\r\n" % size, item, CRLF)
            elif type(item) is list and len(item) < PREFIXED:  # an entry [id, fields]: its id in place too
                out.append(ARRAY_PREFIXES[len(item)])
                for leaf in item:
                    if type(leaf) is bytes and len(leaf) < PREFIXED:
                        out += (BULK_PREFIXES[len(leaf)], leaf, CRLF)
                    else:
                        _encode(leaf, resp3, out)
            else:
                _encode(item, resp3, out)
    elif kind is Mapped:
        _encode(list(map(value.make, value.rows)), resp3, out)
    elif kind is PairsMap:  # XREADGROUP's and XREAD's reply, before the isinstance checks
        _encode_map(value, resp3, out)
    elif kind is WrittenMap:  # as a PairsMap
        out.append(b"%%%d\r\n" % len(value) if resp3 else b"*%d\r\n" % len(value))
        for key, item in value:
            out += (key, item) if resp3 else (b"*2\r\n", key, item)
    elif kind is str:
        out.append(b"$%d\r\n%s\r\n" % (len(data := value.encode()), data))
    elif value is None or value is NULL_ARRAY:
        out.append(b"_\r\n" if resp3 else (b"$-1\r\n" if value is None else b"*-1\r\n"))
    elif kind is SimpleString:
        out.append(b"+%s\r\n" % value.encode())
    elif isinstance(value, ErrorReply):
        out.append(b"-%s\r\n" % _one_line(value.message))
    elif isinstance(value, dict):
        _encode_map(value, resp3, out)
    elif kind is Verbatim:
        data = value.encode()
        out.append(b"=%d\r\ntxt:%s\r\n" % (len(data) + 4, data) if resp3 else b"$%d\r\n%s\r\n" % (len(data), data))
    else:
        raise TypeError(f"cannot encode reply of type {kind.__name__}")


def _encode_map(value: dict, resp3: bool, out: list) -> None:
    if resp3:
        out.append(b"%%%d\r\n" % len(value))
        for key, item in value.items():
            _encode(key, resp3, out)
            _encode(item, resp3, out)
    elif type(value) is PairsMap:
        out.append(b"*%d\r\n" % len(value))
        for key, item in value.items():
            if type(key) is bytes and len(key) < PREFIXED:  # a queue's name (XREADGROUP's reply): in place
                out += (b"*2\r\n", BULK_PREFIXES[len(key)], key, CRLF)
            else:
                out.append(b"*2\r\n")
                _encode(key, resp3, out)
            _encode(item, resp3, out)
    else:
        out.append(b"*%d\r\n" % (2 * len(value)))
        for key, item in value.items():
            _encode(key, resp3, out)
            _encode(item, resp3, out)


def _one_line(message: str) -> bytes:
    # An error is one line on the wire: a CR or LF inside would break the frame.
    return message.replace("\r", " ").replace("\n", " ").encode("utf-8", "replace")
