"""XREAD's reads: the entries of a view (a live queue, or its dead letters) after an id.

A look reads through the writer like XRANGE, so its reply waits for the batch it read in to
commit: it never answers an entry whose push is then rolled back (a disk-full batch is run
again without its pushes, the read too). Who waits for more is observers.py's (the registry)
and the front's (commands/table.py).
"""

from __future__ import annotations

from ..lifecycle import AVAILABLE, DEAD, DELAYED, DONE, IN_FLIGHT, WAITING
from ..protocol.stream_ids import LAST_ONE, MAX_ID_PART, SINCE_NOW, previous_id
from ..writer.transactions import transaction

LIVE_VIEW = (AVAILABLE, DELAYED, IN_FLIGHT, DONE, WAITING)  # what XRANGE shows of a live queue
DEAD_VIEW = (DEAD,)
NEWEST = (MAX_ID_PART, MAX_ID_PART)


class Views:
    """XREAD's transactions: looks at views after ids."""

    def __init__(self, db, queues, writer):
        self.db = db
        self.queues = queues
        self.writer = writer

    @transaction(durable=False)
    def look(self, reads: list[tuple], count: int) -> dict:
        """XREAD: {stream: task rows} for the reads (stream as given, (queue, dead), after) with entries."""
        result = {}
        for stream, (name, dead), after in reads:
            states = DEAD_VIEW if dead else LIVE_VIEW
            rows = self.db.entries_after(name, states, self._resolve(name, states, after), count)
            if rows:
                result[stream] = rows
        return result

    @transaction(durable=False)
    def first_look(self, reads: list[tuple], count: int) -> tuple[list[tuple], dict]:
        """XREAD BLOCK's first look: the ids '$' and '+' stand for now, and what is there after them."""
        reads = [(stream, (name, dead), self._resolve(name, DEAD_VIEW if dead else LIVE_VIEW, after))
                 for stream, (name, dead), after in reads]
        return reads, Views.look.body(self, reads, count)

    def _resolve(self, name: bytes, states: tuple, after):
        """'$' and '+' as ids, now (a queue that does not exist yet: from its start, as Redis)."""
        if after == SINCE_NOW:
            queue = self.queues.get(name)
            return (0, 0) if queue is None else queue.last_id
        if after == LAST_ONE:
            newest = self.db.range(name, states, (0, 0), NEWEST, 1, True)
            return previous_id(newest[0][:2]) if newest else (0, 0)
        return after
