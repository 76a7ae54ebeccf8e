"""Durations as people read them, for the dashboard and `ezra stats` / `ezra ls`."""

from __future__ import annotations


def duration(ms: float) -> str:
    """'3.2 s', '4 min 10 s', '2 h 5 min', '3 d 4 h' (negative counts as 0)."""
    seconds = max(ms, 0) / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"
    return f"{int(seconds // 86400)} d {int(seconds % 86400 // 3600)} h"
