"""A histogram cheap enough for the commit path: fixed buckets, plain counters.

The writer observes every batch, so this avoids prometheus_client's locks and
objects on the hot path; /metrics exports the counts at scrape time.
"""

from __future__ import annotations

from bisect import bisect_left


class Histogram:
    """Counts of observed values per bucket (upper bounds, inclusive) and their sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, int]]:
        """[(upper bound as Prometheus writes it, observations <= it), ..., ("+Inf", all)]."""
        total, buckets = 0, []
        for bound, count in zip((*self.bounds, float("inf")), self.counts):
            total += count
            buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), total))
        return buckets


# Requests per committed batch (group commit), and seconds per commit / per WAL fsync.
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
SECONDS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
