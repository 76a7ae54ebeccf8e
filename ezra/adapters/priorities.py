"""XADD PRIORITY as the frameworks' adapters give it: 0 to 9, 0 served first, 5 without one.

The server's lifecycle.PRIORITIES and DEFAULT_PRIORITY, repeated here because the client side
imports nothing of the server (tests/test_frameworks_taskiq.py checks they agree)."""

PRIORITIES = range(10)
DEFAULT_PRIORITY = 5


def clamped(priority: int) -> list:
    """XADD's PRIORITY option for an integer, brought into 0-9."""
    return ["PRIORITY", str(min(max(priority, PRIORITIES[0]), PRIORITIES[-1]))]
