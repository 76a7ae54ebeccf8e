"""A Dramatiq app on ezra.dramatiq.EzraBroker: `dramatiq dramatiq_app`; produce*() push.

Environment: EZRA_PORT, QUEUE (the actors' queue); PASSWORD (in the URL); SLOW (overrides
the seconds of `work`, for a rerun).
"""

import os
import time

import dramatiq

from common import PORT, QUEUE, line, report
from ezra.dramatiq import EzraBroker

password = os.environ.get("PASSWORD")
dramatiq.set_broker(EzraBroker(url=f"redis://{':' + password + '@' if password else ''}127.0.0.1:{PORT}"))


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def work(n, seconds=0.0):
    line("START", n)
    time.sleep(float(os.environ.get("SLOW", seconds)))
    line("DONE", n)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def on_time(n, eta):
    """Prints how late it started against the time it was due (ms)."""
    line("LATE", int((time.time() - eta) * 1000))
    line("DONE", n)


@dramatiq.actor(queue_name=QUEUE, max_retries=2, min_backoff=100, max_backoff=200)
def always_fails(n):
    line("START", n)
    raise RuntimeError(f"task {n} always fails")


def produce(n, seconds=0.0, first=0):
    for i in range(first, first + n):
        work.send(i, seconds)
    report(pushed=n)


def produce_delayed(n, delay_ms):
    for i in range(n):
        on_time.send_with_options(args=(i, time.time() + delay_ms / 1000), delay=delay_ms)
    report(pushed=n)


def produce_failing(n):
    for i in range(n):
        always_fails.send(i)
    report(pushed=n)
