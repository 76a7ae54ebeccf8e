"""Why a task failed (issue 26, item 1): XNACK ... REASON text, and the reasons EZRA records itself
(a lease that ran out, a worker gone, XDEL, XGROUP DELCONSUMER), kept on the task as its last
failure and shown by XINFO TASKS, across a restart and a migration from schema 4."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest
import redis
from support_http import http
from support_queue import claim, configure
from support_servers import ROOT, wait_until

from ezra.lifecycle import MAX_REASON_BYTES
from ezra.storage import SCHEMA_VERSION


def tasks(r, queue, state: str) -> list[dict]:
    """XINFO TASKS as dicts, in RESP2 (flat pairs) and RESP3 (maps) alike."""
    reply = r.execute_command("XINFO", "TASKS", queue, state)
    return [task if isinstance(task, dict) else dict(zip(task[::2], task[1::2])) for task in reply]


def failure(r, queue, state: str, task_id) -> dict:
    """The failure-* fields of one task, as text (None where empty)."""
    [task] = [t for t in tasks(r, queue, state) if t[b"id"] == task_id]
    shown = {key: task[b"failure-" + key.encode()] for key in ("cause", "reason", "worker")}
    shown = {key: None if value is None else value.decode() for key, value in shown.items()}
    shown["at"] = task[b"failed-at"]
    return shown


def nack(r, queue, mode, task_id, *extra):
    return r.execute_command("XNACK", queue, "g", mode, "IDS", 1, task_id, *extra)


def test_xnack_reason_is_kept_and_shown_by_xinfo_tasks(shared_server, protocol, queue):
    r = shared_server.client(protocol)
    task_id = r.xadd(queue, {"job": "1"})
    assert failure(r, queue, "available", task_id) == {"cause": None, "reason": None, "worker": None, "at": None}
    claim(r, queue, "worker-1")
    assert nack(r, queue, "FAIL", task_id, "REASON", "ValueError: bad input <b>&") == 1
    shown = failure(r, queue, "available", task_id)
    assert shown["at"] > 0
    assert shown | {"at": 0} == {"cause": "nack", "reason": "ValueError: bad input <b>&", "worker": "worker-1",
                                 "at": 0}
    # SILENT without REASON gives the attempt back: not a failure, the record stays
    claim(r, queue, "worker-2")
    assert nack(r, queue, "SILENT", task_id) == 1
    assert failure(r, queue, "available", task_id)["worker"] == "worker-1"
    # SILENT with a REASON records it; RETRYCOUNT and FORCE still read before or after it
    claim(r, queue, "worker-2")
    assert nack(r, queue, "SILENT", task_id, "REASON", "shutting down", "RETRYCOUNT", 0) == 1
    assert failure(r, queue, "available", task_id)["reason"] == "shutting down"
    # FATAL with a reason: the dead task carries it
    claim(r, queue, "worker-3")
    assert nack(r, queue, "FATAL", task_id, "FORCE", "REASON", "KeyError: 'x'") == 1
    assert failure(r, queue, "dead", task_id) | {"at": 0} == {"cause": "nack", "reason": "KeyError: 'x'",
                                                              "worker": "worker-3", "at": 0}
    r.close()


def test_a_nack_without_reason_replaces_the_last_failure(shared_server, protocol, queue):
    r = shared_server.client(protocol)
    task_id = r.xadd(queue, {"job": "1"})
    claim(r, queue, "w1")
    nack(r, queue, "FAIL", task_id, "REASON", "first")
    claim(r, queue, "w2")
    nack(r, queue, "FAIL", task_id)
    assert failure(r, queue, "available", task_id) | {"at": 0} == {"cause": "nack", "reason": None,
                                                                   "worker": "w2", "at": 0}
    r.close()


def test_the_short_form_with_reason_is_a_clear_error(shared_server, protocol, queue):
    r = shared_server.client(protocol)
    task_id = r.xadd(queue, {"job": "1"})
    claim(r, queue, "w1")
    with pytest.raises(redis.ResponseError, match="REASON needs XNACK's long form"):
        r.execute_command("XNACK", queue, "g", task_id, "REASON", "boom")
    with pytest.raises(redis.ResponseError, match="syntax error"):  # REASON without its text
        nack(r, queue, "FAIL", task_id, "REASON")
    [held] = tasks(r, queue, "in_flight")  # nothing changed
    assert held[b"id"] == task_id and held[b"failure-cause"] is None
    r.close()


def test_a_long_reason_is_cut_to_the_bound_with_a_marker(shared_server, protocol, queue):
    r = shared_server.client(protocol)
    task_id = r.xadd(queue, {"job": "1"})
    claim(r, queue, "w1")
    huge = "é" * (512 * 1024)  # 1 MiB of UTF-8, two bytes a character: a cut may fall inside one
    assert nack(r, queue, "FATAL", task_id, "REASON", huge) == 1
    reason = failure(r, queue, "dead", task_id)["reason"]
    assert len(reason.encode()) <= MAX_REASON_BYTES
    assert reason.endswith(" … [cut, 1048576 bytes]") and reason.startswith("é" * 4000)
    r.close()


def test_xdel_and_delconsumer_record_their_own_reason(shared_server, protocol, queue):
    r = shared_server.client(protocol)
    first, second = r.xadd(queue, {"n": "1"}), r.xadd(queue, {"n": "2"})
    claim(r, queue, "w1", count=1)
    claim(r, queue, "w2", count=1)
    assert r.xdel(queue, first) == 1
    assert failure(r, queue, "available", first) | {"at": 0} == {
        "cause": "xdel", "reason": "XDEL reported the failure", "worker": "w1", "at": 0}
    assert r.xgroup_delconsumer(queue, "g", "w2") == 1
    assert failure(r, queue, "available", second) | {"at": 0} == {
        "cause": "consumer deleted", "reason": "XGROUP DELCONSUMER removed worker w2", "worker": "w2", "at": 0}
    r.close()


def test_a_lease_that_runs_out_records_why(ezra_factory, protocol):
    server = ezra_factory("--visibility-timeout", "0.3", "--max-attempts", "1")
    r = server.client(protocol)
    task_id = r.xadd("jobs", {"job": "1"})
    claim(r, "jobs", "worker-1")
    wait_until(lambda: tasks(r, "jobs", "dead"), timeout=15, message="the lease to run out")
    shown = failure(r, "jobs", "dead", task_id)
    assert shown | {"at": 0} == {"cause": "lease expired", "reason": "lease expired after 0.3 s held by worker-1",
                                 "worker": "worker-1", "at": 0}
    r.close()


def test_release_on_disconnect_records_why(shared_server, protocol, queue):
    r = shared_server.client(protocol)
    configure(r, queue, "RELEASE-ON-DISCONNECT", "0.2")
    task_id = r.xadd(queue, {"job": "1"})
    gone = shared_server.client(protocol)
    claim(gone, queue, "worker-gone")
    gone.close()  # its only connection: released after the 0.2 s grace
    wait_until(lambda: tasks(r, queue, "available"), timeout=15, message="the release")
    assert failure(r, queue, "available", task_id) | {"at": 0} == {
        "cause": "worker gone", "worker": "worker-gone", "at": 0,
        "reason": "worker worker-gone gone: its last connection closed and it did not return within 0.2 s "
                  "(RELEASE-ON-DISCONNECT)"}
    r.close()


def test_a_reason_survives_a_restart_and_reads_in_the_sqlite3_shell(ezra_factory, protocol):
    server = ezra_factory()
    r = server.client(protocol)
    task_id = r.xadd("jobs", {"job": "1"})
    claim(r, "jobs", "w1")
    nack(r, "jobs", "FATAL", task_id, "REASON", "OSError: disk on fire")
    r.close()
    server.restart()
    r = server.client(protocol)
    assert failure(r, "jobs", "dead", task_id)["reason"] == "OSError: disk on fire"
    r.close()
    with sqlite3.connect(server.data_dir / "ezra.db") as db:  # what a human sees in a SQLite browser
        [(text,)] = db.execute("SELECT failure FROM tasks_readable WHERE id = ?", (task_id.decode(),)).fetchall()
    record = json.loads(text)
    assert (record["cause"], record["reason"], record["worker"]) == ("nack", "OSError: disk on fire", "w1")


def test_push_and_ack_leave_the_failure_column_null(shared_server, queue):
    r = shared_server.client()
    pushed, acked = r.xadd(queue, {"n": "1"}), r.xadd(queue, {"n": "2"})
    claim(r, queue, "w1", count=1)
    nack(r, queue, "FAIL", pushed, "REASON", "once")
    claim(r, queue, "w1", count=2)
    r.xack(queue, "g", pushed, acked)
    done = {t[b"id"]: t[b"failure-reason"] for t in tasks(r, queue, "done")}
    assert done == {pushed: b"once", acked: None}  # an ack keeps the last failure, writes none
    r.close()


def test_a_schema_4_database_migrates_with_its_tasks(ezra_factory):
    server = ezra_factory()
    r = server.client()
    task_id = r.xadd("jobs", {"job": "1"})
    r.close()
    server.stop()
    with sqlite3.connect(server.data_dir / "ezra.db") as db:  # back to what version 4 wrote
        db.execute("DROP VIEW tasks_readable")  # schema 9's
        db.execute("ALTER TABLE tasks DROP COLUMN failure")
        db.execute("PRAGMA user_version = 4")
    server.start()
    assert f"from schema 4 to {SCHEMA_VERSION}" in server.log()
    r = server.client()
    assert failure(r, "jobs", "available", task_id)["cause"] is None
    claim(r, "jobs", "w1")
    nack(r, "jobs", "FAIL", task_id, "REASON", "after the migration")
    assert failure(r, "jobs", "available", task_id)["reason"] == "after the migration"
    r.close()


def test_ezra_ls_shows_the_last_failure(ezra_factory):
    server = ezra_factory()
    r = server.client()
    task_id = r.xadd("jobs", {"job": "1"})
    claim(r, "jobs", "w1")
    nack(r, "jobs", "FATAL", task_id, "REASON", "ZeroDivisionError: division by zero\n\x1b[31m")
    r.close()
    result = subprocess.run([sys.executable, "-m", "ezra", "ls", "jobs", "--port", str(server.port)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    header, row = result.stdout.splitlines()[:2]
    assert header.split()[-2:] == ["last", "failure"]
    assert row.startswith(task_id.decode()) and "dead" in row
    # the cause, the reason, control characters shown as escapes (not sent to the terminal)
    assert row.endswith("nack: ZeroDivisionError: division by zero\\n\\x1b[31m")


XSS = '<script>window.__xss=1</script><img src=x onerror="window.__xss=1">'


def test_the_dashboard_shows_the_escaped_reason_of_dead_and_retried_tasks(ezra_factory):
    server = ezra_factory("--http-port", "0")
    r = server.client()
    dead_id, retried_id = r.xadd("mail", {"n": "1"}), r.xadd("mail", {"n": "2"})
    claim(r, "mail", "mailer-1", count=2)
    nack(r, "mail", "FATAL", dead_id, "REASON", f"SMTPError: {XSS}")
    nack(r, "mail", "FAIL", retried_id, "REASON", "TimeoutError: <slow>")
    r.close()
    status, _, body = http(f"{server.http_url}/queue?name=mail")
    assert status == 200
    assert b"<script>window" not in body and b"<img src=x" not in body and b"<slow>" not in body
    dead_table = body.split(b'<table class="tasks dead">', 1)[1].split(b"</table>", 1)[0]
    assert b'<span class="reason">SMTPError: &lt;script&gt;window.__xss=1&lt;/script&gt;' in dead_table
    assert b"by mailer-1" in dead_table and b'<span class="cause">nack</span>' in dead_table
    waiting = body.split(b"Next available", 1)[1]
    assert b'<span class="reason">TimeoutError: &lt;slow&gt;</span>' in waiting


def failures_of(r, queue) -> dict:
    """{id: (state, cause, reason, worker, failed-at)} of a queue's unfinished and dead tasks."""
    shown = {}
    for state in ("unfinished", "dead"):
        for task in tasks(r, queue, state):
            shown[task[b"id"]] = (task[b"state"], task[b"failure-cause"], task[b"failure-reason"],
                                  task[b"failure-worker"], task[b"failed-at"])
    return shown


@pytest.mark.parametrize("source_flag", ["--port", "--data-dir"])
def test_export_and_import_carry_the_last_failure(ezra_factory, redis_server_port, source_flag):
    source, target = ezra_factory("--max-attempts", "5"), ezra_factory()
    r = source.client()
    queue = f"moved-{source_flag[2:]}"
    retried, dead, clean = r.xadd(queue, {"n": "1"}), r.xadd(queue, {"n": "2"}), r.xadd(queue, {"n": "3"})
    claim(r, queue, "worker-1", count=2)
    nack(r, queue, "FAIL", retried, "REASON", "TimeoutError: slow ✓")
    nack(r, queue, "FATAL", dead, "REASON", 'ValueError: "quoted" \\ and\nnewline')
    before = failures_of(r, queue)
    assert before[clean][1] is None and before[dead][2] == b'ValueError: "quoted" \\ and\nnewline'
    redis_url = f"redis://127.0.0.1:{redis_server_port}"
    where = str(source.port) if source_flag == "--port" else str(source.data_dir)
    exported = subprocess.run([sys.executable, "-m", "ezra", "export", source_flag, where, "--to", redis_url, queue],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert exported.returncode == 0, exported.stderr
    red = redis.Redis(port=redis_server_port)
    stored = red.hgetall(f"{queue}::ezra-failures")  # beside the streams: entries stay the user's
    assert set(stored) == {retried, dead}
    assert json.loads(stored[dead])["reason"] == 'ValueError: "quoted" \\ and\nnewline'
    assert red.xrange(f"{queue}::dead")[0][1] == {b"n": b"2"}
    imported = subprocess.run([sys.executable, "-m", "ezra", "import", "--port", str(target.port), "--from",
                               redis_url, queue], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert imported.returncode == 0, imported.stderr
    after = failures_of(target.client(), queue)
    assert {task_id: shown[1:] for task_id, shown in after.items()} == \
        {task_id: shown[1:] for task_id, shown in before.items()}
    r.close()


def test_xadd_failure_refuses_what_is_not_a_failure_record(shared_server, protocol, queue):
    r = shared_server.client(protocol)
    for bad in ("not json", "[1]", '{"reason": "no cause"}', '{"cause": "nack", "at": "soon"}',
                '{"cause": "nack", "worker": 7}'):
        with pytest.raises(redis.ResponseError, match="FAILURE must be a JSON object"):
            r.execute_command("XADD", queue, "FAILURE", bad, "*", "n", "1")
    assert r.xlen(queue) == 0  # nothing stored
    long = json.dumps({"cause": "nack", "reason": "x" * 100000, "worker": None, "at": 5})
    task_id = r.execute_command("XADD", queue, "FAILURE", long, "*", "n", "1")
    shown = failure(r, queue, "available", task_id)
    assert len(shown["reason"].encode()) <= MAX_REASON_BYTES and shown["reason"].endswith("[cut, 100000 bytes]")
    assert (shown["cause"], shown["at"]) == ("nack", 5)
    r.close()
