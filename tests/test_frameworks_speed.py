"""The shipped Dramatiq and taskiq brokers' work per task (issue 23's bench rows), counted, not timed.

The probes (tests/frameworks/speed_probe.py) run in build/venv-frameworks against a real
EZRA and count what the brokers send and make: a read of queued tasks without BLOCK after
a read that filled the prefetch, a connection of its own for each Dramatiq thread (no
redis-py pool check-out per command), and one redis-py client for all of taskiq's pushes
and acks (RedisStreamBroker makes one per push and per ack). How fast that makes them is
scripts/bench.py's (BENCHMARKS.md, issue 23).
"""

from __future__ import annotations

import pytest

from frameworks.harness import app_env, counts, produce, python  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # the frameworks' venv


@pytest.fixture
def ezra(ezra_factory):
    """A server of the test's own: the probe counts the blocked clients on it."""
    return ezra_factory()


def test_dramatiq_reads_queued_tasks_without_block_and_blocks_on_an_empty_queue(ezra, queue, python):
    """20 queued tasks, prefetch 8: reads of up to 8; after a full read the next has no BLOCK
    (EZRA sets up no blocked reader for tasks already there); the read after a short one blocks,
    and a push while it blocks answers it. Every task is taken once and acked."""
    summary = produce(python, "speed_probe", "dramatiq_reads(20, 8)", app_env(ezra, queue))
    assert summary["taken"] == list(range(20)) and summary["late"] == 20, summary
    reads = summary["queued_reads"]
    assert sum(read["got"] for read in reads) == 20, reads
    assert all(read["count"] <= 8 for read in reads), reads
    assert reads[0]["block"], "the first read knows nothing of the queue: it blocks"
    for previous, read in zip(reads, reads[1:]):
        assert read["block"] == (previous["got"] < previous["count"]), reads
    assert [read["block"] for read in summary["empty_reads"]][-1], summary["empty_reads"]
    assert summary["empty_reads"][-1]["got"] == 1, summary["empty_reads"]
    client = ezra.client()
    assert counts(client, queue) == {"available": 0, "delayed": 0, "in-flight": 0, "done": 21, "dead": 0}
    client.close()


def test_dramatiq_pushes_reads_and_acks_check_nothing_out_of_a_pool(ezra, queue, python):
    """50 pushes, then 50 tasks taken and acked: each thread's own connection (and the
    consumer's for its reads), so no pool check-out per command (62be3ec: one per command)."""
    summary = produce(python, "speed_probe", "dramatiq_checkouts(50)", app_env(ezra, queue))
    assert summary["checkouts_for_pushes"] == 0 and summary["checkouts_for_reads_and_acks"] == 0, summary
    client = ezra.client()
    assert counts(client, queue) == {"available": 0, "delayed": 0, "in-flight": 0, "done": 51, "dead": 0}
    client.close()


def test_taskiq_pushes_and_acks_share_one_client(ezra, queue, python):
    """50 kiq() and 50 acks through EzraStreamBroker, one at a time, make no redis-py client and
    check no connection out of the pool each (taskiq-redis's kick and ack do both per call:
    50 and 50); 20 more pushed and acked at once; every task is acked on EZRA."""
    summary = produce(python, "speed_probe", "taskiq_clients(50)", app_env(ezra, queue))
    assert summary["clients_for_pushes"] == 0 and summary["clients_for_acks"] == 0, summary
    assert summary["checkouts_for_pushes"] == 0 and summary["checkouts_for_acks"] == 0, summary
    client = ezra.client()
    assert counts(client, queue) == {"available": 0, "delayed": 0, "in-flight": 0, "done": 71, "dead": 0}
    client.close()
