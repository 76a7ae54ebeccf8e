"""taskiq on EZRA, at the path users type: `from ezra.taskiq import EzraStreamBroker`.

The broker is ezra/adapters/taskiq.py; the result backend, EzraResultBackend, is
ezra/adapters/taskiq_results.py.
"""

from .adapters.taskiq import EzraResultBackend, EzraStreamBroker

__all__ = ["EzraResultBackend", "EzraStreamBroker"]
