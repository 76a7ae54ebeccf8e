"""Wiring, in start order: config -> logging -> the data directory's lock -> storage +
recovery -> writer -> broker (reaper) -> scheduler (the config's schedules) -> server -> signals;
stopped in reverse."""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import signal
import stat
import sys
import time

import gevent
from gevent.event import Event
from loguru import logger

from . import __version__
from .broker import Broker
from .broker.schedules import Scheduler
from .config import Settings, parse_settings
from .front.server import EzraServer, trim_freed_memory
from .front.session import ServerState
from .storage import DB_FILENAME, DataDirLock, Integrity, QuickCheck, StorageError, open_database

SHUTDOWN_GRACE = 5.0  # seconds busy connections get to finish at shutdown
TRIM_FILE_BYTES = 16 * 1024 * 1024  # a database this large filled SQLite's page cache at start (16 MB)
GC_THRESHOLD = 20_000  # allocations between two passes of the youngest generation (Python: 700)


def setup_logging(level: str) -> None:
    logger.remove()
    logger.add(sys.stderr, level=level,
               format="{time:YYYY-MM-DD HH:mm:ss.SSS} {level: <7} ezra: {message}")


class App:
    """One running EZRA: database, broker and listener."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.lock = None
        self.db = None
        self.broker = None
        self.scheduler = None
        self.server = None
        self.web = None
        self.check = None  # the database's check after start, while it runs
        self.stopping = False

    def start(self) -> int:
        """Open the database, recover, start serving; returns the bound port.

        If a step fails, what the earlier steps opened is closed before the error rises.
        """
        try:
            return self._start()
        except BaseException as exc:
            self._close_partial_start()
            if Integrity.is_corruption(exc):  # met by recovery or by the counts, before the port opened
                raise StorageError(f"the database {os.path.join(self.settings.data_dir, DB_FILENAME)} is corrupt "
                                   f"({exc}): EZRA does not start on it; restore ezra.db from a backup ("
                                   "'sqlite3 ezra.db .recover' may save what is still readable)") from exc
            raise

    def _close_partial_start(self) -> None:
        for close in (self.web and self.web.stop, self.server and self.server.stop_listening,
                      self.scheduler and self.scheduler.stop, self.broker and self.broker.stop,
                      self.db and self.db.close, self.lock and self.lock.release):
            if close:
                try:
                    close()
                except Exception as exc:
                    logger.opt(exception=exc).error("cleaning up after a failed start: {}", exc)

    def _start(self) -> int:
        settings = self.settings
        # Before anything reads the file: a second server's recovery would hand out the first one's leases.
        self.lock = DataDirLock.acquire(settings.data_dir, settings.lock_timeout, sleep=gevent.sleep)
        self.db = open_database(settings.data_dir, settings.disk_reserve, read_lanes_ahead=True)
        check_directories(settings)
        recovered = self.db.recover()  # before the port opens: in-flight -> available
        if recovered:
            logger.info("recovered {} in-flight tasks to available", recovered)
        self.broker = Broker(self.db, settings)
        for name, changes in settings.queues or ():  # the config file's queue lines, applied at each start
            self.broker.admin.configure(name, changes).wait()
            logger.info("queue {!r} configured: {}", name.decode("utf-8", "replace"),
                        ", ".join(f"{column}={value}" for column, value in changes.items()))
        self.scheduler = Scheduler(self.broker)
        self.scheduler.apply_config(list(settings.schedules))  # the config's schedule lines, at each start
        self.release_start_up_memory()
        self.server = EzraServer(ServerState(self.broker, settings, self.scheduler))
        with naming_the_option("--port", settings.bind, settings.port):
            self.server.start()
        self.broker.reaper.start()
        self.scheduler.start()  # after the port opened: a catch-up firing's waiters can be served
        if settings.http_port is not None:
            from .web.server import WebServer  # here: without --http-port, prometheus_client is never loaded
            with naming_the_option("--http-port", settings.bind, settings.http_port):
                self.web = WebServer(self.server.state, self.server.auth_throttle)
                self.web.start()
            logger.info("metrics and dashboard on {}://{}:{}/ (/metrics, /healthz)", self.web.scheme,
                        settings.bind, self.web.port)
        logger.info("ezra {} listening on {}:{}, data in {} (durability {})", __version__, settings.bind,
                    self.server.port, self.db.path, settings.durability)
        if settings.tls_cert_file:
            logger.info("TLS only, certificate {}; client certificates {}", settings.tls_cert_file,
                        f"required (CA {settings.tls_ca_cert_file})" if settings.tls_ca_cert_file else "not asked")
        log_exposure(settings)
        # Once serving: a full check of a large file takes seconds; the first task must not wait for it.
        self.check = QuickCheck(self.db.path)
        gevent.spawn(self._check_database, self.check)
        return self.server.port

    def release_start_up_memory(self) -> None:
        """Recovery and the counts read every index once: free those pages before serving.

        Measured with 200,000 tasks queued (a 70 MB file): RSS after restart 33.5 MB,
        32.0 with SQLite's cache shrunk, 27.9 with the heap trimmed too. The heap is trimmed
        here only above TRIM_FILE_BYTES; every server trims it once the check after start
        is done (_check_database), which may take seconds for a large file.
        """
        self.db.shrink_memory()
        if os.path.getsize(self.db.path) > TRIM_FILE_BYTES:
            trim_freed_memory()

    def _check_database(self, check: QuickCheck) -> None:
        """PRAGMA quick_check on a native thread; a corrupt file stops the writes (storage/integrity.py)."""
        integrity = self.db.integrity
        integrity.mark_checking()
        started = time.monotonic()
        try:
            problems = gevent.get_hub().threadpool.apply(check.run)
        except StorageError as exc:
            logger.warning("could not check the database {}: {}", self.db.path, exc)
            problems = None
        finally:
            self.check = None
        if self.stopping:  # cut short by stop(), or the database closed meanwhile
            return
        # Start-up is over: hand back to the system what it freed (the option parse, recovery, the
        # check's own SQLite connection). bench.py footprint: idle RSS 29.3 -> 28.4 MB, ctypes (0.3
        # MB, which the trim loads) counted; without it glibc kept 0.9 MB in some starts, none in others.
        trim_freed_memory()
        if problems:
            self.broker.writer.on_corruption("PRAGMA quick_check after start found: " + "; ".join(problems))
            return
        integrity.mark_checked(None if problems is None else True)
        if problems is not None:
            logger.debug("database {} checked (quick_check): whole, in {:.2f}s", self.db.path,
                         time.monotonic() - started)

    def stop(self) -> None:
        """Stop accepting, answer what is under way, commit, close the database."""
        logger.info("stopping")
        self.stopping = True
        if self.check is not None:
            self.check.interrupt()  # its own connection: cut short, not waited for
        if self.web is not None:
            self.web.stop()
        self.server.stop_listening()
        self.scheduler.stop()  # no firing after this: the writer stops soon
        self.broker.cancel_waiters().wait()
        self.server.close_connections(SHUTDOWN_GRACE)
        self.broker.stop()
        try:
            self.db.close()
        finally:
            self.lock.release()  # after the file is closed: the next server finds it whole
        logger.info("stopped cleanly")


BIND_ERRORS = {
    errno.EADDRINUSE: "another program (another EZRA? Redis?) is listening there: choose another {option} "
                      "(0 picks a free one) or stop that program",
    errno.EACCES: "ports below 1024 need privileges: choose a port of 1024 or more with {option}",
    errno.EADDRNOTAVAIL: "--bind is not an address of this machine",
}


@contextlib.contextmanager
def naming_the_option(option: str, bind: str, port: int):
    """A listener that cannot bind says which option to change (the OS error names only the address)."""
    try:
        yield
    except OSError as exc:
        advice = BIND_ERRORS.get(exc.errno)
        if advice is None:
            raise
        raise OSError(exc.errno, f"cannot listen on {bind}:{port} ({option} {port}): {os.strerror(exc.errno)}; "
                                 + advice.format(option=option)) from exc


def check_directories(settings: Settings) -> None:
    """Warn about directories others may write to (a link planted there redirects EZRA's
    writes); refuse a --backup-dir that is not a directory."""
    directories = [("data directory", settings.data_dir)]
    if settings.backup_dir is not None:
        if not os.path.isdir(settings.backup_dir):
            raise NotADirectoryError(errno.ENOTDIR, "--backup-dir is not a directory", settings.backup_dir)
        directories.append(("backup directory", settings.backup_dir))
    for what, path in directories:
        mode = os.stat(path).st_mode
        if mode & stat.S_IWOTH:
            logger.warning("the {} {} is world-writable (mode {:o}): any local user can replace or link "
                           "EZRA's files there; chmod o-w it (EZRA creates it 0700)", what, path,
                           stat.S_IMODE(mode))


def log_exposure(settings: Settings) -> None:
    """Bound beyond loopback without a password: say who is served and how to change it."""
    if settings.password or settings.bind in ("127.0.0.1", "localhost", "::1"):
        return
    if settings.protected_mode:
        logger.warning("protected mode: listening on {} without a password, so only clients from 127.0.0.1 "
                       "and ::1 are served{}; the others get a DENIED error (set --password, or "
                       "--protected-mode no on a network you trust)", settings.bind,
                       "" if settings.http_port is None else " (the dashboard answers them 403, /healthz excepted)")
    else:
        logger.warning("listening on {} without a password and with --protected-mode no: anyone who can reach "
                       "this port{} can read and change every queue (set --password)", settings.bind,
                       "" if settings.http_port is None else " or the dashboard")


def tune_collector() -> None:
    """The server's process only (an embedding application keeps its own settings).

    Every command allocates a few dozen container objects, so the cyclic
    collector's youngest generation ran every few commands and its full passes
    walked every module and function loaded at start. Those are frozen out of
    its reach, and it runs every GC_THRESHOLD allocations: the objects of a
    command are freed by reference counting (connections break their one cycle
    when they close), so little is left for it to find.
    """
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 20, 20)


def main(argv: list[str] | None = None) -> None:
    """Run the server until SIGTERM/SIGINT (subcommands are dispatched in tools/entry.py)."""
    serve(parse_settings(argv))


def serve(settings: Settings) -> None:
    """Run the server with parsed settings until SIGTERM/SIGINT."""
    setup_logging(settings.log_level)
    logger.info("config: port={} bind={} data_dir={} visibility_timeout={}s max_attempts={} "
                "retention={} backoff={} release_on_disconnect={} durability={} max_task_size={} password={} "
                "protected_mode={}",
                settings.port, settings.bind, settings.data_dir, settings.visibility_timeout,
                settings.max_attempts, settings.retention_seconds, settings.backoff,
                settings.release_on_disconnect, settings.durability, settings.max_task_size,
                "set" if settings.password else "unset", "yes" if settings.protected_mode else "no")
    app = App(settings)
    # Before the listener opens: a SIGTERM sent the moment it logs that it listens (a supervisor's,
    # a test's) found the default action still set and killed it mid-start, with no clean stop.
    # One sent while it starts is kept and acted on once it has started.
    stop_requested = Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(signum, stop_requested.set)  # only set a flag: stop in order below
    try:
        app.start()
    except (StorageError, OSError, ValueError) as exc:  # ValueError: a schedule line the server refused
        logger.error("cannot start: {}", exc)
        sys.exit(1)
    tune_collector()
    stop_requested.wait()
    app.stop()
    sys.exit(0)
