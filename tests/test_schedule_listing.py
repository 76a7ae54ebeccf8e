"""Looking at schedules whose fields are big does not stall the server (issue 45, item 4).

INFO, /metrics and the dashboard list the schedules without reading their fields (an index
holds every other column); XSCHEDULE LIST, which shows the fields, reads them on a thread.
"""

from __future__ import annotations

import re
import time

import pytest

from support_http import http, scrape, value
from support_latency import Pinger
from support_resp import RespConnection, parse_reply


def set_schedules(conn: RespConnection, count: int, size: int) -> None:
    """`count` schedules s000... (never due within the test) with one field of `size` bytes."""
    blob = "x" * size
    for i in range(count):
        reply = conn.call(["XSCHEDULE", "SET", f"s{i:03d}", "q", "0 0 1 1 *", "FIELDS", "blob", blob, "n", str(i)])
        assert reply == b"+OK\r\n", reply


@pytest.mark.parametrize("protocol", [2, 3], ids=["resp2", "resp3"])
def test_every_look_shows_the_schedules_and_list_their_fields(ezra_factory, protocol):
    server = ezra_factory("--http-port", "0")
    conn = RespConnection(server.port, timeout=120, protocol=protocol)
    set_schedules(conn, 3, 200_000)
    listing = conn.call(["XSCHEDULE", "LIST"])
    for i in range(3):  # LIST shows each schedule's fields whole
        assert b"$200000\r\n" + b"x" * 200_000 + b"\r\n$1\r\nn\r\n$1\r\n%d\r\n" % i in listing
    # Inside EXEC (read in the transaction, not on a thread) the same bytes
    assert conn.call(["MULTI"]) == b"+OK\r\n"
    assert conn.call(["XSCHEDULE", "LIST"]) == b"+QUEUED\r\n"
    exec_reply = conn.call(["EXEC"])
    assert exec_reply == b"*1\r\n" + listing
    info = parse_reply(conn.call(["INFO", "schedules"]))[0].value
    assert re.search(rb"schedules:3\r\n", info), info
    samples = scrape(server)
    assert value(samples, "ezra_schedules") == 3
    assert value(samples, "ezra_schedule_firings_total", schedule="s002") == 0
    status, _, page = http(server.http_url + "/")
    assert status == 200 and all(f'data-schedule="s{i:03d}"'.encode() in page for i in range(3))
    conn.close()


@pytest.mark.slow
def test_info_metrics_and_the_dashboard_do_not_wait_for_the_fields(ezra_factory):
    """Positive control: XSCHEDULE LIST's own time, which reads all the fields (100 MB). INFO,
    /metrics and the dashboard held every other client about as long (issue 45: 0.56-1.4 s with
    300 schedules of 1 MB); now a PING sent meanwhile waits a small part of it."""
    server = ezra_factory("--http-port", "0")
    conn = RespConnection(server.port, timeout=120, protocol=2)
    set_schedules(conn, 100, 1_000_000)
    client = server.client()  # hiredis reads the 100 MB reply (support_resp would take minutes)
    started = time.perf_counter()
    assert len(client.execute_command("XSCHEDULE", "LIST")) == 100
    fields_read = time.perf_counter() - started
    client.close()
    looks = {"INFO": (lambda: conn.call(["INFO"]), b"schedules:100\r\n"),
             "/metrics": (lambda: http(server.http_url + "/metrics")[2], b'schedule="s099"'),
             "/": (lambda: http(server.http_url + "/")[2], b'data-schedule="s099"')}
    for name, (look, shown) in looks.items():
        with Pinger(server.port) as pinger:
            for _ in range(3):
                assert shown in look()
        assert pinger.worst < fields_read / 8, (name, pinger.worst, fields_read)
    conn.close()
