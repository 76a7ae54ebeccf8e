"""Celery's chords with EZRA as broker and result backend (ezra/adapters/celery_chords.py): the
chord's unlock task is pushed once with XADD AFTER on the header tasks' result slots and runs once,
when the last header result is stored; real `celery worker` processes (tests/frameworks/celery_app.py
prints "UNLOCK" per run of celery.chord_unlock, "TOTAL <sum>" per run of the body)."""

from __future__ import annotations

import signal

import pytest

from support_servers import wait_until
from frameworks.harness import blocked, app_env, counts, produce, python, workers  # noqa: F401 (fixtures)
from support_queue import configure

pytestmark = pytest.mark.slow  # framework workers in their own venv

RESULTS = "celery-results"


def celery_worker(workers, python, env, client, pool: str = "prefork", reads_ezra: bool = True):
    """A `celery worker` ready, waiting in XREADGROUP when its broker is EZRA."""
    worker = workers.start([python, "-m", "celery", "-A", "celery_app", "worker", "--pool", pool,
                            "--concurrency", "2", "--loglevel", "info"], env)
    wait_until(lambda: worker.alive() and "ready." in worker.output() and (not reads_ezra or blocked(client) >= 1),
               90, message=f"the worker to be ready ({worker.log})")
    return worker


def tasks(client, queue: str, state: str) -> list[dict]:
    return [dict(zip(flat[::2], flat[1::2])) for flat in client.execute_command("XINFO", "TASKS", queue, state)]


def test_a_chord_of_10_runs_its_unlock_once_when_the_last_header_result_is_stored(ezra_factory, queue, python,
                                                                                  workers):
    """chord(square(i) for i in range(10))(total), the last header task taking 3 s: the body gets
    the 10 results and runs once; celery.chord_unlock runs once (pushed waiting on the 10 slots;
    Celery's fallback ran it after 1 s and retried it each second while the last task ran): the
    chord's queue ends with 12 done tasks (10 headers, the unlock, the body) and none delayed."""
    server = ezra_factory()
    client = server.client()
    env = app_env(server, queue, RESULTS="1")
    worker = celery_worker(workers, python, env, client)
    got = produce(python, "celery_app", "chord_of(10, 3.0)", env)
    assert got == {"chord": [i * i for i in range(10)]}
    assert [n for n, _ in worker.lines("TOTAL")] == [sum(i * i for i in range(10))], "the body ran once"
    assert len(worker.lines("DONE")) == 10, "positive control: the header ran"
    assert len(worker.lines("UNLOCK")) == 1, f"chord_unlock ran {len(worker.lines('UNLOCK'))} times"
    assert counts(client, queue) == {"available": 0, "delayed": 0, "in-flight": 0, "done": 12, "dead": 0}
    client.close()


def test_a_chord_of_1000_is_one_xadd_after_1000_and_gets_every_header_result(ezra_factory, queue, python, workers):
    """1,000 header tasks: the unlock task is one XADD AFTER 1000 (XADD AFTER takes up to 10,000); the
    body gets all 1,000 results, and the unlock task runs once."""
    server = ezra_factory()
    client = server.client()
    env = app_env(server, queue, RESULTS="1")
    worker = celery_worker(workers, python, env, client)
    got = produce(python, "celery_app", "chord_of(1000)", env)
    assert got == {"chord": sorted(i * i for i in range(1000))}
    assert [n for n, _ in worker.lines("TOTAL")] == [sum(i * i for i in range(1000))]
    assert len(worker.lines("UNLOCK")) == 1, f"chord_unlock ran {len(worker.lines('UNLOCK'))} times"
    assert counts(client, queue)["done"] == 1002
    client.close()


def test_a_failed_header_task_reaches_the_chords_error_path(ezra_factory, queue, python, workers):
    """square(-1) raises in the header: its slot is done with a FAILURE meta, which releases the
    unlock task as any result does; chord_unlock (run once) marks the body FAILURE with Celery's
    ChordError carrying the header's exception (Celery's own chord_unlock words it so: Redis's
    native chords add "Dependency <id> raised"); get() re-raises the header's ValueError, as on
    Redis; the body never runs."""
    server = ezra_factory()
    client = server.client()
    env = app_env(server, queue, RESULTS="1")
    worker = celery_worker(workers, python, env, client)
    got = produce(python, "celery_app", "chord_of(0, 3.0, [1, 2, -1, 3])", env)
    assert got["error"] == "ValueError: no square of -1", "get() re-raises the failed header's error"
    assert got["state"] == "FAILURE", got
    assert got["body"] == "ChordError: ValueError('no square of -1')", got
    assert len(worker.lines("DONE")) == 3, "positive control: the other header tasks ran"
    assert worker.lines("TOTAL") == [], "the body does not run"
    assert len(worker.lines("UNLOCK")) == 1
    client.close()


def test_on_celerys_redis_backend_a_failed_header_fails_the_chord_alike_naming_the_task(
        ezra_factory, redis_server_port, queue, python, workers):
    """The same chord with Celery's Redis result backend (native chords, no unlock task): get()
    raises the header's ValueError and the body is FAILURE with a ChordError, as on EZRA; Redis's
    text also names the failed task ("Dependency <id> raised ...")."""
    server = ezra_factory()
    client = server.client()
    env = app_env(server, queue, RESULTS="1", RESULT_URL=f"redis://127.0.0.1:{redis_server_port}/1")
    worker = celery_worker(workers, python, env, client)
    got = produce(python, "celery_app", "chord_of(0, 0.0, [1, 2, -1, 3])", env)
    assert got["error"] == "ValueError: no square of -1" and got["state"] == "FAILURE", got
    assert got["body"].startswith("ChordError: Dependency "), got
    assert got["body"].endswith(" raised ValueError('no square of -1')"), got
    assert worker.lines("TOTAL") == [] and worker.lines("UNLOCK") == []
    client.close()


def test_a_deleted_header_slot_kills_the_unlock_task_with_a_reason_naming_it(ezra_factory, queue, python,
                                                                            workers):
    """The header's queue paused: the unlock task waits on 3 slots (XINFO TASKS' waits-for); the
    first slot deleted (XDEL celery-results <slot>): the unlock task is dead at once with a reason
    naming the slot, and once the queue runs again the header runs but the body never does
    (its result stays PENDING)."""
    server = ezra_factory()
    client = server.client()
    configure(client, queue, "PAUSED", "1")
    env = app_env(server, queue, RESULTS="1")
    sent = produce(python, "celery_app", "send_chord(3)", env)
    [unlock] = tasks(client, queue, "waiting")
    slots = {task[b"fields"][1].decode(): task[b"id"] for task in tasks(client, RESULTS, "available")}
    assert sorted(map(tuple, unlock[b"waits-for"])) == sorted((RESULTS.encode(), slots[i]) for i in sent["header"])
    first = slots[sent["header"][0]]
    assert client.execute_command("XDEL", RESULTS, first) == 1
    [dead] = tasks(client, queue, "dead")
    assert dead[b"id"] == unlock[b"id"]
    assert dead[b"failure-reason"] == b"dependency %s %s was deleted" % (RESULTS.encode(), first), dead
    configure(client, queue, "PAUSED", "0")
    worker = celery_worker(workers, python, env, client)
    wait_until(lambda: len(worker.lines("DONE")) == 3, 60, message="the header tasks to run")
    assert produce(python, "celery_app", f"states_of([{sent['body']!r}])", env)["states"] == ["PENDING"]
    assert worker.lines("UNLOCK") == [] and worker.lines("TOTAL") == []
    client.close()


def test_a_kill_9_of_the_server_mid_chord_still_runs_the_body_once(ezra_factory, queue, python, workers):
    """chord of 10 tasks of 0.5 s; the server killed (SIGKILL) once 3 header tasks are done and
    restarted on its port: the worker reconnects, the waiting unlock task is still waiting, the
    last header result releases it, and the body runs once with the 10 results."""
    server = ezra_factory()
    client = server.client()
    env = app_env(server, queue, RESULTS="1")
    worker = celery_worker(workers, python, env, client)
    sent = produce(python, "celery_app", "send_chord(10, 0.5)", env)
    wait_until(lambda: len(worker.lines("DONE")) >= 3, 60, message="3 header tasks done")
    [unlock] = tasks(client, queue, "waiting")
    assert worker.lines("TOTAL") == []
    server.kill9()
    server.args += ["--port", str(server.port)]
    server.start()
    client = server.client()
    assert tasks(client, queue, "waiting") in ([unlock], []), "still waiting, or released by the last result"
    got = produce(python, "celery_app", f"results([{sent['body']!r}])", env)
    assert got == {"results": [["SUCCESS", [i * i for i in range(10)]]]}
    assert [n for n, _ in worker.lines("TOTAL")] == [sum(i * i for i in range(10))], "the body ran once"
    assert len(worker.lines("UNLOCK")) == 1
    client.close()


def test_with_another_broker_a_chord_keeps_celerys_retrying_unlock(ezra_factory, redis_server_port, queue, python,
                                                                  workers):
    """The broker a redis-server, the results in EZRA: AFTER cannot name EZRA's slots from there,
    so the backend keeps Celery's fallback: chord_unlock pushed with a 1 s countdown and retried
    each second until the header is ready (here 2 runs or more, the last header task taking 3 s);
    the body gets the 10 results once."""
    server = ezra_factory()
    client = server.client()
    env = app_env(server, queue, RESULTS="1", BROKER_URL=f"redis://127.0.0.1:{redis_server_port}/0")
    worker = celery_worker(workers, python, env, client, reads_ezra=False)
    got = produce(python, "celery_app", "chord_of(10, 3.0)", env)
    assert got == {"chord": [i * i for i in range(10)]}
    assert [n for n, _ in worker.lines("TOTAL")] == [sum(i * i for i in range(10))], "the body ran once"
    assert len(worker.lines("UNLOCK")) >= 2, "Celery's fallback: chord_unlock retried while the header ran"
    assert counts(client, RESULTS)["done"] == 11, "the results in EZRA: the header's 10 and the body's"
    client.close()


def conf_of(broker: str, transport: str | None = None):
    from types import SimpleNamespace
    return SimpleNamespace(conf=SimpleNamespace(broker_write_url=None, broker_url=broker, broker_transport=transport))


@pytest.mark.parametrize("broker, transport, results, uses_after", [
    ("ezra://127.0.0.1:42002", None, "ezra://127.0.0.1:42002", True),
    ("ezra://localhost", None, "ezra.celery:ResultBackend+ezra://127.0.0.1:42002", True),
    ("ezras://:pw@host:7000", None, "ezras://:pw@host:7000", True),
    ("redis://127.0.0.1:42002", "ezra.celery:Transport", "ezra://127.0.0.1:42002", True),
    ("ezra://127.0.0.1:42002", None, "ezra://127.0.0.1:42003", False),
    ("redis://127.0.0.1:42002", None, "ezra://127.0.0.1:42002", False),
    ("ezra://a:1;ezra://b:1", None, "ezra://a:1", False),
])
def test_after_is_used_only_when_the_broker_is_the_results_ezra(broker, transport, results, uses_after):
    from ezra.adapters.celery_chords import broker_is
    assert broker_is(conf_of(broker, transport), results) is uses_after


def test_the_after_property_becomes_xadd_after_and_leaves_the_message():
    from ezra.adapters.celery_chords import AFTER_PROPERTY, after_option
    message = {"properties": {"priority": 3, AFTER_PROPERTY: [["celery-results", "1-0"], ["celery-results", "2-0"]]}}
    assert after_option(message) == ["AFTER", 2, "celery-results", "1-0", "celery-results", "2-0"]
    assert message == {"properties": {"priority": 3}}, "the stored message does not carry it"
    assert after_option(message) == [] and after_option({}) == []
