"""Celery on EZRA, at the path users type: `import ezra.celery`, `broker_transport = "ezra.celery:Transport"`.

The transport is ezra/adapters/celery.py; importing this module registers ezra:// and ezras://
with kombu, as importing that one does, and ezra:// as Celery's result backend
(ezra/adapters/celery_results.py).
"""

from importlib.util import find_spec

from .adapters.celery import Channel, QoS, Transport

__all__ = ["Channel", "QoS", "Transport"]
if find_spec("celery") is not None:  # kombu without Celery (a plain kombu consumer) has no results
    from .adapters.celery_results import ResultBackend
    __all__.append("ResultBackend")
