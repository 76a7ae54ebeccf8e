"""Progress of a long copy (ezra export / import), on stderr.

On a terminal: one bar redrawn in place, a few times a second. Elsewhere (a log file,
CI, a pipe): a plain line every `interval` seconds, so a long run shows it is alive
without filling the log. No dependency: a bar is a line of text.
"""

from __future__ import annotations

import sys
import time

BAR_WIDTH = 30
REDRAW_EVERY = 0.1  # seconds between two redraws of the bar
LINE_EVERY = 10.0   # seconds between two plain lines


class Progress:
    """`advance(n)` as work is done, `finish()` at the end; `total` may be an estimate."""

    def __init__(self, label: str, total: int, stream=None, interval: float = LINE_EVERY, clock=time.monotonic):
        self.label = label
        self.total = max(total, 0)
        self.stream = sys.stderr if stream is None else stream
        self.tty = self.stream.isatty()
        self.interval = REDRAW_EVERY if self.tty else interval
        self.clock = clock
        self.started = self.shown_at = clock()
        self.done = 0
        self.drawn = False

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = self.clock()
        if now - self.shown_at >= self.interval:
            self.shown_at = now
            self._show(now)

    def finish(self) -> None:
        """Close the bar (a terminal) with its final figures; nothing more on a plain stream."""
        if self.tty and self.drawn:
            self._show(self.clock())
            self.stream.write("\n")
            self.stream.flush()

    def text(self, now: float) -> str:
        """`label [#####.....] 45% 4500/10000 tasks, 900/s` (no bar on a plain line)."""
        total = max(self.total, self.done)  # an estimate can be passed
        share = self.done / total if total else 1.0
        seconds = now - self.started
        rate = f", {self.done / seconds:,.0f}/s" if seconds > 0 else ""
        figures = f"{share:4.0%} {self.done:,}/{total:,} tasks{rate}"
        if not self.tty:
            return f"{self.label}: {figures}"
        filled = int(share * BAR_WIDTH)
        return f"{self.label} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {figures}"

    def _show(self, now: float) -> None:
        if self.tty:
            self.stream.write("\r" + self.text(now) + "\033[K")  # erase what a longer line left
            self.drawn = True
        else:
            self.stream.write(self.text(now) + "\n")
        self.stream.flush()
