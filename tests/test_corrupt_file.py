"""A corrupt ezra.db is found, reported and no longer written (issue 21 item 11).

Before: after one page of garbage EZRA started as if nothing were wrong (XLEN 3000),
then claims failed with `database disk image is malformed` and a traceback each time,
and pushes went on writing into the damaged file. Now a quick_check on a thread of its
own after start (or the first malformed page a query meets) puts the server in a
read-only mode: logged once, shown in INFO (database_integrity), /healthz (503) and
/metrics (ezra_database_corrupt), writes refused with a clear error, reads still served.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import urllib.error
import urllib.request

import pytest
import redis

from support_servers import EzraProcess, wait_until

TASKS = 3000


def three_thousand_tasks(tmp_path) -> EzraProcess:
    """A stopped server whose ezra.db holds TASKS available tasks in queue 'jobs'."""
    server = EzraProcess(tmp_path / "data", "--http-port", "0").start()
    r = server.client()
    pipe = r.pipeline(transaction=False)
    for n in range(TASKS):
        pipe.xadd("jobs", {"n": str(n), "body": "x" * 200})
    pipe.execute()
    r.close()
    assert server.stop() == 0
    return server


def garble_a_page_of_tasks(db_path, name: str = "tasks", last: bool = False) -> int:
    """Write one page of garbage over a leaf page in the middle of the tasks table (or of the index
    `name`; `last`: its last leaf page); its number."""
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        pages = [row[0] for row in conn.execute(
            "SELECT pageno FROM dbstat WHERE name = ? AND pagetype = 'leaf' ORDER BY pageno", (name,))]
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    except sqlite3.OperationalError as exc:
        pytest.skip(f"this SQLite has no dbstat table to find a page with: {exc}")
    finally:
        conn.close()
    page = pages[-1] if last else pages[len(pages) // 2]
    times = os.stat(db_path)
    with open(db_path, "r+b") as f:
        f.seek((page - 1) * page_size)
        f.write(b"garbage!" * (page_size // 8))
        f.flush()
        os.fsync(f.fileno())
    # As a disk's own damage does, the file's times stay: a write would tell the next start that the
    # file changed after its clean stop (storage/done_counts.py), and it would read every row.
    os.utime(db_path, ns=(times.st_atime_ns, times.st_mtime_ns))
    return page


def integrity(r) -> str | None:
    return r.info("persistence").get("database_integrity")


def healthz(server) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(server.http_url + "/healthz", timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def files_of(server) -> tuple:
    """What is on disk: the database's digest and the WAL's size."""
    db = server.data_dir / "ezra.db"
    wal = server.data_dir / "ezra.db-wal"
    return hashlib.sha256(db.read_bytes()).hexdigest(), wal.stat().st_size if wal.exists() else 0


def assert_read_only_and_reported(server, r) -> None:
    status, body = healthz(server)
    assert status == 503 and "the database is corrupt, writes are refused" in body, (status, body)
    with urllib.request.urlopen(server.http_url + "/metrics", timeout=30) as response:
        assert "ezra_database_corrupt 1.0" in response.read().decode()
    before = files_of(server)
    for _ in range(5):
        with pytest.raises(redis.ResponseError, match="database corrupt, EZRA has stopped writing"):
            r.xadd("jobs", {"n": "more"})
        with pytest.raises(redis.ResponseError, match="database corrupt"):
            r.xreadgroup("g", "w", {"jobs": ">"}, count=TASKS)
    assert r.xlen("jobs") == TASKS  # reads go on
    assert r.ping()
    assert files_of(server) == before  # nothing more was written into the damaged file
    log = server.log()
    assert log.count("is corrupt") == 1, log  # logged once, however many writes were refused
    assert "Traceback" not in log, log


def test_a_corrupt_page_is_found_after_start_and_writes_stop(tmp_path, protocol):
    server = three_thousand_tasks(tmp_path)
    garble_a_page_of_tasks(server.data_dir / "ezra.db")
    server.start()
    r = server.client(protocol)
    try:
        assert r.xlen("jobs") == TASKS  # it starts (the check runs after the port opens)
        wait_until(lambda: integrity(r) == "corrupt", timeout=60, interval=0.05,
                   message=f"INFO to report the corrupt database; the log:\n{server.log()}")
        assert "quick_check" in r.info("persistence")["database_corruption"]
        assert_read_only_and_reported(server, r)
    finally:
        r.close()
        server.stop()


def test_a_malformed_page_met_at_run_time_stops_the_writes(tmp_path, protocol):
    server = three_thousand_tasks(tmp_path).start()
    r = server.client(protocol)
    try:
        wait_until(lambda: integrity(r) == "ok", timeout=60, interval=0.05, message="the check at start")
        assert healthz(server)[0] == 200
        # The page goes bad under the running server, after its check: a claim is the first to read it.
        garble_a_page_of_tasks(server.data_dir / "ezra.db")
        with pytest.raises(redis.ResponseError, match="database corrupt.*malformed"):
            r.xreadgroup("g", "w", {"jobs": ">"}, count=TASKS)
        assert integrity(r) == "corrupt"
        assert_read_only_and_reported(server, r)
    finally:
        r.close()
        server.stop()


def test_a_corrupt_page_that_start_up_reads_refuses_the_start_clearly(tmp_path):
    server = three_thousand_tasks(tmp_path)
    # start-up reads each queue's newest task, for its last id: the table's last page
    garble_a_page_of_tasks(server.data_dir / "ezra.db", last=True)
    with pytest.raises(AssertionError, match="exited with 1"):
        server.start()
    log = server.log()
    assert f"cannot start: the database {server.data_dir / 'ezra.db'} is corrupt (database disk image is " \
           "malformed): EZRA does not start on it; restore ezra.db from a backup" in log, log
    assert "Traceback" not in log, log
