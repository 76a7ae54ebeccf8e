"""The result backends EZRA ships (ezra/adapters/result_slots.py and each framework's), with real
workers against a real EZRA: Celery (result_backend = "ezra://..."), Dramatiq (the Results
middleware's backend) and taskiq (a result backend). The apps are tests/frameworks/*_app.py."""

from __future__ import annotations

import json
import subprocess

import pytest

from support_servers import wait_until
from frameworks.harness import APPS, app_env, blocked, counts, produce, python, workers  # noqa: F401 (fixtures)
from support_queue import configure

pytestmark = pytest.mark.slow  # framework workers in their own venv

RESULTS = "celery-results"


def celery_worker(workers, python, env, pool: str = "solo"):
    command = [python, "-m", "celery", "-A", "celery_app", "worker", "--pool", pool, "--concurrency", "2",
               "--loglevel", "info"]
    return workers.start(command, env)


def ready(worker, client, readers: int = 1) -> None:
    wait_until(lambda: worker.alive() and "ready." in worker.output() and blocked(client) >= readers, 90,
               message=f"the worker to wait in XREADGROUP ({worker.log})")


def call(python, app: str, code: str, env: dict) -> subprocess.Popen:
    """`import app; app.code` in the venv, running on: its JSON line on stdout."""
    return subprocess.Popen([str(python), "-c", f"import {app}; {app}.{code}"], env=env, cwd=APPS,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def reply(proc: subprocess.Popen, timeout: float = 120) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_celery_get_and_state_read_results_kept_in_ezra_across_a_restart(ezra_factory, queue, python, workers,
                                                                        tmp_path):
    """AsyncResult.get() and .state of 3 tasks (one raises) through result_backend = "ezra://...":
    the values, SUCCESS / FAILURE with the task's exception, PENDING for an id never sent; each
    result is a done task of the results queue, named by its Celery id (XADD NAME), kept with
    result_expires as its TTL; after a kill -9 and restart of the server the same results are read again."""
    server = ezra_factory(data_dir=tmp_path / "data")
    client = server.client()
    env = app_env(server, queue, RESULTS="1", RESULT_EXPIRES="3600")
    worker = celery_worker(workers, python, env)
    ready(worker, client)
    ids = produce(python, "celery_app", "send_squares([3, 4, -1])", env)["ids"]
    got = produce(python, "celery_app", f"results({ids!r})", env)["results"]
    assert got == [["SUCCESS", 9], ["SUCCESS", 16], ["FAILURE", "ValueError: no square of -1"]]
    states = produce(python, "celery_app", f"states_of({ids + ['never-sent']!r})", env)["states"]
    assert states == ["SUCCESS", "SUCCESS", "FAILURE", "PENDING"]
    assert counts(client, RESULTS)["done"] == 3, "one done task per stored result"
    done = [dict(zip(flat[::2], flat[1::2])) for flat in client.execute_command("XINFO", "TASKS", RESULTS, "done")]
    assert sorted(task[b"name"].decode() for task in done) == sorted(ids)  # each slot named by its task's id
    assert all(task[b"fields"][1] == task[b"name"] for task in done)
    worker.kill()
    client.close()

    server.stop(__import__("signal").SIGKILL)
    again = ezra_factory(data_dir=tmp_path / "data")
    env = app_env(again, queue, RESULTS="1", RESULT_EXPIRES="3600")
    got = produce(python, "celery_app", f"results({ids!r})", env)["results"]
    assert got == [["SUCCESS", 9], ["SUCCESS", 16], ["FAILURE", "ValueError: no square of -1"]]


def waiting_progress(client) -> bytes | None:
    """The progress of the one waiting slot of the results queue (None while it has none)."""
    tasks = [dict(zip(flat[::2], flat[1::2])) for flat in client.execute_command("XINFO", "TASKS", RESULTS, "available")]
    return tasks[0][b"progress"] if len(tasks) == 1 else None


def test_celery_get_waits_in_xresult_block_and_state_shows_started(ezra_factory, queue, python, workers):
    """get() on a task not run yet (its queue paused) waits in one XRESULT BLOCK (a blocked client
    besides the worker's read), and returns once the worker stores the result; meanwhile .state is
    PENDING, then STARTED while it runs (task_track_started: the slot's progress)."""
    server = ezra_factory()
    client = server.client()
    configure(client, queue, "PAUSED", "1")
    env = app_env(server, queue, RESULTS="1")
    worker = celery_worker(workers, python, env)
    ready(worker, client)
    [task_id] = produce(python, "celery_app", "send_squares([5], 3.0)", env)["ids"]
    waiter = call(python, "celery_app", f"results([{task_id!r}])", env)
    wait_until(lambda: blocked(client) == 2, 60, message="get() blocked in XRESULT beside the worker's read")
    assert produce(python, "celery_app", f"states_of([{task_id!r}])", env)["states"] == ["PENDING"]
    configure(client, queue, "PAUSED", "0")
    wait_until(lambda: b'"STARTED"' in (waiting_progress(client) or b""), 60,
               message=f"the slot's progress to say STARTED ({worker.log})")
    assert worker.lines("START") and not worker.lines("DONE"), "STARTED while the task runs"
    # the task runs 3 s: .state read in a new process may come after it ended
    assert produce(python, "celery_app", f"states_of([{task_id!r}])", env)["states"] in (["STARTED"], ["SUCCESS"])
    assert reply(waiter)["results"] == [["SUCCESS", 25]]
    assert worker.lines("DONE") == [(5, worker.lines("DONE")[0][1])]
    timed_out = produce(python, "celery_app", "get_with_timeout('never-sent', 0.5)", env)
    assert timed_out == {"outcome": "TimeoutError"}
    client.close()


def test_celery_chord_callback_gets_the_headers_10_results(ezra_factory, queue, python, workers):
    """chord(square(i) for i in range(10))(total): the callback runs once with the 10 results
    (Celery's chord_unlock reads the header's states from the backend)."""
    server = ezra_factory()
    client = server.client()
    env = app_env(server, queue, RESULTS="1")
    worker = celery_worker(workers, python, env, "prefork")
    ready(worker, client)
    got = produce(python, "celery_app", "chord_of(10)", env)
    assert got == {"chord": [i * i for i in range(10)]}
    assert [n for n, _ in worker.lines("TOTAL")] == [sum(i * i for i in range(10))], "the callback ran once"
    client.close()


def test_celery_result_expires_is_the_results_ttl(ezra_factory, queue, python, workers):
    """result_expires = 1 s: the result's task goes with its TTL (positive control: it was there)."""
    server = ezra_factory()
    client = server.client()
    env = app_env(server, queue, RESULTS="1", RESULT_EXPIRES="1")
    worker = celery_worker(workers, python, env)
    ready(worker, client)
    ids = produce(python, "celery_app", "send_squares([2])", env)["ids"]
    assert produce(python, "celery_app", f"results({ids!r})", env)["results"] == [["SUCCESS", 4]]
    assert counts(client, RESULTS)["done"] == 1
    wait_until(lambda: counts(client, RESULTS)["done"] == 0, 30, message="the result removed by its TTL")
    client.close()


def test_dramatiq_get_result_blocks_in_xresult_and_reads_results_kept_across_a_restart(
        ezra_factory, queue, python, workers, tmp_path):
    """The Results middleware on ezra.dramatiq.EzraBackend, a real `dramatiq` worker: before the
    tasks run get_result() is ResultMissing, and get_result(block=True) waits in XRESULT BLOCK (a
    blocked client beside the worker's read); then the values, the failure as ResultFailure, and
    after a kill -9 and restart of the server the same results without blocking."""
    server = ezra_factory(data_dir=tmp_path / "data")
    client = server.client()
    configure(client, queue, "PAUSED", "1")
    env = app_env(server, queue, RESULTS="1")
    worker = workers.start([python, "-m", "dramatiq", "dramatiq_app", "--processes", "1", "--threads", "1"], env)
    wait_until(lambda: worker.alive() and blocked(client) >= 1, 90, message=f"the consumer's read ({worker.log})")
    messages = produce(python, "dramatiq_app", "send_squares([3, 4, -1])", env)["messages"]
    missing = produce(python, "dramatiq_app", f"results({messages!r}, block=False)", env)["results"]
    assert [text.split(":")[0] for text in missing] == ["ResultMissing"] * 3
    waiter = call(python, "dramatiq_app", f"results({messages!r})", env)
    wait_until(lambda: blocked(client) == 2, 60, message="get_result(block=True) blocked in XRESULT")
    configure(client, queue, "PAUSED", "0")
    expected = [9, 16, "ResultFailure: actor raised ValueError: no square of -1"]
    assert reply(waiter)["results"] == expected
    assert counts(client, "dramatiq-results")["done"] == 3
    worker.kill()
    client.close()

    server.stop(__import__("signal").SIGKILL)
    again = ezra_factory(data_dir=tmp_path / "data")
    env = app_env(again, queue, RESULTS="1")
    assert produce(python, "dramatiq_app", f"results({messages!r}, block=False)", env)["results"] == expected


def test_taskiq_results_are_read_from_ezra_blocking_and_across_a_restart(ezra_factory, queue, python, workers,
                                                                         tmp_path):
    """ezra.taskiq.EzraResultBackend with a real `taskiq worker`: before the tasks run
    is_result_ready is False and wait() blocks in XRESULT BLOCK (a blocked client beside the
    worker's read); then the values and the task's error; after a kill -9 and restart of the
    server the same results through is_result_ready / get_result."""
    server = ezra_factory(data_dir=tmp_path / "data")
    client = server.client()
    configure(client, queue, "PAUSED", "1")
    env = app_env(server, queue, RESULTS="1")
    worker = workers.start([python, "-m", "taskiq", "worker", "taskiq_app:broker", "--workers", "1"], env)
    wait_until(lambda: worker.alive() and blocked(client) >= 1, 90, message=f"the worker's read ({worker.log})")
    ids = produce(python, "taskiq_app", "send_squares([3, 4, -1])", env)["ids"]
    assert produce(python, "taskiq_app", f"results({ids!r}, wait=False)", env)["results"] == ["not ready"] * 3
    waiter = call(python, "taskiq_app", f"results({ids!r})", env)
    wait_until(lambda: blocked(client) == 2, 60, message="wait() blocked in XRESULT")
    configure(client, queue, "PAUSED", "0")
    expected = [9, 16, "ValueError: no square of -1"]
    assert reply(waiter)["results"] == expected
    assert counts(client, "taskiq-results")["done"] == 3
    worker.kill()
    client.close()

    server.stop(__import__("signal").SIGKILL)
    again = ezra_factory(data_dir=tmp_path / "data")
    env = app_env(again, queue, RESULTS="1")
    assert produce(python, "taskiq_app", f"results({ids!r}, wait=False)", env)["results"] == expected
