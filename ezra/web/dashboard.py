"""The dashboard's pages: plain server-rendered HTML, every piece of user data escaped.

Queue names and task fields are whatever producers sent, so every one of them
goes through `text()` (html.escape) or `quote()` (URLs) on its way out; the
pages carry no inline script or style (the CSP in server.py forbids both), and
the charts are inline SVG drawn here from the throughput history.
"""

from __future__ import annotations

import html
import time
from collections import deque
from urllib.parse import quote as url_quote

import gevent
from loguru import logger

from .. import __version__, lifecycle
from ..tools import humanize
from ..protocol import stream_ids
from ..storage.schedules import NEVER
from ..settings.cron import local_time
from ..lifecycle import AVAILABLE, DEAD, DELAYED, DONE, IN_FLIGHT, WAITING
from ..storage import decode_failure
from ..protocol.task_fields import shown as shown_fields
from . import NAME_SHOWN, shown_name

SAMPLE_SECONDS = 5.0
SAMPLES = 121                  # ten minutes of 5-second samples
ROWS_SHOWN = 50                # tasks listed per state on a queue page
QUEUES_PER_PAGE = 100          # queues listed per page of the queue list
FIELDS_SHOWN = 300             # characters of a task's fields shown in a table cell
UNIQUE_KEY = 10                # tasks.unique_key in an INSPECT_COLUMNS row (storage/reads.py)
FAILURE = 11                   # tasks.failure in an INSPECT_COLUMNS row (storage/reads.py)
PRIORITY = 12                  # tasks.priority in an INSPECT_COLUMNS row (NULL: the default)
PARTITION = 13                 # tasks.partition_key in an INSPECT_COLUMNS row
PROGRESS = 14                  # tasks.progress (XPROGRESS) in an INSPECT_COLUMNS row
RESULT_SIZE = 15               # the size of tasks.result (XACK ... RESULT) in an INSPECT_COLUMNS row
NAME = 16                      # tasks.name (XADD NAME) in an INSPECT_COLUMNS row
KEY_SHOWN = 80                 # characters of a task's XADD UNIQUE key shown in a table cell
LISTED_STATES = (IN_FLIGHT, DEAD, AVAILABLE, DELAYED)
STATIC_FILES = ("dashboard.css", "dashboard.js", "favicon.svg")
STATE_TITLES = {AVAILABLE: "available", DELAYED: "delayed", IN_FLIGHT: "in flight", DONE: "done", DEAD: "dead",
                WAITING: "waiting"}


class History:
    """Pushes and acks per queue over each SAMPLE_SECONDS interval: the throughput charts.

    Each sample keeps only the queues that moved in its interval, so memory grows
    with activity, not with the number of queues (idle queues cost nothing).
    """

    def __init__(self, broker):
        self.broker = broker
        self.last: dict[bytes, tuple[int, int]] = {}  # queue -> (pushed, acked) at the last sample
        self.intervals: deque = deque(maxlen=SAMPLES - 1)  # (seconds, {queue: (pushes, acks)} that moved)
        self.sampled_at = None
        self._greenlet = None

    def start(self) -> None:
        self.sample()
        self._greenlet = gevent.spawn(self._run)

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill()

    def _run(self) -> None:
        while True:
            gevent.sleep(SAMPLE_SECONDS)
            try:
                self.sample()
            except Exception as exc:  # a chart is not worth stopping the sampler for
                logger.opt(exception=exc).error("dashboard: sampling throughput failed: {}", exc)

    def sample(self) -> None:
        # Read between two batches on the event loop: one consistent view, no writer round trip.
        now = time.monotonic()
        totals = {name: (queue.totals["pushed"], queue.totals["acked"])
                  for name, queue in self.broker.queues.items()}
        if self.sampled_at is not None:
            moved = {}
            for name, (pushed, acked) in totals.items():
                before = self.last.get(name, (0, 0))
                if (pushed, acked) != before:
                    moved[name] = (max(pushed - before[0], 0), max(acked - before[1], 0))
            self.intervals.append((max(now - self.sampled_at, 1e-9), moved))
        self.last, self.sampled_at = totals, now

    def rates(self, name: bytes) -> list[tuple[float, float]]:
        """(pushes/s, acks/s) over each interval, oldest first."""
        return [(moved.get(name, (0, 0))[0] / span, moved.get(name, (0, 0))[1] / span)
                for span, moved in self.intervals]


# ---------------------------------------------------------------- helpers

def text(value) -> str:
    """Any value as escaped HTML text; bytes are decoded leniently (names need not be UTF-8)."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return html.escape(str(value), quote=True)


def quote(name: bytes) -> str:
    return url_quote(name, safe="")


def queue_url(name: bytes) -> str:
    return "/queue?name=" + quote(name)


def queue_link(name: bytes) -> str:
    """The queue's name linking to its page; a name longer than today's limit (an older EZRA's queue)
    is shown cut and not linked: a link holds the whole name, 3 MB per row for a 1 MB name."""
    if len(name) > NAME_SHOWN:
        return f'<span title="name cut: use XINFO STREAM or ezra ls with the whole name">{text(shown_name(name))}</span>'
    return f'<a href="{text(queue_url(name))}">{text(name)}</a>'


def task_link(queue: bytes, row) -> str:
    """A listed task's id linking to its page (task_page.py); plain text in a queue whose name is
    longer than today's limit (an older EZRA's queue), whose whole name each link would carry."""
    task_id = stream_ids.format_id(row[:2])
    if len(queue) > NAME_SHOWN:
        return text(task_id)
    return f'<a href="/task?queue={text(quote(queue))}&amp;id={text(task_id)}">{text(task_id)}</a>'


def duration(ms: float | None) -> str:
    return "–" if ms is None else humanize.duration(ms)


def timestamp(ms: int | None) -> str:
    if ms is None:
        return "–"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + "Z"


def fields_text(row: tuple, limit: int = FIELDS_SHOWN) -> str:
    """A task row's fields as 'name=value  name=value', cut at `limit` characters, escaped."""
    values = [value.decode("utf-8", "replace") for value in shown_fields(row[2], row[:2])]
    shown = "  ".join(f"{values[i]}={values[i + 1]}" for i in range(0, len(values) - 1, 2))
    if len(shown) > limit:
        shown = shown[:limit] + "…"
    return text(shown)


def key_text(key, limit: int = KEY_SHOWN) -> str:
    """A task's XADD UNIQUE key (tasks.unique_key: TEXT, or BLOB when not UTF-8), cut at `limit`, escaped."""
    if key is None:
        return '<span class="muted">–</span>'
    shown = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
    if len(shown) > limit:
        shown = shown[:limit] + "…"
    return text(shown)


def key_cells(rows: list) -> tuple:
    """(the key column's header, a row's cell) for a table: a column only when a listed task has a key."""
    if all(row[UNIQUE_KEY] is None for row in rows):
        return "", lambda row: ""
    return '<th>unique key</th>', lambda row: f'<td class="unique-key">{key_text(row[UNIQUE_KEY])}</td>'


def failure_text(failure_json: str | None, now: int, limit: int = FIELDS_SHOWN) -> str:
    """A task's last failure (tasks.failure): its cause, reason (cut at `limit`), worker and age, escaped."""
    failure = decode_failure(failure_json)
    if failure is None:
        return '<span class="muted">–</span>'
    reason = failure.get("reason")
    if reason is not None and len(reason) > limit:
        reason = reason[:limit] + "…"
    at, worker = failure.get("at"), failure.get("worker")
    held = "" if worker is None else f" by {text(worker)}"
    when = f' <span class="muted">({text(duration(now - at))} ago{held})</span>' if isinstance(at, int) else ""
    shown_reason = "" if reason is None else f': <span class="reason">{text(reason)}</span>'
    return f'<span class="cause">{text(failure.get("cause"))}</span>{shown_reason}{when}'


def count_class(base: str, state_name: str, count: int) -> str:
    """A count's CSS classes: its state's colour only when there is something to see (0 is grey)."""
    return f"{base} {state_name} zero" if count == 0 else f"{base} {state_name}"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def span_words(rates: list) -> str:
    """The time the samples cover, as the chart's caption says it: '45 seconds', '1 minute', '10 minutes'."""
    seconds = len(rates) * SAMPLE_SECONDS
    if seconds < 60:
        return plural(int(seconds), "second")
    return plural(round(seconds / 60), "minute")


def chart(rates: list[tuple[float, float]], width: int, height: int, labelled: bool) -> str:
    """Pushes/s and acks/s as two SVG lines (presentation attributes only: the CSP has no inline style)."""
    if len(rates) < 2:
        return f'<svg class="chart" width="{width}" height="{height}" role="img" aria-label="no data yet">' \
               f'<text x="4" y="{height // 2}" class="chart-empty">collecting…</text></svg>'
    top = max(max(p, a) for p, a in rates) or 1.0
    step = width / (len(rates) - 1)

    def line(values, css_class):
        points = " ".join(f"{i * step:.1f},{height - 2 - v / top * (height - 4):.1f}" for i, v in enumerate(values))
        return f'<polyline class="{css_class}" fill="none" stroke-width="1.5" points="{points}"/>'

    label = f'<text x="{width - 4}" y="12" text-anchor="end" class="chart-label">max {top:.1f}/s</text>' \
        if labelled else ""
    return (f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
            f'aria-label="pushes and acks per second over the last {span_words(rates)}">'
            f'{line([p for p, _ in rates], "pushes")}{line([a for _, a in rates], "acks")}{label}</svg>')


def page(title: str, body: str, refresh: bool = True) -> bytes:
    refresh_attr = ' data-refresh="3"' if refresh else ""  # dashboard.js reloads <main> every 3 s
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{text(title)} · EZRA</title><link rel="icon" href="/static/favicon.svg"><link rel="stylesheet" href="/static/dashboard.css">'
            f'<script src="/static/dashboard.js" defer></script></head>'
            f'<body{refresh_attr}>{body}</body></html>').encode()


def header(state, figures) -> str:
    uptime = int(time.monotonic() - state.started)
    settings = state.settings
    return (f'<header><a class="brand" href="/">EZRA</a> <span class="muted">{text(__version__)} · '
            f'{text(settings.bind)}:{state.port} · up {text(duration(uptime * 1000))} · '
            f'{plural(len(state.sessions), "client")}, {figures.blocked} blocked · '
            f'durability {text(settings.durability)}</span></header>')


def error_page(status: str, message: str) -> bytes:
    return page(status, f'<main><h1>{text(status)}</h1><p>{text(message)}</p>'
                        f'<p><a href="/">back to the queues</a></p></main>', refresh=False)


# ---------------------------------------------------------------- pages

def index_page(state, figures, history: History, page_number: int = 1, total: int | None = None,
               schedules=()) -> bytes:
    """One page of the queue list: `figures` (Admin.figures) holds that page's queues, `total` counts them all;
    then the schedules (storage.schedules.ScheduleRow)."""
    now, overview = figures.now, figures.queues
    total = len(overview) if total is None else total
    rows = []
    for name, queue in sorted(overview.items()):
        counts = queue["counts"]
        since = queue["head_since"]
        rates = history.rates(name)
        pushes, acks = rates[-1] if rates else (0.0, 0.0)
        rows.append(
            f'<tr data-queue="{text(shown_name(name))}"><td>{queue_link(name)}'
            f'{PAUSED_BADGE if queue["paused"] else held_badge(queue)}</td>'
            + "".join(f'<td class="{count_class("num", state_name, counts[state_name])}">{counts[state_name]}</td>'
                      for state_name in lifecycle.STATES)
            + f'<td class="num">{text(duration(None if since is None else now - since))}</td>'
            f'<td>{chart(rates, 160, 28, labelled=False)} <span class="muted"><span class="pushes-key">'
            f'{pushes:.1f} pushes/s</span> · <span class="acks-key">{acks:.1f} acks/s</span></span></td></tr>')
    table = ('<p class="muted">No queues yet: a queue appears with its first XADD.</p>' if not rows else
             '<table class="queues"><thead><tr><th>queue</th>'
             + "".join(f'<th class="num">{STATE_TITLES[s]}</th>' for s in lifecycle.STATES)
             + '<th class="num">oldest waiting</th><th>throughput, last 10 min '
               '(<span class="pushes-key">pushes</span>, <span class="acks-key">acks</span>)</th></tr></thead>'
             f'<tbody>{"".join(rows)}</tbody></table>')
    nav = pages_nav(page_number, len(overview), total)
    return page("queues", f'{header(state, figures)}<main><h1>Queues</h1>{unreadable_note(figures)}{nav}{table}{nav}'
                          f'{schedules_section(schedules)}</main>')


def unreadable_note(figures) -> str:
    """A warning when tasks' rows cannot be read (written by hand: storage/hand_rows.py)."""
    if not figures.unreadable_tasks:
        return ""
    return (f'<p class="paused-note">{plural(figures.unreadable_tasks, "task")} written by hand cannot be read and '
            'are not served: they are in the table <code>unreadable_tasks</code> of ezra.db (or will be at the '
            'next start); the server\'s log names each and says why.</p>')


def schedules_section(schedules) -> str:
    """The schedules (XSCHEDULE), each with its next and last run in its own zone."""
    if not schedules:
        return ""
    rows = "".join(
        f'<tr data-schedule="{text(row.name)}"><td>{text(row.name)}</td><td>{queue_link(row.queue)}</td>'
        f'<td><code>{text(row.cron)}</code> {text(row.zone)}</td>'
        f'<td>{text(local_time(row.next_at, row.zone)) if row.next_at < NEVER else "never"}</td>'
        f'<td>{text(local_time(row.last_slot, row.zone)) if row.last_slot is not None else "—"}</td>'
        f'<td class="num">{row.firings}</td><td class="num">{row.skipped}</td></tr>' for row in schedules)
    return ('<h2>Schedules</h2><table class="schedules"><thead><tr><th>schedule</th><th>queue</th><th>cron</th>'
            '<th>next run</th><th>last run</th><th class="num">firings</th><th class="num">skipped</th></tr></thead>'
            f'<tbody>{rows}</tbody></table>')


def pages_nav(number: int, shown: int, total: int) -> str:
    """'queues 101–200 of 10000' with links to the pages before and after, when there are several."""
    if total <= QUEUES_PER_PAGE:
        return ""
    first = (number - 1) * QUEUES_PER_PAGE + 1
    links = []
    if number > 1:
        links.append(f'<a href="/?page={number - 1}" rel="prev">← previous</a>')
    if first + shown - 1 < total:
        links.append(f'<a href="/?page={number + 1}" rel="next">next →</a>')
    return (f'<nav class="pages"><span class="muted">queues {first}–{first + shown - 1} of {total}</span> '
            f'{" ".join(links)}</nav>')


def queue_page(state, name: bytes, figures, lists: dict, history: History, csrf: str, flash: str) -> bytes:
    """A queue's page: its figures (from Admin.figures), the tasks in `lists` by state, its charts."""
    now, queue = figures.now, figures.queues[name]
    counts = queue["counts"]
    tiles = "".join(f'<div class="{count_class("tile", s, counts[s])}"><div class="count" data-state="{s}">{counts[s]}</div>'
                    f'<div class="muted">{STATE_TITLES[s]}</div></div>'
                    for s in (*lifecycle.STATES, *((WAITING,) if counts[WAITING] else ())))  # XADD AFTER's, if any
    since = queue["head_since"]
    totals = queue["totals"]
    facts = (f'oldest waiting {text(duration(None if since is None else now - since))} · since start: '
             f'{totals["pushed"]} pushed, {totals["acked"]} acked, {totals["failed"]} failed, '
             f'{totals["expired"]} timed out, {totals["dead"]} dead')
    if queue.get("partitions") is not None:  # a queue whose tasks have partitions or priorities
        facts += f' · {queue["partitions"]} partition{"" if queue["partitions"] == 1 else "s"} with work'
    paused = queue["paused"]
    body = [header(state, figures), f'<main><p><a href="/">← queues</a></p>'
                           f'<h1>{text(shown_name(name))}{PAUSED_BADGE if paused else held_badge(queue)}</h1>']
    if flash:
        body.append(f'<p class="flash" role="status">{text(flash)}</p>')
    body += [pause_control(name, paused, csrf),
             f'<div class="tiles">{tiles}</div><p class="muted">{facts}</p>',
             f'<div class="big-chart">{chart(history.rates(name), 640, 120, labelled=True)}'
             f'<p class="muted"><span class="pushes-key">pushes/s</span> and <span class="acks-key">acks/s</span>, '
             f'last {span_words(history.rates(name))}</p></div>',
             in_flight_table(name, lists[IN_FLIGHT], counts[IN_FLIGHT], now),
             dead_table(name, lists[DEAD], counts[DEAD], now, csrf),
             waiting_table(name, "Next available", lists[AVAILABLE], counts[AVAILABLE], now, "waiting for",
                           lambda row: now - row[6], csrf),
             waiting_table(name, "Delayed", lists[DELAYED], counts[DELAYED], now, "due in", lambda row: row[6] - now,
                           csrf),
             "</main>"]
    return page(shown_name(name).decode("utf-8", "replace"), "".join(body))


# What the queue page may say after a change (?done=<code>&n=<count>): the server's own words
# only, so that a link cannot make the dashboard say anything else.
DONE_MESSAGES = {
    b"requeued": "requeued {n} task{s}",
    b"deleted-dead": "deleted {n} dead task{s}",
    b"deleted": "deleted {n} task{s}",
    b"paused": "paused: workers get nothing until it is resumed",
    b"resumed": "resumed",
}


def done_message(code: bytes, count: bytes) -> str:
    """The message of a DONE_MESSAGES code, with its count where it has one; "" for anything else."""
    message = DONE_MESSAGES.get(code)
    if message is None or "{n}" not in message:
        return message or ""
    if not count.isdigit() or len(count) > 9:
        return ""
    n = int(count)
    return message.format(n=n, s="" if n == 1 else "s")


def held_badge(queue: dict) -> str:
    """A badge while MAX-IN-FLIGHT or RATE-LIMIT holds the queue back (a paused one has its own)."""
    held = queue.get("held_back")
    if held is None or held == "paused":
        return ""
    why = "XCFGSET MAX-IN-FLIGHT: as many tasks as it allows are in flight" if held == "cap" else \
        "XCFGSET RATE-LIMIT: as many tasks as it allows were handed out within its window"
    return f' <span class="badge paused" title="{why}">held: {held}</span>'


PAUSED_BADGE = ' <span class="badge paused" title="XCFGSET PAUSED 1: pushes land, nothing is handed out">paused</span>'


def pause_control(name: bytes, paused: bool, csrf: str) -> str:
    """What pausing means, and the button that pauses or resumes the queue (XCFGSET PAUSED)."""
    if paused:
        return ('<div class="paused-note">Paused: pushes are kept, workers get nothing from this queue (leases '
                'still run out; acks and nacks still count) until it is resumed. '
                f'{form("/queue/pause", name, csrf, {"paused": "0"}, "Resume", "resume")}</div>')
    return ('<div class="pause-control">'
            + form("/queue/pause", name, csrf, {"paused": "1"}, "Pause", "pause",
                   confirm="Pause this queue? Workers get nothing from it until it is resumed.")
            + '<span class="muted">stop handing out tasks (pushes are still kept)</span></div>')


def shown_of(rows: list, total: int) -> str:
    return f" <span class=\"muted\">(first {len(rows)} of {total})</span>" if total > len(rows) else ""


def in_flight_table(name: bytes, rows: list, total: int, now: int) -> str:
    """Who holds each leased task, for how long, and when its lease runs out."""
    head = f'<h2>In flight{shown_of(rows, total)}</h2>'
    if not rows:
        return head + '<p class="muted">No task is in flight.</p>'
    key_head, key_cell = key_cells(rows)
    cells = "".join(
        f'<tr><td class="id">{task_link(name, row)}</td><td>{text(row[4])}</td>'
        f'<td class="num">{text(duration(now - row[8]))}</td><td class="num">{text(duration(row[7] - now))}</td>'
        f'<td class="num">{row[3]}</td>{key_cell(row)}<td class="fields">{fields_text(row)}</td></tr>' for row in rows)
    return (head + '<table class="tasks in-flight"><thead><tr><th>id</th><th>worker</th><th class="num">held for'
            f'</th><th class="num">lease left</th><th class="num">attempts</th>{key_head}<th>fields</th></tr></thead>'
            f'<tbody>{cells}</tbody></table>')


def dead_table(name: bytes, rows: list, total: int, now: int, csrf: str) -> str:
    """Dead tasks with their last failure, and the buttons that requeue or delete them."""
    head = f'<h2>Dead{shown_of(rows, total)}</h2>'
    if not rows:
        return head + '<p class="muted">No dead task.</p>'
    requeue_all = form("/queue/requeue", name, csrf, {"all": "1"}, f"Requeue all {total}", "requeue-all",
                       confirm=f"Requeue all {total} dead tasks?")
    key_head, key_cell = key_cells(rows)
    cells = "".join(
        f'<tr data-id="{text(stream_ids.format_id(row[:2]))}"><td class="id">{task_link(name, row)}</td>'
        f'{key_cell(row)}<td class="fields">{fields_text(row, 1000)}</td><td class="num">{row[3]}</td>'
        f'<td>{text(timestamp(row[9]))} <span class="muted">({text(duration(now - row[9]))} ago)</span></td>'
        f'<td class="failure">{failure_text(row[FAILURE], now, 2000)}</td>'
        f'<td class="actions">{form("/queue/requeue", name, csrf, {"id": stream_ids.format_id(row[:2])}, "Requeue", "requeue")}'
        f'{form("/queue/delete", name, csrf, {"id": stream_ids.format_id(row[:2])}, "Delete", "delete", confirm="Delete this task for good?")}'
        f'</td></tr>' for row in rows)
    return (head + requeue_all + f'<table class="tasks dead"><thead><tr><th>id</th>{key_head}<th>fields</th>'
            '<th class="num">attempts</th><th>died</th><th>last failure</th><th></th></tr></thead>'
            f'<tbody>{cells}</tbody></table>')


def waiting_table(name: bytes, title: str, rows: list, total: int, now: int, when: str, age, csrf: str) -> str:
    """Available or delayed tasks, each with the button that cancels it (deleted, as XDEL does)."""
    head = f'<h2>{title}{shown_of(rows, total)}</h2>'
    if not rows:
        return head + '<p class="muted">None.</p>'
    key_head, key_cell = key_cells(rows)

    def delete(row) -> str:
        return form("/queue/delete", name, csrf, {"id": stream_ids.format_id(row[:2])}, "Delete", "delete",
                    confirm="Delete this task for good? It will not run.")

    cells = "".join(
        f'<tr><td class="id">{task_link(name, row)}</td><td class="num">{text(duration(age(row)))}</td>'
        f'<td class="num">{row[3]}</td>{key_cell(row)}<td class="fields">{fields_text(row)}</td>'
        f'<td class="failure">{failure_text(row[FAILURE], now)}</td><td class="actions">{delete(row)}</td></tr>'
        for row in rows)
    return (head + f'<table class="tasks"><thead><tr><th>id</th><th class="num">{when}</th>'
            f'<th class="num">attempts</th>{key_head}<th>fields</th><th>last failure</th><th></th></tr></thead>'
            f'<tbody>{cells}</tbody></table>')


def form(action: str, name: bytes, csrf: str, fields: dict, label: str, css_class: str, confirm: str = "") -> str:
    hidden = "".join(f'<input type="hidden" name="{key}" value="{text(value)}">' for key, value in fields.items())
    confirm_attr = f' data-confirm="{text(confirm)}"' if confirm else ""
    # The queue name travels in the action's query string, percent-encoded byte for byte
    # (it need not be UTF-8, which a form field could not carry); server.py decodes it to bytes.
    return (f'<form method="post" action="{text(action + "?name=" + quote(name))}" class="inline"{confirm_attr}>'
            f'<input type="hidden" name="csrf" value="{text(csrf)}">{hidden}'
            f'<button type="submit" class="{css_class}">{text(label)}</button></form>')
