"""Dramatiq on EZRA through ezra.dramatiq.EzraBroker, with real `dramatiq` worker processes.

The app is tests/frameworks/dramatiq_app.py, run in build/venv-frameworks
(tests/frameworks/harness.py). Dramatiq's own RedisBroker failing on EZRA is
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


def dramatiq_worker(workers, python, env, processes: int = 2, threads: int = 2):
    return workers.start([python, "-m", "dramatiq", "dramatiq_app", "--processes", str(processes),
                          "--threads", str(threads)], env)


def ready(worker, client, readers: int) -> None:
    """Each worker process's consumer waits in a blocking XREADGROUP."""
    wait_until(lambda: worker.alive() and blocked(client) >= readers, 90,
               message=f"the dramatiq consumers to wait in XREADGROUP ({worker.log})")


def once(lines: list[tuple[int, int]], n: int) -> None:
    assert sorted(k for k, _ in lines) == list(range(n)), "every task exactly once"


def test_500_messages_run_exactly_once(ezra_factory, queue, python, workers):
    """500 messages, two worker processes of two threads: each once, all acked, nothing dead;
    the idle consumers wait in blocking reads."""
    server = ezra_factory()
    client = server.client()
    row = Row("Dramatiq (Python, ezra.dramatiq.EzraBroker)", dist_version(python, "dramatiq"))
    env = app_env(server, queue)
    worker = dramatiq_worker(workers, python, env)
    ready(worker, client, 2)
    assert produce(python, "dramatiq_app", "produce(500)", env) == {"pushed": 500}
    wait_until(lambda: counts(client, queue)["done"] == 500 and len(worker.lines("DONE")) >= 500, 120,
               message=f"500 messages done and acked ({worker.log})")
    once(worker.lines("DONE"), 500)
    assert len({pid for _, pid in worker.lines("DONE")}) == 2, "both worker processes ran messages"
    assert counts(client, queue) == {"available": 0, "delayed": 0, "in-flight": 0, "done": 500, "dead": 0}
    wait_until(lambda: blocked(client) == 2, 10, message="the idle consumers back in their blocking reads")
    client.close()
    row.done("works", "shipped in the package (pip install 'ezra[dramatiq]', EzraBroker(url=...)): 500 messages "
                      "each ran once; consumers wait in a blocking XREADGROUP, COUNT as prefetch allows; "
                      "ack is XACK, nack the dead queue (XNACK FATAL), requeue at shutdown XNACK SILENT; "
                      "send_with_options(delay=ms) is XADD DELAY; the Retries middleware works; a killed "
                      "worker's message runs again after the visibility timeout; leases renewed for long "
                      "messages (docs/dramatiq.md)")


def test_delayed_messages_run_on_time(ezra_factory, queue, python, workers):
    """send_with_options(delay=4000): delayed on EZRA (no worker holds it) and run within a second
    of its time; a password in the URL."""
    server = ezra_factory("--password", "s3cret")
    client = server.client(password="s3cret")
    env = app_env(server, queue, PASSWORD="s3cret")
    worker = dramatiq_worker(workers, python, env, 1)
    ready(worker, client, 1)
    produce(python, "dramatiq_app", "produce_delayed(5, 4000)", env)
    assert counts(client, queue)["delayed"] == 5 and counts(client, queue)["in-flight"] == 0
    wait_until(lambda: len(worker.lines("DONE")) == 5, 30, message=f"the delayed messages to run ({worker.log})")
    late = [int(ms) for ms in re.findall(r"^LATE (-?\d+) ", worker.output(), re.M)]
    assert len(late) == 5 and all(0 <= ms < 1000 for ms in late), late
    client.close()


def test_a_killed_workers_message_runs_again_after_the_lease(ezra_factory, queue, python, workers):
    """SIGKILL of the whole worker (main process and its worker processes) mid-message: the
    message is delivered again once the queue's lease runs out; those done before do not repeat."""
    server = ezra_factory()
    client = server.client()
    configure(client, queue, "VISIBILITY-TIMEOUT", str(LEASE))
    env = app_env(server, queue)
    first = dramatiq_worker(workers, python, env, 1)
    ready(first, client, 1)
    produce(python, "dramatiq_app", "produce(1, 60.0)", env)
    produce(python, "dramatiq_app", "produce(9, 0.0, first=1)", env)
    wait_until(lambda: (0 in {n for n, _ in first.lines("START")}) and len(first.lines("DONE")) == 9, 60,
               message=f"message 0 running and the others done ({first.log})")
    first.kill()
    killed = time.monotonic()
    second = dramatiq_worker(workers, python, dict(env, SLOW="0"), 1)
    wait_until(lambda: second.lines("DONE"), 60, message=f"message 0 to run again ({second.log})")
    # the lease runs from its last renewal, at most a third of it before the kill
    assert time.monotonic() - killed >= LEASE * 2 / 3 - 0.2, "not before its lease ran out"
    assert [n for n, _ in second.lines("DONE")] == [0], "only the message that was held runs again"
    wait_until(lambda: counts(client, queue)["done"] == 10, 10, message="every message acked")
    client.close()


def test_messages_longer_than_the_lease_run_once(ezra_factory, queue, python, workers):
    """Messages of 4 s on a queue leasing for 1.5 s: the consumer renews the leases it holds."""
    server = ezra_factory()
    client = server.client()
    configure(client, queue, "VISIBILITY-TIMEOUT", "1.5")
    env = app_env(server, queue)
    worker = dramatiq_worker(workers, python, env, 1, 2)
    ready(worker, client, 1)
    produce(python, "dramatiq_app", "produce(4, 4.0)", env)  # two run, two wait prefetched, all held
    wait_until(lambda: counts(client, queue)["done"] == 4, 60, message=f"the 4 messages done ({worker.log})")
    once(worker.lines("START"), 4)
    assert counts(client, queue)["dead"] == 0
    client.close()


def test_retries_then_dead(ezra_factory, queue, python, workers):
    """An always-failing actor with max_retries=2: the Retries middleware pushes it again (with a
    delay) twice, then the message out of retries is nacked: EZRA's dead queue holds it."""
    server = ezra_factory()
    client = server.client()
    env = app_env(server, queue)
    worker = dramatiq_worker(workers, python, env, 1)
    ready(worker, client, 1)
    produce(python, "dramatiq_app", "produce_failing(1)", env)
    wait_until(lambda: counts(client, queue)["dead"] == 1, 60, message=f"the message dead ({worker.log})")
    assert [n for n, _ in worker.lines("START")] == [0, 0, 0], "the first run and 2 retries"
    assert counts(client, queue) == {"available": 0, "delayed": 0, "in-flight": 0, "done": 2, "dead": 1}
    [dead] = client.execute_command("XINFO", "TASKS", queue, "dead")  # the nack's REASON: the exception
    dead = dict(zip(dead[::2], dead[1::2]))
    assert (dead[b"failure-cause"], dead[b"failure-reason"]) == (b"nack", b"RuntimeError: task 0 always fails")
    client.close()


def test_a_graceful_shutdown_loses_nothing(ezra_factory, queue, python, workers):
    """SIGTERM while 40 messages of 0.3 s wait: running ones finish, the prefetched ones are
    handed back with XNACK SILENT (no attempt counted); a second worker does the rest, each once."""
    server = ezra_factory("--max-attempts", "1")  # a handed-back message counted as an attempt would be dead
    client = server.client()
    env = app_env(server, queue)
    first = dramatiq_worker(workers, python, env, 1)
    ready(first, client, 1)
    produce(python, "dramatiq_app", "produce(40, 0.3)", env)
    wait_until(lambda: len(first.lines("DONE")) >= 3, 60, message=f"some messages done ({first.log})")
    assert first.stop(signal.SIGTERM) == 0, first.output()[-3000:]
    assert counts(client, queue)["in-flight"] == 0, "nothing left leased to the stopped worker"
    assert counts(client, queue)["done"] == len(first.lines("DONE"))
    second = dramatiq_worker(workers, python, env, 1)
    wait_until(lambda: counts(client, queue)["done"] == 40, 60, message=f"the rest done ({second.log})")
    once(first.lines("DONE") + second.lines("DONE"), 40)
    assert counts(client, queue)["dead"] == 0
    client.close()


def test_a_dramatiq_priority_is_the_task_priority(ezra_factory, queue, python, workers):
    """Dramatiq's priority (lower first, 0 its default) lands as PRIORITY 5 + it, clamped to 0-9:
    0 -> the queue's default 5, actor priority -10 -> 0, actor 2 -> 7, send_with_options -2 -> 3
    and 100 -> 9; "x" is refused at send and stores nothing. The worker then runs them all."""
    server = ezra_factory()
    client = server.client()
    configure(client, queue, "PAUSED", "1")
    env = app_env(server, queue)
    worker = dramatiq_worker(workers, python, env, 1, 1)
    ready(worker, client, 1)
    result = produce(python, "dramatiq_app", "produce_priorities()", env)
    assert result["pushed"] == 5 and list(result["refused"]) == ["5"], result
    assert "a dramatiq priority is an integer (lower first), got 'x'" in result["refused"]["5"]
    assert priorities(client, queue) == [5, 0, 7, 3, 9]
    configure(client, queue, "PAUSED", "0")
    wait_until(lambda: counts(client, queue)["done"] == 5 and len(worker.lines("DONE")) == 5, 60,
               message=f"the 5 tasks done ({worker.log})")
    once(worker.lines("DONE"), 5)
    client.close()
