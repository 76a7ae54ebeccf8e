"""Slow and abusive clients, hostile queue names, failed AUTH: the server stays up and fair.

Each test runs a real server; other clients' PING latency is measured while one
client misbehaves.
"""

from __future__ import annotations

import contextlib
import re
import resource
import socket
import threading
import time

import pytest
import redis

from reliability import report
from support_servers import wait_until

pytestmark = pytest.mark.slow  # resource exhaustion, TLS and slowed-down clients: not in `pytest -m "not slow"`

# Not a speed test (the benchmark measures speed): a server stalled by the
# misbehaving client would answer the others in seconds, not in this bound.
STALLED_MS = 1000


def frame(*args: bytes) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


class Pinger(threading.Thread):
    """PINGs the server in a loop and records each round trip, until stopped."""

    def __init__(self, server):
        super().__init__(daemon=True)
        self.client = server.client()
        self.latencies: list[float] = []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            started = time.perf_counter()
            assert self.client.ping()
            self.latencies.append(time.perf_counter() - started)

    def finish(self) -> tuple[float, float]:
        """Stop; (p99, max) latency in milliseconds."""
        self.stop.set()
        self.join(10)
        ordered = sorted(self.latencies)
        assert len(ordered) > 20, "the pinger barely ran"
        return ordered[int(len(ordered) * 0.99)] * 1000, ordered[-1] * 1000


def connected_clients(client) -> int:
    return client.info("clients")["connected_clients"]


def test_client_that_never_reads_is_closed_and_others_stay_fast(ezra_factory):
    server = ezra_factory("--client-send-timeout", "1")
    admin = server.client()
    for n in range(10):
        admin.xadd("big", {"n": str(n), "pad": b"x" * 10_000})
    pinger = Pinger(server)
    pinger.start()
    hog = socket.socket()
    hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    hog.connect(("127.0.0.1", server.port))
    hog.sendall(frame(b"XRANGE", b"big", b"-", b"+") * 300)  # ~30 MB of replies, never read
    wait_until(lambda: "it read none of its replies" in server.log(), 20, message="the hog to be closed")
    wait_until(lambda: connected_clients(admin) == 2, 10, message="the hog's session to go")  # admin + pinger
    p99, worst = pinger.finish()
    print(f"PING while a client never read its replies: p99 {p99:.2f} ms, max {worst:.2f} ms")
    assert p99 < STALLED_MS, (p99, worst)
    hog.settimeout(10)
    with pytest.raises(OSError):  # reset by the server: whatever is buffered is dropped
        while hog.recv(1 << 20):
            pass
        raise ConnectionResetError("closed")
    assert admin.xlen("big") == 10


def test_frame_sent_one_byte_at_a_time_does_not_block_others(ezra_factory):
    server = ezra_factory()
    pinger = Pinger(server)
    pinger.start()
    slow = socket.create_connection(("127.0.0.1", server.port))
    payload = b"p" * 32_000
    data = frame(b"XADD", b"slow", b"*", b"f", payload)
    for byte in data[:-1]:
        slow.send(bytes([byte]))
    # The frame is still incomplete: other clients must be served meanwhile. (Waiting for
    # the pings here, not counting those that fit in the sending loop: that loop holds
    # this process's GIL, so on a busy machine the pinger thread may get few turns in it.)
    wait_until(lambda: len(pinger.latencies) > 20, 20, message="PINGs answered while the frame is incomplete")
    slow.send(data[-1:])
    slow.settimeout(10)
    reply = slow.recv(100)
    p99, worst = pinger.finish()
    print(f"PING while a 32 KB frame arrived one byte per send: p99 {p99:.2f} ms, max {worst:.2f} ms")
    assert reply.startswith(b"$") and b"-" in reply, reply
    assert server.client().xrange("slow")[0][1][b"f"] == payload
    assert p99 < STALLED_MS, (p99, worst)


def test_idle_half_frame_is_closed_after_the_frame_timeout(ezra_factory):
    server = ezra_factory("--client-frame-timeout", "0.5")
    idle = server.client()
    idle.ping()  # an idle client between commands is never closed
    half = socket.create_connection(("127.0.0.1", server.port))
    started = time.monotonic()
    half.sendall(b"*2\r\n$4\r\nECHO\r\n$10\r\nhal")
    half.settimeout(10)
    assert half.recv(100) == b""  # closed by the server
    assert time.monotonic() - started >= 0.5
    assert "half a command" in server.log()
    assert idle.ping()


HOSTILE_NAMES = [
    b'q"uote', b"q'uote", b"back`tick", b"a\x00b", b"a", b"\x00", b"::dead", b"::dead::x", b"x::dead:dead",
    b"::deadx", b"tasks; DROP TABLE tasks; --", b"' OR '1'='1", b"%_*?[]", b"\xff\xfe invalid utf-8",
    b"\\", b"\r\n*1\r\n$4\r\nPING", b"n" * 256,  # the longest name a new queue may have (docs/reference/limits.md)
]


def test_hostile_queue_names_are_data(ezra_factory, protocol):
    server = ezra_factory()
    client = server.client(protocol)
    for name in HOSTILE_NAMES:
        client.xadd(name, {"name": name})
    for name in HOSTILE_NAMES:
        assert client.xlen(name) == 1, name
        [(task_id, fields)] = client.xrange(name)
        assert fields[b"name"] == name
        client.xgroup_create(name, "g", id="0")
        result = client.xreadgroup("g", "w", {name: ">"}, count=5)
        [(stream, entries)] = result.items() if protocol == 3 else result
        if protocol == 3:
            [entries] = entries  # redis-py nests RESP3's map values once more
        assert stream == name and [entry_id for entry_id, _ in entries] == [task_id]
        assert client.xack(name, "g", task_id) == 1
        assert client.xlen(name) == 0
    # '::dead' alone is an ordinary name; a name ending in it is the dead-letter view of the rest:
    # XADD there pushes a dead task of that queue (ezra import); a view of a view is refused.
    with pytest.raises(redis.ResponseError, match="read-only dead-letter view"):
        client.xadd(b"x::dead::dead", {"f": "v"})
    for view, name in ((b"a\x00b::dead", b"a\x00b"), (b"::dead::dead", b"::dead")):
        client.xadd(view, {"f": "v"})
        assert client.xlen(view) == 1 and client.xlen(name) == 0  # dead, not waiting
    assert sorted(client.xrange(b"::dead")) and client.xlen(b"a") == 0
    assert client.ping()


def test_failed_auth_is_slowed_down_logged_once_and_closed_after_many(ezra_factory):
    server = ezra_factory("--password", "s3cret")
    guesser = socket.create_connection(("127.0.0.1", server.port))
    guesser.settimeout(30)
    pinger = Pinger(server)
    pinger.client = server.client(password="s3cret")
    pinger.start()
    started = time.monotonic()
    guesser.sendall(b"AUTH wrong\r\n" * 12 + b"PING\r\n")
    received = b""
    while True:
        data = guesser.recv(65536)
        if not data:
            break
        received += data
    elapsed = time.monotonic() - started
    p99, worst = pinger.finish()
    print(f"10 failed AUTHs took {elapsed:.2f}s; PING meanwhile: p99 {p99:.2f} ms, max {worst:.2f} ms")
    wrongpass = b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"
    assert received == wrongpass * 10  # then closed: the rest is never run
    assert elapsed >= sum(min(0.05 * 2 ** n, 1.0) for n in range(9))  # each reply waited longer
    log = server.log()
    assert log.count("failed AUTH from") == 1, log  # one line per burst, not per attempt
    assert "after 10 failed AUTH attempts" in log
    assert p99 < STALLED_MS
    assert server.client(password="s3cret").ping()  # the right password is never slowed down


def test_pipelined_large_reads_are_not_all_held_in_memory(ezra_factory):
    """60 pipelined XRANGEs of a 10 MB queue: a 2 KB request for 600 MB of replies. The server
    computed and encoded all of them before sending the first byte (6 GB for 200 of them)."""
    server = ezra_factory()
    admin = server.client()
    pipe = admin.pipeline(transaction=False)
    for n in range(1000):
        pipe.xadd("big", {"n": str(n), "pad": b"x" * 10_000})
    pipe.execute()
    before = peak_rss_mib(server.proc.pid)
    reader = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    reader.sendall(frame(b"XRANGE", b"big", b"-", b"+") * 60)
    received = 0
    while received < 60 * 1000 * 10_000:
        chunk = reader.recv(1 << 22)
        assert chunk, "closed before all the replies"
        received += len(chunk)
    reader.close()
    grew = peak_rss_mib(server.proc.pid) - before
    print(f"600 MB of pipelined XRANGE replies: server peak RSS grew {grew} MiB")
    assert grew < 300, grew  # a few replies at a time, not 600 MB (and its encoded copy)
    assert admin.ping()


# ---------------------------------------------------------------- many connections

MAX_CLIENTS_ERROR = b"-ERR max number of clients reached\r\n"  # Redis's exact bytes


@contextlib.contextmanager
def open_files_limit(soft: int):
    """Set this process's soft RLIMIT_NOFILE (servers started meanwhile inherit it), restored after."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


def open_idle_connections(server, admin, count: int, already: int) -> list[socket.socket]:
    """Open `count` idle connections, in batches the server accepts before the next (the backlog is 1024)."""
    sockets, deadline = [], time.monotonic() + 60
    try:
        while len(sockets) < count:
            for _ in range(min(500, count - len(sockets))):
                # A server that stopped accepting leaves connects waiting in the backlog: bounded.
                left = deadline - time.monotonic()
                assert left > 0, f"only {len(sockets)} of {count} connections opened in 60s"
                sockets.append(socket.create_connection(("127.0.0.1", server.port), timeout=min(left, 10)))
            expected = already + len(sockets)
            wait_until(lambda: connected_clients(admin) >= expected, 30, 0.05, f"{expected} connected clients")
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def push_claim_ack(client, queue: str) -> None:
    task_id = client.xadd(queue, {"f": "v"})
    assert client.xreadgroup("g", "w", {queue: ">"}, count=10) == [[queue.encode(), [(task_id, {b"f": b"v"})]]]
    assert client.xack(queue, "g", task_id) == 1


def refused_with_redis_error(port: int) -> None:
    """A connection over the limit gets Redis's error, then is closed."""
    extra = socket.create_connection(("127.0.0.1", port), timeout=30)
    received = b""
    while chunk := extra.recv(1024):
        received += chunk
    extra.close()
    assert received == MAX_CLIENTS_ERROR, received


def test_ten_thousand_connections_then_redis_error(ezra_factory):
    wanted = 10_000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + 1000  # this process holds every connection too, and the server inherits the limit
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"the hard open files limit is {hard}, {need} are needed (raise it: ulimit -Hn)")
    started = time.monotonic()
    with open_files_limit(max(soft, need if hard == resource.RLIM_INFINITY else hard)):
        server = ezra_factory("--max-clients", str(wanted))
        admin = server.client()
        assert admin.ping()  # connection 1 of 10,000
        idle = open_idle_connections(server, admin, wanted - 1, already=1)
        try:
            assert connected_clients(admin) == wanted
            push_claim_ack(admin, "busy")  # served among 10,000 connections
            refused_with_redis_error(server.port)  # connection 10,001
            assert admin.info("stats")["rejected_connections"] == 1
            assert admin.ping()
        finally:
            for sock in idle:
                sock.close()
        wait_until(lambda: connected_clients(admin) == 1, 30, 0.05, "the idle connections to be gone")
        push_claim_ack(server.client(), "after")  # a new client is served again
        rss = peak_rss_mib(server.proc.pid)
        assert server.stop() == 0, server.log()[-2000:]
    print(f"{wanted} connections: served a push/claim/ack, refused the next with Redis's error; "
          f"server peak RSS {rss} MiB; {time.monotonic() - started:.1f}s")
    assert "Traceback" not in server.log()


def test_max_clients_above_the_open_files_limit_raises_it(ezra_factory):
    """The server raises its own descriptor limit for --max-clients (as Redis does): with the inherited
    limit of 256, accept() failed with EMFILE past ~250 clients, which then waited with no answer."""
    with open_files_limit(256):
        server = ezra_factory("--max-clients", "1000")
    admin = server.client()
    assert admin.ping()  # connected before the others: it is served whatever happens to them
    idle = open_idle_connections(server, admin, 999, already=1)
    try:
        push_claim_ack(admin, "raised")
        refused_with_redis_error(server.port)
    finally:
        for sock in idle:
            sock.close()
    assert "Too many open files" not in server.log() and "Traceback" not in server.log()
    assert admin.info("clients")["maxclients"] == 1000  # INFO shows the clients that fit


def peak_rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmHWM:"))


# ---------------------------------------------------------------- TLS

def test_tls_with_redis_py(ezra_factory, certificates, protocol):
    c = certificates
    server = ezra_factory("--tls-cert-file", str(c / "server.pem"), "--tls-key-file", str(c / "server.key"))
    client = redis.Redis(host="localhost", port=server.port, protocol=protocol, ssl=True,
                         ssl_ca_certs=str(c / "ca.pem"), socket_timeout=10)
    task_id = client.xadd("tls", {"f": "v"})
    assert client.xrange("tls") == [(task_id, {b"f": b"v"})]
    # A plain-text client gets no service and does not disturb the others.
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=server.port, socket_timeout=5).ping()
    assert client.ping()
    assert "Traceback" not in server.log()


def test_tls_client_certificates(ezra_factory, certificates):
    c = certificates
    server = ezra_factory("--tls-cert-file", str(c / "server.pem"), "--tls-key-file", str(c / "server.key"),
                          "--tls-ca-cert-file", str(c / "ca.pem"))
    with_cert = redis.Redis(host="localhost", port=server.port, ssl=True, ssl_ca_certs=str(c / "ca.pem"),
                            ssl_certfile=str(c / "client.pem"), ssl_keyfile=str(c / "client.key"),
                            socket_timeout=10)
    assert with_cert.ping()
    without = redis.Redis(host="localhost", port=server.port, ssl=True, ssl_ca_certs=str(c / "ca.pem"),
                          socket_timeout=10)
    with pytest.raises(redis.ConnectionError):
        without.ping()
    assert with_cert.xadd("tls", {"f": "v"})
    wait_until(lambda: "TLS handshake with" in server.log(), 10, message="the refused handshake's log line")


def test_a_transaction_that_never_ends_cannot_pin_unbounded_memory(ezra_factory):
    """MULTI, then 1 MiB pushes that never see EXEC: past the bound (8 MB) they are refused and the EXEC
    aborts; nothing is stored and the server's memory stays bounded."""
    server = ezra_factory()
    client = server.client()
    pipe = client.pipeline(transaction=True)
    field = b"x" * (1024 * 1024 - 64)
    for _ in range(70):
        pipe.xadd("pinned", {"f": field})
    with pytest.raises(redis.ResponseError) as failure:
        pipe.execute()
    assert "EXECABORT" in str(failure.value) or "too much queued between MULTI and EXEC" in str(failure.value)
    assert client.xlen("pinned") == 0
    assert peak_rss_mib(server.proc.pid) < 400
    assert client.ping()


def _queue_bound(error: redis.ResponseError) -> int:
    """The command bound the refusal names ("at most N commands")."""
    found = re.search(r"at most ([\d,]+) commands", str(error))
    assert found, error
    return int(found.group(1).replace(",", ""))


def test_a_large_transaction_cannot_freeze_other_clients(ezra_factory):
    """EXEC runs its commands without letting other clients in: 30,000 queued XADDs froze every
    client for the whole EXEC (1.2 s quiet, 8 s loaded). A MULTI that large is now refused
    (EXECABORT, nothing stored), and the largest EXEC allowed keeps others' PINGs fast."""
    server = ezra_factory()
    client = server.client()
    pipe = client.pipeline(transaction=True)
    for n in range(30_000):
        pipe.xadd("bulk", {"n": str(n), "pad": "x" * 100})
    with pytest.raises(redis.ResponseError, match="EXECABORT|too much queued") as refused:
        pipe.execute()
    assert client.xlen("bulk") == 0
    # The refusal says what the bound is and what to do instead (a pipeline without MULTI).
    bound_error = _queue_bound_error(client)
    assert "transaction=False" in str(bound_error), bound_error
    bound = _queue_bound(bound_error)
    # The largest transactions allowed, by count then by size: other clients wait little.
    worst_ms = {}
    for count, pad in ((bound, 100), (8, 1024 * 1024 - 64)):
        pinger = Pinger(server)
        pinger.start()
        wait_until(lambda: len(pinger.latencies) > 20, 10, message="the pinger to start")
        pipe = client.pipeline(transaction=True)
        for n in range(count):
            pipe.xadd("bounded", {"n": str(n), "pad": b"x" * pad})
        assert len(pipe.execute()) == count
        p99, worst = pinger.finish()
        print(f"PING during an EXEC of {count} XADDs of {pad} bytes: p99 {p99:.1f} ms, max {worst:.1f} ms")
        assert worst < STALLED_MS, (count, pad, p99, worst)
        worst_ms[f"{count}x{pad}B"] = round(worst, 1)
    assert client.xlen("bounded") == bound + 8
    report("exec_bound", refused_commands=30_000, bound=bound, worst_ping_ms_at_bound=worst_ms)


def _queue_bound_error(client) -> redis.ResponseError:
    """Queue one command past the bound by hand, to read the refusal itself (not EXECABORT)."""
    connection = client.connection_pool.get_connection()
    try:
        connection.send_command("MULTI")
        assert connection.read_response() == b"OK"
        for n in range(100_001):
            connection.send_command("XADD", "probe", "*", "n", str(n))
            try:
                connection.read_response()
            except redis.ResponseError as exc:
                return exc
        raise AssertionError("100,001 commands were queued")
    finally:
        connection.send_command("DISCARD")
        connection.read_response()
        client.connection_pool.release(connection)
