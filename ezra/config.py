"""Every option once: flag, environment variable, default, help.

Precedence (configargparse): command-line flag > EZRA_* environment variable >
config file > default. `parse_settings` returns a frozen `Settings`.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass

import configargparse

from . import __version__
from .settings import queue_settings, schedule_settings
from .errors import CommandError

DURABILITY_MODES = ("full", "normal")
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL")


@dataclass(frozen=True)
class Settings:
    port: int = 42002
    bind: str = "127.0.0.1"
    data_dir: str = "./data"
    visibility_timeout: float = 30.0
    max_attempts: int = 3
    retention_seconds: float | None = None
    password: str | None = None
    config: str | None = None
    log_level: str = "INFO"
    durability: str = "full"
    max_task_size: int = 1024 * 1024
    max_clients: int = 10000
    backoff: str = "fixed 0"                   # retry delay of failed tasks (queue_settings)
    release_on_disconnect: float | None = None  # grace seconds; None: off
    client_send_timeout: float = 60.0           # seconds a client may leave its replies unread; 0: never
    client_frame_timeout: float = 30.0          # seconds a half-received command may stall; 0: never
    tcp_keepalive: int = 300                    # seconds of silence before TCP probes a client; 0: off
    tls_cert_file: str | None = None            # set with tls_key_file: the port speaks TLS only
    tls_key_file: str | None = None
    tls_ca_cert_file: str | None = None         # set: clients must present a certificate it signed
    disk_reserve: int = 4 * 1024 * 1024         # bytes set aside so acks/claims work on a full disk
    queues: tuple = ()                          # ((name, {column: value}), ...) from --queue lines
    http_port: int | None = None                # /metrics, /healthz and the dashboard; None: off
    backup_dir: str | None = None               # where BACKUP may write; None: the data directory
    protected_mode: bool = True                 # no password: serve only 127.0.0.1 and ::1 (as Redis)
    max_unauthenticated_per_host: int = 100     # with a password: connections one host may hold before AUTH
    auth_timeout: float = 30.0                  # with a password: seconds a connection may stay unauthenticated
    metrics_queues: int = 100                   # queues with their own /metrics series; the rest summed
    http_request_timeout: float = 5.0           # seconds an HTTP request (head and body) may take to arrive
    # One server per data directory (storage/dirlock.py):
    lock_timeout: float = 0.0                   # seconds to wait for another server to let the directory go
    # Schedules (XSCHEDULE): the config's, set at every start (schedule_settings.Definition, ...)
    schedules: tuple = ()


def positive_float(text: str) -> float:
    value = finite_float(text)
    if value <= 0:
        raise configargparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = finite_float(text)
    if value < 0:
        raise configargparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise configargparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def queue_setting(parse):
    """An option type that checks its value as XCFGSET checks the queue setting of the same name."""
    def checked(text: str):
        try:
            return parse(text.encode())
        except CommandError as exc:
            raise configargparse.ArgumentTypeError(exc.message.removeprefix("ERR ")) from None
    checked.__name__ = parse.__name__  # argparse names the type in its 'invalid <name> value' errors
    return checked


def yes_no(text: str) -> bool:
    """yes/no as Redis's config takes it (true/false, on/off, 1/0 too: the embedding API passes booleans)."""
    word = str(text).strip().lower()
    if word in ("yes", "true", "on", "1"):
        return True
    if word in ("no", "false", "off", "0"):
        return False
    raise configargparse.ArgumentTypeError(f"must be yes or no, got {text}")


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise configargparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise configargparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def port_number(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise configargparse.ArgumentTypeError(f"must be 0..65535 (0 picks a free port), got {text}")
    return value


def backoff_policy(text: str) -> str:
    try:
        policy, used = queue_settings.parse_backoff(text.encode().split())
    except (CommandError, IndexError) as exc:
        message = exc.message.removeprefix("ERR ") if isinstance(exc, CommandError) else "missing values"
        raise configargparse.ArgumentTypeError(f"{message}, got {text!r}") from None
    if used != len(text.split()):
        raise configargparse.ArgumentTypeError(f"unexpected words after the backoff policy in {text!r}")
    return policy


def queue_line(text: str) -> tuple:
    try:
        return queue_settings.parse_queue_line(text)
    except ValueError as exc:
        raise configargparse.ArgumentTypeError(str(exc)) from None


def schedule_line(text: str) -> str:
    """A --schedule line, checked (the task size again once --max-task-size is known: parse_settings)."""
    try:
        schedule_settings.parse_line(text, sys.maxsize)
    except ValueError as exc:
        raise configargparse.ArgumentTypeError(str(exc)) from None
    return text


USAGE = """ezra [OPTION ...]                 run the server (the options below)
       ezra COMMAND [OPTION ...]         one of the commands below; ezra COMMAND --help"""

COMMANDS_HELP = """EZRA: a persistent task queue that speaks the Redis protocol (XADD / XREADGROUP /
XACK / XNACK), stored in one SQLite file.

commands (each has --help):
  ping       check that a running server answers (exit 0 if it does): ezra ping --port N
  stats      every queue's counts on a running server: ezra stats [--watch]
  ls         a queue's tasks by state: ezra ls QUEUE [--state dead]
  requeue    move dead tasks back: ezra requeue QUEUE --all
  backup     copy the live database: ezra backup DEST.db
  export     move queues to Redis: ezra export --to redis://HOST
  import     bring queues from Redis: ezra import --from redis://HOST"""

EPILOG = """Every option can also be set in a config file (--config FILE), one 'option = value'
line each (e.g. 'visibility-timeout = 60'; lists as 'queue = [a ..., b ...]'). A flag
beats its EZRA_* environment variable, which beats the file, which beats the default."""


# --help shows the options by group, in this order; --help, --version and --config stay first.
OPTION_GROUPS = {
    "server": ("--port", "--bind", "--data-dir", "--log-level", "--max-clients"),
    "queues and tasks (XCFGSET sets them per queue)": (
        "--visibility-timeout", "--max-attempts", "--retention-seconds", "--backoff",
        "--release-on-disconnect", "--max-task-size", "--queue", "--schedule"),
    "durability and the data directory": ("--durability", "--disk-reserve", "--backup-dir", "--lock-timeout"),
    "security: password, TLS, protected mode": (
        "--password", "--protected-mode", "--tls-cert-file", "--tls-key-file", "--tls-ca-cert-file",
        "--max-unauthenticated-per-host", "--auth-timeout"),
    "slow and silent clients": ("--client-send-timeout", "--client-frame-timeout", "--tcp-keepalive"),
    "HTTP: /metrics, /healthz and the dashboard": ("--http-port", "--metrics-queues", "--http-request-timeout"),
}


def group_options(parser: configargparse.ArgParser) -> None:
    """Move each option of OPTION_GROUPS from the parser's one list into its group (help only:
    parsing does not look at groups)."""
    by_flag = {flag: action for action in parser._optionals._group_actions for flag in action.option_strings}
    for title, flags in OPTION_GROUPS.items():
        group = parser.add_argument_group(title)
        for flag in flags:
            action = by_flag[flag]
            parser._optionals._group_actions.remove(action)
            group._group_actions.append(action)


def help_formatter() -> type:
    """Defaults after each option's help; the description and epilog laid out as written. Made
    per parser: the parser's modules are let go once the options are parsed (lean_imports.py),
    and a class made at import would hold the first argparse's classes."""
    return type("HelpFormatter", (configargparse.ArgumentDefaultsHelpFormatter,
                                  configargparse.RawDescriptionHelpFormatter), {})


def build_parser() -> configargparse.ArgParser:
    parser = configargparse.ArgParser(
        prog="ezra", usage=USAGE, description=COMMANDS_HELP, epilog=EPILOG,
        # configargparse's own notes end in a dead short link and repeat the epilog's precedence
        add_config_file_help=False, add_env_var_help=False,
        formatter_class=help_formatter(),
    )
    add = parser.add_argument
    add("--config", is_config_file=True, env_var="EZRA_CONFIG",
        help="config file with 'option = value' lines (e.g. 'port = 42002')")
    add("--port", type=port_number, default=Settings.port, env_var="EZRA_PORT", help="TCP port")
    add("--bind", default=Settings.bind, env_var="EZRA_BIND", help="address to listen on")
    add("--data-dir", default=Settings.data_dir, env_var="EZRA_DATA_DIR",
        help="directory holding ezra.db (created 0700)")
    add("--visibility-timeout", type=queue_setting(queue_settings.visibility_timeout),
        default=Settings.visibility_timeout, env_var="EZRA_VISIBILITY_TIMEOUT",
        help="seconds a delivered task may stay unacknowledged before it is redelivered")
    add("--max-attempts", type=queue_setting(queue_settings.max_attempts), default=Settings.max_attempts,
        env_var="EZRA_MAX_ATTEMPTS",
        help="deliveries before a failing task goes to <queue>::dead")
    add("--retention-seconds", type=non_negative_float, default=None, env_var="EZRA_RETENTION_SECONDS",
        help="seconds a done task is kept (unset: forever; 0: purged right after the ack)")
    add("--password", default=None, env_var="EZRA_PASSWORD",
        help="require AUTH <password> (or HELLO 3 AUTH default <password>)")
    add("--log-level", default=Settings.log_level, type=str.upper, choices=LOG_LEVELS,
        env_var="EZRA_LOG_LEVEL", help="stderr log level")
    add("--durability", default=Settings.durability, choices=DURABILITY_MODES, env_var="EZRA_DURABILITY",
        help="full: replies after fsync (survives power loss); normal: no fsync per commit "
             "(survives an EZRA crash, not a machine crash)")
    add("--max-task-size", type=positive_int, default=Settings.max_task_size, env_var="EZRA_MAX_TASK_SIZE",
        help="largest task in bytes (all field names and values together); 100 KB is recommended")
    add("--max-clients", type=positive_int, default=Settings.max_clients, env_var="EZRA_MAX_CLIENTS",
        help="connections served at once; more are refused with Redis's error")
    add("--backoff", type=backoff_policy, default=Settings.backoff, env_var="EZRA_BACKOFF",
        help="delay before a failed task with attempts left is offered again: 'fixed <seconds>' or "
             "'exponential <base seconds> <max seconds>' (each queue can override it with XCFGSET)")
    add("--release-on-disconnect", type=non_negative_float, default=None, metavar="GRACE_SECONDS",
        env_var="EZRA_RELEASE_ON_DISCONNECT",
        help="when the last connection that used a worker name closes, give that worker's tasks back "
             "after this many seconds unless the name reconnects (unset: off; per queue: XCFGSET)")
    add("--client-send-timeout", type=non_negative_float, default=Settings.client_send_timeout,
        metavar="SECONDS", env_var="EZRA_CLIENT_SEND_TIMEOUT",
        help="close a client that reads none of its pending replies for this long (its socket buffers "
             "are full: it pipelines and never reads); 0: never")
    add("--client-frame-timeout", type=non_negative_float, default=Settings.client_frame_timeout,
        metavar="SECONDS", env_var="EZRA_CLIENT_FRAME_TIMEOUT",
        help="close a client that sends part of a command and then nothing for this long "
             "(slowloris); idle clients between commands are never closed; 0: never")
    add("--tcp-keepalive", type=non_negative_int, default=Settings.tcp_keepalive, metavar="SECONDS",
        env_var="EZRA_TCP_KEEPALIVE",
        help="probe a silent client's TCP connection after this many seconds, as Redis's tcp-keepalive: "
             "a worker whose machine died is closed (and its tasks released, with --release-on-disconnect) "
             "within about twice this; 0: off")
    add("--tls-cert-file", default=None, env_var="EZRA_TLS_CERT_FILE", metavar="PEM",
        help="serve TLS only (clients use ssl=True / rediss://) with this certificate (chain); "
             "needs --tls-key-file")
    add("--tls-key-file", default=None, env_var="EZRA_TLS_KEY_FILE", metavar="PEM",
        help="the private key of --tls-cert-file")
    add("--tls-ca-cert-file", default=None, env_var="EZRA_TLS_CA_CERT_FILE", metavar="PEM",
        help="require client certificates signed by these CA certificates (TLS only)")
    add("--disk-reserve", type=non_negative_int, default=Settings.disk_reserve, metavar="BYTES",
        env_var="EZRA_DISK_RESERVE",
        help="bytes set aside in the data directory (file ezra.reserve); when the disk fills up they "
             "are released so workers can still claim and acknowledge while pushes are refused (0: off)")
    add("--queue", dest="queues", action="append", type=queue_line, default=[], metavar="'NAME SETTING VALUE ...'",
        env_var="EZRA_QUEUE",
        help="per-queue settings applied at start, as XCFGSET takes them, e.g. 'emails VISIBILITY-TIMEOUT 60 "
             "MAX-ATTEMPTS 5'; repeat for more queues (config file: queue = [emails ..., reports ...])")
    add("--http-port", type=port_number, default=None, env_var="EZRA_HTTP_PORT",
        help="serve Prometheus /metrics, /healthz and the web dashboard on this port, with the same "
             "--bind, --password (HTTP Basic, any user name) and TLS as the main port (unset: off; "
             "0 picks a free port)")
    add("--backup-dir", default=None, env_var="EZRA_BACKUP_DIR", metavar="DIR",
        help="the only directory where the BACKUP command may write (a new file; a relative path is "
             "taken in it; links leading out of it are refused); unset: the data directory. "
             "'ezra backup', run by the operator, writes anywhere")
    add("--protected-mode", type=yes_no, default="yes", metavar="yes|no", env_var="EZRA_PROTECTED_MODE",
        help="without --password, serve only clients from 127.0.0.1 and ::1; others get Redis's DENIED "
             "error, as in Redis's protected mode (no: serve every client that can reach --bind)")
    add("--max-unauthenticated-per-host", type=non_negative_int, default=Settings.max_unauthenticated_per_host,
        metavar="N", env_var="EZRA_MAX_UNAUTHENTICATED_PER_HOST",
        help="with --password: connections one client address may have open before they authenticate; a "
             "new one beyond this is served and the address's oldest unauthenticated connection is closed to "
             "make room (password guessing is bounded apart, per network); 0: no limit")
    add("--auth-timeout", type=non_negative_float, default=Settings.auth_timeout, metavar="SECONDS",
        env_var="EZRA_AUTH_TIMEOUT",
        help="with --password: close a connection that has not authenticated this long after connecting; "
             "0: never")
    add("--metrics-queues", type=non_negative_int, default=Settings.metrics_queues, metavar="N",
        env_var="EZRA_METRICS_QUEUES",
        help="/metrics gives its own series to the N queues with the most unfinished tasks (available, "
             "delayed, in flight, dead) and sums the others into series with an empty queue label, "
             "so a scrape stays small however many queues there are")
    add("--http-request-timeout", type=positive_float, default=Settings.http_request_timeout, metavar="SECONDS",
        env_var="EZRA_HTTP_REQUEST_TIMEOUT",
        help="close an HTTP connection whose request (request line, headers and body; also the TLS "
             "handshake) has not fully arrived this long after the server began waiting for it, "
             "however steadily it trickles in (slowloris); an idle keep-alive connection is closed "
             "after this long too")
    add("--lock-timeout", type=non_negative_float, default=Settings.lock_timeout, metavar="SECONDS",
        env_var="EZRA_LOCK_TIMEOUT",
        help="another EZRA holds the data directory (its ezra.lock): wait this long for it to exit "
             "before giving up (a rolling update starts the new server before the old one stops); "
             "0: refuse to start at once")
    add("--schedule", dest="schedules", action="append", type=schedule_line, default=[],
        metavar="'NAME QUEUE \"CRON\" [TZ zone] FIELDS field value ...'", env_var="EZRA_SCHEDULE",
        help="a schedule set at every start, as XSCHEDULE SET takes it (the cron expression quoted); repeat "
             "for more; one the config no longer has is removed at the next start (config file: "
             "schedule = [\"nightly reports '0 2 * * *' FIELDS job nightly\", \"...\"])")
    add("--version", action="version", version=f"ezra {__version__}")
    for action in parser._actions:  # what add_env_var_help did, without its closing sentence
        if getattr(action, "env_var", None):
            action.help = f"{action.help or ''}   [env var: {action.env_var}]"
    group_options(parser)
    return parser


def parse_settings(argv: list[str] | None = None) -> Settings:
    """Settings from flags, environment and config file (exits on bad input, like argparse)."""
    parser = build_parser()
    namespace, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(unknown_arguments(parser, unknown, namespace.config, argv))
    namespace.queues = tuple(namespace.queues or ())
    try:
        namespace.schedules = tuple(schedule_settings.parse_line(line, namespace.max_task_size)
                                    for line in namespace.schedules or ())
    except ValueError as exc:
        parser.error(f"--schedule: {exc}")
    names = [definition.name for definition in namespace.schedules]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        parser.error(f"--schedule: the name {twice[0].decode('utf-8', 'replace')!r} is given twice")
    if bool(namespace.tls_cert_file) != bool(namespace.tls_key_file):
        parser.error("--tls-cert-file and --tls-key-file go together")
    if namespace.tls_ca_cert_file and not namespace.tls_cert_file:
        parser.error("--tls-ca-cert-file needs --tls-cert-file and --tls-key-file")
    return Settings(**{name: getattr(namespace, name) for name in Settings.__dataclass_fields__})


def unknown_arguments(parser, unknown: list[str], config_path: str | None, argv: list[str] | None) -> str:
    """The error for options nobody defines: a config-file line named by file and line number
    (configargparse passes the file's keys on as flags), the nearest real option as a hint."""
    import difflib  # here: a server that started has no use for it (lean_imports.py)
    given = {arg.split("=", 1)[0] for arg in (sys.argv[1:] if argv is None else argv)}
    flags = [flag for action in parser._actions for flag in action.option_strings if flag.startswith("--")]
    for arg in unknown:
        key = arg.split("=", 1)[0]
        near = difflib.get_close_matches(key, flags, n=1)
        line = None if key in given else config_file_line(config_path, key)
        if line:  # in the file, keys are written without their dashes
            hint = f" (did you mean {near[0].removeprefix('--')}?)" if near else ""
            return f"{config_path}, line {line}: unknown option {key.removeprefix('--')!r}{hint}"
        if near:
            return f"unrecognized arguments: {' '.join(unknown)} (did you mean {near[0]}?)"
    return f"unrecognized arguments: {' '.join(unknown)}"


def config_file_line(path: str | None, flag: str) -> int | None:
    """The line of config file `path` that sets `flag` ('--name'), if it does."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            lines = file.read().splitlines()
    except OSError:
        return None  # configargparse has read it already; this only places the error
    for number, line in enumerate(lines, start=1):
        key = re.match(r"\s*(?:--)?([^\s=:#;]+)", line)
        if key and "--" + key.group(1) == flag:
            return number
    return None
