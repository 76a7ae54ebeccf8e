"""Dramatiq on EZRA, at the path users type: `from ezra.dramatiq import EzraBroker`.

The broker is ezra/adapters/dramatiq.py; the Results middleware's backend, EzraBackend, is
ezra/adapters/dramatiq_results.py.
"""

from .adapters.dramatiq import EzraBackend, EzraBroker, EzraConsumer, EzraMessage

__all__ = ["EzraBackend", "EzraBroker", "EzraConsumer", "EzraMessage"]
