"""A Dramatiq app on ezra.dramatiq.EzraBroker: `dramatiq dramatiq_app`; produce*() push.

Environment: EZRA_PORT, QUEUE (the actors' queue); PASSWORD (in the URL); SLOW (overrides
the seconds of `work`, for a rerun); RESULTS=1 (the Results middleware on ezra.dramatiq.EzraBackend).
"""

import os
import time

import dramatiq

from common import PORT, QUEUE, line, report
from ezra.dramatiq import EzraBroker

password = os.environ.get("PASSWORD")
dramatiq.set_broker(EzraBroker(url=f"redis://{':' + password + '@' if password else ''}127.0.0.1:{PORT}"))
if os.environ.get("RESULTS") == "1":
    from dramatiq.results import Results
    from ezra.dramatiq import EzraBackend
    dramatiq.get_broker().add_middleware(Results(backend=EzraBackend(url=f"redis://127.0.0.1:{PORT}")))


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


@dramatiq.actor(queue_name=QUEUE, max_retries=0, priority=-10)
def urgent(n):
    line("DONE", n)


@dramatiq.actor(queue_name=QUEUE, max_retries=0, priority=2)
def later(n):
    line("DONE", n)


def produce_priorities():
    """Tasks 0-4 with dramatiq priorities 0 (the default), -10 and 2 (their actors'), -2 and 100
    (send_with_options); task 5's priority "x" is refused at send."""
    work.send(0)
    urgent.send(1)
    later.send(2)
    work.send_with_options(args=(3,), priority=-2)
    work.send_with_options(args=(4,), priority=100)
    refused = {}
    try:
        work.send_with_options(args=(5,), priority="x")
    except ValueError as exc:
        refused[5] = str(exc)
    report(pushed=5, refused=refused)


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


@dramatiq.actor(queue_name=QUEUE, max_retries=0, **({"store_results": True} if os.environ.get("RESULTS") == "1" else {}))
def square(n, seconds=0.0):
    line("START", n)
    time.sleep(seconds)
    if n < 0:
        raise ValueError(f"no square of {n}")
    line("DONE", n)
    return n * n


def send_squares(numbers, seconds=0.0):
    """square(n) for each: the messages (as dicts), to read their results with."""
    report(messages=[square.send(n, seconds).asdict() for n in numbers])


def results(messages, block=True, timeout=60000):
    """message.get_result() of each: the value, or the error's type and text."""
    from dramatiq import Message
    out = []
    for fields in messages:
        try:
            out.append(Message(**fields).get_result(block=block, timeout=timeout))
        except Exception as exc:  # ResultFailure, ResultMissing, ResultTimeout: reported
            out.append(f"{type(exc).__name__}: {exc}")
    report(results=out)
