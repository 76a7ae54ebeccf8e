"""Dramatiq on EZRA, at the path users type: `from ezra.dramatiq import EzraBroker`.

The broker is ezra/adapters/dramatiq.py.
"""

from .adapters.dramatiq import EzraBroker, EzraConsumer, EzraMessage

__all__ = ["EzraBroker", "EzraConsumer", "EzraMessage"]
