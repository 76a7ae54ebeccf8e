"""Issue 4's rules without a server: backoff, settings, and the reaper moved through time.

The broker's verbs run here on a real ezra.db with a clock the test sets, so delays,
backoff, retention and TTL are checked by moving time, not waiting.
"""

from __future__ import annotations

import pytest

from ezra import lifecycle
from ezra.settings import queue_settings
from ezra.protocol import stream_ids
from ezra.errors import CommandError
from ezra.lifecycle import AVAILABLE, DEAD, DELAYED, EXPONENTIAL, FAIL, FIXED, SILENT
from ezra.protocol.task_fields import stored
from support_queue import submit_broken_request
from support_broker import push_one, claim_committed

# ---------------------------------------------------------------- pure rules


@pytest.mark.parametrize("policy, attempts, seconds", [
    ((FIXED, 5.0, 5.0), 1, 5.0),
    ((FIXED, 5.0, 5.0), 9, 5.0),
    ((EXPONENTIAL, 1.0, 60.0), 1, 1.0),
    ((EXPONENTIAL, 1.0, 60.0), 2, 2.0),
    ((EXPONENTIAL, 1.0, 60.0), 4, 8.0),
    ((EXPONENTIAL, 1.0, 60.0), 7, 60.0),
    ((EXPONENTIAL, 1.0, 60.0), 10_000, 60.0),
])
def test_retry_delay(policy, attempts, seconds):
    assert lifecycle.retry_delay(policy, attempts) == seconds


def test_retry_state():
    backoff = (FIXED, 0.5, 0.5)
    assert lifecycle.retry_state(AVAILABLE, 1, FAIL, backoff, now=1000) == (DELAYED, 1501)
    assert lifecycle.retry_state(AVAILABLE, 1, SILENT, backoff, now=1000) == (AVAILABLE, 1000)
    assert lifecycle.retry_state(DEAD, 3, FAIL, backoff, now=1000) == (DEAD, 1000)
    assert lifecycle.retry_state(AVAILABLE, 1, FAIL, lifecycle.NO_BACKOFF, now=1000) == (AVAILABLE, 1000)


@pytest.mark.parametrize("nacked_at", [1000.0, 1000.3, 1000.999])
def test_a_retry_never_comes_before_its_backoff(nacked_at):
    """The server's clock reads whole ms rounded down (broker/clock.py): a task nacked at
    1000.999 ms reads 1000. Whatever part of that ms was gone, the first clock reading at which
    the retry is due must be at least the whole backoff after the nack (CI saw 0.59997 s for a
    0.6 s backoff when the due time was now + 600)."""
    backoff = (FIXED, 0.6, 0.6)
    _, due = lifecycle.retry_state(AVAILABLE, 1, FAIL, backoff, now=int(nacked_at))
    first_due_reading = float(due)  # the clock reads `due` from the instant due.000 ms
    assert first_due_reading - nacked_at >= 600


def test_idmp_auto_iid_ignores_field_order_only():
    iid = lifecycle.idmp_auto_iid([b"a", b"1", b"b", b"2"])
    assert iid == lifecycle.idmp_auto_iid([b"b", b"2", b"a", b"1"])
    assert iid != lifecycle.idmp_auto_iid([b"a", b"2", b"b", b"1"])
    assert lifecycle.idmp_auto_iid([b"ab", b"c"]) != lifecycle.idmp_auto_iid([b"a", b"bc"])


def test_settings_parse_to_stored_values():
    assert queue_settings.parse([b"visibility-timeout", b"0.5", b"BACKOFF", b"exponential", b"1", b"60",
                                 b"RETENTION", b"FOREVER", b"RELEASE-ON-DISCONNECT", b"OFF",
                                 b"MAX-ATTEMPTS", b"DEFAULT"]) == {
        "visibility_timeout": 0.5, "backoff": "exponential 1 60", "retention_seconds": -1.0,
        "release_on_disconnect": -1.0, "max_attempts": None}
    assert queue_settings.backoff_policy("exponential 1 60") == (EXPONENTIAL, 1.0, 60.0)
    assert queue_settings.parse_queue_line("emails MAX-ATTEMPTS 5") == (b"emails", {"max_attempts": 5})
    with pytest.raises(ValueError, match="syntax error"):
        queue_settings.parse_queue_line("emails MAX-ATTEMPTS 5 RETENTION")
    with pytest.raises(CommandError):
        queue_settings.parse([b"RETENTION", b"-1"])


# ---------------------------------------------------------------- the broker, moved through time

@pytest.fixture
def broker(clocked_broker):
    return clocked_broker


def push(broker, fields=(b"a", b"1"), delay_ms=0, ttl_ms=None) -> bytes:
    return push_one(broker, b"q", stored(list(fields)), delay_ms=delay_ms, ttl_ms=ttl_ms)


def claim(broker, queue=b"q", worker=b"w"):
    result = claim_committed(broker, [queue], worker, 10, False)
    return [stream_ids.format_id(row[:2]) for row in result[queue]] if result else []  # plain rows (issue 25)


def fail(broker, task_id: bytes) -> None:
    broker.tasks.fail(b"q", [stream_ids.parse_id(task_id)]).wait()


def reaper_pass(broker) -> None:
    """One pass of the reaper, as its loop runs it."""
    broker.reaper.maintain()


def test_a_delayed_task_comes_due_on_the_reapers_pass(broker):
    task_id = push(broker, delay_ms=5000)
    assert claim(broker) == [] and broker.queues[b"q"].counts[DELAYED] == 1
    broker.clock_.now += 5000  # the push's ms may have been all but gone: 1 ms more
    reaper_pass(broker)
    assert claim(broker) == []
    broker.clock_.now += 1
    reaper_pass(broker)
    assert claim(broker) == [task_id]


@pytest.mark.parametrize("pushed_at", [1000.0, 1000.3, 1000.999])
def test_a_delayed_task_never_comes_before_its_delay(pushed_at):
    """XADD DELAY, as the backoff above: the clock reads whole ms rounded down, so the first
    reading at which the task is due must be at least the whole delay after the push."""
    assert float(lifecycle.due_after(int(pushed_at), 600)) - pushed_at >= 600


def test_the_reaper_runs_no_query_before_anything_is_due(broker, monkeypatch):
    push(broker, delay_ms=60_000)
    reaper_pass(broker)  # the first pass looks at everything once
    broker.clock_.now += 100
    for name in ("promote_due", "next_due"):
        monkeypatch.setattr(broker.db, name, lambda *a, name=name: pytest.fail(f"{name} queried"))
    for name in ("expired", "next_deadline"):  # the leases in memory (broker/in_flight.py)
        monkeypatch.setattr(broker.in_flight, name, lambda *a, name=name: pytest.fail(f"{name} looked at"))
    for name in ("purge_done", "mark_retained", "purge_expired_ttl"):
        monkeypatch.setattr(broker.db.retention, name, lambda *a, name=name: pytest.fail(f"{name} queried"))
    reaper_pass(broker)


def test_backoff_then_dead(broker):
    broker.admin.configure(b"q", {"backoff": "exponential 1 60", "max_attempts": 3}).wait()
    task_id = push(broker)
    for attempt, wait_ms in ((1, 1000), (2, 2000)):
        assert claim(broker) == [task_id]
        fail(broker, task_id)
        broker.clock_.now += wait_ms  # the nack's ms may have been all but gone: 1 ms more
        reaper_pass(broker)
        assert claim(broker) == [], f"retry {attempt} came early"
        broker.clock_.now += 1
        reaper_pass(broker)
    assert claim(broker) == [task_id]
    fail(broker, task_id)
    assert broker.queues[b"q"].counts[DEAD] == 1


def test_retention_and_ttl_purge_by_the_clock(broker):
    broker.admin.configure(b"q", {"retention_seconds": 10.0}).wait()
    plain = push(broker)
    short = push(broker, (b"b", b"2"), ttl_ms=2000)
    claim(broker)
    broker.tasks.ack(b"q", [stream_ids.parse_id(plain), stream_ids.parse_id(short)]).wait()
    broker.clock_.now += 2000
    reaper_pass(broker)
    assert broker.queues[b"q"].counts[lifecycle.DONE] == 1  # the TTL task went first
    broker.clock_.now += 8000
    reaper_pass(broker)
    assert broker.queues[b"q"].counts[lifecycle.DONE] == 1  # kept for exactly 10 s ...
    broker.clock_.now += 1
    reaper_pass(broker)
    assert broker.queues[b"q"].counts[lifecycle.DONE] == 0  # ... and no longer
    assert broker.queues[b"q"].deleted == 2


def test_counters_since_start_survive_a_rollback(broker):
    """After a rolled-back batch the caches are rebuilt from the file; the per-queue event
    counters (metrics, INFO) are not in the file and must not drop to zero."""
    push(broker)
    claim(broker)
    rolled_back = broker.tasks.push(b"q", [stored([b"a", b"2"])])  # runs now, commits at the turn's end...
    submit_broken_request(broker)  # ...but a broken request in the same turn rolls the batch back
    with pytest.raises(CommandError, match="storage error"):
        rolled_back.wait()
    totals = broker.queues[b"q"].totals
    assert (totals["pushed"], totals["delivered"]) == (2, 1)  # the rolled-back push was counted
    assert broker.queues[b"q"].counts[AVAILABLE] == 0  # ...but the counts come from the file
