"""The dashboard in a real headless browser (Debian's chromium driven by Playwright).

Load the page, see a queue's counts, requeue a dead task with its button and see it
flow to done through the page's own refresh; a hostile task field shows as text and
runs nothing; the confirm dialogs guard requeue-all and delete. Screenshots are saved
to build/screenshots/ (the README's picture is one of them).
"""

from __future__ import annotations

import shutil
import threading

import pytest

from support_servers import ROOT, wait_until

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.slow,  # a real browser: not in `pytest -m "not slow"`
              pytest.mark.skipif(CHROMIUM is None, reason="apt-get install chromium (scripts/test.sh does)")]
SCREENSHOTS = ROOT / "build" / "screenshots"
XSS = '<script>window.__xss=1</script><img src=x onerror="window.__xss=1">'
# As the machine's notes say: without these, Chromium tries Google's hosts at start.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    sync_api.expect.set_options(timeout=15_000)  # polls; 5 s (the default) is short on a busy 2-core CI
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.problems = []  # script errors and CSP violations: there must be none
    page.on("pageerror", lambda error: page.problems.append(str(error)))
    page.on("console", lambda message: message.type == "error" and page.problems.append(message.text))
    yield page
    context.close()


class Traffic:
    """A producer and a worker in a thread, so the charts have something to show."""

    def __init__(self, client, queues):
        self.client, self.queues = client, queues
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.is_set():
            for queue in self.queues:
                self.client.xadd(queue, {"to": "someone@example.com"})
                for _, entries in self.client.xreadgroup("g", "bg-worker", {queue: ">"}, count=1):
                    self.client.xack(queue, "g", *[task_id for task_id, _ in entries])
            self.stop.wait(0.05)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)


def make_dead(client, queue, fields) -> str:
    task_id = client.xadd(queue, fields).decode()
    client.xreadgroup("g", "w", {queue: ">"}, count=1)
    client.execute_command("XNACK", queue, "g", "FATAL", "IDS", 1, task_id)
    return task_id


def count(page, state: str):
    return page.locator(f'.count[data-state="{state}"]')


def test_see_counts_requeue_a_dead_task_and_see_it_flow(ezra_factory, page):
    server = ezra_factory("--http-port", "0")
    client = server.client()
    dead_id = make_dead(client, "emails", {"to": "x@example.com", "note": XSS})
    client.xadd("emails", {"n": "held"})
    client.xreadgroup("g", "mailer-1", {"emails": ">"}, count=1)  # in flight, held by mailer-1
    for n in range(2):
        client.xadd("emails", {"n": str(n)})
    expect = sync_api.expect

    with Traffic(server.client(), ["pdfs", "webhooks"]):
        page.goto(server.http_url + "/")
        row = page.locator('tr[data-queue="emails"]')
        expect(row.locator("td.available")).to_have_text("2")
        expect(row.locator("td.in_flight")).to_have_text("1")
        expect(row.locator("td.dead")).to_have_text("1")
        expect(page.locator('tr[data-queue="pdfs"]')).to_be_visible()
        # Wait for the charts to have two samples (5 s apart), then keep the picture.
        expect(page.locator('tr[data-queue="pdfs"] svg polyline').first).to_be_attached(timeout=30000)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "dashboard.png"))

        row.locator("a").click()
        expect(page.locator("h1")).to_have_text("emails")
        expect(count(page, "dead")).to_have_text("1")
        in_flight = page.locator("table.in-flight tbody tr")
        expect(in_flight).to_have_count(1)
        expect(in_flight.locator("td").nth(1)).to_have_text("mailer-1")
        dead_row = page.locator(f'table.dead tr[data-id="{dead_id}"]')
        expect(dead_row.locator("td.fields")).to_contain_text(f"note={XSS}")  # shown as text
        assert page.evaluate("window.__xss") is None  # and nothing ran
        page.screenshot(path=str(SCREENSHOTS / "dashboard-queue.png"), full_page=True)

        dead_row.locator("button.requeue").click()
        expect(page.locator(".flash")).to_have_text("requeued 1 task")
        expect(count(page, "dead")).to_have_text("0")
        expect(count(page, "available")).to_have_text("3")

    # A worker takes the requeued task (with the others) and acks them: the page,
    # left alone, refreshes itself and shows them done.
    entries = client.xreadgroup("g", "mailer-2", {"emails": ">"}, count=10)[0][1]
    assert dead_id in [task_id.decode() for task_id, _ in entries]
    client.xack("emails", "g", *[task_id for task_id, _ in entries])
    expect(count(page, "done")).to_have_text("3", timeout=20000)
    expect(count(page, "available")).to_have_text("0")
    assert page.problems == []


def test_requeue_all_and_delete_ask_first(ezra_factory, page):
    server = ezra_factory("--http-port", "0")
    client = server.client()
    ids = [make_dead(client, "reports", {"n": str(n)}) for n in range(3)]
    page.goto(f"{server.http_url}/queue?name=reports")
    expect = sync_api.expect
    expect(count(page, "dead")).to_have_text("3")

    page.once("dialog", lambda dialog: dialog.dismiss())  # "Delete this task for good?" -> no
    page.locator(f'tr[data-id="{ids[0]}"] button.delete').click()
    expect(page.locator(f'tr[data-id="{ids[0]}"]')).to_be_visible()
    assert client.xlen("reports::dead") == 3

    page.once("dialog", lambda dialog: dialog.accept())
    page.locator(f'tr[data-id="{ids[0]}"] button.delete').click()
    expect(page.locator(".flash")).to_have_text("deleted 1 dead task")
    expect(count(page, "dead")).to_have_text("2")

    page.once("dialog", lambda dialog: dialog.accept())  # "Requeue all 2 dead tasks?"
    page.locator("button.requeue-all").click()
    expect(page.locator(".flash")).to_have_text("requeued 2 tasks")
    expect(count(page, "available")).to_have_text("2")
    wait_until(lambda: client.xlen("reports::dead") == 0, message="the dead tasks to be requeued")
    assert page.problems == []


def test_pause_and_resume_with_the_buttons(ezra_factory, page):
    server = ezra_factory("--http-port", "0")
    client = server.client()
    task_id = client.xadd("webhooks", {"url": "https://example.com/hook"}).decode()
    page.goto(f"{server.http_url}/queue?name=webhooks")
    expect = sync_api.expect

    page.once("dialog", lambda dialog: dialog.dismiss())  # "Pause this queue?" -> no
    page.locator("button.pause").click()
    expect(page.locator("button.pause")).to_be_visible()
    assert client.xinfo_stream("webhooks")["paused"] == b"0"

    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("button.pause").click()
    expect(page.locator(".flash")).to_have_text("paused: workers get nothing until it is resumed")
    expect(page.locator("h1 .badge.paused")).to_have_text("paused")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "dashboard-queue-paused.png"))
    assert client.xreadgroup("g", "w", {"webhooks": ">"}) in (None, [], {})
    page.goto(server.http_url + "/")
    expect(page.locator('tr[data-queue="webhooks"] .badge.paused')).to_be_visible()
    page.screenshot(path=str(SCREENSHOTS / "dashboard-paused.png"))

    page.goto(f"{server.http_url}/queue?name=webhooks")
    page.locator("button.resume").click()  # resuming asks nothing
    expect(page.locator(".flash")).to_have_text("resumed")
    expect(page.locator(".badge.paused")).to_have_count(0)
    assert client.xreadgroup("g", "w", {"webhooks": ">"})[0][1][0][0].decode() == task_id
    assert page.problems == []


def test_extensions_schedules_reasons_and_unique_keys_show_as_text_and_run_nothing(ezra_factory, page):
    """Issue 26's three extensions on the dashboard: a schedule on the front page, a dead task's
    XNACK REASON and a task's XADD UNIQUE key on the queue page, all carrying HTML."""
    server = ezra_factory("--http-port", "0")
    client = server.client()
    schedule = f"nightly {XSS}"
    client.execute_command("XSCHEDULE", "SET", schedule, "reports", "30 2 * * *", "TZ", "Europe/Paris",
                           "FIELDS", "job", "nightly")
    dead_id = client.xadd("reports", {"n": "1"}).decode()
    client.xreadgroup("g", "w", {"reports": ">"}, count=1)
    client.execute_command("XNACK", "reports", "g", "FATAL", "IDS", 1, dead_id, "REASON", f"SMTPError: {XSS}")
    key = f"report-7 {XSS}"
    keyed_id = client.execute_command("XADD", "reports", "UNIQUE", key, "*", "n", "2").decode()
    expect = sync_api.expect

    page.goto(server.http_url + "/")
    row = page.locator("table.schedules tbody tr")
    expect(row).to_have_count(1)
    cells = row.locator("td")
    expect(cells.nth(0)).to_have_text(schedule)  # the name as text, tags and all
    expect(cells.nth(1)).to_have_text("reports")
    expect(cells.nth(2)).to_have_text("30 2 * * * Europe/Paris")
    expect(cells.nth(3)).to_contain_text("02:30:00+01:00")  # the next run, in the schedule's zone (winter)
    assert page.evaluate("window.__xss") is None

    page.goto(f"{server.http_url}/queue?name=reports")
    expect(page.locator(f'table.dead tr[data-id="{dead_id}"] td.failure .reason')).to_have_text(f"SMTPError: {XSS}")
    keyed_row = page.locator("table.tasks tbody tr", has=page.locator(f'td.id a:text-is("{keyed_id}")'))
    expect(keyed_row.locator("td.unique-key")).to_have_text(key)
    page.screenshot(path=str(SCREENSHOTS / "dashboard-extensions.png"), full_page=True)
    # the page's own refresh (dashboard.js swaps in a fresh <main> every 3 s) shows the same, runs nothing
    page.evaluate("window.__shown = document.querySelector('main')")
    page.wait_for_function("() => !document.contains(window.__shown)", timeout=20_000)
    expect(keyed_row.locator("td.unique-key")).to_have_text(key)
    assert page.evaluate("window.__xss") is None  # nothing injected ran, before or after the refresh
    assert page.problems == []
