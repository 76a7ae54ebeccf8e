"""taskiq on EZRA through ezra.taskiq.EzraStreamBroker, with real `taskiq worker` processes.

The apps are in tests/frameworks/, run in build/venv-frameworks (tests/frameworks/harness.py).
The stock RedisStreamBroker's failure on EZRA is tests/test_worker_libs.py's.
"""

from __future__ import annotations

import time

import pytest

from support_servers import wait_until
from frameworks.harness import (app_env, blocked, compat_json, counts, priorities, produce, python,  # noqa: F401 (fixtures)
                                workers)
from support_queue import configure
from support_worker_libs import Row, dist_version

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("compat_json")]  # framework workers in their own venv

LEASE = "2"  # the queue's visibility timeout, seconds: the tasks below run longer


@pytest.fixture
def server(ezra_factory):
    return ezra_factory("--max-attempts", "3")


def taskiq_worker(workers, python, env, processes: int, *options: str):
    return workers.start([python, "-m", "taskiq", "worker", "taskiq_app:broker", "--workers", str(processes),
                          *options], env)


def test_tasks_longer_than_the_lease_run_once_each(server, queue, python, workers):
    """20 tasks of 3 s on a queue with a 2 s lease, two worker processes: the broker renews the
    leases it holds, so each task runs once, none is redelivered, none dead."""
    row = Row("taskiq (Python, ezra.taskiq.EzraStreamBroker)",
              f"taskiq-redis {dist_version(python, 'taskiq-redis')} (taskiq {dist_version(python, 'taskiq')})")
    client = server.client()
    configure(client, queue, "VISIBILITY-TIMEOUT", LEASE)
    env = app_env(server, queue)
    worker = taskiq_worker(workers, python, env, 2)
    wait_until(lambda: worker.alive() and blocked(client) == 2, 60,
               message=f"two taskiq worker processes waiting in XREADGROUP ({worker.log})")
    assert produce(python, "taskiq_app", "produce(20, 3.0)", env) == {"pushed": 20}
    wait_until(lambda: len(worker.lines("DONE")) >= 20 and counts(client, queue)["done"] == 20, 60,
               message=f"every task done and acked ({worker.log})")
    assert sorted(n for n, _ in worker.lines("START")) == list(range(20)), "every task started exactly once"
    assert sorted(n for n, _ in worker.lines("DONE")) == list(range(20))
    assert len({pid for _, pid in worker.lines("DONE")}) == 2, "both worker processes took tasks"
    assert counts(client, queue) == {"available": 0, "delayed": 0, "in-flight": 0, "done": 20, "dead": 0}
    assert "unknown command" not in worker.output() and "is dead" not in worker.output(), worker.output()[-3000:]
    client.close()
    row.done("works", "shipped in the package (pip install 'ezra[taskiq]'): RedisStreamBroker's kiq(), startup() "
                      "and acks, its listen() reading with XREADGROUP only (no Lua lock, no XAUTOCLAIM) and "
                      "renewing the leases of unacked tasks (XCLAIM by their owner, every third of the queue's "
                      "visibility timeout). `taskiq worker` with two processes: 20 tasks of 3 s on a 2 s lease "
                      "each ran once; a worker killed mid-task: its task ran again after the lease; see "
                      "docs/taskiq.md")


def test_tasks_read_and_waiting_for_a_slot_keep_their_leases(server, queue, python, workers):
    """One slot (--max-async-tasks 1), 60 tasks of 0.1 s on a 2 s lease: one XREADGROUP reads them
    all, and taskiq starts them one after another for 6 s. The tasks still waiting for the slot
    are held too (their leases renewed), so none runs out and none is delivered twice."""
    client = server.client()
    configure(client, queue, "VISIBILITY-TIMEOUT", LEASE)
    env = app_env(server, queue)
    assert produce(python, "taskiq_app", "produce(60, 0.1)", env) == {"pushed": 60}
    worker = taskiq_worker(workers, python, env, 1, "--max-async-tasks", "1")
    settled = lambda: (lambda c: c["done"] + c["dead"] == 60 and c["available"] + c["in-flight"] == 0)(
        counts(client, queue))
    wait_until(settled, 120, message=f"every task settled ({worker.log})")
    wait_until(lambda: len(worker.lines("DONE")) >= len(worker.lines("START")), 30,
               message=f"every task started to finish ({worker.log})")
    started = sorted(n for n, _ in worker.lines("START"))
    twice = sorted({n for n in started if started.count(n) > 1})
    assert started == list(range(60)), f"{len(twice)} of 60 tasks started more than once: {twice}"
    assert counts(client, queue) == {"available": 0, "delayed": 0, "in-flight": 0, "done": 60, "dead": 0}
    wait_until(lambda: "is no longer leased" not in worker.output() and worker.alive(), 1,
               message="no lease was lost")
    client.close()


def test_a_killed_workers_task_runs_again_after_the_lease(server, queue, python, workers):
    """A worker killed (SIGKILL, all its processes) mid-task: its task is delivered again once the
    queue's visibility timeout passes, to the next worker, and done once."""
    client = server.client()
    configure(client, queue, "VISIBILITY-TIMEOUT", LEASE)
    env = app_env(server, queue)
    first = taskiq_worker(workers, python, env, 1)
    wait_until(lambda: first.alive() and blocked(client) == 1, 60, message=f"the worker to wait ({first.log})")
    produce(python, "taskiq_app", "produce(1, 30.0)", env)
    wait_until(lambda: first.lines("START"), 30, message=f"the task to start ({first.log})")
    first.kill()
    killed = time.monotonic()
    # The worker renewed the lease every third of it: it runs out LEASE after the last renewal.
    [held] = client.xpending_range(queue, "taskiq", "-", "+", 10)
    lease_left = float(LEASE) - held["time_since_delivered"] / 1000
    second = taskiq_worker(workers, python, env, 1)
    wait_until(lambda: second.lines("START"), 60, message=f"the task to run again ({second.log})")
    assert time.monotonic() - killed >= lease_left - 0.1, "not before the lease ran out"
    assert [n for n, _ in second.lines("START")] == [0]
    [entry] = client.xpending_range(queue, "taskiq", "-", "+", 10)
    assert entry["times_delivered"] == 2, entry
    client.close()


def test_the_priority_label_is_the_task_priority(server, queue, python, workers):
    """with_labels(priority=p) lands as XADD PRIORITY p; no label is the queue's default (5);
    10, -1, "x" and 1.5 are refused at kiq() and store nothing. The worker then runs them all."""
    client = server.client()
    configure(client, queue, "PAUSED", "1")
    env = app_env(server, queue)
    worker = taskiq_worker(workers, python, env, 1)
    wait_until(lambda: worker.alive() and blocked(client) == 1, 60,
               message=f"the taskiq worker waiting in XREADGROUP ({worker.log})")
    result = produce(python, "taskiq_app", "produce_priorities([3, None, 0, 9, 10, -1, 'x', 1.5])", env)
    assert result["pushed"] == 4 and sorted(result["refused"]) == ["4", "5", "6", "7"], result
    assert "an integer from 0 (first) to 9; got '10'" in result["refused"]["4"]
    assert priorities(client, queue) == [3, 5, 0, 9]
    configure(client, queue, "PAUSED", "0")
    wait_until(lambda: counts(client, queue)["done"] == 4 and len(worker.lines("DONE")) == 4, 60,
               message=f"the 4 tasks done ({worker.log})")
    assert sorted(n for n, _ in worker.lines("DONE")) == [0, 1, 2, 3]
    client.close()


def test_the_worker_runs_priority_0_first(server, queue, python, workers):
    """Labels 9, 9, 0, 5, 0 pushed on a paused queue, then resumed: one worker taking one task at
    a time runs 2, 4, 3, 0, 1."""
    client = server.client()
    configure(client, queue, "PAUSED", "1")
    env = app_env(server, queue)
    worker = taskiq_worker(workers, python, env, 1, "--max-async-tasks", "1")
    wait_until(lambda: worker.alive() and blocked(client) == 1, 60,
               message=f"the taskiq worker waiting in XREADGROUP ({worker.log})")
    produce(python, "taskiq_app", "produce_priorities([9, 9, 0, 5, 0])", env)
    configure(client, queue, "PAUSED", "0")
    wait_until(lambda: len(worker.lines("DONE")) == 5, 60, message=f"the 5 tasks done ({worker.log})")
    assert [n for n, _ in worker.lines("START")] == [2, 4, 3, 0, 1]
    client.close()

def test_the_adapters_priorities_are_the_servers():
    """ezra/adapters/priorities.py repeats the server's range and default (the client side imports
    nothing of the server): they agree."""
    from ezra import lifecycle
    from ezra.adapters import priorities
    assert (priorities.PRIORITIES, priorities.DEFAULT_PRIORITY) == (lifecycle.PRIORITIES, lifecycle.DEFAULT_PRIORITY)
