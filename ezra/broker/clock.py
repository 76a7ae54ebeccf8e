"""The server's clock: ms since the epoch that the system clock's steps do not move.

It reads the system (wall) clock once, at start, and from then on adds the time elapsed, as
the kernel counts it (CLOCK_BOOTTIME: monotonic, and counting a suspend, so it keeps pace with
the wall clock through one). Leases, delays, backoff, rate windows, retention, idle times and
the tasks' ids all read it: a step of the system clock back (NTP correcting a fast clock) or
forward changes no duration, and no lease waits for the clock to come round again. What it
records (a task's push, its due time) is stored as ms since the epoch and read again by the
next start, which takes the wall clock afresh.

Schedules are wall-clock times by nature (02:30 in Paris), so they read `wall` instead, and
the Scheduler (schedules.py) sees the system clock step by comparing the two.
"""

from __future__ import annotations

import time
from functools import partial

# Seconds from an arbitrary start; a partial, not a def: no Python frame per reading.
elapsed_seconds = partial(time.clock_gettime, time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") \
    else time.monotonic


class ServerClock:
    """`now()`: the server's time (ms); `wall()`: the system clock's (ms)."""

    def __init__(self, wall=None, elapsed=elapsed_seconds):
        wall = wall or time.time  # looked up now: a test may have replaced time.time
        origin = wall() - elapsed()

        def now() -> int:  # a closure: the parts call it once or more per command
            return int((elapsed() + origin) * 1000)

        self.now = now
        self._wall = wall

    def wall(self) -> int:
        return int(self._wall() * 1000)
