"""Admin.figures, the one snapshot INFO, /metrics and the dashboard read (unit, a real ezra.db, no server):
each way of choosing queues returns the figures it names, and only per-queue figures need the writer."""

from __future__ import annotations

import pytest

from ezra.broker import ALL_QUEUES, Broker
from ezra.config import Settings
from ezra.storage import open_database
from ezra.protocol.task_fields import stored
from support_broker import push_one, claim_committed


@pytest.fixture
def broker(tmp_path):
    """A Broker on a real ezra.db holding fill()'s queues."""
    broker = Broker(open_database(str(tmp_path / "data")), Settings(data_dir=str(tmp_path), durability="normal"))
    try:
        fill(broker)
        yield broker
    finally:
        broker.stop()


def fill(broker: Broker) -> None:
    """q1: 3 tasks, one claimed; q2: 1 task; q3: empty."""
    for name, n in ((b"q1", 3), (b"q2", 1)):
        for i in range(n):
            push_one(broker, name, stored([b"n", b"%d" % i]))
    broker.tasks.create_queue(b"q3", False).wait()
    claim_committed(broker, [b"q1"], b"w", 1, False)


def test_every_queue_and_the_server_wide_figures(broker):
    figures = broker.admin.figures(ALL_QUEUES, head_since=False)
    assert sorted(figures.queues) == [b"q1", b"q2", b"q3"] and figures.queue_count == 3
    assert figures.queues[b"q1"]["counts"]["available"] == 2
    assert figures.queues[b"q1"]["counts"]["in_flight"] == 1
    assert figures.queues[b"q1"]["totals"]["pushed"] == 3 and figures.queues[b"q1"]["head_since"] is None
    assert figures.totals["pushed"] == 4 and figures.totals["delivered"] == 1
    assert figures.rest is None and figures.blocked == 0 and figures.database_bytes > 0
    assert figures.fsync_seconds is None  # --durability normal: no fsync per commit
    assert figures.batches == broker.writer.batches - 1  # taken in the batch the call committed


def test_named_queues_with_the_head_s_age(broker):
    figures = broker.admin.figures([b"q2", b"nope"])
    assert list(figures.queues) == [b"q2"] and figures.queue_count == 3
    assert figures.queues[b"q2"]["head_since"] is not None
    assert figures.now >= figures.queues[b"q2"]["head_since"]


def test_busiest_and_the_rest_summed(broker):
    figures = broker.admin.figures(busiest=1)
    assert list(figures.queues) == [b"q1"]
    assert figures.rest["counts"]["available"] == 1 and figures.rest["totals"]["pushed"] == 1
    assert figures.rest["paused"] == 0


def test_no_queues_needs_no_batch(broker):
    batches = broker.writer.batches
    figures = broker.admin.figures()
    assert figures.queues == {} and figures.queue_count == 3 and figures.totals["pushed"] == 4
    assert broker.writer.pending() == 0 and broker.writer.batches == batches
