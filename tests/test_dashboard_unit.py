"""The dashboard's throughput history (unit): rates per interval, idle queues cost nothing."""

from __future__ import annotations

from types import SimpleNamespace

import ezra.web.dashboard as dashboard
from ezra.web.dashboard import History


def queue(pushed=0, acked=0):
    return SimpleNamespace(totals={"pushed": pushed, "acked": acked})


def test_rates_per_interval_and_only_moving_queues_are_kept(monkeypatch):
    clock = iter([100.0, 105.0, 110.0, 115.0])
    monkeypatch.setattr(dashboard.time, "monotonic", lambda: next(clock))
    broker = SimpleNamespace(queues={b"busy": queue(), **{b"idle-%d" % n: queue() for n in range(1000)}})
    history = History(broker)
    history.sample()
    broker.queues[b"busy"].totals.update(pushed=50, acked=20)
    history.sample()
    broker.queues[b"busy"].totals.update(acked=45)
    broker.queues[b"new"] = queue(pushed=5)  # a queue created between samples
    history.sample()
    history.sample()  # nothing moved
    assert history.rates(b"busy") == [(10.0, 4.0), (0.0, 5.0), (0.0, 0.0)]
    assert history.rates(b"new") == [(0.0, 0.0), (1.0, 0.0), (0.0, 0.0)]
    assert history.rates(b"idle-7") == [(0.0, 0.0)] * 3
    assert [sorted(moved) for _, moved in history.intervals] == [[b"busy"], [b"busy", b"new"], []]


def test_the_window_is_bounded(monkeypatch):
    ticks = iter(range(10_000))
    monkeypatch.setattr(dashboard.time, "monotonic", lambda: float(next(ticks)))
    broker = SimpleNamespace(queues={b"q": queue()})
    history = History(broker)
    for n in range(dashboard.SAMPLES * 3):
        broker.queues[b"q"].totals["pushed"] = n
        history.sample()
    assert len(history.rates(b"q")) == dashboard.SAMPLES - 1
