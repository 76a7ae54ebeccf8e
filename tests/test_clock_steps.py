"""The system clock stepped back or forward under a running server: issue 45 item 5.

Leases, delays and every other duration run on elapsed time, so a step changes none of them;
schedules follow the system clock, keep their pace through a step back and fire no slot twice.
Black-box tests step the wall clock of the server process (tests/clock_hook/sitecustomize.py,
loaded into it through PYTHONPATH); unit tests drive the ServerClock and the Scheduler with the
wall clock and the elapsed time given by the test.
"""

from __future__ import annotations

import os
import re
import time
from datetime import datetime
from pathlib import Path

import pytest

from support_queue import claim, configure, entries_of
from support_servers import ROOT, wait_until
from ezra.broker import Broker
from ezra.broker.clock import ServerClock
from ezra.broker.schedules import Scheduler
from ezra.config import Settings
from ezra.settings.schedule_settings import parse_line
from ezra.storage import decode_fields, open_database
from ezra.protocol.stream_ids import MAX_ID_PART

HOOK = ROOT / "tests" / "clock_hook"
HOUR = 3600
NINE = 1_796_115_600_000  # 2026-12-01 09:00:00 UTC, ms


class SteppedClock:
    """The server process's wall clock, stepped by the test (through the hook's file)."""

    def __init__(self, folder: Path):
        self.path = folder / "clock-offset"
        self.env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{HOOK}", "EZRA_TEST_CLOCK_FILE": str(self.path)}

    def set_offset(self, seconds: float) -> None:
        """Step the server's wall clock to `seconds` from the true time; return once it took it."""
        text = repr(float(seconds))
        self.path.with_suffix(".tmp").write_text(text)
        os.replace(self.path.with_suffix(".tmp"), self.path)
        seen = Path(f"{self.path}.seen")
        wait_until(lambda: seen.exists() and seen.read_text() == text, message="the server to take the step")


def slot_ms(fields: dict) -> int:
    return int(datetime.fromisoformat(fields[b"slot"].decode()).timestamp() * 1000)


# ---------------------------------------------------------------- through the front door

def test_a_lease_runs_out_after_its_length_when_the_clock_steps_back(ezra_factory, tmp_path, protocol):
    clock = SteppedClock(tmp_path)
    server = ezra_factory(env=clock.env)
    client = server.client(protocol)
    client.xgroup_create("jobs", "g", id="0", mkstream=True)
    configure(client, "jobs", "VISIBILITY-TIMEOUT", "2")
    task_id = client.xadd("jobs", {"n": "1"})
    assert [entry[0] for entry in claim(client, "jobs", "dead-worker")] == [task_id]  # never acked
    clock.set_offset(-HOUR)
    # the 2 s lease runs out 2 s after the claim, not an hour later: another worker gets the task
    redelivered = wait_until(lambda: claim(client, "jobs", "w2", block=500), timeout=30,
                             message="the task redelivered after its 2 s lease")
    assert [entry[0] for entry in redelivered] == [task_id]
    pending = client.xpending_range("jobs", "g", "-", "+", 10)
    assert [(row["consumer"], row["times_delivered"]) for row in pending] == [(b"w2", 2)]
    assert client.info("server")["uptime_in_seconds"] >= 0  # -3600 when it was counted on the system clock


def test_a_delay_keeps_its_remaining_time_when_the_clock_steps_back(ezra_factory, tmp_path, protocol):
    clock = SteppedClock(tmp_path)
    server = ezra_factory(env=clock.env)
    client = server.client(protocol)
    client.xgroup_create("later", "g", id="0", mkstream=True)
    task_id = client.execute_command("XADD", "later", "DELAY", "2", "*", "n", "1")
    clock.set_offset(-HOUR)
    got = wait_until(lambda: claim(client, "later", "w", block=500), timeout=30,
                     message="the delayed task due 2 s after its push")
    assert [entry[0] for entry in got] == [task_id]


def test_a_schedule_keeps_its_pace_through_steps_back_and_forward_and_fires_no_slot_twice(
        ezra_factory, tmp_path, protocol):
    clock = SteppedClock(tmp_path)
    server = ezra_factory(env=clock.env)
    client = server.client(protocol)
    started = time.monotonic()
    client.execute_command("XSCHEDULE", "SET", "tick", "ticks", "*/2 * * * * *", "SLOT-FIELD", "slot",
                           "FIELDS", "job", "tick")
    wait_until(lambda: client.xlen("ticks") >= 2, timeout=30, message="two firings")  # the positive control
    for offset in (-HOUR, 0):  # an hour back (a fast clock corrected), then forward again
        clock.set_offset(offset)
        before = client.xlen("ticks")
        wait_until(lambda: client.xlen("ticks") >= before + 3, timeout=30,
                   message=f"three firings after the step to {offset} s")
        # the slots follow the stepped clock (their times are the system clock's, an hour back)
        *_, (last_id, last) = client.xrange("ticks", "-", "+")
        assert abs(slot_ms(last) / 1000 - (time.time() + offset)) < 60
        # the ids and every duration run on elapsed time: the ids never step back
        assert abs(int(last_id.split(b"-")[0]) / 1000 - time.time()) < 60
    elapsed = time.monotonic() - started
    slots = [slot_ms(fields) for _, fields in client.xrange("ticks", "-", "+")]
    assert len(slots) == len(set(slots)), "a slot fired twice"
    # no burst: at most one firing per 2 s that went by, and the one slot the step forward
    # skipped over (fired once, as after downtime); the schedule's own count agrees
    assert len(slots) <= elapsed / 2 + 2, (len(slots), elapsed)
    # each step is logged once, with how far the clock moved
    assert len(re.findall(r"the system clock stepped back 3(599|600)\.\d+ s", server.log())) == 1, server.log()
    assert len(re.findall(r"the system clock stepped forward 3(599|600)\.\d+ s", server.log())) == 1, server.log()
    listed = client.execute_command("XSCHEDULE", "LIST")[0]
    listed = listed if isinstance(listed, dict) else dict(zip(listed[::2], listed[1::2]))
    assert listed[b"firings"] == client.xlen("ticks")


# ---------------------------------------------------------------- in process, time given by the test

class Times:
    """The system clock (wall, seconds) and elapsed time (seconds) the test moves."""

    def __init__(self, wall: float):
        self.wall_s = wall
        self.elapsed_s = 1000.0

    def wall(self) -> float:
        return self.wall_s

    def elapsed(self) -> float:
        return self.elapsed_s

    def run(self, seconds: float) -> None:
        self.wall_s += seconds
        self.elapsed_s += seconds


def test_the_server_clock_starts_at_the_wall_clock_and_runs_on_elapsed_time():
    times = Times(1_700_000_000.0)
    clock = ServerClock(wall=times.wall, elapsed=times.elapsed)
    assert clock.now() == clock.wall() == 1_700_000_000_000
    times.run(2.5)
    assert clock.now() == 1_700_000_002_500
    times.wall_s -= HOUR  # a step back: the server's clock goes on, the wall clock is an hour behind it
    times.run(1)
    assert clock.now() == 1_700_000_003_500 and clock.wall() == 1_700_000_003_500 - HOUR * 1000
    times.wall_s += 2 * HOUR  # a step forward: nor does it jump
    assert clock.now() == 1_700_000_003_500


@pytest.fixture
def stepped_scheduler(tmp_path):
    times = Times(NINE / 1000)
    clock = ServerClock(wall=times.wall, elapsed=times.elapsed)
    broker = Broker(open_database(str(tmp_path / "data")), Settings(data_dir=str(tmp_path), durability="normal"),
                    clock=clock.now, wall_clock=clock.wall)
    yield Scheduler(broker), times
    broker.stop()
    broker.db.close()


def fired_slots(scheduler) -> list[int]:
    rows = scheduler.broker.tasks.range(b"ticks", False, (0, 0), (MAX_ID_PART, MAX_ID_PART), 1000, False).wait()
    return [slot_ms(dict(zip(*[iter(decode_fields(row[2]))] * 2))) for row in rows]


def run_for(scheduler, times, seconds: float, step: float = 0.5) -> None:
    for _ in range(int(seconds / step)):
        times.run(step)
        scheduler.fire_due()


def test_a_step_back_keeps_a_schedules_pace_and_a_step_forward_fires_one_slot(stepped_scheduler):
    scheduler, times = stepped_scheduler
    scheduler.set(parse_line("tick ticks '*/2 * * * * *' SLOT-FIELD slot FIELDS job tick", 1 << 20)).wait()
    run_for(scheduler, times, 10)
    assert len(fired_slots(scheduler)) == 5
    times.wall_s -= HOUR
    run_for(scheduler, times, 10)
    slots = fired_slots(scheduler)
    assert len(slots) == 10 and slots[5] - slots[4] == 2000 - HOUR * 1000  # no wait, no extra firing
    times.wall_s += HOUR
    run_for(scheduler, times, 10)
    slots = fired_slots(scheduler)
    assert len(slots) == 16  # one firing per 2 s, and the one slot the step forward went past, once
    assert len(set(slots)) == len(slots)


def test_a_small_step_back_fires_no_slot_twice(stepped_scheduler):
    scheduler, times = stepped_scheduler
    scheduler.set(parse_line("tick ticks '*/10 * * * * *' SLOT-FIELD slot FIELDS job tick", 1 << 20)).wait()
    run_for(scheduler, times, 21)
    assert len(fired_slots(scheduler)) == 2
    times.wall_s -= 3  # NTP steps a clock off by more than 0.128 s
    run_for(scheduler, times, 30)
    slots = fired_slots(scheduler)
    assert len(slots) == len(set(slots)) == 4  # :10, :20, then :30 and :40 (it came 3 s later)


def test_a_daily_run_is_not_repeated_when_the_clock_steps_back_past_it(stepped_scheduler):
    scheduler, times = stepped_scheduler
    scheduler.set(parse_line("daily ticks '30 9 * * *' SLOT-FIELD slot FIELDS job tick", 1 << 20)).wait()
    run_for(scheduler, times, 35 * 60, step=60)  # fired at 09:30
    assert len(fired_slots(scheduler)) == 1
    times.wall_s -= HOUR  # 09:35 -> 08:35: 09:30 comes round again and is not run again
    run_for(scheduler, times, 2 * HOUR, step=60)
    assert len(fired_slots(scheduler)) == 1
    assert scheduler.broker.writer.call(scheduler.db.schedules.get, b"daily", durable=False).next_at == \
        NINE + (24 * HOUR + 30 * 60) * 1000


def test_a_step_back_while_stopped_is_found_at_the_first_look(stepped_scheduler):
    scheduler, times = stepped_scheduler
    scheduler.set(parse_line("tick ticks '*/2 * * * * *' SLOT-FIELD slot FIELDS job tick", 1 << 20)).wait()
    run_for(scheduler, times, 4)
    fresh = Scheduler(scheduler.broker)  # as after a restart: it has looked at nothing yet
    times.wall_s -= HOUR
    run_for(fresh, times, 10)
    # it fired at 09:00:04 and its next run was 2 s later; at 08:00:04.5, the step is at least
    # 3599.5 s: its next run is the first slot from 09:00:06 less that, 08:00:08
    after_step = [NINE - HOUR * 1000 + second * 1000 for second in (8, 10, 12, 14)]
    assert fired_slots(scheduler) == [NINE + 2000, NINE + 4000, *after_step]
