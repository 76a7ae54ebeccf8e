"""The writer's group commit on a real ezra.db, without a server: durable requests wait for the fsync
under way, so with only durable requests every commit gets an fsync of its own."""

from __future__ import annotations

import gevent

from ezra.broker import Broker
from ezra.config import Settings
from ezra.storage import open_database


def test_durable_requests_queued_during_an_fsync_commit_together_after_it(tmp_path):
    broker = Broker(open_database(str(tmp_path / "data")), Settings(data_dir=str(tmp_path), durability="full"))
    writer = broker.writer
    producers, pushes_each = 20, 30

    def producer(n: int) -> list[bytes]:
        ids = []
        for i in range(pushes_each):
            gevent.sleep(n * 0.00005)  # spread the submissions over the fsync under way
            ids.append(broker.push(b"jobs", b"*", [b"n", b"%d-%d" % (n, i)]).wait())
        return ids

    try:
        greenlets = [gevent.spawn(producer, n) for n in range(producers)]
        gevent.joinall(greenlets, raise_error=True)
        ids = [task_id for greenlet in greenlets for task_id in greenlet.value]
        assert len(set(ids)) == producers * pushes_each
        assert broker.queue_counts()[b"jobs"]["available"] == producers * pushes_each
        # No commit while an fsync was under way: each batch had its own fsync, and
        # the 600 pushes needed far fewer batches than requests.
        assert writer.fsyncs == writer.batches - 1  # the queue_counts read above: a batch, no fsync
        assert writer.batches < producers * pushes_each / 2
    finally:
        broker.stop()
        broker.db.close()
