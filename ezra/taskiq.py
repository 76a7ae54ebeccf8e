"""taskiq on EZRA, at the path users type: `from ezra.taskiq import EzraStreamBroker`.

The broker is ezra/adapters/taskiq.py; the result backend, EzraResultBackend, is
ezra/adapters/taskiq_results.py.
"""

from .adapters.taskiq import EzraStreamBroker
from .adapters.taskiq_results import EzraResultBackend

__all__ = ["EzraResultBackend", "EzraStreamBroker"]
