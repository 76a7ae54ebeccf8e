"""EXISTS and TYPE on queue names.

Redis-Streams worker libraries look before they create a consumer group (walrus's
`ConsumerGroup.create` asks EXISTS, then TYPE). Both answer as Redis does for a
stream key: a queue exists once a push, `XGROUP CREATE ... MKSTREAM` or `XCFGSET`
made it, and its dead-letter view `q::dead` exists with it. Keys are only
queues here, so there is no DEL: EZRA never drops tasks.
"""

from __future__ import annotations

from ..lifecycle import split_queue
from ..protocol.resp import SimpleString
from .args import broker_of
from .table import command


def known_queues(session, names: list[bytes]) -> set[bytes]:
    """Those of the names (or the queues of their ::dead views) that are queues."""
    return broker_of(session).tasks.existing([split_queue(name)[0] for name in names]).wait()


@command("EXISTS", -2)
def exists(session, args):
    """EXISTS queue [queue ...]: how many of the names are queues (a name given twice counts twice)."""
    queues = known_queues(session, args[1:])
    return sum(split_queue(name)[0] in queues for name in args[1:])


@command("TYPE", 2)
def type_(session, args):
    """TYPE queue: stream for a queue or its ::dead view, none for any other name."""
    return SimpleString("stream" if known_queues(session, args[1:2]) else "none")
