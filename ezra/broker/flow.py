"""Flow control: how many tasks of a queue a claim may hand out now.

    XCFGSET q MAX-IN-FLIGHT n         at most n tasks of q leased at once, all workers together
    XCFGSET q RATE-LIMIT n seconds    at most n tasks of q handed out in any window of that length

A queue with neither has no Flow (QueueState.flow is None) and its claims pay one test for it.
A queue with either has one, and every claim of it asks `room(in_flight, now)`: the cap's room
(n minus the tasks in flight) and the rate's (n minus those handed out within the last `seconds`),
whichever is smaller. The claim route (Transitions.claim_rows, which XREADGROUP '>' and the
blocked workers' service both take, and Claims.nothing_to_claim between batches) asks it, and
records what it handed out with `handed_out`.

The rate's window slides, and is exact: it keeps the times of the last n hand-outs (a claim of
several at one ms is one entry), so "5 per second" never lets 9 out in one second, as a bucket
that refills continuously would. Every hand-out counts: redeliveries, NOACK claims, and
take-overs of a task another worker held (XCLAIM, XAUTOCLAIM, XREADGROUP CLAIM), which the rate
limits too. The cap does not limit take-overs: the task is in flight already, and stays so.
A worker renewing its own lease (XCLAIM by the owner, XREADGROUP with an id) hands nothing out.

The window lives in memory: a restart starts it empty (as it makes every task in flight
available again). A rollback keeps it (QueueState.set_flow): it counts the hand-outs the
rolled-back batch made, which only holds the queue back a little longer.
"""

from __future__ import annotations

import math
from collections import deque

FLOW_COLUMNS = ("max_in_flight", "rate_limit_count", "rate_limit_seconds")  # the queues table's
UNLIMITED = 1 << 62  # room where no limit applies

# What holds a queue back now (QueueState.held_back): INFO, /metrics, the dashboard.
PAUSED, CAP, RATE = "paused", "cap", "rate limit"


class Flow:
    """A queue's MAX-IN-FLIGHT and RATE-LIMIT, and the times of its last hand-outs."""

    __slots__ = ("cap", "rate", "window_ms", "times", "recent")

    def __init__(self, cap: int | None, rate: int | None, seconds: float | None, before: "Flow | None" = None):
        self.cap = cap
        self.rate = rate
        # Whole ms, rounded up: the server's clock counts ms, and a shorter window would let more out.
        self.window_ms = None if rate is None else math.ceil(seconds * 1000)
        self.times = deque()  # [ms, how many] per claim, oldest first
        self.recent = 0       # the hand-outs in `times`
        if before is not None and rate is not None:  # new settings keep the hand-outs already made
            self.times, self.recent = before.times, before.recent

    def room(self, in_flight: int, now: int) -> int:
        """How many tasks a claim may hand out now (0: none)."""
        room = UNLIMITED if self.cap is None else self.cap - in_flight
        if self.rate is not None:
            room = min(room, self.rate_room(now))
        return room if room > 0 else 0

    def rate_room(self, now: int) -> int:
        """How many the rate lets out now (UNLIMITED without one)."""
        if self.rate is None:
            return UNLIMITED
        times, since = self.times, now - self.window_ms
        while times and times[0][0] <= since:  # out of the window now
            self.recent -= times.popleft()[1]
        return self.rate - self.recent

    def handed_out(self, n: int, now: int) -> bool:
        """n tasks were handed out at `now`; True if that filled the rate's window (see `opens_at`)."""
        if self.rate is None or n <= 0:
            return False
        times = self.times
        if times and times[-1][0] == now:
            times[-1][1] += n
        else:
            times.append([now, n])
        self.recent += n
        return self.recent >= self.rate

    def opens_at(self, now: int) -> int | None:
        """When the window lets the next task out, if it is full now (ms); None if it is not."""
        if self.rate is None or self.rate_room(now) > 0:
            return None
        # Entries leave oldest first: room comes back when enough of them have left.
        over, left = self.recent - self.rate, 0
        for at, n in self.times:
            left += n
            if left > over:
                return at + self.window_ms
        return None

    def held_back(self, in_flight: int, now: int) -> str | None:
        """CAP or RATE if that limit allows no hand-out now, else None."""
        if self.cap is not None and in_flight >= self.cap:
            return CAP
        if self.rate is not None and self.rate_room(now) <= 0:
            return RATE
        return None


def flow_of(cap: int | None, rate: int | None, seconds: float | None, before: Flow | None) -> Flow | None:
    """The Flow these settings make (None: neither is set), keeping `before`'s hand-outs."""
    if cap is None and rate is None:
        return None
    return Flow(cap, None if seconds is None else rate, seconds, before)
