"""Helpers that several test modules share: they live here, so no test module imports another.

Fixtures stay in conftest.py (this module holds none); state that several modules share
(WORKER_LIBS_RESULTS, the rows of build/compat/worker_libs.json) lives here too.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- the broker without a server

def submit_broken_request(broker) -> None:
    """A request whose statement fails: its whole batch rolls back and answers a storage error."""
    def broken():
        broker.db.conn.execute("INSERT INTO no_such_table VALUES (1)")

    try:
        broker.writer.submit(broken)
    except Exception as exc:
        assert "storage error" in str(exc)
    else:
        raise AssertionError("the broken request was answered")


# ---------------------------------------------------------------- the queue through redis-py

OK_REPLIES = (True, b"OK", "OK")


def configure(r, queue, *settings):
    assert r.execute_command("XCFGSET", queue, *settings) in OK_REPLIES


def queue_figures(client, queue) -> dict:
    """One queue's counts and tallies since start, keyed as INFO's (`in_flight`), read with XINFO
    QUEUES: INFO lists only the first 100 queues by name, and a shared server holds more."""
    name = queue.encode() if isinstance(queue, str) else queue
    # AFTER is exclusive: from the name less its last byte, `name` is among the first few.
    for row in client.execute_command("XINFO", "QUEUES", "AFTER", name[:-1], "COUNT", 1000):
        fields = row if isinstance(row, dict) else dict(zip(row[::2], row[1::2]))
        fields = {text(key).replace("-", "_"): value for key, value in fields.items()}
        if fields.pop("name") in (name, name.decode(errors="replace")):
            return fields
    raise AssertionError(f"XINFO QUEUES does not list {name!r}")


def entries_of(reply, queue):
    """The entries for `queue` in an XREADGROUP reply, in either protocol's shape."""
    if not reply:
        return []
    key = queue.encode()
    if isinstance(reply, dict):  # RESP3: {queue: [entries]}
        items = reply.get(key, [])
        return items[0] if items and isinstance(items[0], list) else items
    return {name: items for name, items in reply}.get(key, [])


def claim(r, queue, worker="w1", count=None, block=None, **kwargs):
    return entries_of(r.xreadgroup("g", worker, {queue: ">"}, count=count, block=block, **kwargs), queue)


def pending(r, queue) -> list[dict]:
    return r.xpending_range(queue, "g", "-", "+", 100)


def text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# ---------------------------------------------------------------- raw RESP (the vector harness's reader)

def raw(text: str) -> bytes:
    """Vector text (latin-1) to the bytes on the wire."""
    return text.encode("latin-1")


class Incomplete(Exception):
    """The buffer ends before the reply does: read more."""


@dataclass(frozen=True)
class Reply:
    """One parsed RESP2/RESP3 reply.

    `kind` is the type byte ('+', '$', '*', '%', ...); `value` is the line or blob
    (bytes), None for any null, a tuple of Reply for arrays, sets and pushes, and
    a tuple of (key, value) pairs for maps.
    """

    kind: str
    value: object


LINE_TYPES = "+-:_,#("
BLOB_TYPES = "$=!"
AGGREGATE_TYPES = "*~>"


def parse_reply(buf: bytes, pos: int = 0) -> tuple[Reply, int]:
    """The reply starting at `pos` and the position after it; Incomplete if cut short."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise Incomplete
    kind, line, pos = chr(buf[pos]), buf[pos + 1:end], end + 2
    if kind in LINE_TYPES:
        return Reply(kind, None if kind == "_" else line), pos
    if kind in BLOB_TYPES:
        size = int(line)
        if size < 0:
            return Reply(kind, None), pos
        if len(buf) < pos + size + 2:
            raise Incomplete
        if buf[pos + size:pos + size + 2] != b"\r\n":
            raise ValueError(f"blob not terminated by CRLF in {buf!r}")
        return Reply(kind, buf[pos:pos + size]), pos + size + 2
    if kind in AGGREGATE_TYPES or kind == "%":
        count = int(line)
        if count < 0:
            return Reply(kind, None), pos
        items = []
        for _ in range(2 * count if kind == "%" else count):
            item, pos = parse_reply(buf, pos)
            items.append(item)
        if kind == "%":
            items = list(zip(items[::2], items[1::2]))
        return Reply(kind, tuple(items)), pos
    raise ValueError(f"not a RESP reply type {kind!r} in {buf!r}")


class RespConnection:
    """A raw TCP client: send bytes, read one complete reply at a time (as bytes)."""

    def __init__(self, port: int, timeout: float = 10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buffer = b""

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_reply(self) -> bytes:
        while True:
            if self.buffer:
                try:
                    _, end = parse_reply(self.buffer)
                except Incomplete:
                    pass
                else:
                    reply, self.buffer = self.buffer[:end], self.buffer[end:]
                    return reply
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError(f"closed by the server; partial reply {self.buffer!r}")
            self.buffer += data

    def call(self, args: list[str]) -> bytes:
        self.send(encode_command(args))
        return self.read_reply()

    def closed_by_server(self) -> bool:
        """True once the server closes: recv blocks until EOF (or the timeout)."""
        try:
            return not self.buffer and self.sock.recv(1) == b""
        except TimeoutError:
            return False


def encode_command(args: list[str]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = raw(arg)
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def blocked_clients(conn: RespConnection) -> int:
    info = parse_reply(conn.call(["INFO", "clients"]))[0].value
    return int(re.search(rb"blocked_clients:(\d+)", info).group(1))


# ---------------------------------------------------------------- HTTP (the dashboard and /metrics)

class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a 303 is the answer we check, not a page to follow


OPENER = urllib.request.build_opener(NoRedirect)


def http(url: str, data: bytes | None = None, headers: dict | None = None, opener=OPENER) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def basic(password: str, user: str = "admin") -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def scrape(server, headers=None) -> dict:
    """{(metric sample name, frozenset(labels)): value} from /metrics."""
    status, response_headers, body = http(server.http_url + "/metrics", headers=headers)
    assert status == 200, body
    assert response_headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict, name: str, **labels) -> float:
    return samples[(name, frozenset(labels.items()))]


def form_token(server, queue: str) -> str:
    status, _, body = http(f"{server.http_url}/queue?name={quote(queue)}")
    assert status == 200
    return re.search(rb'name="csrf" value="([0-9a-f]+)"', body).group(1).decode()


# ---------------------------------------------------------------- a small file system (disk full)

def mount_small_tmpfs(path: Path, size: str) -> str | None:
    """Mount a tmpfs of `size` at path; None on success, else why not."""
    if os.geteuid() != 0:
        return "needs root to mount a small tmpfs as the data directory"
    path.mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return f"mount is not permitted here: {done.stderr.strip()[:200]}"
    return None


def tmpfs(mount_point: Path, size: str):
    """A fixture's body: a tmpfs of `size` mounted at `mount_point`, unmounted after the test."""
    reason = mount_small_tmpfs(mount_point, size)
    if reason:
        pytest.skip(reason)
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


def leave_free(mount_point: Path, room: int) -> Path:
    """Fill the file system with a file, so that about `room` bytes stay free; the file."""
    stats = os.statvfs(mount_point)
    filler = mount_point / "filler"
    filler.write_bytes(b"\0" * (stats.f_bavail * stats.f_frsize - room))
    return filler


# ---------------------------------------------------------------- compatibility rows, venvs, Node.js

NODE_SRC = ROOT / "tests" / "node"
NODE_DIR = ROOT / "build" / "node"
COMPAT = ROOT / "build" / "compat"


def record_results(name: str, results: list[dict], key=None) -> None:
    """Merge this run's results into build/compat/<name>.json (keyed by client, version,
    protocol and settings, or by `key`, so a partial run keeps the other rows)."""
    key = key or KEY
    COMPAT.mkdir(parents=True, exist_ok=True)
    path = COMPAT / f"{name}.json"
    with open(COMPAT / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # pytest-xdist workers merge one after the other
        table = {}
        if path.exists():
            table = {key(e): e for e in json.loads(path.read_text())}
        for entry in results:
            table[key(entry)] = entry
        path.write_text(json.dumps(sorted(table.values(), key=key), indent=1) + "\n")


def KEY(entry: dict) -> tuple:
    return entry["client"], entry["version"], entry["protocol"], entry["settings"].split(", node")[0]


def python_venv(name: str, requirements: list[str]) -> Path:
    """build/<name>/bin/python, a virtual environment with `requirements`, made on first use.

    Another redis-py (or a library pinning one) cannot share this interpreter, so it gets
    its own venv and the test runs it in a subprocess. Skips with the reason when pip cannot
    install (offline). A stamp file remembers what was installed, so a change rebuilds it."""
    venv = ROOT / "build" / name
    python, stamp = venv / "bin" / "python", venv / "ezra-requirements.txt"
    wanted = "\n".join(requirements) + "\n"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    shutil.rmtree(venv, ignore_errors=True)
    for what, step in (("python -m venv", [sys.executable, "-m", "venv", str(venv)]),
                       ("pip install " + " ".join(requirements),
                        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *requirements])):
        result = subprocess.run(step, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            pytest.skip(f"could not make build/{name}: {what} failed: {result.stderr[-500:]}")
    stamp.write_text(wanted)
    return python


def node_modules() -> Path:
    """build/node/node_modules from tests/node/package-lock.json (npm ci when missing)."""
    if shutil.which("node") is None:
        pytest.skip("Node.js is not installed (apt-get install nodejs npm; scripts/test.sh does)")
    modules = NODE_DIR / "node_modules"
    lock = NODE_SRC / "package-lock.json"
    installed_lock = NODE_DIR / "package-lock.json"
    if not modules.is_dir() or not installed_lock.exists() or installed_lock.read_bytes() != lock.read_bytes():
        if shutil.which("npm") is None:
            pytest.skip("npm is not installed and build/node/node_modules is missing "
                        "(apt-get install npm; scripts/test.sh runs npm ci)")
        NODE_DIR.mkdir(parents=True, exist_ok=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copy(NODE_SRC / name, NODE_DIR / name)
        result = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR,
                                capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            pytest.skip(f"npm ci failed in build/node (offline?): {result.stderr[-500:]}")
    return modules


def node_env() -> dict:
    return dict(os.environ, NODE_PATH=str(node_modules()))


def node_version(package: str) -> str:
    return json.loads((node_modules() / package / "package.json").read_text())["version"]


def run_examples(port: int, producer: list[str], worker: list[str], queue: str, env: dict) -> None:
    """The producer pushes 10, two workers stop after 5 each; every task done exactly once."""
    env = dict(env, QUEUE=queue, MAX_TASKS="5", IDLE_TIMEOUT="10")
    workers = [subprocess.Popen(worker + [str(port)], stdout=subprocess.PIPE, text=True,
                                env=dict(env, WORKER_NAME=f"w{i}")) for i in (1, 2)]
    pushed = subprocess.run(producer, capture_output=True, text=True, timeout=60,
                            env=dict(env, EZRA_PORT=str(port), TASKS="10"))
    assert pushed.returncode == 0, pushed.stderr
    ids = [line.split()[1] for line in pushed.stdout.splitlines()]
    done = []
    for proc in workers:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        lines = out.splitlines()
        assert len(lines) == 5, out
        done += [line.split()[1] for line in lines]
    assert len(ids) == 10 and sorted(done) == sorted(ids)


# ---------------------------------------------------------------- worker libraries (three test modules)

WORKER_LIBS_RESULTS: list[dict] = []  # test_worker_libs*.py's rows, in build/compat/worker_libs.json
VENV_REQUIREMENTS = ["celery[redis]>=5.4,<6", "rq>=2,<4", "faststream[redis]>=0.6,<0.8",
                     "taskiq-redis>=1.2,<2", "dramatiq[redis]>=2,<3", "huey[redis]>=3,<4"]
# arq pins redis<6 and saq[redis] redis<8, while taskiq-redis needs redis>=8 and Celery's kombu
# redis>=6.4: these two get a venv of their own. saq imports typing_extensions without requiring it.
VENV_REDIS5_REQUIREMENTS = ["arq>=0.26,<1", "saq[redis]>=0.26,<1", "typing_extensions"]


def record_worker_libs() -> None:
    """Merge the rows so far (of any of the three modules) into build/compat/worker_libs.json."""
    record_results("worker_libs", WORKER_LIBS_RESULTS, key=lambda e: (e["library"], e["version"]))


class Row:
    """One library's line in the README: it starts as a failure until the test says otherwise."""

    def __init__(self, library: str, version: str):
        self.entry = dict(library=library, version=version, status="fail (test did not finish)",
                          notes="", when=time.strftime("%Y-%m-%d %H:%M:%S"))
        WORKER_LIBS_RESULTS.append(self.entry)

    def done(self, status: str, notes: str) -> None:
        self.entry.update(status=status, notes=notes)


PIPELINED = re.compile(r"(Command # \d+ \(\S+) [^)]*\)")  # redis-py: "Command # 1 (LLEN q-…) of pipeline"


def short(message: str) -> str:
    """An error for the README's table, without what varies from run to run (the arguments,
    the list of supported commands): "unknown command 'SET', with args beginning with: … (EZRA
    is a task queue; … Keys other than queues (strings, …) are outside a streams-only queue: …)"."""
    head, hint, rest = PIPELINED.sub(r"\1 …)", message).partition(" (EZRA is a task queue;")
    command, args, _ = head.partition(" with args beginning with:")
    why = rest.partition(". ")[2].partition(":")[0]
    return (command + (" with args beginning with: …" if args else "")
            + (f" (EZRA is a task queue; … {why}: …)" if why else " (EZRA is a task queue; …)" if hint else ""))


# EZRA's error for a command outside the queue (errors.unknown_command): the command, then the
# reason when it is one of the kinds a streams-only queue lacks.
REFUSAL = re.compile(r"unknown command '([^']+)', with args beginning with: .*?\(EZRA is a task queue; "
                     r"supported: [A-Z_ ]+(?:\. (.+?) are outside a streams-only queue: "
                     r"a library built on them cannot run on EZRA)?\)", re.S)


def first_refusal(text: str) -> tuple[str, str | None, str]:
    """The first of EZRA's refusals in what a library showed its user: (command, reason, error)."""
    match = REFUSAL.search(text or "")
    assert match, f"no EZRA error in:\n{(text or '')[-3000:]}"
    return match.group(1).upper(), match.group(2), match.group(0)


def refusals(text: str) -> dict[str, str | None]:
    """Every command refused in a worker's log, with EZRA's reason."""
    return {command.upper(): reason for command, reason in reversed(REFUSAL.findall(text))}


def dist_version(python, distribution: str) -> str:
    """The installed version of a distribution in another interpreter (build/venv-*)."""
    return subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({distribution!r}))"],
                          capture_output=True, text=True, check=True).stdout.strip()


def run_json(command: list[str], timeout: float = 60, **kwargs) -> dict:
    """Run a scenario script; its last stdout line that is a JSON object is its summary."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])


def walrus_database(port: int):
    try:
        import walrus
    except ImportError:
        pytest.skip("walrus is not installed (pip install -e '.[test]')")
    return walrus, walrus.Database(port=port)

