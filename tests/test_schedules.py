"""Schedules (XSCHEDULE, --schedule / config `schedule` lines): issue 26 item 2.

The times (next slot, daylight saving, downtime) are unit tests with the clock moved (cron.py
and the Scheduler over an in-process Broker take `now`); the rest goes through the front door:
a real server, redis-py in RESP2 and RESP3, kill -9 around firings.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest
import redis

from support_http import http, scrape, value
from support_queue import entries_of, submit_broken_request
from support_servers import ROOT, wait_until
from ezra.protocol import stream_ids
from ezra.broker import Broker
from ezra.broker.schedules import Scheduler
from ezra.config import Settings, parse_settings
from ezra.settings.cron import Cron, CronError
from ezra.settings.schedule_settings import parse_line
from ezra.storage import SCHEMA_VERSION, decode_fields, open_database
from support_broker import claim_committed

PARIS = ZoneInfo("Europe/Paris")


def paris_ms(*when, fold=0) -> int:
    return int(datetime(*when, tzinfo=PARIS, fold=fold).timestamp() * 1000)


def utc_ms(*when) -> int:
    return int(datetime(*when, tzinfo=timezone.utc).timestamp() * 1000)


def runs(cron: Cron, after_ms: int, n: int) -> list[str]:
    out = []
    for _ in range(n):
        after_ms = cron.next_after(after_ms)
        out.append(cron.local(after_ms))
    return out


# ---------------------------------------------------------------- next slot, daylight saving (pure)

def test_a_skipped_time_runs_once_just_after_the_gap():
    # 2026-03-29: Paris clocks go 02:00 -> 03:00; 02:30 does not exist that day
    cron = Cron("30 2 * * *", "Europe/Paris")
    assert runs(cron, paris_ms(2026, 3, 28, 12, 0), 3) == [
        "2026-03-29T03:00:00+02:00",  # once, just after the gap
        "2026-03-30T02:30:00+02:00", "2026-03-31T02:30:00+02:00"]


def test_a_repeated_time_runs_once():
    # 2026-10-25: Paris clocks go 03:00 -> 02:00; 02:30 happens twice, the job runs at the first only
    cron = Cron("30 2 * * *", "Europe/Paris")
    assert runs(cron, paris_ms(2026, 10, 24, 12, 0), 3) == [
        "2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00", "2026-10-27T02:30:00+01:00"]
    # asked during the second pass of 02:xx (a start then), the first pass is not run again
    assert runs(cron, paris_ms(2026, 10, 25, 2, 10, fold=1), 1) == ["2026-10-26T02:30:00+01:00"]


def test_an_hourly_job_follows_elapsed_time_through_the_repeated_hour():
    cron = Cron("@hourly", "Europe/Paris")
    assert runs(cron, paris_ms(2026, 10, 25, 0, 30), 4) == [
        "2026-10-25T01:00:00+02:00", "2026-10-25T02:00:00+02:00", "2026-10-25T02:00:00+01:00",
        "2026-10-25T03:00:00+01:00"]


def test_expressions_names_seconds_and_zones():
    assert runs(Cron("0 9,17 * * MON-FRI"), utc_ms(2026, 12, 4, 10, 0), 3) == [  # a Friday
        "2026-12-04T17:00:00+00:00", "2026-12-07T09:00:00+00:00", "2026-12-07T17:00:00+00:00"]
    assert runs(Cron("@daily", "America/New_York"), utc_ms(2026, 12, 1, 0, 0), 1) == ["2026-12-01T00:00:00-05:00"]
    assert Cron("*/5 * * * * *").next_after(utc_ms(2026, 1, 1) + 1) == utc_ms(2026, 1, 1) + 5000
    assert Cron("* * * * *").next_after(utc_ms(2026, 1, 1)) == utc_ms(2026, 1, 1, 0, 1)  # strictly after


@pytest.mark.parametrize("text, message", [
    ("61 * * * *", "Bad minute"), ("* * *", "has 3 fields"), ("@often", "unknown cron name"),
    ("*/0 * * * *", "Bad minute"), ("0 0 31 2 *", "Bad day-of-month"), ("* * * * * * *", "has 7 fields"),
])
def test_bad_expressions_are_refused_with_the_reason(text, message):
    with pytest.raises(CronError, match=message):
        Cron(text)


@pytest.mark.parametrize("zone", ["Mars/Olympus", "../../etc/passwd", "/etc/localtime", ""])
def test_bad_zones_are_refused(zone):
    with pytest.raises(CronError, match="unknown time zone"):
        Cron("* * * * *", zone)


# ---------------------------------------------------------------- the Scheduler, clock moved

class Clock:
    def __init__(self, now: int):
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def scheduler(tmp_path):
    clock = Clock(utc_ms(2026, 12, 1, 8, 59, 30))
    broker = Broker(open_database(str(tmp_path / "data")), Settings(data_dir=str(tmp_path), durability="normal"),
                    clock=clock)
    yield Scheduler(broker), clock
    broker.stop()
    broker.db.close()


TOP = (stream_ids.MAX_ID_PART, stream_ids.MAX_ID_PART)


def tasks(scheduler, queue=b"reports") -> list[list[bytes]]:
    """The fields of every task in the queue, oldest first."""
    return [decode_fields(row[2]) for row in scheduler.broker.tasks.range(queue, False, (0, 0), TOP, 100, False).wait()]


def define(line: str):
    return parse_line(line, 1 << 20)


def test_a_slot_fires_once_and_downtime_gives_one_catch_up_run(scheduler):
    scheduler, clock = scheduler
    scheduler.set(define("hourly reports '0 * * * *' SLOT-FIELD slot FIELDS job report")).wait()
    assert scheduler.fire_due() == (False, utc_ms(2026, 12, 1, 9))
    assert tasks(scheduler) == []
    clock.now = utc_ms(2026, 12, 1, 9, 0, 0) + 5
    scheduler.fire_due()
    scheduler.fire_due()  # the same slot again: nothing
    assert tasks(scheduler) == [[b"job", b"report", b"slot", b"2026-12-01T09:00:00+00:00"]]
    clock.now = utc_ms(2026, 12, 1, 14, 30)  # down from 09:00 to 14:30: slots 10..14 missed
    more, earliest = scheduler.fire_due()
    assert earliest == utc_ms(2026, 12, 1, 15)  # the next one after now, not 11:00
    assert [fields[-1] for fields in tasks(scheduler)] == [b"2026-12-01T09:00:00+00:00", b"2026-12-01T10:00:00+00:00"]
    (row,) = scheduler.rows().wait()
    assert (row.firings, row.last_slot, row.next_at) == (2, utc_ms(2026, 12, 1, 10), utc_ms(2026, 12, 1, 15))


def test_a_rolled_back_firing_leaves_neither_its_task_nor_its_record(scheduler):
    scheduler, clock = scheduler
    scheduler.set(define("hourly reports '0 * * * *' FIELDS job report")).wait()
    clock.now = utc_ms(2026, 12, 1, 9, 0, 1)
    firing = scheduler._fire_batch(clock.now)  # this loop turn's batch...
    submit_broken_request(scheduler.broker)  # ...rolls back whole
    with pytest.raises(Exception, match="storage error"):
        firing.wait()
    (row,) = scheduler.rows().wait()
    assert (tasks(scheduler), row.firings, row.next_at) == ([], 0, utc_ms(2026, 12, 1, 9))
    scheduler.fire_due()  # the slot is still due: it fires now, once
    scheduler.fire_due()
    (row,) = scheduler.rows().wait()
    assert (len(tasks(scheduler)), row.firings, row.last_slot) == (1, 1, utc_ms(2026, 12, 1, 9))


def test_the_same_definition_again_keeps_its_runs_a_new_one_starts_over(scheduler):
    scheduler, clock = scheduler
    line = "hourly reports '0 * * * *' FIELDS job report"
    assert scheduler.set(define(line)).wait() is True
    clock.now = utc_ms(2026, 12, 1, 11, 30)  # 09:00 was due, and 10:00, 11:00
    assert scheduler.set(define(line)).wait() is False  # a restart applying the same config line
    scheduler.fire_due()
    assert len(tasks(scheduler)) == 1  # the catch-up run survived the SET
    assert scheduler.set(define("hourly reports '30 * * * *' FIELDS job report")).wait() is True
    (row,) = scheduler.rows().wait()
    assert (row.firings, row.next_at) == (0, utc_ms(2026, 12, 1, 12, 30))


def test_skip_if_unfinished_passes_slots_while_the_last_task_is_unfinished(scheduler):
    scheduler, clock = scheduler
    scheduler.set(define("hourly reports '0 * * * *' SKIP-IF-UNFINISHED FIELDS job report")).wait()
    for hour in (9, 10, 11):
        clock.now = utc_ms(2026, 12, 1, hour)
        scheduler.fire_due()
    assert len(tasks(scheduler)) == 1
    (row,) = scheduler.rows().wait()
    assert (row.firings, row.skipped) == (1, 2)
    result = claim_committed(scheduler.broker, [b"reports"], b"w", 10, False)
    scheduler.broker.tasks.ack(b"reports", [result[b"reports"][0][:2]]).wait()  # a task row: its id first
    clock.now = utc_ms(2026, 12, 1, 12)
    scheduler.fire_due()
    assert len(tasks(scheduler)) == 2


def test_a_skipped_time_fires_once_with_the_clock_moved_through_the_gap(scheduler):
    scheduler, clock = scheduler
    clock.now = paris_ms(2026, 3, 29, 1, 0)
    scheduler.set(define("night reports '30 2 * * *' TZ Europe/Paris SLOT-FIELD slot FIELDS job n")).wait()
    for minute in range(0, 240, 10):  # 01:00 .. 05:00 (wall clock), ten minutes at a time
        clock.now = paris_ms(2026, 3, 29, 1, 0) + minute * 60_000
        scheduler.fire_due()
    assert [fields[-1] for fields in tasks(scheduler)] == [b"2026-03-29T03:00:00+02:00"]


# ---------------------------------------------------------------- through the front door

def xschedule(client, *args):
    return client.execute_command("XSCHEDULE", *args)


def as_text(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return [as_text(item) for item in value]
    return value


def listed(client) -> dict:
    """XSCHEDULE LIST as {name: {field: value}}, in RESP2 (flat pairs) or RESP3 (maps)."""
    out = {}
    for item in xschedule(client, "LIST"):
        if isinstance(item, list):
            item = dict(zip(item[::2], item[1::2]))
        item = {as_text(key): as_text(value) for key, value in item.items()}
        out[item["name"]] = item
    return out


def test_set_list_del_round_trip(r, queue):
    name = f"{queue}-nightly"
    assert xschedule(r, "SET", name, queue, "0 9,17 * * *", "TZ", "Europe/Paris", "FIELDS", "job", "x", "n", "1") \
        in (b"OK", "OK", True)
    entry = listed(r)[name]
    next_run = entry.pop("next-run")
    assert entry == {"name": name, "queue": queue, "cron": "0 9,17 * * *", "tz": "Europe/Paris",
                     "fields": ["job", "x", "n", "1"], "skip-if-unfinished": 0, "slot-field": None,
                     "origin": "command", "next-run-local": entry["next-run-local"], "last-run": None,
                     "last-fired-at": None, "last-task-id": None, "firings": 0, "skipped": 0}
    local = datetime.fromisoformat(entry["next-run-local"])
    assert local.hour in (9, 17) and local.minute == 0 and int(local.timestamp() * 1000) == next_run
    assert next_run > time.time() * 1000
    xschedule(r, "SET", name, queue, "@hourly", "SKIP-IF-UNFINISHED", "SLOT-FIELD", "slot", "FIELDS", "job", "y")
    entry = listed(r)[name]
    assert (entry["cron"], entry["tz"], entry["skip-if-unfinished"], entry["slot-field"], entry["fields"]) == (
        "@hourly", "UTC", 1, "slot", ["job", "y"])
    assert xschedule(r, "DEL", name) == 1
    assert xschedule(r, "DEL", name) == 0
    assert name not in listed(r)


@pytest.mark.parametrize("args, message", [
    (["SET", "s", "q", "0 25 * * *", "FIELDS", "a", "b"], "Bad hour"),
    (["SET", "s", "q", "every day", "FIELDS", "a", "b"], "has 2 fields"),
    (["SET", "s", "q", "* * * * *", "TZ", "Mars/Olympus", "FIELDS", "a", "b"], "unknown time zone"),
    (["SET", "s", "q::dead", "* * * * *", "FIELDS", "a", "b"], "read-only dead-letter view"),
    (["SET", "s", "q" * 300, "* * * * *", "FIELDS", "a", "b"], "a new queue's name is at most 256 bytes"),
    (["SET", "s" * 300, "q", "* * * * *", "FIELDS", "a", "b"], "schedule name must be 1 to 256 bytes"),
    (["SET", "s", "q", "* * * * *", "FIELDS", "a"], "field value pairs"),
    (["SET", "s", "q", "* * * * *", "a", "b"], "unknown schedule option 'a'"),
    (["SET", "s", "q", "* * * * *", "TZ", "UTC"], "FIELDS field value"),
    (["DEL"], "wrong number of arguments for 'xschedule|del'"),
    (["NOPE"], "unknown subcommand 'NOPE'"),
])
def test_bad_definitions_get_clear_errors_and_store_nothing(r, args, message):
    with pytest.raises(redis.ResponseError, match=message):
        xschedule(r, *args)
    assert "s" not in listed(r)


def test_a_schedule_every_second_pushes_as_xadd_does(ezra_factory, protocol):
    server = ezra_factory()
    client = server.client(protocol)
    waiter = server.client(protocol)
    client.xgroup_create("ticks", "g", id="0", mkstream=True)
    xschedule(client, "SET", "tick", "ticks", "* * * * * *", "SLOT-FIELD", "slot", "FIELDS", "job", "tick")
    # a worker blocked on the queue is woken by the firing
    ((_, fields),) = entries_of(waiter.xreadgroup("g", "w", {"ticks": ">"}, count=1, block=10_000), "ticks")
    assert fields[b"job"] == b"tick" and datetime.fromisoformat(fields[b"slot"].decode()).microsecond == 0
    wait_until(lambda: client.xlen("ticks") >= 3, timeout=30, message="three firings")
    entry = listed(client)["tick"]
    assert entry["firings"] >= 3 and entry["last-task-id"] is not None
    xschedule(client, "DEL", "tick")
    count = client.xlen("ticks")
    deadline = entry["next-run"] + 2000  # two more slots go by: no firing after DEL
    wait_until(lambda: time.time() * 1000 > deadline, timeout=30, message="two more slots")
    assert client.xlen("ticks") == count


def slots_in_db(data_dir) -> tuple[list[int], tuple]:
    """(every task's slot, as ms; (last_slot, firings) of the schedule) read with sqlite3, the server down."""
    db = sqlite3.connect(f"file:{data_dir}/ezra.db?mode=ro", uri=True)
    try:
        slots = [int(datetime.fromisoformat(json.loads(fields)[3]).timestamp() * 1000)
                 for (fields,) in db.execute("SELECT fields FROM tasks WHERE queue = 'ticks' ORDER BY id_ms, id_seq")]
        row = db.execute("SELECT last_slot, firings FROM schedules WHERE name = 'tick'").fetchone()
    finally:
        db.close()
    return slots, row


@pytest.mark.slow
def test_kill_9_around_firings_never_fires_a_slot_twice_and_catches_up_once(ezra_factory):
    server = ezra_factory("--schedule", "tick ticks '* * * * * *' SLOT-FIELD slot FIELDS job tick")
    rng = random.Random(26)
    down = None  # (last slot before the kill, when the server was started again)
    for cycle in range(4):
        client = server.client()
        start = client.xlen("ticks")
        wait_until(lambda: client.xlen("ticks") >= start + 2, timeout=30, message="two firings")
        time.sleep(rng.random())  # places the kill at a random point of a second (before, in, after a commit)
        server.kill9()
        slots, (last_slot, firings) = slots_in_db(server.data_dir)
        assert len(slots) == len(set(slots)) == firings, slots  # no slot twice; each firing has its task
        assert slots == sorted(slots) and max(slots) == last_slot
        if down is not None:  # the downtime before: one catch-up run, the first slot missed
            assert [slot for slot in slots if down[0] < slot < down[1]] == [down[0] + 1000], (down, slots)
        wait_until(lambda: time.time() * 1000 > last_slot + 3500, timeout=30, message="three slots missed")
        down = (last_slot, int(time.time() * 1000))
        server.start()


def test_a_catch_up_run_after_downtime_is_one_task(ezra_factory):
    server = ezra_factory("--schedule", "tick ticks '* * * * * *' SLOT-FIELD slot FIELDS job tick")
    client = server.client()
    wait_until(lambda: client.xlen("ticks") >= 1, timeout=30, message="a firing")
    server.kill9()
    before, (last_slot, _) = slots_in_db(server.data_dir)
    down_until = last_slot + 4500  # slots last+1 .. last+4 are missed
    wait_until(lambda: time.time() * 1000 > down_until, timeout=30, message="downtime")
    started_at = int(time.time() * 1000)
    server.start()
    client = server.client()
    wait_until(lambda: client.xlen("ticks") >= len(before) + 2, timeout=30, message="firings after the restart")
    server.kill9()
    slots, _ = slots_in_db(server.data_dir)
    missed = [slot for slot in slots if last_slot < slot < started_at]
    assert missed == [last_slot + 1000]  # one catch-up run (the first slot missed), not four


CONFIG = ("""schedule = ["nightly reports '0 9,17 * * *' TZ Europe/Paris FIELDS job 'nightly, with a comma'", """
          """"hourly reports @hourly SKIP-IF-UNFINISHED FIELDS job hourly"]\n""")


def test_config_lines_are_applied_at_every_start_and_removed_when_dropped(ezra_factory, tmp_path, protocol):
    config = tmp_path / "ezra.conf"
    config.write_text(CONFIG)
    server = ezra_factory("--config", str(config))
    client = server.client(protocol)
    schedules = listed(client)
    assert schedules["nightly"]["cron"] == "0 9,17 * * *" and schedules["nightly"]["tz"] == "Europe/Paris"
    assert schedules["nightly"]["fields"] == ["job", "nightly, with a comma"]
    assert schedules["hourly"]["skip-if-unfinished"] == 1
    assert {s["origin"] for s in schedules.values()} == {"config"}
    xschedule(client, "SET", "mine", "reports", "@daily", "FIELDS", "job", "mine")
    config.write_text('schedule = ["hourly reports @hourly SKIP-IF-UNFINISHED FIELDS job hourly"]\n')
    server.restart()
    assert set(listed(server.client(protocol))) == {"hourly", "mine"}  # nightly went with its line; mine stays


def test_bad_config_lines_stop_the_start_with_the_line(tmp_path):
    with pytest.raises(SystemExit):
        parse_settings(["--schedule", "s q '61 * * * *' FIELDS a b"])
    with pytest.raises(SystemExit):
        parse_settings(["--schedule", "s q '* * * * *' FIELDS a b", "--schedule", "s q @daily FIELDS a b"])
    settings = parse_settings(["--schedule", "s q '0 9,17 * * *' TZ UTC FIELDS a b"])
    (definition,) = settings.schedules
    assert (definition.name, definition.queue, definition.cron.text) == (b"s", b"q", "0 9,17 * * *")


def test_the_environment_takes_a_json_list_of_schedules(monkeypatch):
    monkeypatch.setenv("EZRA_SCHEDULE", json.dumps(["a q '0 9,17 * * *' TZ Asia/Tokyo FIELDS job a",
                                                    "b q @weekly FIELDS job b"]))
    settings = parse_settings([])
    assert [(d.name, d.cron.text, d.cron.zone_name) for d in settings.schedules] == [
        (b"a", "0 9,17 * * *", "Asia/Tokyo"), (b"b", "@weekly", "UTC")]


def test_info_counts_the_schedules(ezra_factory, protocol):
    client = ezra_factory().client(protocol)
    assert client.info("schedules") == {"schedules": 0, "schedule_firings": 0, "schedule_next_run": 0}
    xschedule(client, "SET", "tick", "ticks", "* * * * * *", "FIELDS", "job", "tick")
    wait_until(lambda: client.info("schedules")["schedule_firings"] >= 1, timeout=30, message="a firing")
    info = client.info("schedules")
    assert info["schedules"] == 1 and info["schedule_next_run"] % 1000 == 0  # a whole second: the next slot
    assert info["schedule_next_run"] > time.time() * 1000 - 5000


def test_a_schema_3_database_gains_the_schedules_table(tmp_path):
    data = tmp_path / "data"
    open_database(str(data)).close()
    db = sqlite3.connect(data / "ezra.db")
    db.execute("DROP TABLE schedules")
    db.execute("PRAGMA user_version = 3")
    db.commit()
    db.close()
    open_database(str(data)).close()
    db = sqlite3.connect(data / "ezra.db")
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION  # 4 then; 5 tasks.failure, 6 UNIQUE, 7 CHECK
        assert db.execute("SELECT count(*) FROM schedules").fetchone()[0] == 0
    finally:
        db.close()


def test_metrics_and_dashboard_show_each_schedule(ezra_factory):
    server = ezra_factory("--http-port", "0")
    client = server.client()
    xschedule(client, "SET", "tick", "ticks", "* * * * * *", "FIELDS", "job", "tick")
    xschedule(client, "SET", "<b>night</b>", "reports", "30 2 * * *", "TZ", "Europe/Paris", "FIELDS", "job", "n")
    wait_until(lambda: listed(client)["tick"]["firings"] >= 2, timeout=30, message="two firings")
    samples = scrape(server)
    assert value(samples, "ezra_schedules") == 2
    assert value(samples, "ezra_schedule_firings_total", schedule="tick") >= 2
    assert value(samples, "ezra_schedule_firings_total", schedule="<b>night</b>") == 0
    night = datetime.fromtimestamp(value(samples, "ezra_schedule_next_run_timestamp_seconds",
                                         schedule="<b>night</b>"), PARIS)
    assert (night.hour, night.minute) in ((2, 30), (3, 0))
    last = value(samples, "ezra_schedule_last_run_timestamp_seconds", schedule="tick")
    assert last == int(last) and last * 1000 <= listed(client)["tick"]["last-run"]
    assert ("ezra_schedule_last_run_timestamp_seconds", frozenset({("schedule", "<b>night</b>")})) not in samples
    status, _, page = http(server.http_url + "/")
    assert status == 200
    assert b"<h2>Schedules</h2>" in page and b'data-schedule="tick"' in page
    assert b"&lt;b&gt;night&lt;/b&gt;" in page and b"<b>night</b>" not in page  # escaped like every name
    assert b"Europe/Paris" in page and b'href="/queue?name=reports"' in page


def test_a_server_without_schedules_never_loads_the_cron_library(tmp_path):
    script = f"""
import sys
import gevent
from ezra.app import App
from ezra.config import parse_settings
app = App(parse_settings(["--port", "0", "--data-dir", {str(tmp_path / "data")!r}]))
app.start()
gevent.sleep(0.05)  # the scheduler's greenlet has looked for schedules due
app.stop()
print(sorted(m for m in ("cronsim", "zoneinfo") if m in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            cwd=str(ROOT), env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"  # idle memory: loaded with the first schedule only


# ---------------------------------------------------------------- settled points still open (finish of issue 26)

def test_a_server_with_a_schedule_loads_the_cron_library(tmp_path):
    """The other side of the idle-memory test above: with a schedule, cronsim is what computes its times
    (so that test's module names are the ones EZRA really loads)."""
    script = f"""
import sys
import gevent
from ezra.app import App
from ezra.config import parse_settings
app = App(parse_settings(["--port", "0", "--data-dir", {str(tmp_path / "data")!r},
                          "--schedule", "nightly reports @daily FIELDS job n"]))
app.start()
gevent.sleep(0.05)
app.stop()
print(sorted(m for m in ("cronsim", "zoneinfo") if m in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            cwd=str(ROOT), env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert result.returncode == 0, result.stderr
    assert "cronsim" in result.stdout.strip().splitlines()[-1]


def test_schedules_are_bounded_in_number_and_name_so_metrics_stay_bounded(ezra_factory):
    """/metrics has one series per schedule and family: at most MAX_SCHEDULES of them, each label at most
    256 bytes (as queue names are bounded there), the limit itself fine, one more a clear error."""
    from ezra.broker.schedules import MAX_SCHEDULES
    server = ezra_factory("--http-port", "0")
    client = server.client()
    longest = "s" * 256
    pipe = client.pipeline(transaction=False)
    for n in range(MAX_SCHEDULES - 1):
        pipe.execute_command("XSCHEDULE", "SET", f"s{n}", "reports", "@yearly", "FIELDS", "n", str(n))
    pipe.execute_command("XSCHEDULE", "SET", longest, "reports", "@yearly", "FIELDS", "n", "last")
    assert all(reply in (b"OK", True) for reply in pipe.execute())
    with pytest.raises(redis.ResponseError, match=f"too many schedules \\(at most {MAX_SCHEDULES}\\)"):
        xschedule(client, "SET", "one-more", "reports", "@yearly", "FIELDS", "n", "x")
    xschedule(client, "SET", "s0", "reports", "@monthly", "FIELDS", "n", "0")  # replacing one is fine at the bound
    assert len(listed(client)) == MAX_SCHEDULES and "one-more" not in listed(client)
    samples = scrape(server)
    firings = [labels for name, labels in samples if name == "ezra_schedule_firings_total"]
    assert len(firings) == MAX_SCHEDULES
    assert max(len(dict(labels)["schedule"].encode()) for labels in firings) == 256
    assert value(samples, "ezra_schedule_firings_total", schedule=longest) == 0
    assert xschedule(client, "DEL", "s1") == 1  # a DEL makes room again
    xschedule(client, "SET", "one-more", "reports", "@yearly", "FIELDS", "n", "x")
