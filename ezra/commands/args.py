"""Argument helpers the command families share: ids, queue and worker names, the limits of counts.
(Integers: ezra/protocol/integers.py's to_int, the one reader; ids: ezra/protocol/stream_ids.py.)"""

from __future__ import annotations

from .. import errors
from ..lifecycle import split_queue
from ..protocol.stream_ids import parse_ids
from ..protocol.integers import to_int

RANGE_DEFAULT_COUNT = 10000  # XRANGE without COUNT: Redis means "all"; EZRA pages
# RETRYCOUNT above this means the same (above any MAX-ATTEMPTS): the deliveries counted after it stay 64-bit.
MAX_RETRY_COUNT = 2 ** 31 - 1
# A worker (consumer) name is written into every task it claims: one XREADGROUP COUNT 500 with a
# 1 MB name wrote 965 MB. Longer names are refused where a name is given tasks (XREADGROUP,
# XCLAIM, XAUTOCLAIM); XPENDING and XGROUP DELCONSUMER still take any name, to clean up.
MAX_WORKER_NAME = 256  # bytes


ids_of = parse_ids  # a command's ids (stream_ids.parse_ids: parse_id of each)


def worker_name(name: bytes) -> bytes:
    """The worker (consumer) name of a command that leases tasks to it: at most MAX_WORKER_NAME bytes."""
    if len(name) > MAX_WORKER_NAME:
        raise errors.worker_name_too_long(len(name), MAX_WORKER_NAME)
    return name


def live_queue(name: bytes) -> bytes:
    queue, dead = split_queue(name)
    if dead:
        raise errors.dead_view_is_read_only(name, queue)
    return queue


def broker_of(session):
    return session.state.broker


def block_timeout(arg: bytes) -> int:
    """BLOCK's milliseconds (XREADGROUP, XREAD, XRESULT): 0 is for ever."""
    block_ms = to_int(arg, errors.BLOCK_NOT_INTEGER)
    if block_ms < 0:
        raise errors.TIMEOUT_NEGATIVE
    return block_ms
