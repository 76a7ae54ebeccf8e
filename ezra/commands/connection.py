"""Connection and server commands: PING, ECHO, QUIT, SELECT, AUTH, HELLO, CLIENT,
COMMAND, MULTI/EXEC/DISCARD and INFO. Same rules as every command (table.py); these
act on the connection's session (ezra/front/session.py) more than on the broker.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from typing import TYPE_CHECKING

from loguru import logger

from .. import __version__, errors, lifecycle
from ..broker import flow
from ..broker.queues import MAX_QUEUE_NAME
from ..protocol.integers import to_int
from ..settings.options import Custom, Options, Value, parse_options
from ..protocol.resp import OK, ErrorReply, SimpleString, Verbatim
from ..storage.schedules import NEVER
from .table import COMMANDS, Deferred, command, resolved, run

if TYPE_CHECKING:  # annotations only: no command module imports the connection side
    from ..front.session import ServerState, Session

REDIS_COMPAT_VERSION = "7.0.15"  # what clients see: the Redis version whose replies EZRA matches


# ---------------------------------------------------------------- connection commands

@command("PING", -1)
def ping(session, args):
    """PING [message]"""
    if len(args) > 2:
        raise errors.wrong_arity("ping")
    return args[1] if len(args) == 2 else SimpleString("PONG")


@command("ECHO", 2)
def echo(session, args):
    """ECHO message"""
    return args[1]


@command("QUIT", -1)
def quit_(session, args):
    """QUIT: reply OK, then close."""
    session.closing = True
    return OK


# ---------------------------------------------------------------- transactions

@command("MULTI", 1)
def multi(session, args):
    """MULTI: queue the next commands until EXEC (or DISCARD)."""
    if session.queued is not None:
        return errors.MULTI_NESTED()  # answered, the transaction goes on
    session.queued, session.queued_bytes, session.queue_failed = [], 0, False
    return OK


@command("EXEC", 1)
def exec_(session, args):
    """EXEC: run the queued commands in order; an array of their replies.

    They run in one writer transaction (Writer.atomic), with no other client's
    command between them: every write of the EXEC commits together or not at
    all, for a crash and for any reader of the file alike, whatever it holds (a
    read in it answers at once from the open transaction; a blocking read does
    not block, as in Redis). As in Redis, a command that fails at run time
    answers its error and the others still apply; only a storage failure (or a
    full disk met at the commit) undoes the whole EXEC, and then every reply in
    it is that error. BACKUP, which waits for a commit, is refused at queue time.
    """
    if session.queued is None:
        raise errors.EXEC_WITHOUT_MULTI
    queued, failed = session.queued, session.queue_failed
    session.queued, session.queued_bytes, session.queue_failed = None, 0, False
    if failed:
        raise errors.EXECABORT
    session.in_exec = True
    try:
        with session.state.broker.writer.atomic() as atomic:
            replies = [run(session, fn, queued_args) for fn, queued_args in queued]
    finally:
        session.in_exec = False
    return Deferred(AllReplies(replies, atomic))


class AllReplies:
    """EXEC's replies once its transaction committed (Deferred's request): every one an
    error if it rolled back."""

    durable = False  # counted as a read by the connection (connection.LARGE): it may be one

    def __init__(self, replies: list, atomic):
        self.replies = replies
        self.atomic = atomic

    def wait(self) -> list:
        undone = self.atomic.wait()
        if undone is not None:
            error = undone.as_reply() if isinstance(undone, ErrorReply) else errors.storage_failed(str(undone))
            return [error] * len(self.replies)
        answers = []
        for reply in self.replies:
            try:
                reply = resolved(reply)
            except ErrorReply as exc:
                reply = exc.as_reply()
            answers.append(reply)
        return answers


@command("DISCARD", 1)
def discard(session, args):
    """DISCARD: forget the queued commands."""
    if session.queued is None:
        raise errors.DISCARD_WITHOUT_MULTI
    session.queued, session.queued_bytes, session.queue_failed = None, 0, False
    return OK


@command("SELECT", 2)
def select(session, args):
    """SELECT 0: EZRA has one database."""
    index = to_int(args[1])
    if not 0 <= index < 16:
        raise errors.DB_OUT_OF_RANGE  # what Redis answers with its 16 databases
    if index != 0:
        raise errors.SELECT_ONLY_ZERO
    return OK


@command("AUTH", -2)
def auth(session, args):
    """AUTH [username] password"""
    if len(args) > 3:
        raise errors.SYNTAX
    if not session.state.settings.password:
        raise errors.AUTH_NOT_CONFIGURED
    check_password(session, args[1] if len(args) == 3 else b"default", args[-1])
    return OK


def check_password(session: Session, user: bytes, password: bytes) -> None:
    expected = session.state.settings.password
    import hmac  # here: it loads OpenSSL (3.4 MB), which a server without a password need not hold
    if expected and not (user == b"default" and hmac.compare_digest(password, expected.encode())):
        logger.debug("failed authentication from {}", session.addr)  # ezra/front/connection.py logs bursts
        raise errors.WRONGPASS
    session.authenticated = True


def valid_client_name(name: bytes) -> bytes:
    if any(c <= 32 or c >= 127 for c in name):
        raise errors.BAD_CLIENT_NAME
    return name


def take_credentials(args: list[bytes], i: int, _) -> tuple:
    """AUTH username password -> (username, password)."""
    return (args[i + 1], args[i + 2]), i + 3


HELLO_OPTIONS = Options(AUTH=Custom(take_credentials, need=2), SETNAME=Value(valid_client_name),
                        unknown=errors.unknown_hello_option)


@command("HELLO", -1)
def hello(session, args):
    """HELLO [protover [AUTH username password] [SETNAME clientname]]"""
    proto = session.proto
    if len(args) > 1:
        proto = to_int(args[1], errors.PROTOCOL_NOT_INTEGER)
        if proto not in (2, 3):
            raise errors.NOPROTO
    # Every option is checked before anything changes: a HELLO that fails leaves the connection as it
    # was (an invalid name must not leave it authenticated), as Redis does since redis/redis#11037.
    (credentials, name), _ = parse_options(args, 2, HELLO_OPTIONS)
    if credentials is not None:
        check_password(session, *credentials)
    if not session.authenticated:
        raise errors.HELLO_NOT_AUTHENTICATED
    if name is not None:
        session.name = name
    session.proto = proto
    return {"server": "ezra", "version": REDIS_COMPAT_VERSION, "proto": proto, "id": session.id,
            "mode": "standalone", "role": "master", "modules": []}


@command("CLIENT", -2)
def client(session, args):
    """CLIENT SETNAME name | GETNAME | ID | SETINFO LIB-NAME|LIB-VER value"""
    sub = args[1].upper()
    if sub == b"SETNAME" and len(args) == 3:
        session.name = valid_client_name(args[2]) or None
        return OK
    if sub == b"GETNAME" and len(args) == 2:
        return session.name
    if sub == b"ID" and len(args) == 2:
        return session.id
    if sub == b"SETINFO" and len(args) == 4:
        attr = args[2].upper()
        if attr == b"LIB-NAME":
            session.lib_name = args[3]
        elif attr == b"LIB-VER":
            session.lib_ver = args[3]
        else:
            raise errors.unrecognized_option(args[2])
        return OK
    if sub in (b"SETNAME", b"GETNAME", b"ID", b"SETINFO"):
        raise errors.wrong_subcommand_arity("client", sub)
    raise errors.unknown_subcommand(args[1].decode("utf-8", "replace"), "CLIENT")


@command("COMMAND", -1)
def command_(session, args):
    """COMMAND [COUNT | INFO name... | DOCS [name...] | LIST]: enough for clients that ask."""
    sub = args[1].upper() if len(args) > 1 else None
    if sub is None:
        return [command_info(name) for name in COMMANDS]
    if sub == b"COUNT":
        return len(COMMANDS)
    if sub == b"LIST":
        return [entry[2] for entry in COMMANDS.values()]
    if sub == b"INFO":
        return [command_info(name.upper()) if name.upper() in COMMANDS else None for name in args[2:]]
    if sub == b"DOCS":
        return {}
    raise errors.unknown_subcommand(args[1].decode("utf-8", "replace"), "COMMAND")


def command_info(name: bytes) -> list:
    fn, arity, lower = COMMANDS[name]
    keyed = name.startswith(b"X") and name not in (b"XREAD", b"XREADGROUP", b"XGROUP", b"XINFO")
    first = 1 if keyed else 0
    return [lower, arity, [SimpleString("write" if keyed else "fast")], first, first, 1 if keyed else 0]


# ---------------------------------------------------------------- INFO

@command("INFO", -1)
def info(session, args):
    """INFO [section ...]: server, clients, memory, persistence, stats, queues, schedules."""
    wanted = {arg.decode("utf-8", "replace").lower() for arg in args[1:]} or {"default"}
    everything = bool(wanted & {"all", "everything", "default"})
    # One snapshot of the broker's figures for every section; the queues' only when shown, and
    # only the first INFO_QUEUES of them (50,000 queues took ~0.5 s a call): XINFO QUEUES pages.
    broker = session.state.broker
    figures = broker.admin.figures(broker.names_after(None, INFO_QUEUES) if everything or "queues" in wanted else (),
                             head_since=False)
    sections = []
    for name, build in INFO_SECTIONS:
        if everything or name in wanted:
            lines = build(session.state, figures)
            title = INFO_TITLES.get(name, name.capitalize())
            sections.append(f"# {title}\r\n" + "".join(f"{k}:{v}\r\n" for k, v in lines))
    return Verbatim("\r\n".join(sections))


def info_server(state: ServerState, figures):
    uptime = int(time.monotonic() - state.started)
    system = os.uname()  # what platform.system/release/machine read, without the platform module (0.2 MB)
    return [("redis_version", REDIS_COMPAT_VERSION), ("ezra_version", __version__),
            ("redis_mode", "standalone"), ("os", f"{system.sysname} {system.release} {system.machine}"),
            ("arch_bits", 64), ("multiplexing_api", "gevent"), ("python_version", "%d.%d.%d" % sys.version_info[:3]),
            ("process_id", os.getpid()), ("run_id", RUN_ID), ("tcp_port", state.port),
            ("server_time_usec", time.time_ns() // 1000), ("uptime_in_seconds", uptime),
            ("uptime_in_days", uptime // 86400), ("hz", 10), ("executable", sys.argv[0]),
            ("config_file", state.settings.config or "")]


# Redis's run_id and master_replid: 40 hex digits made at each start (a tool that sees it change
# knows the server restarted). One server per process, so one per process.
RUN_ID = os.urandom(20).hex()
REPLICATION_ID = os.urandom(20).hex()


def info_clients(state: ServerState, figures):
    return [("connected_clients", len(state.sessions)), ("blocked_clients", figures.blocked),
            ("maxclients", state.max_clients), ("parked_clients", state.parked_clients)]


def info_memory(state: ServerState, figures):
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    current = rss
    try:
        with open("/proc/self/statm") as statm:
            current = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        pass  # not Linux: the peak is the best figure we have
    return [("used_memory", current), ("used_memory_human", human_bytes(current)), ("used_memory_rss", current),
            ("used_memory_rss_human", human_bytes(current)), ("used_memory_peak", rss),
            ("used_memory_peak_human", human_bytes(rss)), ("maxmemory", 0), ("maxmemory_human", "0B"),
            ("maxmemory_policy", "noeviction")]


def human_bytes(n: int) -> str:
    """Redis's *_human figures: 943.74K, 11.26M (bytesToHuman)."""
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n}B"


def info_persistence(state: ServerState, figures):
    integrity = state.broker.db.integrity  # unchecked, checking, ok or corrupt (storage/integrity.py)
    return [("loading", 0), ("database_file", state.broker.db.path), ("database_bytes", figures.database_bytes),
            ("durability", state.settings.durability), ("commit_batches", figures.batches),
            ("wal_fsyncs", figures.fsyncs),
            ("committed_requests", figures.committed_requests), ("aof_enabled", 0), ("aof_rewrite_in_progress", 0),
            # every reply that promises durability waits for its commit: nothing is ever unsaved
            ("rdb_changes_since_last_save", 0), ("rdb_bgsave_in_progress", 0),
            ("rdb_last_save_time", int(time.time())), ("rdb_last_bgsave_status", "ok"),
            ("database_integrity", integrity.state), ("unreadable_tasks", figures.unreadable_tasks),
            *([("database_corruption", integrity.reason)] if integrity.corrupt else [])]


def info_stats(state: ServerState, figures):
    totals = figures.totals
    return [("total_connections_received", state.total_connections),
            ("total_commands_processed", state.total_commands),
            ("rejected_connections", state.rejected_connections),
            # Redis's key figures, for tools that read them: EZRA expires, evicts and looks up no keys
            ("expired_keys", 0), ("evicted_keys", 0), ("keyspace_hits", 0), ("keyspace_misses", 0),
            ("pubsub_channels", 0), ("pubsub_patterns", 0),
            ("pipeline_yields", state.slice_yields),  # a long pipeline let the other clients in (connection.SLICE)
            ("tasks_pushed", totals["pushed"]), ("tasks_delivered", totals["delivered"]),
            ("tasks_acked", totals["acked"]), ("tasks_failed", totals["failed"]),
            ("tasks_expired", totals["expired"]), ("tasks_dead", totals["dead"]),
            ("tasks_released", totals["released"]), ("tasks_purged", totals["purged"]),
            ("tasks_redelivered", totals["redelivered"]), ("tasks_requeued", totals["requeued"])]


def info_queues(state: ServerState, figures):
    lines = [("queues", figures.queue_count)]
    if figures.queue_count > len(figures.queues):
        lines.append(("queues_listed", len(figures.queues)))  # the first by name; XINFO QUEUES pages them all
    for name, queue in sorted(figures.queues.items()):
        if len(name) > MAX_QUEUE_NAME:  # an older EZRA's queue: cut, as /metrics and the dashboard do
            name = name[:MAX_QUEUE_NAME] + f"…({len(name)} bytes)".encode()
        shown = name.decode("utf-8", "replace").translate(INFO_NAME_SAFE)
        fields = [(key, queue["counts"][key]) for key in INFO_STATES]
        fields += [(key, queue["totals"][key]) for key in INFO_TOTALS]
        fields.append(("paused", int(queue["paused"])))
        held = INFO_HELD.get(queue["held_back"])  # only while a limit holds it back (flow.py)
        if held is not None:
            fields.append((held, 1))
        if queue["partitions"] is not None:  # only on a queue whose tasks have partitions or priorities
            fields.append(("partitions", queue["partitions"]))
        if queue["counts"][lifecycle.WAITING]:  # only while tasks wait for others (XADD AFTER)
            fields.append(("waiting", queue["counts"][lifecycle.WAITING]))
        lines.append((f"queue_{shown}", ",".join(f"{key}={value}" for key, value in fields)))
    return lines


# The counts by state (the first four fields first, as they always were), then totals of
# events since start ('ezra stats --watch' turns those into rates), then paused=1|0 (XCFGSET PAUSED),
# then, only while one holds the queue back, at_cap=1 (MAX-IN-FLIGHT) or rate_limited=1 (RATE-LIMIT),
# then, on a queue whose tasks have partitions or priorities, partitions=n (those with work),
# then, while some of its tasks wait for others (XADD AFTER), waiting=n.
# Integers all: `ezra stats` of any version reads every figure as one.
INFO_STATES = (lifecycle.AVAILABLE, lifecycle.IN_FLIGHT, lifecycle.DONE, lifecycle.DEAD, lifecycle.DELAYED)
INFO_TOTALS = ("pushed", "delivered", "acked", "failed", "expired")
INFO_HELD = {flow.CAP: "at_cap", flow.RATE: "rate_limited"}


INFO_QUEUES = 100  # queue_<name> lines at most, the first queues by name
INFO_NAME_SAFE = str.maketrans({"\r": "?", "\n": "?", ",": "?"})

def info_schedules(state: ServerState, figures):
    """XSCHEDULE's schedules in all: how many, tasks they pushed, the next run (ms; 0: none)."""
    rows = [] if state.scheduler is None else state.scheduler.shown().wait()
    upcoming = [row.next_at for row in rows if row.next_at < NEVER]
    return [("schedules", len(rows)), ("schedule_firings", sum(row.firings for row in rows)),
            ("schedule_next_run", min(upcoming, default=0))]


def info_replication(state: ServerState, figures):
    """A single node: always a master without replicas (clients and tools check the role)."""
    return [("role", "master"), ("connected_slaves", 0), ("master_failover_state", "no-failover"),
            ("master_replid", REPLICATION_ID), ("master_repl_offset", 0), ("repl_backlog_active", 0)]


def info_cpu(state: ServerState, figures):
    usage, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return [("used_cpu_sys", f"{usage.ru_stime:.6f}"), ("used_cpu_user", f"{usage.ru_utime:.6f}"),
            ("used_cpu_sys_children", f"{children.ru_stime:.6f}"),
            ("used_cpu_user_children", f"{children.ru_utime:.6f}")]


def info_cluster(state: ServerState, figures):
    return [("cluster_enabled", 0)]  # single node; redis-py's test session and cluster-aware tools ask


# Redis's default sections in its order (server, clients, memory, persistence, stats, replication,
# cpu, cluster), then EZRA's own.
INFO_SECTIONS = [("server", info_server), ("clients", info_clients), ("memory", info_memory),
                 ("persistence", info_persistence), ("stats", info_stats), ("replication", info_replication),
                 ("cpu", info_cpu), ("cluster", info_cluster), ("queues", info_queues)]
INFO_TITLES = {"cpu": "CPU"}
INFO_SECTIONS.append(("schedules", info_schedules))  # XSCHEDULE (an EZRA extension)
