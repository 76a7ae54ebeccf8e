"""Celery on EZRA, at the path users type: `import ezra.celery`, `broker_transport = "ezra.celery:Transport"`.

The transport is ezra/adapters/celery.py; importing this module registers ezra:// and ezras://
with kombu, as importing that one does.
"""

from .adapters.celery import Channel, QoS, Transport

__all__ = ["Channel", "QoS", "Transport"]
