"""Run EZRA inside a Python application: `from ezra import Server`.

    with Server(data_dir="var/queue") as server:      # port=0: a free port
        r = redis.Redis(port=server.port)
        r.xadd("emails", {"to": "ada@example.com"})

The server runs in a native thread of its own with its own gevent hub (gevent
keeps one hub per thread), so the host application needs no monkey-patching
and keeps its threads, asyncio loop or WSGI server as they are; it talks to
EZRA over TCP like any other client. `start()` returns once the port is open
and raises there if EZRA cannot start (port in use, a database that is not
EZRA's); `stop()` stops in the server's own order (listener, blocked readers,
connections, writer, database) and waits for the thread to end.

Settings are the command line's options as keyword arguments
(`visibility_timeout=60`, `password="..."`, `config="ezra.conf"`), checked as
the command line checks them. EZRA_* environment variables are not read: an
embedded server is configured by its host. Logs go through loguru
(`logger.disable("ezra")` silences them).
"""

from __future__ import annotations

import atexit
import os
import threading

from .adapters.client import reachable_host
from .config import Settings, build_parser

START_TIMEOUT = 60.0  # seconds; opening a large database runs recovery first


def embedded_settings(**options) -> Settings:
    """Settings from keyword options, validated like flags; the environment is not read."""
    parser = build_parser()
    actions = {action.dest: action for action in parser._actions if action.option_strings}
    fields = Settings.__dataclass_fields__
    unknown = sorted(name for name in options if name not in fields or name not in actions)
    if unknown:
        raise TypeError(f"unknown EZRA setting(s): {', '.join(unknown)}; known: {', '.join(fields)}")
    argv = []
    for name, value in options.items():
        flag = actions[name].option_strings[-1]
        values = value if isinstance(value, (list, tuple)) else [] if value is None else [value]
        argv += [f"{flag}={os.fspath(item) if isinstance(item, os.PathLike) else item}" for item in values]

    def refuse(message):
        raise ValueError(f"invalid EZRA setting: {message}")

    parser.error = refuse  # argparse would print usage and exit the host process
    namespace = parser.parse_args(argv, env_vars={})
    return Settings(**{name: tuple(value) if isinstance(value, list) else value
                       for name, value in ((name, getattr(namespace, name)) for name in fields)})


class Server:
    """An EZRA server running in a thread of this process; start/stop or use `with`."""

    def __init__(self, data_dir: str | os.PathLike = "./data", port: int = 0, bind: str = "127.0.0.1",
                 **settings):
        self.settings = embedded_settings(data_dir=data_dir, port=port, bind=bind, **settings)
        self.port: int | None = None  # the bound port while running
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._wakeup = None  # the server hub's async watcher: the one thread-safe way in
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        """redis://host:port for client libraries (`redis.Redis.from_url(server.url)`)."""
        if self.port is None:
            raise RuntimeError("the EZRA server is not running")
        host = reachable_host(self.settings.bind)
        host = f"[{host}]" if ":" in host else host
        return f"redis://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout: float = START_TIMEOUT) -> "Server":
        """Start serving; returns once the port is open, raises if EZRA cannot start (another
        server holds the data directory: DataDirLocked, after `lock_timeout` seconds if given,
        which adds to `timeout`)."""
        if self._thread is not None:
            raise RuntimeError("this EZRA server is already started")
        self._started.clear()
        self._error = None
        self._thread = threading.Thread(target=self._run, name=f"ezra-server:{self.settings.data_dir}",
                                        daemon=True)
        self._thread.start()
        timeout += self.settings.lock_timeout  # the wait for the data directory comes first
        if not self._started.wait(timeout):
            raise TimeoutError(f"EZRA did not open its port within {timeout}s")
        if self._error is not None:
            self._thread.join()
            self._thread = None
            error, self._error = self._error, None
            raise error
        atexit.register(self.stop)  # a daemon thread is frozen at exit, not stopped: stop it first
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop accepting, answer what is under way, close the database; wait for the thread."""
        thread = self._thread
        if thread is None:
            return
        atexit.unregister(self.stop)
        if thread.is_alive():
            self._wakeup.send()
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError(f"EZRA did not stop within {timeout}s")
        self._thread = None
        self.port = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def __enter__(self) -> "Server":
        if self._thread is None:
            self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"port {self.port}" if self.running else "stopped"
        return f"<ezra.Server {self.settings.data_dir} {state}>"

    def _run(self) -> None:
        """The server thread: its own hub, App.start, wait for stop, App.stop."""
        import gevent  # here, not at import: `import ezra` stays cheap for hosts that only start later
        from gevent.event import Event

        from .app import App

        hub = gevent.get_hub()
        stop_requested = Event()
        self._wakeup = hub.loop.async_()
        self._wakeup.start(stop_requested.set)
        try:
            app = App(self.settings)
            try:
                self.port = app.start()
            except BaseException as exc:
                self._error = exc
                return
            finally:
                self._started.set()
            stop_requested.wait()
            try:
                app.stop()
            except BaseException as exc:
                self._error = exc
        finally:
            self._wakeup.close()
            hub.destroy(destroy_loop=True)
