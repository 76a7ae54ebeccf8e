"""The queries of idempotent producers (XADD IDMP / IDMPAUTO), named; run in the writer's
transaction like the rest. A producer's iid maps to the id its first push created, until
it expires or the producer's newest `maxsize` iids push it out (Redis's IDMP-MAXSIZE).
"""

from __future__ import annotations

from . import reads
from .schema import name_value


class IdempotentProducers:
    """The idempotency table: which push each producer's iid made."""

    def __init__(self, conn):
        self.conn = conn

    def lookup(self, queue: bytes, producer: bytes, iid: bytes, now: int) -> tuple | None:
        """The id a push with this producer/iid created, if still remembered."""
        return self.conn.execute(
            "SELECT id_ms, id_seq FROM idempotency WHERE queue = ? AND producer = ? AND iid = ? "
            "AND expires_at > ?", (name_value(queue), name_value(producer), iid, now)).fetchone()

    def record(self, queue: bytes, producer: bytes, iid: bytes, task_id: tuple, expires_at: int,
               maxsize: int) -> None:
        """Remember a push; a producer keeps its `maxsize` newest iids (Redis's IDMP-MAXSIZE)."""
        q, p = name_value(queue), name_value(producer)
        self.conn.execute(
            "INSERT OR REPLACE INTO idempotency (queue, producer, iid, id_ms, id_seq, expires_at) "
            "VALUES (?, ?, ?, ?, ?, ?)", (q, p, iid, task_id[0], task_id[1], expires_at))
        self.conn.execute(
            "DELETE FROM idempotency WHERE rowid IN (SELECT rowid FROM idempotency "
            "WHERE queue = ? AND producer = ? ORDER BY rowid DESC LIMIT -1 OFFSET ?)", (q, p, maxsize))

    def forget(self, queue: bytes) -> None:
        """Every iid of the queue (its IDMP limits changed: as Redis, they start from an empty map)."""
        self.conn.execute("DELETE FROM idempotency WHERE queue = ?", (name_value(queue),))

    def purge(self, now: int, limit: int) -> int:
        """Forget up to `limit` expired iids; how many were forgotten."""
        return self.conn.execute(
            "DELETE FROM idempotency WHERE rowid IN (SELECT rowid FROM idempotency "
            "WHERE expires_at <= ? ORDER BY expires_at LIMIT ?)", (now, limit)).rowcount

    def next_expiry(self) -> int | None:
        """When the next iid expires (ms), or None."""
        return self.conn.execute("SELECT min(expires_at) FROM idempotency").fetchone()[0]

    def tracked(self, queue: bytes, now: int) -> tuple[int, int]:
        """(producers, iids) remembered for a queue (XINFO STREAM pids-tracked, iids-tracked)."""
        return reads.idmp_tracked(self.conn, queue, now)
