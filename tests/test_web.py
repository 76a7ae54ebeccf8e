"""The --http-port listener over real HTTP: /metrics (parsed by prometheus_client's own
parser), /healthz, Basic authentication with --password, the cross-site guard on the
dashboard's forms, and escaping of user data in the pages. The browser tests are in
test_dashboard.py."""

from __future__ import annotations

import re
import select
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import quote

import pytest
import redis

from support_http import NoRedirect, basic, form_token, http, scrape, value
from support_servers import ROOT, wait_until

XSS = '<script>window.__xss=1</script><img src=x onerror="window.__xss=1">'


@pytest.fixture
def web(ezra_factory):
    return ezra_factory("--http-port", "0", "--visibility-timeout", "60")


def test_metrics_parse_and_move_when_tasks_flow(web):
    client = web.client()
    before = scrape(web)
    assert ("ezra_pushes_total", frozenset({("queue", "jobs")})) not in before
    batches_before = value(before, "ezra_commit_batch_size_count")

    ids = [client.xadd("jobs", {"n": str(i)}) for i in range(4)]
    client.xreadgroup("g", "w1", {"jobs": ">"}, count=3)
    client.xack("jobs", "g", ids[0])
    client.execute_command("XNACK", "jobs", "g", "FATAL", "IDS", 1, ids[1])
    client.execute_command("XNACK", "jobs", "g", "FAIL", "IDS", 1, ids[2])
    client.xreadgroup("g", "w2", {"jobs": ">"}, count=1)  # ids[2] again: a redelivery

    after = scrape(web)
    q = {"queue": "jobs"}
    assert value(after, "ezra_pushes_total", **q) == 4
    assert value(after, "ezra_deliveries_total", **q) == 4
    assert value(after, "ezra_redeliveries_total", **q) == 1
    assert value(after, "ezra_acks_total", **q) == 1
    assert value(after, "ezra_nacks_total", **q) == 2
    assert value(after, "ezra_dead_letters_total", **q) == 1
    assert value(after, "ezra_timeouts_total", **q) == 0
    counts = {state: value(after, "ezra_tasks", queue="jobs", state=state)
              for state in ("available", "delayed", "in_flight", "done", "dead")}
    assert counts == {"available": 1, "delayed": 0, "in_flight": 1, "done": 1, "dead": 1}
    assert value(after, "ezra_oldest_available_age_seconds", **q) >= 0
    assert value(after, "ezra_commit_batch_size_count") > batches_before
    assert value(after, "ezra_commit_duration_seconds_count") == value(after, "ezra_commit_batch_size_count")
    assert value(after, "ezra_fsync_duration_seconds_count") >= 1  # full durability fsyncs
    assert value(after, "ezra_connected_clients") >= 1
    assert value(after, "ezra_info", version=value_label(after, "ezra_info", "version"),
                 durability="full") == 1
    assert value(after, "process_resident_memory_bytes") > 0


def value_label(samples: dict, name: str, label: str) -> str:
    return next(dict(labels)[label] for sample_name, labels in samples if sample_name == name)


def test_oldest_available_age_grows_while_the_head_waits(web):
    web.client().xadd("waiting", {"n": "1"})
    wait_until(lambda: value(scrape(web), "ezra_oldest_available_age_seconds", queue="waiting") >= 0.05,
               message="the head task's age to grow")
    web.client().xreadgroup("g", "w", {"waiting": ">"}, count=1)
    assert value(scrape(web), "ezra_oldest_available_age_seconds", queue="waiting") == 0


def test_blocked_clients_and_timeouts_show(ezra_factory):
    server = ezra_factory("--http-port", "0", "--visibility-timeout", "0.2")
    blocked = server.client()
    reader = blocked.connection_pool.get_connection()
    reader.send_command("XREADGROUP", "GROUP", "g", "w", "BLOCK", "0", "STREAMS", "b", ">")
    wait_until(lambda: value(scrape(server), "ezra_blocked_clients") == 1, message="a blocked client")
    client = server.client()
    client.xadd("b", {"n": "1"})
    assert reader.read_response()[0][0] == b"b"  # the blocked reader got it; its lease will run out
    wait_until(lambda: value(scrape(server), "ezra_timeouts_total", queue="b") == 1, message="a timeout")
    assert value(scrape(server), "ezra_blocked_clients") == 0
    # Both connections are quiet now: parked after a sweep or two (scrapes come over HTTP).
    wait_until(lambda: value(scrape(server), "ezra_parked_clients") == 2, timeout=20, message="two parked")


def test_healthz(web):
    status, headers, body = http(web.http_url + "/healthz")
    assert (status, body) == (200, b"ok\n")
    assert headers["X-Content-Type-Options"] == "nosniff"


def test_password_guards_everything_but_healthz(ezra_factory):
    server = ezra_factory("--http-port", "0", "--password", "s3cret")
    for path in ("/metrics", "/", "/queue?name=q"):
        status, headers, _ = http(server.http_url + path)
        assert status == 401, path
        assert headers["WWW-Authenticate"].startswith("Basic realm=")
        assert http(server.http_url + path, headers=basic("wrong"))[0] == 401
    assert http(server.http_url + "/metrics", headers=basic("s3cret"))[0] == 200
    assert http(server.http_url + "/", headers=basic("s3cret", user="default"))[0] == 200
    assert http(server.http_url + "/healthz")[0] == 200
    assert http(server.http_url + "/", headers={"Authorization": "Basic !!notbase64"})[0] == 401
    # The dashboard's own script and style are public assets (files of the package, nothing of
    # the queues), as documented in docs/operations.md: a login page could not load them otherwise.
    status, _, body = http(server.http_url + "/static/dashboard.js")
    assert status == 200 and b"setInterval" in body
    assert http(server.http_url + "/static/nothing.js")[0] == 404


def test_the_status_message_is_the_servers_own(web):
    """Issue 45 item 10: ?done= names one of the server's messages (a code and a count); any other
    text, such as a phishing line in a link, is not shown."""
    web.client().xadd("jobs", {"n": "1"})
    page = f"{web.http_url}/queue?name=jobs"
    status, _, body = http(page + "&done=" + quote("call support at +1 555 0100"))
    assert status == 200 and b"call support" not in body and b'class="flash"' not in body
    status, _, body = http(page + "&done=deleted&n=" + quote("2 tasks; call support at +1 555 0100"))
    assert status == 200 and b"call support" not in body and b'class="flash"' not in body
    status, _, body = http(page + "&done=deleted&n=2")  # positive control: the server's own message
    assert status == 200 and b'<p class="flash" role="status">deleted 2 tasks</p>' in body
    status, _, body = http(page + "&done=requeued&n=1")
    assert b'<p class="flash" role="status">requeued 1 task</p>' in body


def test_http_is_off_by_default(ezra_factory):
    assert "dashboard on" in ezra_factory("--http-port", "0").log(), "the phrase a listener logs"
    server = ezra_factory()
    assert "dashboard on" not in server.log()


def dead_task(client, queue: str, fields: dict) -> str:
    task_id = client.xadd(queue, fields).decode()
    client.xreadgroup("g", "w", {queue: ">"}, count=1)
    client.execute_command("XNACK", queue, "g", "FATAL", "IDS", 1, task_id)
    return task_id


def test_forms_refuse_cross_site_requests(web):
    client = web.client()
    task_id = dead_task(client, "guarded", {"n": "1"})
    url = f"{web.http_url}/queue/requeue?name=guarded"
    token = form_token(web, "guarded")
    good = f"csrf={token}&id={task_id}".encode()
    assert http(url, f"id={task_id}".encode())[0] == 403                      # no token
    assert http(url, f"csrf={'0' * 64}&id={task_id}".encode())[0] == 403      # a forged token
    assert http(url, good, {"Origin": "http://evil.example"})[0] == 403       # another site's page
    assert http(url, good, {"Sec-Fetch-Site": "cross-site"})[0] == 403
    assert http(web.http_url + "/queue/requeue?name=guarded")[0] == 405       # GET changes nothing
    assert client.xlen("guarded::dead") == 1

    status, headers, _ = http(url, good, {"Origin": web.http_url, "Sec-Fetch-Site": "same-origin"})
    assert status == 303 and headers["Location"].startswith("/queue?name=guarded&done=requeued")
    assert client.xlen("guarded::dead") == 0
    assert client.xreadgroup("g", "w", {"guarded": ">"}, count=1)[0][1][0][0].decode() == task_id


def test_delete_a_dead_task(web):
    client = web.client()
    keep, drop = dead_task(client, "deletes", {"n": "1"}), dead_task(client, "deletes", {"n": "2"})
    status, _, _ = http(f"{web.http_url}/queue/delete?name=deletes",
                        f"csrf={form_token(web, 'deletes')}&id={drop}".encode())
    assert status == 303
    assert [entry[0].decode() for entry in client.xrange("deletes::dead")] == [keep]


def test_user_data_is_escaped_in_pages(web):
    client = web.client()
    queue = 'q"><b>bold</b>'
    dead_task(client, queue, {"payload": XSS, "<i>field</i>": "x"})
    for path in ("/", f"/queue?name={quote(queue)}"):
        status, headers, body = http(web.http_url + path)
        assert status == 200
        assert b"<script>window" not in body and b"<img src=x" not in body and b"<b>bold" not in body
        assert b"script-src 'self'" in headers["Content-Security-Policy"].encode()
    assert b"&lt;script&gt;window.__xss=1&lt;/script&gt;" in body
    assert b"&lt;i&gt;field&lt;/i&gt;=x" in body


def test_queue_names_that_are_not_utf8(web):
    name = b"\xff\xfe-binary"
    web.client().xadd(name, {"n": "1"})
    status, _, body = http(f"{web.http_url}/queue?name={quote(name)}")
    assert status == 200 and "\ufffd\ufffd-binary".encode() in body
    status, _, body = http(web.http_url + "/")
    assert quote(name).encode() in body  # the link carries the exact bytes


def test_unknown_pages(web):
    assert http(web.http_url + "/nope")[0] == 404
    assert http(web.http_url + "/queue?name=missing")[0] == 404
    assert http(web.http_url + "/queue")[0] == 400
    assert http(web.http_url + "/static/../server.py")[0] == 404
    status, headers, body = http(web.http_url + "/static/dashboard.js")
    assert status == 200 and headers["Content-Type"].startswith("text/javascript") and b"setInterval" in body
    assert "Traceback" not in web.log()
    with pytest.raises(redis.ResponseError, match="no such key"):
        web.client().execute_command("XINFO", "TASKS", "missing", "dead")


def test_a_stalled_http_client_is_closed_and_others_are_served(ezra_factory):
    server = ezra_factory("--http-port", "0", "--client-frame-timeout", "1")
    host, port = server.http_url.removeprefix("http://").rsplit(":", 1)
    stalled = [socket.create_connection((host, int(port)), timeout=10) for _ in range(70)]  # > the 64 slots
    for sock in stalled:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # ...and never the blank line
    started = time.monotonic()
    assert http(server.http_url + "/healthz")[0] == 200  # served once the stalled ones time out
    for sock in stalled:
        received = b""
        while chunk := sock.recv(4096):  # until the server closes (recv would time out after 10 s)
            received += chunk
        assert received == b"" or re.match(rb"HTTP/1.1 4\d\d ", received), received  # 400 or 408, then closed
        sock.close()
    assert time.monotonic() - started < 30
    assert "Traceback" not in server.log()


def test_tls_for_http_ping_and_the_inspector(ezra_factory, certificates):
    """With --tls-cert-file the HTTP listener speaks HTTPS only, and ezra ping / ezra stats
    connect with TLS, trusting the server's own certificate file."""
    c = certificates
    server = ezra_factory("--tls-cert-file", str(c / "server.pem"), "--tls-key-file", str(c / "server.key"),
                          "--http-port", "0")
    assert server.http_url.startswith("https://")
    context = ssl.create_default_context(cafile=str(c / "ca.pem"))
    tls_opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context), NoRedirect)
    assert http(server.http_url + "/healthz", opener=tls_opener)[0] == 200
    with pytest.raises(OSError):  # plain HTTP gets nothing
        urllib.request.urlopen(server.http_url.replace("https://", "http://") + "/healthz", timeout=10).read()
    for command in (["ping"], ["stats"]):
        result = subprocess.run([sys.executable, "-m", "ezra", *command, "--port", str(server.port),
                                 "--tls-cert-file", str(c / "server.pem")],
                                cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
    without_tls = subprocess.run([sys.executable, "-m", "ezra", "ping", "--port", str(server.port), "--timeout", "2"],
                                 cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert without_tls.returncode == 1


def test_the_commands_of_one_exec_commit_in_one_batch(web):
    """MULTI + 50 XADDs + EXEC: one transaction of at least 50 requests (the batch-size histogram)."""
    def big_batches():
        samples = scrape(web)
        return value(samples, "ezra_commit_batch_size_count") - value(samples, "ezra_commit_batch_size_bucket",
                                                                      le="32.0")
    before = big_batches()
    pipeline = web.client().pipeline(transaction=True)
    for n in range(50):
        pipeline.xadd("atomic", {"n": str(n)})
    assert len(pipeline.execute()) == 50
    assert big_batches() == before + 1


def test_dns_rebinding_is_refused_without_a_password(ezra_factory):
    """A page of evil.example resolved to 127.0.0.1 is same-origin for the browser: without a
    password, only IP addresses, localhost and this machine's name are answered."""
    open_server = ezra_factory("--http-port", "0")
    for path in ("/", "/metrics", "/queue?name=q"):
        assert http(open_server.http_url + path, headers={"Host": "evil.example"})[0] == 421
    assert http(open_server.http_url + "/", headers={"Host": "evil.example:80"})[0] == 421
    for host in ("localhost", "127.0.0.1:9", "[::1]:9", socket.gethostname(), "app.localhost"):
        assert http(open_server.http_url + "/", headers={"Host": host})[0] == 200, host
    assert http(open_server.http_url + "/healthz", headers={"Host": "evil.example"})[0] == 200
    protected = ezra_factory("--http-port", "0", "--password", "s3cret")
    assert http(protected.http_url + "/", headers={"Host": "evil.example", **basic("s3cret")})[0] == 200


def http_address(server) -> tuple[str, int]:
    host, port = server.http_url.split("://", 1)[1].rsplit(":", 1)
    return host, int(port)


def test_slowloris_that_keeps_sending_is_closed_at_the_request_deadline(ezra_factory):
    """70 connections (more than the old 64 slots) that each send one more header line every
    half second, faster than any per-read timeout: /healthz still answers at once, and each
    is closed when its whole request has not arrived within the request deadline (1.5 s here,
    so that it is waited out quickly; 5 s by default)."""
    web = ezra_factory("--http-port", "0", "--http-request-timeout", "1.5")
    address = http_address(web)
    dripping = [socket.create_connection(address, timeout=10) for _ in range(70)]
    for sock in dripping:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    started = time.monotonic()
    healthz_took = None
    open_socks = set(dripping)
    while open_socks and time.monotonic() - started < 60:
        for sock in list(open_socks):
            try:
                sock.sendall(b"X-Drip: 1\r\n")
            except OSError:  # reset by the server: closed
                open_socks.discard(sock)
        readable, _, _ = select.select(list(open_socks), [], [], 0.5)
        for sock in readable:
            try:
                reply = sock.recv(4096)
            except OSError:
                reply = b""
            assert reply == b"" or re.match(rb"HTTP/1.1 4\d\d ", reply), reply
            open_socks.discard(sock)  # a 4xx comes with Connection: close; EOF is the close
        if healthz_took is None:
            asked = time.monotonic()
            assert http(web.http_url + "/healthz")[0] == 200  # times out (an exception) when no slot is free
            healthz_took = time.monotonic() - asked
    closed_after = time.monotonic() - started
    for sock in dripping:
        sock.close()
    assert not open_socks, f"{len(open_socks)} dripping connections still open after {closed_after:.1f}s"
    assert healthz_took < 5, healthz_took
    assert closed_after < 30, closed_after  # the deadline is 1.5 s here
    assert "Traceback" not in web.log()


def new_log_lines(server, before: str) -> list[str]:
    return server.log()[len(before):].splitlines()


def test_a_body_cut_short_is_one_log_line(web):
    before = web.log()
    with socket.create_connection(http_address(web), timeout=10) as sock:
        sock.sendall(b"POST /queue/requeue?name=q HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n"
                     b"csrf=00000")
        sock.shutdown(socket.SHUT_WR)  # 85 bytes short
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 400 "), reply
    wait_until(lambda: new_log_lines(web, before), message="a log line")
    lines = new_log_lines(web, before)
    assert len(lines) == 1 and "ended" in lines[0], lines


def test_too_many_headers_is_one_log_line(web):
    before = web.log()
    with socket.create_connection(http_address(web), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     + b"".join(b"X-Header-%d: 1\r\n" % n for n in range(150)) + b"\r\n")
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 4"), reply
    wait_until(lambda: new_log_lines(web, before), message="a log line")
    lines = new_log_lines(web, before)
    assert len(lines) == 1 and "headers" in lines[0], lines


def test_plain_http_to_the_tls_listener_is_one_log_line(ezra_factory, certificates):
    c = certificates
    server = ezra_factory("--tls-cert-file", str(c / "server.pem"), "--tls-key-file", str(c / "server.key"),
                          "--http-port", "0")
    before = server.log()
    with socket.create_connection(http_address(server), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            while sock.recv(4096):  # whatever TLS alert, then the close
                pass
        except ConnectionResetError:
            pass
    wait_until(lambda: new_log_lines(server, before), message="a log line")
    lines = new_log_lines(server, before)
    assert len(lines) == 1 and "TLS handshake" in lines[0], lines


def fill_queues(client, count: int, backlog: dict) -> None:
    """`count` queues q-0000... with one task each; the queues in `backlog` get that many."""
    pipeline = client.pipeline(transaction=False)
    for n in range(count):
        name = f"q-{n:04d}"
        for i in range(backlog.get(name, 1)):
            pipeline.xadd(name, {"n": str(i)})
    pipeline.execute()


def test_metrics_show_the_busiest_queues_and_sum_the_rest(web):
    """150 queues, more than the 100 shown by default: the 100 with the most unfinished tasks
    keep their own series, the other 50 are summed in series without a queue label, so
    sums over all series stay exact."""
    client = web.client()
    busy = {f"q-{n:04d}": 5 for n in range(140, 150)}  # last by name, first by backlog
    fill_queues(client, 150, busy)
    client.xreadgroup("g", "w", {"q-0149": ">"}, count=2)
    samples = scrape(web)
    labelled = {dict(labels).get("queue") for name, labels in samples if name == "ezra_tasks"}
    assert len(labelled - {None, ""}) == 100
    assert set(busy) <= labelled
    assert value(samples, "ezra_tasks", queue="q-0149", state="in_flight") == 2
    rest = {"queue": ""}
    assert value(samples, "ezra_tasks", state="available", **rest) == 50
    assert value(samples, "ezra_pushes_total", **rest) == 50
    assert sum(v for (name, labels), v in samples.items() if name == "ezra_pushes_total") == 140 + 50
    assert value(samples, "ezra_queues") == 150
    assert ("ezra_oldest_available_age_seconds", frozenset(rest.items())) not in samples


def test_metrics_queues_option(ezra_factory):
    server = ezra_factory("--http-port", "0", "--metrics-queues", "2")
    client = server.client()
    fill_queues(client, 5, {"q-0003": 3, "q-0001": 2})
    for n in range(4):  # the longest backlog, but a queue named "" would share the rest's label
        client.xadd("", {"n": n})
    samples = scrape(server)
    labelled = {dict(labels).get("queue") for name, labels in samples if name == "ezra_pushes_total"}
    assert labelled == {"q-0003", "q-0001", ""}
    assert value(samples, "ezra_pushes_total", queue="") == 3 + 4
    assert value(samples, "ezra_tasks", queue="", state="available") == 3 + 4
    assert value(samples, "ezra_queues") == 6


def test_the_dashboard_lists_queues_a_page_at_a_time(web):
    fill_queues(web.client(), 250, {})
    status, _, body = http(web.http_url + "/")
    assert status == 200
    rows = re.findall(rb'<tr data-queue="([^"]+)"', body)
    assert rows == [b"q-%04d" % n for n in range(100)]
    assert b'href="/?page=2"' in body and b"of 250" in body
    status, _, body = http(web.http_url + "/?page=3")
    assert re.findall(rb'<tr data-queue="([^"]+)"', body) == [b"q-%04d" % n for n in range(200, 250)]
    assert b'href="/?page=2"' in body and b"page=4" not in body
    status, _, body = http(web.http_url + "/?page=99")  # past the end: the last page
    assert status == 200 and re.findall(rb'<tr data-queue="([^"]+)"', body)[0] == b"q-0200"
    assert http(web.http_url + "/?page=x")[0] == 400
