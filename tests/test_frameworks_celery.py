"""Celery on EZRA through ezra.celery.Transport, with real `celery worker` processes (prefork and solo).

The app is tests/frameworks/celery_app.py, run in build/venv-frameworks
(tests/frameworks/harness.py). Celery's own redis transport failing on EZRA is
tests/test_worker_libs.py's.
"""

from __future__ import annotations

import re
import signal
import time

import pytest

from support_servers import wait_until
from frameworks.harness import (app_env, blocked, compat_json, counts, priorities, produce, python,  # noqa: F401 (fixtures)
                                workers)
from support_queue import configure
from support_worker_libs import Row, dist_version

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("compat_json")]  # framework workers in their own venv

LEASE = 3  # seconds: the queue's visibility timeout in the tests that wait for it


def celery_worker(workers, python, env, pool: str, concurrency: int = 2, *more: str):
    command = [python, "-m", "celery", "-A", "celery_app", "worker", "--pool", pool, "--concurrency",
               str(concurrency), "--loglevel", "info", *more]
    return workers.start(command, env)


def ready(worker, client, readers: int = 1) -> None:
    """The worker has started and waits in XREADGROUP (a blocked client), not in a polling loop."""
    wait_until(lambda: worker.alive() and "ready." in worker.output() and blocked(client) >= readers, 90,
               message=f"the celery worker to wait in XREADGROUP ({worker.log})")


def once(worker_lines: list[tuple[int, int]], n: int) -> None:
    assert sorted(k for k, _ in worker_lines) == list(range(n)), "every task exactly once"


@pytest.mark.parametrize("pool", ["prefork", "solo"])
def test_500_tasks_run_exactly_once(ezra_factory, queue, python, workers, pool):
    """500 tasks through `celery worker`: each run once, all acked, nothing pending or dead; the
    idle worker waits in one blocking XREADGROUP. The solo worker runs with -E (events): they
    are dropped with a warning, no queue made for them; remote control is left out by Celery."""
    server = ezra_factory()
    client = server.client()
    row = Row(f"Celery (Python, ezra.celery transport, {pool} pool)",
              f"{dist_version(python, 'celery')} (kombu {dist_version(python, 'kombu')})")
    env = app_env(server, queue)
    worker = celery_worker(workers, python, env, pool, 2, *(["--events"] if pool == "solo" else []))
    ready(worker, client)
    assert "pidbox" not in worker.output() and "mingle" not in worker.output().lower(), worker.output()[-3000:]
    assert produce(python, "celery_app", "produce(500)", env) == {"pushed": 500}
    wait_until(lambda: len(worker.lines("DONE")) >= 500 and counts(client, queue)["done"] == 500, 120,
               message=f"500 tasks done and acked ({worker.log})")
    once(worker.lines("DONE"), 500)
    if pool == "prefork":
        assert len({pid for _, pid in worker.lines("DONE")}) == 2, "both pool processes ran tasks"
    assert counts(client, queue) == {"available": 0, "delayed": 0, "in-flight": 0, "done": 500, "dead": 0}
    wait_until(lambda: blocked(client) == 1, 10, message="the idle worker back in its blocking read")
    assert client.info("queues")["queues"] == 1, "no other queue (events, remote control)"
    if pool == "solo":
        assert "exchange 'celeryev' (Celery's events or remote control) was dropped" in worker.output()
    client.close()
    row.done("works", "shipped in the package (pip install 'ezra[celery]', import ezra.celery, "
                      "broker='ezra://host:port'): 500 tasks each ran once; the idle worker waits in one "
                      "blocking XREADGROUP across its queues, COUNT as prefetch allows; acks are XACKs; "
                      "acks_late with a SIGKILLed worker: the task runs again after the queue's visibility "
                      "timeout; countdown/ETA is XADD DELAY; failures with acks_late and "
                      "task_acks_on_failure_or_timeout=False end in the dead queue; leases renewed for "
                      "long tasks; remote control, events and fanout are off (docs/celery.md)")


def test_a_killed_worker_under_acks_late_runs_its_task_again_after_the_lease(ezra_factory, queue, python,
                                                                           workers):
    """SIGKILL of the whole worker (main process and pool) mid-task under acks_late: the task held
    is delivered again once the queue's lease (3 s) runs out; the tasks done before do not repeat."""
    server = ezra_factory()
    client = server.client()
    configure(client, queue, "VISIBILITY-TIMEOUT", str(LEASE))
    env = app_env(server, queue, ACKS_LATE="1")
    first = celery_worker(workers, python, env, "prefork")
    ready(first, client)
    produce(python, "celery_app", "produce(1, 60.0)", env)  # task 0: a minute, killed first
    produce(python, "celery_app", "produce(9, 0.0, first=1)", env)
    wait_until(lambda: (0 in {n for n, _ in first.lines("START")}) and len(first.lines("DONE")) == 9, 60,
               message=f"task 0 running and the others done ({first.log})")
    first.kill()
    killed = time.monotonic()
    assert counts(client, queue)["in-flight"] == 1
    second = celery_worker(workers, python, dict(env, SLOW="0"), "prefork")
    wait_until(lambda: second.lines("DONE"), 60, message=f"task 0 to run again ({second.log})")
    # the lease runs from its last renewal, at most a third of it before the kill
    assert time.monotonic() - killed >= LEASE * 2 / 3 - 0.2, "not before its lease ran out"
    assert [n for n, _ in second.lines("DONE")] == [0], "only the task that was held runs again"
    assert sorted(n for n, _ in first.lines("DONE")) == list(range(1, 10))
    wait_until(lambda: counts(client, queue)["done"] == 10, 10, message="every task acked")
    assert counts(client, queue)["dead"] == 0
    client.close()


def test_tasks_longer_than_the_lease_run_once(ezra_factory, queue, python, workers):
    """acks_late tasks of 4 s on a queue leasing for 1.5 s: the transport renews the leases of the
    tasks it holds (XCLAIM by their owner), so none is delivered twice."""
    server = ezra_factory()
    client = server.client()
    configure(client, queue, "VISIBILITY-TIMEOUT", "1.5")
    env = app_env(server, queue, ACKS_LATE="1")
    worker = celery_worker(workers, python, env, "prefork")
    ready(worker, client)
    produce(python, "celery_app", "produce(4, 4.0)", env)  # two run, two wait prefetched, all held
    wait_until(lambda: counts(client, queue)["done"] == 4, 60, message=f"the 4 tasks done ({worker.log})")
    once(worker.lines("START"), 4)
    assert counts(client, queue)["dead"] == 0
    client.close()


def test_countdown_runs_on_time_and_is_not_held_by_a_worker(ezra_factory, queue, python, workers):
    """apply_async(countdown=4): pushed with XADD DELAY (delayed on EZRA, no worker holds it) and run
    soon after its time. The app is configured the other documented way: broker_transport
    = 'ezra.celery:Transport', no import; and a password in the URL."""
    server = ezra_factory("--password", "s3cret")
    client = server.client(password="s3cret")
    env = app_env(server, queue, STYLE="setting", PASSWORD="s3cret", VT="3600")
    worker = celery_worker(workers, python, env, "solo")
    ready(worker, client)
    assert "visibility_timeout=3600.0, but EZRA leases the tasks of queue" in worker.output()
    produce(python, "celery_app", "produce_countdowns(5, 4)", env)
    assert counts(client, queue)["delayed"] == 5 and counts(client, queue)["in-flight"] == 0
    wait_until(lambda: len(worker.lines("DONE")) == 5, 30, message=f"the countdown tasks to run ({worker.log})")
    late = [int(ms) for ms in re.findall(r"^LATE (-?\d+) ", worker.output(), re.M)]
    # Due after 4 s, run within 3 s of it: a held task would wait out the 3600 s lease, a lost
    # DELAY would run at once (negative); 1 s was exceeded (876-1266 ms) at load average 10.
    assert len(late) == 5 and all(0 <= ms < 3000 for ms in late), late
    client.close()


def test_an_always_failing_task_is_retried_then_dead(ezra_factory, queue, python, workers):
    """self.retry(max_retries=2) under acks_late, task_reject_on_worker_lost and
    task_acks_on_failure_or_timeout=False: 3 runs, then the last message is rejected without
    requeue, which is XNACK FATAL: EZRA's dead queue holds it."""
    server = ezra_factory()
    client = server.client()
    env = app_env(server, queue, ACKS_LATE="1")
    worker = celery_worker(workers, python, env, "solo")
    ready(worker, client)
    produce(python, "celery_app", "produce_failing(1)", env)
    wait_until(lambda: counts(client, queue)["dead"] == 1, 60, message=f"the task dead ({worker.log})")
    assert [n for n, _ in worker.lines("START")] == [0, 0, 0], "the first run and 2 retries"
    assert counts(client, queue) == {"available": 0, "delayed": 0, "in-flight": 0, "done": 2, "dead": 1}
    [(_, fields)] = client.xrange(queue + "::dead")
    assert b"always_fails" in fields[b"payload"]
    [dead] = client.execute_command("XINFO", "TASKS", queue, "dead")  # the reject's REASON: the exception
    dead = dict(zip(dead[::2], dead[1::2]))
    assert (dead[b"failure-cause"], dead[b"failure-reason"]) == (b"nack", b"RuntimeError: task 0 always fails")
    client.close()


def test_a_graceful_shutdown_loses_nothing(ezra_factory, queue, python, workers):
    """SIGTERM (warm shutdown) while 40 tasks of 0.3 s wait: the running ones finish, the prefetched
    ones are handed back with XNACK SILENT (no attempt counted); a second worker does the rest,
    every task once."""
    server = ezra_factory("--max-attempts", "1")  # a handed-back task counted as an attempt would be dead
    client = server.client()
    env = app_env(server, queue)
    first = celery_worker(workers, python, env, "prefork")
    ready(first, client)
    produce(python, "celery_app", "produce(40, 0.3)", env)
    wait_until(lambda: len(first.lines("DONE")) >= 3, 60, message=f"some tasks done ({first.log})")
    assert first.stop(signal.SIGTERM) == 0, first.output()[-3000:]
    assert counts(client, queue)["in-flight"] == 0, "nothing left leased to the stopped worker"
    handed_back = 40 - len(first.lines("DONE"))
    assert handed_back > 0 and counts(client, queue)["available"] == handed_back
    second = celery_worker(workers, python, env, "prefork")
    wait_until(lambda: counts(client, queue)["done"] == 40 and len(first.lines("DONE") + second.lines("DONE")) >= 40,
               60, message=f"the rest done ({second.log})")  # acked as they start (acks_late off)
    once(first.lines("DONE") + second.lines("DONE"), 40)
    assert counts(client, queue)["dead"] == 0
    client.close()


def test_ezras_speaks_tls(ezra_factory, certificates, queue, python, workers):
    """ezras:// with broker_use_ssl's CA: the worker and the producer connect over TLS."""
    server = ezra_factory("--tls-cert-file", str(certificates / "server.pem"),
                          "--tls-key-file", str(certificates / "server.key"))
    client = server.client(ssl=True, ssl_ca_certs=str(certificates / "ca.pem"))
    env = app_env(server, queue, TLS_CA=str(certificates / "ca.pem"))
    worker = celery_worker(workers, python, env, "solo")
    ready(worker, client)
    assert "ezras://" in worker.output()
    produce(python, "celery_app", "produce(5)", env)
    wait_until(lambda: counts(client, queue)["done"] == 5, 30, message=f"5 tasks done over TLS ({worker.log})")
    once(worker.lines("DONE"), 5)
    client.close()


@pytest.mark.parametrize("password", [None, "s3cret"], ids=["no-password", "password"])
def test_a_worker_without_events_starts_without_a_warning_and_its_banner_shows_no_missing_password(
        ezra_factory, queue, python, workers, password):
    """Issue 48: every worker start logged a WARNING that a celeryev message was dropped (its own
    online/heartbeat events, sent with events off), and the banner read ezra://:**@ with no
    password. Now those events go to the debug log, and ** stands only for a real password.
    (test_500_tasks_run_exactly_once's solo worker, with -E, still gets the warning.)"""
    server = ezra_factory(*(["--password", password] if password else []))
    client = server.client(password=password)
    env = app_env(server, queue, **({"PASSWORD": password} if password else {}))
    worker = celery_worker(workers, python, env, "solo")
    ready(worker, client)
    produce(python, "celery_app", "produce(3)", env)
    wait_until(lambda: counts(client, queue)["done"] == 3, 30, message=f"3 tasks done ({worker.log})")
    output = worker.output()
    assert "was dropped" not in output, output[-3000:]
    expected = f"ezra://{':**@' if password else ''}127.0.0.1:{server.port}//"
    assert f"transport:   {expected}" in output and f"Connected to {expected}" in output, output[:3000]
    assert password is None or f":{password}@" not in output
    client.close()


def paused_worker(ezra_factory, queue, python, workers):
    """A solo worker waiting on a paused queue: what is pushed stays available to be looked at."""
    server = ezra_factory()
    client = server.client()
    configure(client, queue, "PAUSED", "1")
    env = app_env(server, queue)
    worker = celery_worker(workers, python, env, "solo", 1)
    ready(worker, client)
    return client, env, worker


def test_a_message_priority_is_the_task_priority(ezra_factory, queue, python, workers):
    """apply_async(priority=p) lands as XADD PRIORITY p (0 first, as kombu's Redis transport reads
    it); out of 0-9 it is clamped as kombu clamps it (12 -> 9, -2 -> 0); none given is the queue's
    default (5), not kombu's 0; "x" is refused at publish and stores nothing. The worker then runs
    them all."""
    client, env, worker = paused_worker(ezra_factory, queue, python, workers)
    result = produce(python, "celery_app", "produce_priorities([0, 3, 9, None, 12, -2, 'x'])", env)
    assert result["pushed"] == 6 and list(result["refused"]) == ["6"], result
    assert "priority must be an integer from 0 (first) to 9, got 'x'" in result["refused"]["6"]
    assert priorities(client, queue) == [0, 3, 9, 5, 9, 0]
    configure(client, queue, "PAUSED", "0")
    # acked as they start (acks_late off): each one's DONE line comes after its ack
    wait_until(lambda: counts(client, queue)["done"] == 6 and len(worker.lines("DONE")) >= 6, 60,
               message=f"the 6 tasks done ({worker.log})")
    once(worker.lines("DONE"), 6)
    client.close()


def test_the_worker_runs_priority_0_first(ezra_factory, queue, python, workers):
    """Pushed 9, 9, 0, 5, 0 on a paused queue, then resumed: the solo worker runs 2, 4, 3, 0, 1."""
    client, env, worker = paused_worker(ezra_factory, queue, python, workers)
    produce(python, "celery_app", "produce_priorities([9, 9, 0, 5, 0])", env)
    configure(client, queue, "PAUSED", "0")
    wait_until(lambda: len(worker.lines("DONE")) == 5, 60, message=f"the 5 tasks done ({worker.log})")
    assert [n for n, _ in worker.lines("DONE")] == [2, 4, 3, 0, 1]
    client.close()
