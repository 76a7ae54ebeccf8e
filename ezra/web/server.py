"""The HTTP listener (--http-port): /metrics, /healthz and the dashboard.

A gevent WSGI server in the same process and event loop as the Redis-protocol
port, with the same rules: the same --bind, TLS when the main port has it, and
with --password, HTTP Basic authentication (any user name, that password;
the answer to a wrong one is held back by the RESP port's GuessThrottle: one
bound for both listeners). Only /healthz and /static/* answer without a password:
the first tells nothing but "up" or "down", the others are the dashboard's own
script and style, files of the package that hold nothing of the queues.

Without a password, only requests addressed to an IP address, `localhost` or
this machine's name are served: a web page whose DNS name an attacker points at
127.0.0.1 (DNS rebinding) is same-origin in the browser, and would otherwise
read the queues and the form token. With a password the browser has no
credentials for such a name.

Protected mode (--protected-mode, on by default) applies here as on the main
port: without a password, only clients from 127.0.0.1 and ::1 are served;
the others get 403 with the way out (/healthz answers everyone, as it does
with a password).

Changes (requeue, delete, pause/resume) are POST forms guarded against cross-site requests:
each form carries a token derived from a secret made at start, and a request
whose Origin or Sec-Fetch-Site names another site is refused, so a page elsewhere
cannot make a logged-in browser change queues.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import http.client
import io
import ipaddress
import mimetypes
import os
import socket
import time
from importlib import resources
from urllib.parse import unquote_to_bytes

import gevent
from gevent.pool import Pool
from gevent.pywsgi import WSGIHandler, WSGIServer
from loguru import logger

from . import dashboard, metrics, task_page
from .. import errors
from ..errors import CommandError, HttpError
from ..front.gate import LOCAL_PEERS
from ..front.server import HTTP_CONNECTIONS, tls_context  # (server.py reserves their descriptors)
from ..protocol.stream_ids import parse_id

MAX_FORM_BYTES = 64 * 1024
HEALTH_TIMEOUT = 2.0         # /healthz: seconds the writer has to answer before "down"
SECURITY_HEADERS = [
    # No inline script or style at all: even a field that escaped escaping could not run.
    ("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                                "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "same-origin"),
]


DEFAULT_HEADERS = [("Content-Type", "text/html; charset=utf-8"), ("Cache-Control", "no-store")]


class WebApp:
    """The WSGI application: routes, authentication, the cross-site guard."""

    def __init__(self, state, auth_throttle, history: dashboard.History):
        self.state = state
        self.broker = state.broker
        self.password = state.settings.password
        self.protected = state.settings.protected_mode and not self.password
        self.auth_throttle = auth_throttle
        self.history = history
        self.csrf_token = hmac.new(os.urandom(32), b"ezra dashboard forms", hashlib.sha256).hexdigest()
        self.local_names = {"localhost", socket.gethostname().lower()}
        self.routes = {
            ("GET", "/healthz"): self.healthz,
            ("GET", "/metrics"): self.metrics,
            ("GET", "/"): self.index,
            ("GET", "/queue"): self.queue_page,
            ("GET", "/task"): self.task_page,
            ("POST", "/queue/requeue"): self.requeue,
            ("POST", "/queue/delete"): self.delete,
            ("POST", "/queue/pause"): self.pause,
        }

    def __call__(self, environ, start_response):
        try:
            status, headers, body = self.respond(environ)
        except HttpError as exc:
            status, headers, body = exc.status, exc.headers, dashboard.error_page(exc.status, str(exc))
        except ClientInputError as exc:
            logger.info("http: {} {} from {}: {}", environ.get("REQUEST_METHOD"), environ.get("PATH_INFO"),
                        environ.get("REMOTE_ADDR"), exc)
            status, headers = "400 Bad Request", [("Connection", "close")]
            body = dashboard.error_page(status, str(exc))
        except Exception as exc:
            logger.opt(exception=exc).error("HTTP {} {} failed: {}", environ.get("REQUEST_METHOD"),
                                            environ.get("PATH_INFO"), exc)
            status, headers, body = "500 Internal Server Error", [], dashboard.error_page(
                "500 Internal Server Error", errors.HTTP_FAILED)
        named = {name for name, _ in headers}
        headers = [*headers, *((name, default) for name, default in DEFAULT_HEADERS if name not in named)]
        start_response(status, [*headers, *SECURITY_HEADERS, ("Content-Length", str(len(body)))])
        return [body]

    def respond(self, environ) -> tuple[str, list, bytes]:
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "/")
        if method == "HEAD":
            method = "GET"
        if path.startswith("/static/") and method == "GET":
            return static_file(path.removeprefix("/static/"))
        handler = self.routes.get((method, path))
        if handler is None:
            if any(route_path == path for _, route_path in self.routes):
                raise errors.http_method_not_allowed(method, path)
            raise errors.http_nothing_at(path)
        if handler != self.healthz:
            self.check_peer(environ)
            self.check_host(environ)
            self.authenticate(environ)
        params = query_params(environ.get("QUERY_STRING", ""))
        if method == "POST":
            params.update(self.read_form(environ))
        return handler(environ, params)

    # -- guards

    def check_peer(self, environ) -> None:
        """Protected mode: without a password, only clients from 127.0.0.1 and ::1 (as the main port)."""
        if self.protected and environ.get("REMOTE_ADDR") not in LOCAL_PEERS:
            raise errors.HTTP_PROTECTED_MODE

    def check_host(self, environ) -> None:
        """Without a password: refuse a Host that is a DNS name other than this machine's (rebinding)."""
        if self.password:
            return
        host = environ.get("HTTP_HOST", "").lower()
        name = host[1:host.find("]")] if host.startswith("[") else host.rpartition(":")[0] or host
        if name in self.local_names or name.endswith(".localhost"):
            return
        try:
            ipaddress.ip_address(name)
            return
        except ValueError:
            raise errors.http_misdirected(socket.gethostname(), host) from None

    def authenticate(self, environ) -> None:
        """With --password: HTTP Basic with that password (any user name), else 401."""
        if not self.password:
            return
        header = environ.get("HTTP_AUTHORIZATION", "")
        scheme, _, encoded = header.partition(" ")
        try:
            _, _, given = base64.b64decode(encoded, validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            given = None
        if scheme.lower() == "basic" and given is not None and hmac.compare_digest(
                given.encode(), self.password.encode()):
            return
        if header:  # a wrong password, not a first visit: its answer waits its network's turn, as AUTH's
            host = environ.get("REMOTE_ADDR", "?")
            gevent.sleep(self.auth_throttle.failed(host, f"{host} (HTTP)", 1, time.monotonic()))
        raise errors.HTTP_PASSWORD_NEEDED

    def read_form(self, environ) -> dict[str, list[bytes]]:
        """A POSTed form, once it passed the cross-site guard."""
        origin = environ.get("HTTP_ORIGIN")
        scheme = environ.get("wsgi.url_scheme", "http")
        if origin is not None and origin != f"{scheme}://{environ.get('HTTP_HOST', '')}":
            raise errors.HTTP_CROSS_SITE_ORIGIN
        if environ.get("HTTP_SEC_FETCH_SITE", "same-origin") not in ("same-origin", "none"):
            raise errors.HTTP_CROSS_SITE_FETCH
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            raise errors.HTTP_BAD_CONTENT_LENGTH from None
        if length > MAX_FORM_BYTES:
            raise errors.HTTP_FORM_TOO_LARGE
        try:
            body = environ["wsgi.input"].read(length)
        except OSError as exc:  # cut short, or past the request deadline (Handler): the client's doing
            raise ClientInputError(errors.http_body_cut_short(exc)) from None
        form = query_params(body.decode("latin-1"))
        token = form.get("csrf", [b""])[0]
        if not hmac.compare_digest(token, self.csrf_token.encode()):
            raise errors.HTTP_STALE_FORM_TOKEN
        return form

    # -- pages

    def healthz(self, environ, params):
        """200 when the writer commits within HEALTH_TIMEOUT seconds, else 503 (and for a corrupt database)."""
        if self.broker.db.integrity.corrupt:  # what was found is for the log and INFO, not for anyone
            return ("503 Service Unavailable", [("Content-Type", "text/plain")],
                    errors.HEALTH_CORRUPT)
        try:
            with gevent.Timeout(HEALTH_TIMEOUT):
                self.broker.writer.call(lambda: True, durable=False)
        except gevent.Timeout:
            return "503 Service Unavailable", [("Content-Type", "text/plain")], errors.HEALTH_WRITER_STUCK
        except CommandError as exc:  # shutting down
            return "503 Service Unavailable", [("Content-Type", "text/plain")], errors.health_down(exc)
        return "200 OK", [("Content-Type", "text/plain")], b"ok\n"

    def metrics(self, environ, params):
        body = gevent.get_hub().threadpool.apply(metrics.render, (metrics.snapshot(self.state),))
        return "200 OK", [("Content-Type", metrics.CONTENT_TYPE)], body

    def index(self, environ, params):
        """The queue list, QUEUES_PER_PAGE at a time by name (?page=N; past the end: the last page)."""
        try:
            number = int(params.get("page", [b"1"])[0])
        except ValueError:
            raise errors.HTTP_PAGE_NOT_A_NUMBER from None
        if number < 1:
            raise errors.HTTP_PAGES_START_AT_1
        names = self.broker.queues.names  # kept sorted by the broker: no sort of every name per load
        per_page = dashboard.QUEUES_PER_PAGE
        number = min(number, max(1, -(-len(names) // per_page)))
        shown = names[(number - 1) * per_page:number * per_page]
        # Only this page's queues: 10,000 of them (counts, the head's age, a chart each) took
        # 170-400 ms on the event loop per load, and every open dashboard reloads every 3 s.
        figures = self.broker.admin.figures(shown)
        schedules = [] if self.state.scheduler is None else self.state.scheduler.shown().wait()
        return "200 OK", [], dashboard.index_page(self.state, figures, self.history, number, len(names), schedules)

    def queue_page(self, environ, params):
        name = required(params, "name")
        figures = self.broker.admin.figures([name])
        if name not in figures.queues:
            raise errors.HTTP_NO_SUCH_QUEUE
        lists = {state: self.broker.admin.tasks(name, state, dashboard.ROWS_SHOWN).wait()
                 for state in dashboard.LISTED_STATES}
        flash = dashboard.done_message(params.get("done", [b""])[0], params.get("n", [b""])[0])
        page = dashboard.queue_page(self.state, name, figures, lists, self.history, self.csrf_token, flash)
        return "200 OK", [], page

    def task_page(self, environ, params):
        """One task's page: /task?queue=<name>&id=<ms-seq> (the name percent-encoded byte for byte)."""
        name = required(params, "queue")
        wanted = task_id(params)
        figures = self.broker.admin.figures([name])
        if name not in figures.queues:
            raise errors.HTTP_NO_SUCH_QUEUE
        row = self.broker.admin.task(name, wanted)
        if row is None:
            raise errors.http_no_such_task(wanted)
        edges = self.broker.admin.task_dependencies(name, wanted)  # XADD AFTER, both ways
        return "200 OK", [], task_page.render(self.state, name, row, figures, self.csrf_token, edges)

    def requeue(self, environ, form):
        name = required(form, "name")
        ids = None if form.get("all") else [task_id(form)]
        moved = self.broker.admin.requeue(name, ids).wait()
        logger.info("dashboard: requeued {} dead task(s) of {!r}", moved, name.decode("utf-8", "replace"))
        return see_other(name, "requeued", moved)

    def delete(self, environ, form):
        """A dead task deleted for good, or one nobody holds (available, delayed) cancelled, as
        XDEL does; a task in flight is its worker's, and stays."""
        name = required(form, "name")
        ids = [task_id(form)]
        dead = self.broker.tasks.delete_dead(name, ids).wait()
        deleted = dead or self.broker.tasks.cancel(name, ids).wait()
        logger.info("dashboard: deleted {} {}task(s) of {!r}", deleted, "dead " if dead else "",
                    name.decode("utf-8", "replace"))
        return see_other(name, "deleted-dead" if dead else "deleted", deleted)


    def pause(self, environ, form):
        """paused=1 pauses the queue, paused=0 resumes it (XCFGSET PAUSED); an existing queue only."""
        name = required(form, "name")
        paused = required(form, "paused")
        if paused not in (b"0", b"1"):
            raise errors.HTTP_PAUSED_INVALID
        if name not in self.broker.queues:  # XCFGSET would create it: the dashboard only changes queues it shows
            raise errors.HTTP_NO_SUCH_QUEUE
        self.broker.admin.configure(name, {"paused": int(paused)}).wait()
        return see_other(name, "paused" if paused == b"1" else "resumed")


def query_params(text: str) -> dict[str, list[bytes]]:
    """Form or query fields as bytes: queue names need not be UTF-8."""
    params: dict[str, list[bytes]] = {}
    for part in text.split("&"):
        if part:
            key, _, value = part.partition("=")
            params.setdefault(key, []).append(unquote_to_bytes(value.replace("+", " ")))
    return params


def required(params: dict, key: str) -> bytes:
    values = params.get(key)
    if not values:
        raise errors.http_missing(key)
    return values[0]


def task_id(form: dict) -> tuple:
    try:
        return parse_id(required(form, "id"))
    except CommandError:
        raise errors.HTTP_BAD_TASK_ID from None


def see_other(name: bytes, done: str, count: int | None = None):
    """Back to the queue page after a change (POST/redirect/GET: a reload does not repeat it),
    saying what was done: a code of dashboard.DONE_MESSAGES (and a count), never text."""
    location = f"{dashboard.queue_url(name)}&done={done}" + ("" if count is None else f"&n={count}")
    return "303 See Other", [("Location", location)], b""


def static_file(name: str):
    if name not in dashboard.STATIC_FILES:
        raise errors.HTTP_NO_SUCH_FILE
    body = resources.files("ezra.web").joinpath("static", name).read_bytes()
    content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
    return "200 OK", [("Content-Type", f"{content_type}; charset=utf-8"), ("Cache-Control", "max-age=3600")], body


class ErrorLog:
    """pywsgi's error stream, into the server log."""

    def write(self, text: str) -> None:
        if text.strip():
            logger.warning("http: {}", text.strip())

    def flush(self) -> None:
        pass


class ClientInputError(Exception):
    """The client's request broke off or ran out of time: answered 400 and closed, logged in one line."""


BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


class DeadlineReader(io.RawIOBase):
    """A socket's reading side that stops at the current request's deadline.

    A per-read timeout does not stop a slowloris that sends a byte just in time, again
    and again; this one counts from the first byte the server waits for (the request
    line) to the last one of the body, so a request that trickles in frees its slot.
    Replies are written with the socket's own timeout, untouched.
    """

    def __init__(self, sock, request_timeout: float):
        super().__init__()
        self.sock = sock
        self.request_timeout = request_timeout
        self.deadline = None

    def start_request(self) -> None:
        self.deadline = time.monotonic() + self.request_timeout

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.deadline is None:  # not in a request yet (pywsgi reads the request line first)
            return self.sock.recv_into(buffer)
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout(f"the request did not arrive within {self.request_timeout:g}s")
        send_timeout = self.sock.gettimeout()
        self.sock.settimeout(left if send_timeout is None else min(left, send_timeout))
        try:
            return self.sock.recv_into(buffer)
        except socket.timeout:
            if time.monotonic() < self.deadline:
                raise  # --client-frame-timeout, shorter than what was left
            raise socket.timeout(f"the request did not arrive within {self.request_timeout:g}s") from None
        finally:
            self.sock.settimeout(send_timeout)


class Handler(WSGIHandler):
    def __init__(self, sock, address, server):
        self.reader = DeadlineReader(sock, server.request_timeout)
        super().__init__(sock, address, server, rfile=io.BufferedReader(self.reader))

    def read_requestline(self):
        self.reader.start_request()  # the deadline runs until the body has been read
        # Between requests (a browser's keep-alive connection): nothing to finish at a stop
        self.server.between_requests.add(self.socket)
        try:
            return super().read_requestline()
        finally:
            self.server.between_requests.discard(self.socket)

    def _handle_client_error(self, ex):
        """pywsgi's hook for bad client input: one log line, never a traceback. A stall or a
        reset closes the connection; a malformed request (more than 100 headers, a line too
        long, a bad request line) gets 400 and is closed."""
        if isinstance(ex, OSError):
            logger.info("http: closed {}: {}", peer(self.client_address), ex)
            return None
        if isinstance(ex, (ValueError, http.client.HTTPException)):  # pywsgi print_exc()s the latter
            logger.info("http: bad request from {}: {}", peer(self.client_address), ex)
            return "400", BAD_REQUEST
        return super()._handle_client_error(ex)


def peer(address) -> str:
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)


class TimedWSGIServer(WSGIServer):
    """pywsgi with a deadline per request (--http-request-timeout) and per socket operation
    (--client-frame-timeout): a client that trickles or stalls mid-request or mid-handshake
    (slowloris) gives its slot back."""

    client_timeout: float | None = None
    request_timeout: float = 5.0
    handler_class = Handler

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.between_requests: set = set()  # sockets waiting for their next request line

    def stop(self, timeout=None):
        """Close the connections that wait between requests at once (the dashboard keeps one
        open: a stop waited the whole `timeout` for it, 1 s); requests under way get `timeout`."""
        self.close()  # no new connection meanwhile
        for sock in list(self.between_requests):
            try:
                sock.shutdown(socket.SHUT_RDWR)  # its read ends: the handler returns and closes it
            except OSError as exc:
                logger.debug("http: closing an idle connection at stop: {}", exc)
        super().stop(timeout)

    def wrap_socket_and_handle(self, client_socket, address):
        """TLS: the handshake within the request deadline; a failed one (plain HTTP, a scan) is one line."""
        client_socket.settimeout(self.client_timeout)
        try:
            with gevent.Timeout(self.request_timeout, socket.timeout(
                    f"no TLS handshake within {self.request_timeout:g}s")):
                tls_socket = self.wrap_socket(client_socket, **self.ssl_args)
        except (OSError, ValueError) as exc:  # ssl.SSLError, a timeout, a reset
            logger.info("http: TLS handshake with {} failed: {}", peer(address), exc)
            client_socket.close()
            return None
        with tls_socket:
            return self.handle(tls_socket, address)

    def handle(self, sock, address):
        sock.settimeout(self.client_timeout)
        return super().handle(sock, address)


class WebServer:
    """The listener and the dashboard's throughput sampler."""

    def __init__(self, state, auth_throttle):
        settings = state.settings
        self.history = dashboard.History(state.broker)
        self.app = WebApp(state, auth_throttle, history=self.history)
        tls = tls_context(settings)
        ssl_args = {} if tls is None else {"ssl_context": tls}
        self.server = TimedWSGIServer((settings.bind, settings.http_port), self.app,
                                      spawn=Pool(HTTP_CONNECTIONS), log=None, error_log=ErrorLog(), **ssl_args)
        self.server.client_timeout = settings.client_frame_timeout or None
        self.server.request_timeout = settings.http_request_timeout
        self.scheme = "https" if tls is not None else "http"

    def start(self) -> None:
        self.server.start()
        self.history.start()

    @property
    def port(self) -> int:
        return self.server.server_port

    def stop(self) -> None:
        self.history.stop()
        self.server.stop(timeout=1)
