"""`ezra stats`, `ezra ls` and `ezra requeue`: look at a running server from a terminal.

Each talks to the server over its Redis port (INFO, XINFO TASKS, XREQUEUE), so it
works wherever redis-cli would: on the server's machine it finds the server
from the same flags, EZRA_* environment and config file; elsewhere, give
--host/--port/--password. Text from tasks is shown with control characters
escaped: a task field cannot move the cursor or recolour the terminal.
"""

from __future__ import annotations

import os
import sys
import time

import configargparse

from ..adapters.client import Client, ClientError, ReplyError, reachable_host
from ..config import Settings, port_number, positive_float, positive_int
from .humanize import duration
from ..lifecycle import DEFAULT_PRIORITY

STATES = ("available", "delayed", "in_flight", "done", "dead")  # INFO's counts, each queue's row in `ezra stats`
# done tasks only when asked for; waiting ones (XADD AFTER) after the rest
LISTED_BY_DEFAULT = ("in_flight", "available", "delayed", "dead", "waiting")
FIELDS_WIDTH = 60
KEY_WIDTH = 30  # characters of an XADD NAME, UNIQUE or PARTITION key shown by `ezra ls`
# `ezra ls`'s columns shown only when a listed task's cell says something: what says something.
OPTIONAL_COLUMNS = {"priority": lambda cell: cell not in ("", str(DEFAULT_PRIORITY)), "partition": bool,
                    "name": bool, "unique key": bool, "progress": bool}
PROGRESS_WIDTH = 30  # characters of a task's progress (XPROGRESS) shown by `ezra ls`
CLEAR_SCREEN = "\033[H\033[2J"


def connection_parser(prog: str, description: str, port_flags: tuple = ("--port",),
                      parser_class=configargparse.ArgParser) -> configargparse.ArgParser:
    """Options that reach the server as the server's own settings say; `port_flags`: --port and aliases."""
    parser = parser_class(prog=prog, description=description, ignore_unknown_config_file_keys=True)
    add = parser.add_argument
    add("--config", is_config_file=True, env_var="EZRA_CONFIG",
        help="the server's config file (port, bind, password and tls-cert-file are read from it)")
    add("--host", default=None, help="the server's address (default: its --bind; a wildcard means this machine)")
    add(*port_flags, dest="port", type=port_number, default=Settings.port, env_var="EZRA_PORT",
        help="the server's port")
    add("--bind", default=Settings.bind, env_var="EZRA_BIND", help=configargparse.SUPPRESS)
    add("--password", default=None, env_var="EZRA_PASSWORD", help="sent with AUTH when set")
    add("--tls-cert-file", default=None, env_var="EZRA_TLS_CERT_FILE", metavar="PEM",
        help="the server's certificate: connect with TLS and trust it")
    add("--timeout", type=positive_float, default=5.0, help="seconds to wait for the server")
    return parser


def connect(options) -> Client:
    host = options.host or reachable_host(options.bind)
    client = Client(host, options.port, options.timeout, options.tls_cert_file)
    if options.password:
        client.call("AUTH", options.password)
    return client


def run(main, argv: list[str]) -> int:
    """Run a subcommand: errors from the server or the network become one line and exit 1."""
    try:
        return main(argv)
    except (ClientError, ReplyError) as exc:
        print(f"ezra: {exc}", file=sys.stderr)
        return 1
    except REPLY_SHAPE_ERRORS as exc:
        print(f"ezra: {unexpected_reply(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # `ezra stats --watch | head`: the reader has gone, so stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


# A reply of a well-formed kind but not the shape asked for (a number where INFO's text goes, a
# string where XINFO TASKS' list goes) fails where the tool takes it apart, with one of these.
REPLY_SHAPE_ERRORS = (TypeError, ValueError, KeyError, IndexError, AttributeError)


def unexpected_reply(exc: Exception) -> str:
    """One line for a reply the tool could not take apart: what was wrong, not a traceback."""
    return f"a reply of the server is not what this tool can read ({type(exc).__name__}: {str(exc)[:200]})"


# ---------------------------------------------------------------- text

def printable(text: str) -> str:
    """Control characters (escape sequences, newlines) as visible escapes."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def shown(value: bytes, width: int | None = None) -> str:
    text = printable(value.decode("utf-8", "replace"))
    return text if width is None or len(text) <= width else text[:width - 1] + "…"


def table(headers: list[str], rows: list[list], right: set[int]) -> str:
    """Columns padded to their widest cell; the columns in `right` aligned right (numbers)."""
    cells = [headers] + [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
                               for i, cell in enumerate(row)).rstrip() for row in cells)


# ---------------------------------------------------------------- ezra stats

QUEUES_PAGE = 1000  # queues per XINFO QUEUES call


def read_info(client: Client) -> tuple[dict, dict]:
    """INFO's fields and every queue's figures: ({field: value}, {queue name: {figure: int}}).

    INFO lists only the first 100 queues, so the queues come from XINFO QUEUES, a page at a
    time; a server older than that command has them all in INFO."""
    fields, queues = read_info_lines(client)
    try:
        return fields, read_queues(client)
    except ReplyError as exc:
        if "unknown subcommand" not in str(exc).lower():
            raise
        return fields, queues


def read_queues(client: Client) -> dict:
    """{queue name: {figure: int}} of every queue, from XINFO QUEUES pages."""
    queues, after = {}, None
    while True:
        page = client.call("XINFO", "QUEUES", "COUNT", QUEUES_PAGE, *(() if after is None else ("AFTER", after)))
        for flat in page:
            queue = dict(zip(flat[::2], flat[1::2])) if isinstance(flat, list) else flat
            name = queue.pop(b"name")
            queues[name.decode("utf-8", "replace")] = {key.decode().replace("-", "_"): int(value)
                                                       for key, value in queue.items()}
            after = name
        if len(page) < QUEUES_PAGE:
            return queues


def read_info_lines(client: Client) -> tuple[dict, dict]:
    """INFO as ({field: value}, {queue name: {figure: int}}) (the queues it lists)."""
    fields, queues = {}, {}
    for line in client.call("INFO", "everything").decode("utf-8", "replace").splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith("queue_"):
            name, _, figures = line[len("queue_"):].rpartition(":")  # names may hold ':', figures never
            queues[name] = {key: int(value) for key, _, value in
                            (pair.partition("=") for pair in figures.split(","))}
        else:
            key, _, value = line.partition(":")
            fields[key] = value
    return fields, queues


def stats_text(fields: dict, queues: dict, rates: dict | None) -> str:
    """The server line and one row per queue; with `rates`, pushes/s and acks/s instead of totals."""
    head = (f"EZRA {fields.get('ezra_version', '?')} on port {fields.get('tcp_port', '?')} · up "
            f"{duration(int(fields.get('uptime_in_seconds', 0)) * 1000)} · {fields.get('connected_clients', '?')} "
            f"clients, {fields.get('blocked_clients', '?')} blocked · durability {fields.get('durability', '?')}")
    if not queues:
        return head + "\n\nno queues yet (a queue appears with its first XADD)"
    moving = ["pushed", "acked"] if rates is None else ["pushes/s", "acks/s"]
    headers = ["queue", "available", "delayed", "in flight", "done", "dead", *moving, "failed", "timed out"]

    def events(name: str, figures: dict) -> list:
        if rates is None:
            return [figures["pushed"], figures["acked"], figures["failed"], figures["expired"]]
        pushes, acks = rates.get(name, (0.0, 0.0))
        return [f"{pushes:.1f}", f"{acks:.1f}", figures["failed"], figures["expired"]]

    rows = [[printable(name) + (" (paused)" if figures.get("paused") else ""),
             *(figures[state] for state in STATES), *events(name, figures)]
            for name, figures in sorted(queues.items())]
    return head + "\n\n" + table(headers, rows, right=set(range(1, len(headers))))


def rates_between(before: dict, after: dict, seconds: float) -> dict:
    return {name: tuple(max(q[key] - before.get(name, q)[key], 0) / seconds for key in ("pushed", "acked"))
            for name, q in after.items()}


def stats_main(argv: list[str]) -> int:
    parser = connection_parser("ezra stats", "Counts of every queue of a running EZRA server, from INFO.")
    parser.add_argument("--watch", nargs="?", const=2.0, type=positive_float, metavar="SECONDS",
                        help="refresh every SECONDS (default 2) with rates, until Ctrl+C")
    options = parser.parse_args(argv)
    with connect(options) as client:
        if options.watch is None:
            print(stats_text(*read_info(client), rates=None))
            return 0
        before, before_at = None, 0.0
        while True:
            fields, queues = read_info(client)
            now = time.monotonic()
            rates = rates_between(before, queues, now - before_at) if before is not None else {}
            before, before_at = queues, now
            screen = stats_text(fields, queues, rates)
            print(CLEAR_SCREEN + screen if sys.stdout.isatty() else screen + "\n", flush=True)
            time.sleep(options.watch)


# ---------------------------------------------------------------- ezra ls

def task_age(task: dict, now_ms: int) -> str:
    """What matters about a task's time in its state."""
    state = task[b"state"].decode()
    if state == "in_flight":
        return f"held {duration(now_ms - task[b'delivered-at'])}, lease {duration(task[b'deadline'] - now_ms)}"
    if state == "delayed":
        return f"due in {duration(task[b'available-at'] - now_ms)}"
    if state in ("done", "dead"):
        return f"{state} {duration(now_ms - task[b'finished-at'])} ago"
    if state == "waiting":  # XADD AFTER: for the tasks it names
        return f"waiting for others {duration(now_ms - task[b'created-at'])}"
    return f"waiting {duration(now_ms - task[b'available-at'])}"


def last_failure(task: dict) -> str:
    """Why the task last failed (XNACK REASON, or the cause EZRA recorded), on one line; "" if never."""
    cause, reason = task.get(b"failure-cause"), task.get(b"failure-reason")
    if cause is None:
        return ""
    return shown(cause if reason is None else cause + b": " + reason, FIELDS_WIDTH)


def ls_main(argv: list[str]) -> int:
    parser = connection_parser("ezra ls", "The tasks of one queue of a running EZRA server (XINFO TASKS).")
    parser.add_argument("queue", help="the queue's name")
    parser.add_argument("--state", choices=(*STATES, "waiting", "all"), default=None,
                        help="only this state (default: in flight, available, delayed, dead and waiting "
                             "(XADD AFTER); 'all' adds done)")
    parser.add_argument("--count", type=positive_int, default=20, help="tasks shown per state")
    options = parser.parse_args(argv)
    states = {None: LISTED_BY_DEFAULT, "all": (*LISTED_BY_DEFAULT, "done")}.get(options.state, (options.state,))
    rows, more = [], []
    with connect(options) as client:
        now_ms = int(time.time() * 1000)
        for state in states:
            try:
                reply = client.call("XINFO", "TASKS", options.queue, state, "COUNT", options.count)
            except ReplyError as exc:
                if "no such key" in str(exc):
                    raise ReplyError(f"no queue named {printable(options.queue)!r}") from None
                raise
            tasks = [dict(zip(flat[::2], flat[1::2])) for flat in reply]
            if len(tasks) == options.count:
                more.append(state)
            for task in tasks:
                fields = task[b"fields"]
                text = "  ".join(f"{shown(fields[i])}={shown(fields[i + 1])}" for i in range(0, len(fields) - 1, 2))
                # XADD UNIQUE's, PRIORITY's and PARTITION's: a server before them sends none
                key, priority, partition = task.get(b"unique-key"), task.get(b"priority"), task.get(b"partition")
                rows.append([task[b"id"].decode(), state, task[b"attempts"],
                             shown(task[b"worker"]) if task[b"worker"] is not None else "",
                             task_age(task, now_ms), "" if priority is None else str(priority),
                             "" if partition is None else shown(partition, KEY_WIDTH),
                             "" if task.get(b"name") is None else shown(task[b"name"], KEY_WIDTH),  # XADD NAME's
                             "" if key is None else shown(key, KEY_WIDTH),
                             text[:FIELDS_WIDTH - 1] + "…" if len(text) > FIELDS_WIDTH else text,
                             # XPROGRESS's: a server before it sends none
                             "" if task.get(b"progress") is None else shown(task[b"progress"], PROGRESS_WIDTH),
                             last_failure(task)])
    if not rows:
        print(f"no {' / '.join(states)} tasks in {printable(options.queue)}")
        return 0
    headers = ["id", "state", "attempts", "worker", "when", "priority", "partition", "name", "unique key", "fields",
               "progress", "last failure"]
    # The priority, partition and key columns only when a listed task has one (a priority of its own)
    shown_columns = [column for column, header in enumerate(headers) if header not in OPTIONAL_COLUMNS
                     or any(OPTIONAL_COLUMNS[header](row[column]) for row in rows)]
    headers = [headers[column] for column in shown_columns]
    rows = [[row[column] for column in shown_columns] for row in rows]
    print(table(headers, rows, right={2}))
    if more:
        print(f"\n(first {options.count} {', '.join(more)}; --count shows more)")
    return 0


# ---------------------------------------------------------------- ezra requeue

def requeue_main(argv: list[str]) -> int:
    parser = connection_parser("ezra requeue", "Send dead tasks back to their queue (XREQUEUE).")
    parser.add_argument("queue", help="the queue whose dead tasks go back (from <queue>::dead)")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="every dead task of the queue")
    which.add_argument("--id", dest="ids", action="append", metavar="ID", help="this dead task (repeatable)")
    options = parser.parse_args(argv)
    with connect(options) as client:
        if options.all:
            moved = client.call("XREQUEUE", options.queue, "ALL")
        else:
            moved = client.call("XREQUEUE", options.queue, "IDS", len(options.ids), *options.ids)
    print(f"requeued {moved} dead task{'s' if moved != 1 else ''} of {printable(options.queue)}")
    return 0


SUBCOMMANDS = {"stats": stats_main, "ls": ls_main, "requeue": requeue_main}
