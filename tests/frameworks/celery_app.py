"""A Celery app on ezra.celery: `celery -A celery_app worker`; produce.py-style calls push.

Environment: EZRA_PORT, QUEUE; PASSWORD (in the URL); TLS_CA (ezras://, verified with it); STYLE=setting (broker_transport, no
import) or import (the default: `import ezra.celery`, broker="ezra://..."); ACKS_LATE=1
(acks_late, task_reject_on_worker_lost, task_acks_on_failure_or_timeout=False); VT (the
visibility_timeout transport option); SLOW (overrides the seconds of `work`, for a rerun);
RESULTS=1 (result_backend: the same URL, results in EZRA; RESULT_EXPIRES: result_expires).
BROKER_URL: another broker (redis://...), the results staying in EZRA with RESULTS=1; RESULT_URL:
another result backend (redis://...) with RESULTS=1.
Each run of Celery's celery.chord_unlock prints "UNLOCK 0 <pid>".
"""

import json
import os
import time

from celery import Celery
from celery.signals import task_prerun

from common import PORT, QUEUE, line, report

password = os.environ.get("PASSWORD")
scheme = "ezras" if os.environ.get("TLS_CA") else "ezra"
url = f"{scheme}://{':' + password + '@' if password else ''}127.0.0.1:{PORT}"
if os.environ.get("STYLE") == "setting":
    app = Celery("celery_app")
    app.conf.broker_url = url
    app.conf.broker_transport = "ezra.celery:Transport"
else:
    import ezra.celery  # noqa: F401  registers ezra:// with kombu
    app = Celery("celery_app", broker=os.environ.get("BROKER_URL", url))

app.conf.task_default_queue = QUEUE
if os.environ.get("RESULTS") == "1":
    app.conf.result_backend = url if os.environ.get("STYLE") != "setting" else "ezra.celery:ResultBackend+" + url
    app.conf.result_backend = os.environ.get("RESULT_URL", app.conf.result_backend)
    app.conf.task_track_started = True
    if os.environ.get("RESULT_EXPIRES"):
        app.conf.result_expires = int(os.environ["RESULT_EXPIRES"])
if os.environ.get("TLS_CA"):
    app.conf.broker_use_ssl = {"ssl_ca_certs": os.environ["TLS_CA"], "ssl_cert_reqs": "required"}
app.conf.broker_connection_retry_on_startup = True
if os.environ.get("VT"):
    app.conf.broker_transport_options = {"visibility_timeout": float(os.environ["VT"])}
if os.environ.get("ACKS_LATE") == "1":
    app.conf.task_acks_late = True
    app.conf.task_reject_on_worker_lost = True
    app.conf.task_acks_on_failure_or_timeout = False


@app.task
def work(n, seconds=0.0):
    line("START", n)
    time.sleep(float(os.environ.get("SLOW", seconds)))
    line("DONE", n)


@app.task
def on_time(n, eta):
    """Prints how late it started against the time it was due (ms)."""
    line("LATE", int((time.time() - eta) * 1000))
    line("DONE", n)


@app.task(bind=True, max_retries=2)
def always_fails(self, n):
    line("START", n)
    raise self.retry(exc=RuntimeError(f"task {n} always fails"), countdown=0.2)


def produce(n, seconds=0.0, first=0):
    for i in range(first, first + n):
        work.delay(i, seconds)
    report(pushed=n)


def produce_countdowns(n, countdown):
    for i in range(n):
        on_time.apply_async((i, time.time() + countdown), countdown=countdown)
    report(pushed=n)


def produce_failing(n):
    for i in range(n):
        always_fails.delay(i)
    report(pushed=n)


def produce_priorities(priorities):
    """work(i) for each priority, apply_async(priority=p) (None: sent without one); one refused
    (ValueError at publish) is reported with its error instead."""
    refused = {}
    for i, priority in enumerate(priorities):
        try:
            work.apply_async((i, 0.0), **({} if priority is None else {"priority": priority}))
        except ValueError as exc:
            refused[i] = str(exc)
    report(pushed=len(priorities) - len(refused), refused=refused)


@app.task
def square(n, seconds=0.0):
    line("START", n)
    time.sleep(seconds)
    if n < 0:
        raise ValueError(f"no square of {n}")
    line("DONE", n)
    return n * n


@app.task
def total(numbers):
    line("TOTAL", sum(numbers))
    return sorted(numbers)


def send_squares(numbers, seconds=0.0):
    """square(n) for each: their Celery task ids."""
    report(ids=[square.delay(n, seconds).id for n in numbers])


def results(ids, timeout=60):
    """AsyncResult(id).get() of each (blocking), with its state after: [state, value or error]."""
    from celery.result import AsyncResult
    out = []
    for task_id in ids:
        handle = AsyncResult(task_id, app=app)
        try:
            value = handle.get(timeout=timeout)
        except Exception as exc:  # the task's own exception, re-raised by get()
            value = f"{type(exc).__name__}: {exc}"
        out.append([handle.state, value])
    report(results=out)


def states_of(ids):
    from celery.result import AsyncResult
    report(states=[AsyncResult(task_id, app=app).state for task_id in ids])


def get_with_timeout(task_id, timeout):
    from celery.result import AsyncResult
    try:
        AsyncResult(task_id, app=app).get(timeout=timeout)
        report(outcome="got")
    except Exception as exc:
        report(outcome=type(exc).__name__)


@task_prerun.connect
def count_unlocks(sender=None, **_):
    """One UNLOCK line per run of the chord's unlock task (each retry is a run)."""
    if getattr(sender, "name", None) == "celery.chord_unlock":
        line("UNLOCK", 0)


def chord_of(n, last=0.0, numbers=None):
    """chord(square(i) for i in range(n), or for each of `numbers`)(total), the last header task
    taking `last` seconds: the body's result; or the error get() raises (a failed header's own,
    re-raised as a parent's) with the body's state and result (Celery's ChordError)."""
    from celery import chord
    numbers = list(range(n)) if numbers is None else numbers
    header = [square.s(i, last if k == len(numbers) - 1 else 0.0) for k, i in enumerate(numbers)]
    handle = chord(header)(total.s())
    try:
        report(chord=handle.get(timeout=90))
    except Exception as exc:
        handle.get(timeout=90, propagate=False)
        report(error=f"{type(exc).__name__}: {exc}", state=handle.state,
               body=f"{type(handle.result).__name__}: {handle.result}")


def send_chord(n, seconds=0.0):
    """chord(square(i, seconds) for i in range(n))(total), not waited for: the body's and the
    header's Celery ids."""
    from celery import chord
    handle = chord(square.s(i, seconds) for i in range(n))(total.s())
    report(body=handle.id, header=[result.id for result in handle.parent.results])
