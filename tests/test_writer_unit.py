"""The writer's group commit on a real ezra.db, without a server: what one loop turn submits commits as
one transaction, and a durable request is answered only after an fsync that began after its commit."""

from __future__ import annotations

import gevent

from ezra.broker import Broker
from ezra.config import Settings
from ezra.storage import open_database
from ezra.protocol.task_fields import stored
from support_queue import queue_counts, submit_broken_request
from ezra.broker.waiters import Claim
from support_broker import push_one, claim_committed


def open_broker(tmp_path, durability="full") -> Broker:
    return Broker(open_database(str(tmp_path / "data")), Settings(data_dir=str(tmp_path), durability=durability))


def test_pushes_of_one_loop_turn_commit_together(tmp_path):
    broker = open_broker(tmp_path)
    writer = broker.writer
    producers, pushes_each = 20, 30

    def producer(n: int) -> list[bytes]:
        return [push_one(broker, b"jobs", stored([b"n", b"%d-%d" % (n, i)])) for i in range(pushes_each)]

    try:
        batches_before = writer.batches
        greenlets = [gevent.spawn(producer, n) for n in range(producers)]
        gevent.joinall(greenlets, raise_error=True)
        ids = [task_id for greenlet in greenlets for task_id in greenlet.value]
        assert len(set(ids)) == producers * pushes_each
        # Each turn, every producer pushes once: one commit (and one fsync) per turn.
        assert writer.batches - batches_before == pushes_each
        assert writer.fsyncs == pushes_each
        assert queue_counts(broker)[b"jobs"]["available"] == producers * pushes_each
    finally:
        broker.stop()
        broker.db.close()


def test_a_durable_reply_waits_for_its_fsync_a_read_does_not_need_one(tmp_path):
    broker = open_broker(tmp_path)
    writer = broker.writer
    try:
        request = broker.tasks.push(b"jobs", [stored([b"f", b"v"])])
        assert writer.pending() == 1 and writer.fsyncs == 0  # runs at once; commits at the turn's end
        assert request.wait()[0].endswith(b"-0")
        assert writer.fsyncs == 1
        assert broker.tasks.length(b"jobs", False).wait() == 1
        assert writer.fsyncs == 1  # a read's batch commits without an fsync
    finally:
        broker.stop()
        broker.db.close()


def test_a_failed_request_rolls_back_its_whole_batch(tmp_path):
    broker = open_broker(tmp_path, durability="normal")
    try:
        first = broker.tasks.push(b"jobs", [stored([b"f", b"v"])])
        submit_broken_request(broker)
        try:
            first.wait()
        except Exception as exc:
            assert "storage error" in str(exc)
        else:
            raise AssertionError("a request of the rolled-back batch was answered")
        assert broker.tasks.length(b"jobs", False).wait() == 0
        assert push_one(broker, b"jobs", stored([b"f", b"v"]))  # the next turn starts afresh
        assert broker.tasks.length(b"jobs", False).wait() == 1
    finally:
        broker.stop()
        broker.db.close()


def test_a_blocked_read_whose_batch_rolled_back_is_not_left_waiting(tmp_path):
    # XREADGROUP BLOCK ... CLAIM registers its waiter inside the batch; when a broken request
    # in the same turn rolls the batch back, the reader gets the error and nobody waits. Its
    # registration went with it: before, the next push leased its task to that reader, whom
    # no reply ever reached (the task came back only after the visibility timeout).
    broker = open_broker(tmp_path, durability="normal")
    try:
        push_one(broker, b"jobs", stored([b"f", b"v"]))
        claimed = claim_committed(broker, [b"jobs"], b"w1", 1, False)
        assert claimed and queue_counts(broker)[b"jobs"]["in_flight"] == 1

        def blocked_read():
            return broker.claim(Claim([b"jobs"], b"w2", 1, False, claim_idle=60_000), wait=True)

        reader = gevent.spawn(blocked_read)
        gevent.sleep(0)  # the reader's batch is open and it waits for the commit
        submit_broken_request(broker)
        reader.join(5)
        assert reader.ready() and "storage error" in str(reader.exception)
        push_one(broker, b"jobs", stored([b"f", b"v2"]))
        assert queue_counts(broker)[b"jobs"] == dict(queue_counts(broker)[b"jobs"], available=1, in_flight=1)
    finally:
        broker.stop()
        broker.db.close()


def test_the_checkpoint_look_comes_at_the_first_batch_where_one_could_start(tmp_path):
    """The writer looks whether to checkpoint only at some batches (Writer._next_look): from any
    point after the last checkpoint, the next look must be the first batch at which the rule
    (every CHECKPOINT_EVERY_BATCHES, or a WAL over its limit every WAL_SIZE_EVERY batches from
    CHECKPOINT_MIN_BATCHES) could start one, neither later (a missed checkpoint) nor earlier."""
    from ezra.writer.writer import CHECKPOINT_EVERY_BATCHES, CHECKPOINT_MIN_BATCHES, WAL_SIZE_EVERY

    def could_start(since: int) -> bool:
        return since >= CHECKPOINT_EVERY_BATCHES or (since >= CHECKPOINT_MIN_BATCHES and since % WAL_SIZE_EVERY == 0)

    broker = open_broker(tmp_path)
    writer = broker.writer
    try:
        for since in range(CHECKPOINT_EVERY_BATCHES + 3):
            # The first batch numbered `_next_look` or more looks: how many since the last, then.
            looked_at = max(writer._next_look(since), writer.batches + 1) - writer.batches + since
            assert looked_at == next(later for later in range(since + 1, since + 1000) if could_start(later)), since
    finally:
        broker.stop()
        broker.db.close()
