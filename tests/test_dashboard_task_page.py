"""The dashboard's task page (/task?queue=<name>&id=<ms-seq>) over real HTTP: an available task,
a dead one whose REASON carries HTML (escaped, shown whole, with the queue page's buttons), a
UNIQUE key and binary fields shown safely, large values cut with a note, 404 for a missing task
or queue, 400 for a bad id, Basic auth with --password, and the queue page's ids linking here.
The Chromium check is at the end (slow marker)."""

from __future__ import annotations

import html
import re
import shutil
from urllib.parse import quote

import pytest

from support_http import basic, http
from support_servers import ROOT

XSS = '<script>window.__xss=1</script><img src=x onerror="window.__xss=1">'


@pytest.fixture
def web(ezra_factory):
    return ezra_factory("--http-port", "0", "--visibility-timeout", "60")


def task_page(server, queue: str | bytes, task_id: str, headers=None):
    name = quote(queue if isinstance(queue, bytes) else queue.encode(), safe="")
    return http(f"{server.http_url}/task?queue={name}&id={quote(task_id)}", headers=headers)


def fact(body: bytes, name: str) -> str:
    """The cell of one row of the facts table, as HTML."""
    match = re.search(rf'<tr data-fact="{name}"><th>{name}</th><td>(.*?)</td></tr>'.encode(), body, re.S)
    assert match, f"no {name} row in the page"
    return match.group(1).decode()


def make_dead(client, queue, fields, reason: str) -> str:
    task_id = client.xadd(queue, fields).decode()
    client.xreadgroup("g", "worker-7", {queue: ">"}, count=1)
    assert client.execute_command("XNACK", queue, "g", "FATAL", "IDS", 1, task_id, "REASON", reason) == 1
    return task_id


def test_an_available_task(web):
    client = web.client()
    task_id = client.xadd("mail", {"to": "someone@example.com", "n": "1"}).decode()
    status, headers, body = task_page(web, "mail", task_id)
    assert status == 200, body
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert f'task <span class="id">{task_id}</span>'.encode() in body
    assert ">available<" in fact(body, "state")
    assert fact(body, "attempts") == "0"
    created_ms = int(task_id.split("-")[0])
    assert f"{created_ms} ms" in fact(body, "created")           # the exact time beside the human one
    assert "ago" in fact(body, "created") and "–" in fact(body, "finished")
    assert b'<td class="field-name">to</td><td class="field-value">someone@example.com</td>' in body
    assert b"None: this task has not failed." in body
    assert b'action="/queue/requeue' not in body                   # only dead tasks get the buttons


def test_a_dead_task_shows_its_whole_reason_escaped_and_the_buttons(web):
    client = web.client()
    reason = f"ValueError: {XSS}\n" + "x" * 5000  # past the queue page's 2000-character cut
    task_id = make_dead(client, "jobs", {"payload": XSS}, reason)
    status, _, body = task_page(web, "jobs", task_id)
    assert status == 200
    assert b"<script>" not in body and b"<img" not in body
    assert f'<pre class="reason">{html.escape(reason)}</pre>'.encode() in body   # in full, escaped
    assert ">dead<" in fact(body, "state") and fact(body, "attempts") == "1"
    failure = re.search(rb'<table class="facts failure">(.*?)</table>', body, re.S).group(1).decode()
    assert '<th>worker</th><td>worker-7</td>' in failure and "ago" in failure
    assert re.search(r'<th>cause</th><td><span class="cause">\w+</span>', failure), failure
    assert html.escape(XSS).encode() in body

    token = re.search(rb'name="csrf" value="([0-9a-f]+)"', body).group(1).decode()
    assert f'action="/queue/requeue?name=jobs"'.encode() in body
    status, headers, _ = http(f"{web.http_url}/queue/requeue?name=jobs", f"csrf={token}&id={task_id}".encode())
    assert status == 303 and headers["Location"].startswith("/queue?name=jobs&done=requeued")
    assert ">available<" in fact(task_page(web, "jobs", task_id)[2], "state")
    assert client.xlen("jobs::dead") == 0


def test_a_unique_key_binary_fields_and_a_large_value(web):
    client = web.client()
    queue = b"bin\xffq"
    fields = {b"\x00\xfe": b"\xff\x01<b>", "text": "plain", "big": "y" * 10_000}
    task_id = client.execute_command("XADD", queue, "UNIQUE", "order-<42>", "*", *sum(fields.items(), ())).decode()
    status, _, body = task_page(web, queue, task_id)
    assert status == 200, body
    assert fact(body, "unique key") == '<span class="unique-key">order-&lt;42&gt;</span>'
    # Binary names and values are \x-escaped and marked; nothing raw reaches the page.
    assert (b'<td class="field-name">\\x00\\xfe <span class="muted note">(binary: shown with \\x escapes)</span></td>'
            b'<td class="field-value">\\xff\\x01&lt;b&gt; <span class="muted note">(binary: shown with \\x escapes)'
            b'</span></td>') in body
    assert b"<b>" not in body and b"\xff\x01" not in body
    value = re.search(rb'<td class="field-name">big</td><td class="field-value">(y+) <span class="muted note">'
                      rb'\(cut: 10000 bytes in all', body)
    assert value and len(value.group(1)) == 2000
    assert len(body) < 100_000
    # The queue page's lists link each id to its page (the name percent-encoded byte for byte).
    _, _, queue_body = http(f"{web.http_url}/queue?name={quote(queue)}")
    assert f'<a href="/task?queue=bin%FFq&amp;id={task_id}">{task_id}</a>'.encode() in queue_body


def test_a_missing_task_is_404_and_a_bad_id_is_400(web):
    client = web.client()
    task_id = client.xadd("few", {"n": "1"}).decode()
    status, _, body = task_page(web, "few", "1-1")
    assert status == 404 and b"no task 1-1 in this queue" in body
    assert task_page(web, "no-such-queue", task_id)[0] == 404
    for bad in ("abc", "1-2-3", "99999999999999999999-0", ""):
        status, _, body = task_page(web, "few", bad)
        assert status == 400 and b"bad task id" in body, bad
    assert http(f"{web.http_url}/task?id={task_id}")[0] == 400     # no queue
    client.xreadgroup("g", "w", {"few": ">"}, count=1)
    client.execute_command("XACKDEL", "few", "g", "IDS", 1, task_id)
    assert task_page(web, "few", task_id)[0] == 404                # acked and deleted


def test_the_task_page_needs_the_password(ezra_factory):
    server = ezra_factory("--http-port", "0", "--password", "s3cret")
    task_id = server.client(password="s3cret").xadd("guarded", {"n": "1"}).decode()
    status, headers, body = task_page(server, "guarded", task_id)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic realm=")
    assert task_id.encode() not in body
    assert task_page(server, "guarded", task_id, headers=basic("wrong"))[0] == 401
    assert task_page(server, "guarded", task_id, headers=basic("s3cret"))[0] == 200


# ---------------------------------------------------------------- in Chromium

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="apt-get install chromium (scripts/test.sh does)")
def test_in_chromium_the_id_link_opens_the_task_page_with_the_reason_as_text(web):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
    client = web.client()
    reason = f"KeyError: {XSS}"
    task_id = make_dead(client, "browsed", {"note": XSS}, reason)
    expect = sync_api.expect
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            problems = []
            page.on("pageerror", lambda error: problems.append(str(error)))
            page.on("console", lambda message: message.type == "error" and problems.append(message.text))
            page.goto(web.http_url + "/queue?name=browsed")
            page.locator(f'table.dead tr[data-id="{task_id}"] td.id a').click()
            expect(page.locator("h1")).to_have_text(f"task {task_id}", timeout=15_000)
            expect(page.locator("pre.reason")).to_have_text(reason)          # shown as text
            expect(page.locator("td.field-value")).to_have_text(XSS)
            expect(page.locator("button.requeue")).to_be_visible()
            assert page.evaluate("window.__xss") is None                     # and nothing ran
            (ROOT / "build" / "screenshots").mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ROOT / "build" / "screenshots" / "dashboard-task.png"), full_page=True)
            assert problems == []
        finally:
            browser.close()
