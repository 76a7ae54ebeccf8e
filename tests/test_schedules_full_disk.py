"""Schedules on a full disk (issue 45 item 2): a firing is a push, and waits as pushes are refused.

A firing adds a row, as XADD does. Firings that went on in full-disk mode used up the reserve kept
for the workers' claims and acks: with 50 schedules firing 40 KB a second, workers got thousands of
'database or disk is full' errors in 8 s, and the reaper logged 'reaper pass failed' with a traceback
every pass. Now a firing waits while the disk is full (its slot kept), the log says so once, and
each schedule fires that slot once when there is room again.
"""

from __future__ import annotations

import errno
import os
import time
from datetime import datetime

import pytest
import redis

from reliability import report
from support_disk import tmpfs
from support_servers import wait_until

pytestmark = pytest.mark.slow  # a tmpfs filled on purpose, and 8 s of work on a full disk

SCHEDULES = 50
FIELD = b"x" * 40_000  # 50 schedules x 40 KB a second: 2 MB a second
WORK_SECONDS = 8


@pytest.fixture
def fs_48m(tmp_path):
    """A 48 MB tmpfs: room for the schedules' table and the workers' tasks, then filled with a file."""
    yield from tmpfs(tmp_path / "fs48", "48m")


def xschedule(client, *args):
    return client.execute_command("XSCHEDULE", *args)


def next_runs(client) -> dict[str, int]:
    """{schedule name: next-run (ms)} from XSCHEDULE LIST (RESP2: flat pairs)."""
    out = {}
    for item in xschedule(client, "LIST"):
        entry = dict(zip(item[::2], item[1::2]))
        out[entry[b"name"].decode()] = entry[b"next-run"]
    return out


def work(client, seconds: float) -> tuple[int, int, list[str]]:
    """A worker claiming and acking one task at a time for `seconds`: (cycles, errors, a few errors)."""
    cycles, failed, seen = 0, 0, []
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        cycles += 1
        try:
            claimed = client.xreadgroup("g", "w", {"jobs": ">"}, count=1)
            if claimed:
                client.xack("jobs", "g", claimed[0][1][0][0])
        except redis.ResponseError as exc:
            failed += 1
            if len(seen) < 3:
                seen.append(str(exc))
    return cycles, failed, seen


def fill(mount_point, room: int):
    """A file filling the file system but about `room` bytes, written while the schedules write too:
    it stops early if they took the room first. The file."""
    filler = mount_point / "filler"
    stats = os.statvfs(mount_point)
    left = stats.f_bavail * stats.f_frsize - room
    with open(filler, "wb") as out:
        try:
            while left > 0:
                left -= out.write(b"\0" * min(left, 1024 * 1024))
                out.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


def slots_by_schedule(client) -> dict[str, list[int]]:
    """Every task of the `ticks` queue as {schedule: [slot (ms), ...]} in push order."""
    out: dict[str, list[int]] = {}
    for _, fields in client.xrange("ticks"):
        slot = int(datetime.fromisoformat(fields[b"slot"].decode()).timestamp() * 1000)
        out.setdefault(fields[b"s"].decode(), []).append(slot)
    return out


def test_firings_wait_on_a_full_disk_and_the_workers_go_on(fs_48m, ezra_factory):
    server = ezra_factory(data_dir=fs_48m)  # the default 4 MB reserve
    client = server.client()
    client.xgroup_create("jobs", "g", id="0", mkstream=True)
    pipe = client.pipeline(transaction=False)
    for n in range(20_000):
        pipe.xadd("jobs", {"n": str(n)})
    pipe.execute()
    for n in range(SCHEDULES):
        xschedule(client, "SET", f"s{n}", "ticks", "* * * * * *", "SLOT-FIELD", "slot", "FIELDS", "s", f"s{n}",
                  "pad", FIELD)
    wait_until(lambda: client.xlen("ticks") >= 2 * SCHEDULES, 30, message="the schedules to fire")
    filler = fill(fs_48m, 1024 * 1024)  # the firings fill the rest within a second
    wait_until(lambda: "disk full:" in server.log(), 30, message="the full-disk mode to start")
    time.sleep(1.5)  # the episode's first second: the batch that met the full disk, run again
    log_before = server.log()
    ticks_before = client.xlen("ticks")
    cycles, failed, seen = work(server.client(), WORK_SECONDS)
    reaper_failures = server.log()[len(log_before):].count("reaper pass failed")
    report("schedules_full_disk", seconds=WORK_SECONDS, worker_cycles=cycles, worker_errors=failed,
           reaper_failures=reaper_failures)
    assert cycles > 100, cycles  # the worker did work: the counts below mean something
    assert (failed, reaper_failures) == (0, 0), seen
    assert client.xlen("ticks") == ticks_before  # nothing fired while the disk was full...
    waiting = next_runs(client)
    assert all(next_run < time.time() * 1000 for next_run in waiting.values())  # ...each with a slot due, kept
    log = server.log()
    assert log.count("schedules wait: the disk is full") == 1, log[-3000:]
    assert "firing schedules failed" not in log and "reaper pass failed" not in log

    filler.unlink()  # room again: each schedule fires its kept slot once, then goes on
    wait_until(lambda: all(len(slots) >= 2 and max(slots) > waiting[name]
                           for name, slots in slots_by_schedule(client).items()), 60,
               message="every schedule to fire again")
    assert "schedules fire again" in server.log()
    for name, slots in slots_by_schedule(client).items():
        assert len(slots) == len(set(slots)) and slots == sorted(slots), (name, slots)  # no slot twice
        assert waiting[name] in slots, (name, waiting[name], slots)  # the slot kept was fired
    assert server.log().count("schedules wait: the disk is full") == 1
