"""Celery on EZRA, at the path users type: `import ezra.celery`, `broker_transport = "ezra.celery:Transport"`.

The transport is ezra/adapters/celery.py; importing this module registers ezra:// and ezras://
with kombu, as importing that one does, and ezra:// as Celery's result backend
(ezra/adapters/celery_results.py).
"""

from .adapters.celery import Channel, QoS, ResultBackend, Transport

__all__ = ["Channel", "QoS", "ResultBackend", "Transport"]
