"""Issue 25 item 1: the broker's collaborators are plain objects that own their data, each tested
alone here (no database, no writer): the waiters' lines, the observers, the reaper's schedule,
the worker names and their release timers, and a queue's settings in force. Item 2: blocking is
declared in the command table and waited out there, not in handlers."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import gevent
import pytest

from ezra.broker.observers import Observer, Observers
from ezra.broker.queues import Defaults, Queues
from ezra.broker.deadlines import INF, ReaperSchedule
from ezra.broker.waiters import Claim, Waiter, Waiters
from ezra.broker.workers import WorkerNames
from ezra.errors import CommandError
from ezra.lifecycle import AVAILABLE, GONE, IN_FLIGHT

PACKAGE = Path(__file__).resolve().parent.parent / "ezra"
SETTINGS = SimpleNamespace(visibility_timeout=30.0, max_attempts=5, retention_seconds=3600.0,
                           backoff="fixed 1", release_on_disconnect=None)


def test_waiters_are_served_first_come_first_served_and_woken_after_the_batch():
    waiters = Waiters()
    first, second = Waiter(Claim([b"q"], b"w1", 1, False)), Waiter(Claim([b"q", b"r"], b"w2", 1, False))
    waiters.register(first)
    waiters.register(second)
    assert waiters.first(b"q") is first and waiters.first(b"r") is second and waiters.count() == 2
    waiters.served(first, {b"q": ["row"]})
    assert waiters.first(b"q") is second and not first.registered and not first.event.is_set()
    waiters.after_batch(committed=True)
    assert first.event.is_set() and first.result == {b"q": ["row"]}
    waiters.unregister(second)
    assert waiters.blocked == {} and waiters.count() == 0


def test_a_waiter_served_in_a_rolled_back_batch_waits_again_first_then_gets_the_error():
    waiters = Waiters()
    early, late = Waiter(Claim([b"q"], b"w1", 1, False)), Waiter(Claim([b"q"], b"w2", 1, False))
    waiters.register(early)
    waiters.register(late)
    waiters.served(early, {b"q": ["row"]})
    waiters.after_batch(committed=False)
    assert waiters.first(b"q") is early and early.result is None and not early.event.is_set()
    waiters.served(early, {b"q": ["row"]})
    waiters.after_batch(committed=False)  # once only: the second rollback answers the error
    assert early.event.is_set() and isinstance(early.error, CommandError) and early.result is None


def test_observers_wake_only_for_the_views_a_committed_batch_grew():
    observers = Observers()
    live, dead = Observer({(b"q", False)}), Observer({(b"q", True)})
    observers.watch(live)
    observers.watch(dead)
    observers.grew(b"q", False)
    observers.grew(b"other", False)  # nobody watches it: not kept
    observers.after_batch(committed=False)
    assert not live.event.is_set()
    observers.grew(b"q", False)
    observers.after_batch(committed=True)
    assert live.event.is_set() and not dead.event.is_set() and observers.count() == 2
    observers.unwatch(live)
    observers.cancel_all()
    assert dead.cancelled and dead.event.is_set() and observers.count() == 1


def test_the_reapers_schedule_is_only_ever_lowered_by_new_work_and_reset_looks_at_everything():
    schedule = ReaperSchedule(clock=lambda: 5)
    schedule.earliest_deadline = schedule.earliest_due = schedule.next_idmp_purge = INF
    schedule.lease_until(200)
    schedule.lease_until(300)
    schedule.due_at(50)
    schedule.idmp_expires_at(70)
    assert (schedule.earliest_deadline, schedule.earliest_due, schedule.next_idmp_purge) == (200, 50, 70)
    schedule.deleted_rows(3)
    assert schedule.rows_since_vacuum == 3 and schedule.last_delete_at == 5
    schedule.reset()
    assert (schedule.earliest_deadline, schedule.earliest_due, schedule.next_flush) == (0, 0, 0)


def test_a_queues_own_settings_win_over_the_servers_and_negative_means_off():
    queues = Queues(Defaults(SETTINGS))
    queue = queues.new(b"q")
    assert (queue.lease_seconds(), queue.attempts_allowed(), queue.retention(), queue.release_grace()) == \
        (30.0, 5, 3600.0, None)
    queue.visibility_timeout, queue.max_attempts, queue.retention_seconds = 2.5, 1, -1
    queue.release_on_disconnect, queue.paused = -1, 1
    assert (queue.lease_seconds(), queue.attempts_allowed(), queue.retention(), queue.release_grace()) == \
        (2.5, 1, None, None)
    assert queue.is_paused()
    queue.release_on_disconnect = 0.5
    assert queue.release_grace() == 0.5


def test_the_queue_table_keeps_its_names_in_order_and_is_refilled_in_place():
    queues = Queues(Defaults(SETTINGS))
    for name in (b"b", b"a", b"c"):
        queues.add(queues.new(name))
    assert queues.names == [b"a", b"b", b"c"]
    names = queues.names
    queues.replace({b"z": queues.new(b"z")})
    assert names is queues.names and names == [b"z"] and list(queues) == [b"z"]
    queues[b"z"].tally("pushed", 2)
    assert queues.totals["pushed"] == 2 and queues[b"z"].totals["pushed"] == 2


def held_worker_names(grace: float | None):
    """WorkerNames over one queue with a task in flight, recording each release it asks for."""
    queues = Queues(Defaults(SETTINGS))
    queue = queues.new(b"q")
    queue.release_on_disconnect = grace
    queue.move(GONE, AVAILABLE)
    queue.move(AVAILABLE, IN_FLIGHT)  # a task leased
    queues.add(queue)
    releases = []
    workers = WorkerNames(queues, clock=lambda: 1000, release=lambda worker, gone_at: releases.append(worker))
    return workers, queue, releases


def test_a_gone_workers_tasks_are_released_after_the_grace_unless_the_name_comes_back():
    workers, queue, releases = held_worker_names(grace=0.05)
    workers.seen(b"w")
    workers.seen(b"w")
    workers.leased(b"w", queue)
    workers.gone(b"w")
    assert workers.connected(b"w")  # one connection left: nothing to release
    workers.gone(b"w")
    workers.seen(b"w")  # came back within the grace: the timer is cancelled
    gevent.sleep(0.1)
    assert releases == []
    workers.gone(b"w")
    deadline = gevent.get_hub().loop.now() + 5
    while not releases and gevent.get_hub().loop.now() < deadline:
        gevent.sleep(0.01)
    assert releases == [b"w"]


def test_a_gone_worker_with_no_grace_anywhere_is_forgotten_at_once():
    workers, queue, releases = held_worker_names(grace=None)
    workers.seen(b"w")
    workers.leased(b"w", queue)
    workers.gone(b"w")
    assert workers.held_in == {} and releases == []


def test_the_broker_has_no_part_that_calls_back_through_self():
    """No mixin, no base of stubs: every class under broker/ derives from object (or dict, or list)."""
    bases = {}
    for path in sorted((PACKAGE / "broker").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases[f"{path.name}:{node.name}"] = [ast.unparse(base) for base in node.bases]
    assert "core.py:Broker" in bases and not (PACKAGE / "broker" / "base.py").exists()
    assert {name: base for name, base in bases.items() if base not in ([], ["dict"], ["list"])} == {}


def test_blocking_is_declared_in_the_table_and_no_handler_waits_or_flushes():
    from ezra.commands.table import COMMANDS, Block
    import ezra.commands.queue as queue_commands
    import ezra.commands.results as result_commands

    blocking = sorted(name.decode() for name, (fn, _, _) in COMMANDS.items() if hasattr(fn, "__wrapped__"))
    assert blocking == ["XREAD", "XREADGROUP", "XRESULT"]
    assert issubclass(queue_commands.ClaimWait, Block) and issubclass(queue_commands.ObserveWait, Block)
    assert issubclass(result_commands.OutcomeWait, Block)
    waiting = [f"{path.relative_to(PACKAGE)}:{n}" for path in sorted((PACKAGE / "commands").glob("*.py"))
               if path.name != "table.py"
               for n, line in enumerate(path.read_text().splitlines(), 1)
               if re.search(r"session\.(wait|flush)\b", line)]
    assert waiting == []


@pytest.mark.parametrize("command", ["XREADGROUP", "XREAD"])
def test_inside_exec_a_blocking_read_answers_without_waiting(r, queue, command):
    r.execute_command("XGROUP", "CREATE", queue, "g", "$", "MKSTREAM")
    pipe = r.pipeline(transaction=True)
    if command == "XREADGROUP":
        pipe.execute_command("XREADGROUP", "GROUP", "g", "w", "COUNT", "1", "BLOCK", "0", "STREAMS", queue, ">")
    else:
        pipe.execute_command("XREAD", "BLOCK", "0", "STREAMS", queue, "$")
    assert pipe.execute() in ([None], [{}], [[]])  # BLOCK 0 is for ever outside EXEC: this returned at once
