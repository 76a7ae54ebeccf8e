"""The dashboard's page of one task (/task?queue=<name>&id=<ms-seq>): everything stored about it.

Its id, state, attempts, worker, times, XADD UNIQUE key, priority and partition, last failure in
full, its progress (XPROGRESS), its result (XACK ... RESULT: cut, with its size), its dependencies both ways (XADD AFTER) and its fields. Like every page, all user data goes through dashboard.text() (escaped); values
that are not text are shown with \\xNN escapes, and the page is bounded: at most
FIELDS_LISTED fields, each name and value cut with a note saying how much was left out.
"""

from __future__ import annotations

import time

from ..protocol import stream_ids
from ..lifecycle import AVAILABLE, DEAD, DEFAULT_PRIORITY, DELAYED, MAX_REASON_BYTES
from ..storage import decode_failure, name_bytes
from ..protocol.task_fields import shown as shown_fields
from . import shown_name
from .dashboard import (FAILURE, NAME, PARTITION, PRIORITY, PROGRESS, RESULT_SIZE, STATE_TITLES, UNIQUE_KEY, duration,
                        form, header, page, queue_link, task_link, text)

RESULT_CUT = 17                # the result's first bytes after INSPECT_COLUMNS (storage.reads.task_by_id)
STATE = 18                     # then the state column
FIELDS_LISTED = 100            # fields shown on a task's page; XRANGE shows the rest
VALUE_SHOWN = 2000             # characters of a field's value (or of its name, or the key) shown
NAME_SHOWN_CHARS = 200         # characters of a field's name shown
# (column in the row, its title, what it means): the task's times, each human and exact.
TIMES = ((5, "created", "when it was pushed"), (6, "available", "when it became (or becomes) available"),
         (8, "delivered", "its last delivery to a worker"), (7, "deadline", "when its lease runs out"),
         (9, "finished", "when it was acked or died"))


def shown_bytes(value: bytes, limit: int = VALUE_SHOWN) -> str:
    """A field's name or value as escaped HTML: text when it is UTF-8 without control characters,
    else marked binary and shown with \\xNN escapes; cut at `limit` characters with a note."""
    try:
        decoded = value.decode("utf-8")
        binary = any(ord(c) < 32 and c not in "\t\n\r" or c == "\x7f" for c in decoded)
    except UnicodeDecodeError:
        binary = True
    if binary:
        decoded = value.decode("latin-1").encode("unicode_escape").decode("ascii")
    cut = len(decoded) > limit
    shown = text(decoded[:limit])
    notes = []
    if binary:
        notes.append("binary: shown with \\x escapes")
    if cut:
        notes.append(f"cut: {len(value)} bytes in all, XRANGE shows the whole value")
    if notes:
        shown += f' <span class="muted note">({text("; ".join(notes))})</span>'
    return shown


def exact_time(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def time_cell(ms: int | None, now: int) -> str:
    """'3 minutes ago' / 'in 20 seconds', then the exact UTC time and the stored milliseconds."""
    if ms is None:
        return '<span class="muted">–</span>'
    human = f"{duration(now - ms)} ago" if ms <= now else f"in {duration(ms - now)}"
    return (f'{text(human)} <span class="muted"><time datetime="{text(exact_time(ms))}">{text(exact_time(ms))}'
            f'</time> · {ms} ms</span>')


def facts_table(row: tuple, now: int) -> str:
    state = row[STATE]
    worker = row[4]
    facts = [("state", f'<span class="state {text(state)}">{text(STATE_TITLES.get(state, state))}</span>'),
             ("attempts", str(row[3])),
             ("worker", '<span class="muted">–</span>' if worker is None else text(worker))]
    facts += [(title, f'{time_cell(row[column], now)} <span class="muted">· {text(meaning)}</span>')
              for column, title, meaning in TIMES]
    facts.append(("name", f'<span class="name">{shown_key(row[NAME])}</span>'))
    facts.append(("unique key", f'<span class="unique-key">{shown_key(row[UNIQUE_KEY])}</span>'))
    priority, default = (DEFAULT_PRIORITY, ' <span class="muted">· the default</span>') if row[PRIORITY] is None \
        else (row[PRIORITY], "")
    facts.append(("priority", f'<span class="priority">{text(str(priority))}</span>{default}'))
    facts.append(("partition", f'<span class="partition">{shown_key(row[PARTITION])}</span>'))
    cells = "".join(f'<tr data-fact="{text(name)}"><th>{text(name)}</th><td>{value}</td></tr>' for name, value in facts)
    return f'<table class="facts">{cells}</table>'


def shown_key(key) -> str:
    """A task's NAME, UNIQUE or PARTITION key (TEXT, or BLOB when not UTF-8), escaped; a dash for none."""
    if key is None:
        return '<span class="muted">–</span>'
    return shown_bytes(key.encode("utf-8", "surrogateescape") if isinstance(key, str) else bytes(key))


def failure_section(failure_json: str | None, now: int) -> str:
    """The last failure in full: its cause, reason (stored up to lifecycle.MAX_REASON_BYTES), worker, when."""
    failure = decode_failure(failure_json)
    head = "<h2>Last failure</h2>"
    if failure is None:
        return head + '<p class="muted">None: this task has not failed.</p>'
    at, worker, reason = failure.get("at"), failure.get("worker"), failure.get("reason")
    if reason is not None and len(reason) > MAX_REASON_BYTES:  # only a hand-edited row holds more
        reason = reason[:MAX_REASON_BYTES] + f"… [cut here: {len(reason)} characters in all]"
    rows = [("cause", f'<span class="cause">{text(failure.get("cause") or "–")}</span>'),
            ("worker", '<span class="muted">–</span>' if worker is None else text(worker)),
            ("when", time_cell(at if isinstance(at, int) else None, now)),
            ("reason", '<span class="muted">none given</span>' if reason is None else
                       f'<pre class="reason">{text(reason)}</pre>')]
    cells = "".join(f'<tr><th>{name}</th><td>{value}</td></tr>' for name, value in rows)
    return f'{head}<table class="facts failure">{cells}</table>'


def outcome_section(row: tuple) -> str:
    """Its progress (XPROGRESS's last value) and result (XACK ... RESULT's: its first bytes and size)."""
    size = row[RESULT_SIZE]
    if size is None:
        result = '<span class="muted">none</span>'
    else:
        shown = bytes(row[RESULT_CUT] or b"")
        note = f" <span class=\"muted\">(first {len(shown)} of {size} bytes: XRESULT reads it whole)</span>" \
            if size > len(shown) else f' <span class="muted">({size} bytes)</span>'
        result = f'<pre class="result">{shown_bytes(shown)}</pre>{note}'
    progress = row[PROGRESS]
    progress = '<span class="muted">none reported</span>' if progress is None else \
        f'<span class="progress">{shown_bytes(bytes(progress))}</span>'
    cells = f'<tr data-fact="progress"><th>progress</th><td>{progress}</td></tr>' \
            f'<tr data-fact="result"><th>result</th><td>{result}</td></tr>'
    return f'<h2>Progress and result</h2><table class="facts outcome">{cells}</table>'


def fields_section(row: tuple) -> str:
    values = shown_fields(row[2], row[:2])
    pairs = [(values[i], values[i + 1]) for i in range(0, len(values) - 1, 2)]
    shown = pairs[:FIELDS_LISTED]
    note = (f' <span class="muted">(first {len(shown)} of {len(pairs)}: XRANGE shows them all)</span>'
            if len(pairs) > len(shown) else "")
    head = f"<h2>Fields{note}</h2>"
    if not pairs:
        return head + '<p class="muted">None.</p>'
    cells = "".join(f'<tr><td class="field-name">{shown_bytes(name, NAME_SHOWN_CHARS)}</td>'
                    f'<td class="field-value">{shown_bytes(value)}</td></tr>' for name, value in shown)
    return (f'{head}<table class="tasks task-fields"><thead><tr><th>field</th><th>value</th></tr></thead>'
            f'<tbody>{cells}</tbody></table>')


def actions(queue: bytes, task_id: str, state: str, csrf: str) -> str:
    """A dead task's requeue and delete buttons, a waiting task's delete (cancel) button: the queue
    page's forms (they return to the queue page). A task in flight or done has none."""
    if state not in (DEAD, AVAILABLE, DELAYED):
        return ""
    requeue = form("/queue/requeue", queue, csrf, {"id": task_id}, "Requeue", "requeue") if state == DEAD else ""
    return ('<div class="task-actions">' + requeue
            + form("/queue/delete", queue, csrf, {"id": task_id}, "Delete", "delete",
                   confirm="Delete this task for good?")
            + "</div>")


def dependencies_section(edges: tuple | None) -> str:
    """XADD AFTER, both ways: the tasks it waits for and those waiting for it (storage.dependencies's
    task_dependencies; none either way: no section)."""
    if not edges or not (edges[0] or edges[1]):
        return ""

    def listed(rows) -> str:
        if not rows:
            return '<span class="muted">none</span>'
        return "<ul>" + "".join(
            f'<li>{queue_link(name_bytes(queue))} {task_link(name_bytes(queue), (ms, seq))} '
            f'<span class="state {text(state)}">{text(STATE_TITLES.get(state, state))}</span></li>'
            if queue is not None else '<li><span class="muted">a task deleted since</span></li>'
            for queue, ms, seq, state in rows) + "</ul>"

    return (f'<h2>Dependencies</h2><table class="facts dependencies">'
            f'<tr data-fact="waits for"><th>waits for (not done yet)</th><td>{listed(edges[0])}</td></tr>'
            f'<tr data-fact="waited for by"><th>waited for by</th><td>{listed(edges[1])}</td></tr></table>')


def render(state, queue: bytes, row: tuple, figures, csrf: str, edges: tuple | None = None) -> bytes:
    """The page of one task: `row` is storage.reads.task_by_id's (INSPECT_COLUMNS + state); `edges`, its
    dependencies both ways (XADD AFTER)."""
    now = figures.now
    task_id = stream_ids.format_id(row[:2])
    body = [header(state, figures),
            f'<main><p><a href="/">← queues</a> · queue {queue_link(queue)}</p>'
            f'<h1>task <span class="id">{text(task_id)}</span></h1>',
            actions(queue, task_id, row[STATE], csrf),
            facts_table(row, now), failure_section(row[FAILURE], now), outcome_section(row),
            dependencies_section(edges), fields_section(row), "</main>"]
    title = f"{task_id} in {shown_name(queue).decode('utf-8', 'replace')}"
    return page(title, "".join(body), refresh=False)  # a still page: the reason stays put while it is read
