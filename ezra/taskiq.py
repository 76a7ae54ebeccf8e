"""taskiq on EZRA, at the path users type: `from ezra.taskiq import EzraStreamBroker`.

The broker is ezra/adapters/taskiq.py.
"""

from .adapters.taskiq import EzraStreamBroker

__all__ = ["EzraStreamBroker"]
