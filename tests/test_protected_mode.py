"""Trust, round two: protected mode, unauthenticated connections per host, HELLO that fails, settings' ranges.

A remote client is played by a client socket bound to 127.0.0.2 (a loopback
address that, as in Redis 7, does not count as local) talking to a server
bound to 0.0.0.0.
"""

from __future__ import annotations

import http.client
import re
import socket

import pytest
import redis

from support_servers import EzraProcess

REMOTE = "127.0.0.2"  # a loopback address that is not local to protected mode (as in Redis 7)
DENIED = (b"-DENIED EZRA is running in protected mode because protected mode is enabled and no password is set "
          b"for the default user. In this mode connections are only accepted from the loopback interface. ")


class RemoteConnection(redis.Connection):
    """redis-py's connection, from 127.0.0.2: a client on another host, as far as the server can tell."""

    def _connect(self):
        sock = socket.create_connection((self.host, self.port), self.socket_connect_timeout,
                                        source_address=(REMOTE, 0))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.socket_timeout)
        return sock


def remote_client(server: EzraProcess, protocol: int = 2, **kwargs) -> redis.Redis:
    pool = redis.ConnectionPool(connection_class=RemoteConnection, host="127.0.0.1", port=server.port,
                                protocol=protocol, socket_timeout=30, **kwargs)
    return redis.Redis(connection_pool=pool)


def read_to_end(port: int, source: str) -> bytes:
    """Connect from `source`, send nothing, read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0)) as sock:
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def info_field(server: EzraProcess, name: str, password: str | None = None):
    client = server.client(password=password)
    try:
        return client.info()[name]
    finally:
        client.close()


# ---------------------------------------------------------------- protected mode

def test_protected_mode_refuses_other_hosts_with_redis_error_and_closes(ezra_factory):
    server = ezra_factory("--bind", "0.0.0.0")
    data = read_to_end(server.port, REMOTE)  # ends: the server closed the connection
    assert data.startswith(DENIED) and data.endswith(b"\r\n") and data.count(b"\r\n") == 1, data
    assert b"'--protected-mode no'" in data and b"EZRA_PROTECTED_MODE=no" in data and b"--password" in data
    assert info_field(server, "rejected_connections") == 1
    for protocol in (2, 3):  # a stock client sees an error, never a served command
        client = remote_client(server, protocol)
        with pytest.raises(redis.RedisError):
            client.xadd("q", {"f": "v"})
        client.close()
    loopback = server.client()  # 127.0.0.1 is still served
    assert loopback.xlen("q") == 0 and loopback.ping()
    assert "protected mode: listening on 0.0.0.0 without a password" in server.log()
    assert server.log().count("refused a client from 127.0.0.2: protected mode") == 1  # once per host


def test_only_127_0_0_1_and_ipv6_loopback_count_as_local(ezra_factory):
    """As Redis 7's connIsLocal: not all of 127.0.0.0/8. The default --bind 127.0.0.1 is reachable from 127.0.0.2."""
    server = ezra_factory()
    assert read_to_end(server.port, REMOTE).startswith(DENIED)
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    try:
        dual = ezra_factory("--bind", "::")  # IPv4 clients arrive as ::ffff:127.0.0.1 / ::ffff:127.0.0.2
    except AssertionError as exc:  # no IPv6 here (a container without it)
        pytest.skip(f"cannot listen on '::': {exc}")
    for host in ("::1", "127.0.0.1"):
        client = redis.Redis(host=host, port=dual.port, socket_timeout=30)
        assert client.ping(), host
        client.close()
    assert read_to_end(dual.port, REMOTE).startswith(DENIED)


@pytest.mark.parametrize("protocol", [2, 3])
def test_a_password_lets_other_hosts_in(ezra_factory, protocol):
    server = ezra_factory("--bind", "0.0.0.0", "--password", "s3cret")
    client = remote_client(server, protocol, password="s3cret")
    assert client.xadd("q", {"f": "v"}) and client.xlen("q") == 1
    client.close()
    without = remote_client(server, protocol)
    with pytest.raises(redis.AuthenticationError):
        without.xlen("q")
    without.close()


@pytest.mark.parametrize("how", ["flag", "env"])
def test_protected_mode_no_lets_other_hosts_in(ezra_factory, how):
    if how == "flag":
        server = ezra_factory("--bind", "0.0.0.0", "--protected-mode", "no")
    else:
        server = ezra_factory("--bind", "0.0.0.0", env={"EZRA_PROTECTED_MODE": "no"})
    for protocol in (2, 3):
        client = remote_client(server, protocol)
        assert client.xadd("q", {"f": "v"})
        client.close()
    assert "with --protected-mode no: anyone who can reach this port can read and change" in server.log()


def http_get(base: str, path: str, source: str) -> tuple[int, bytes]:
    port = int(re.search(r":(\d+)$", base).group(1))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_the_dashboard_follows_protected_mode(ezra_factory):
    server = ezra_factory("--bind", "0.0.0.0", "--http-port", "0")
    for path in ("/", "/metrics", "/queue?name=q"):
        status, body = http_get(server.http_url, path, REMOTE)
        assert status == 403 and b"protected mode" in body and b"--password" in body, (path, status)
        assert http_get(server.http_url, path, "127.0.0.1")[0] in (200, 404), path
    assert http_get(server.http_url, "/healthz", REMOTE) == (200, b"ok\n")  # as with a password: says only "up"
    opened = ezra_factory("--bind", "0.0.0.0", "--http-port", "0", "--protected-mode", "no")
    assert http_get(opened.http_url, "/", REMOTE)[0] == 200
    with_password = ezra_factory("--bind", "0.0.0.0", "--http-port", "0", "--password", "s3cret")
    assert http_get(with_password.http_url, "/", REMOTE)[0] == 401  # asks for the password instead


# ---------------------------------------------------------------- the flags' ranges, as XCFGSET's

@pytest.mark.parametrize("args, message", [
    (("--visibility-timeout", "1e-300"), "VISIBILITY-TIMEOUT must be at least 0.001 seconds (1 ms), got 1e-300"),
    (("--visibility-timeout", "inf"), "seconds must be above 0 and at most 315360000, got inf"),
    (("--max-attempts", "99999999999"), "MAX-ATTEMPTS must be between 1 and 2147483647, got 99999999999"),
    (("--retention-seconds", "nan"), "must be a finite number, got nan"),
])
def test_start_refuses_settings_that_xcfgset_refuses(tmp_path, args, message):
    server = EzraProcess(tmp_path / "data", *args)
    try:
        with pytest.raises(AssertionError, match="ezra exited with 2"):
            server.start()
    finally:
        server.stop()
    assert message in server.log()


# ---------------------------------------------------------------- HELLO that fails changes nothing

def exchange(port: int, request: bytes, replies: int, source: str = "127.0.0.1") -> list[bytes]:
    """Send raw bytes; read until `replies` CRLF-terminated lines came (or the server closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0)) as sock:
        sock.sendall(request)
        data = b""
        while data.count(b"\r\n") < replies:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return data.split(b"\r\n")[:-1]


def test_hello_with_an_invalid_name_leaves_the_connection_unauthenticated(ezra_factory):
    server = ezra_factory("--password", "s3cret")
    lines = exchange(server.port, b'HELLO 3 AUTH default s3cret SETNAME "a b"\r\nXLEN q\r\nCLIENT GETNAME\r\n', 3)
    assert lines == [b"-ERR Client names cannot contain spaces, newlines or special characters.",
                     b"-NOAUTH Authentication required.", b"-NOAUTH Authentication required."]
    # A wrong password with a valid name: the name is not set either; then the right one works.
    lines = exchange(server.port, b"HELLO 3 AUTH default wrong SETNAME w1\r\nAUTH s3cret\r\nCLIENT GETNAME\r\n", 3)
    assert lines == [b"-WRONGPASS invalid username-password pair or user is disabled.", b"+OK", b"$-1"]


@pytest.mark.parametrize("protocol", [2, 3])
def test_hello_that_succeeds_authenticates_and_names(ezra_factory, protocol):
    server = ezra_factory("--password", "s3cret")
    client = server.client(protocol, password="s3cret", client_name="worker-1")
    assert client.client_getname() in (b"worker-1", "worker-1")
    assert client.xlen("q") == 0
    with pytest.raises(redis.RedisError):
        server.client(protocol, password="s3cret", client_name="a b").ping()
    client.close()


# ---------------------------------------------------------------- unauthenticated connections per host

def open_unauthenticated(port: int, count: int) -> list[socket.socket]:
    """`count` connections from 127.0.0.1, each shown to be served (NOAUTH) before the next opens."""
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sockets.append(sock)
        sock.sendall(b"PING\r\n")
        assert sock.recv(100) == b"-NOAUTH Authentication required.\r\n"
    return sockets


MADE_ROOM = b"-ERR closed to make room: 127.0.0.1 has more than {n} connections that have not authenticated yet "


def read_closed(sock: socket.socket) -> bytes:
    """What an open connection still receives until the server closes it."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_a_host_beyond_its_unauthenticated_limit_loses_its_oldest_connection(ezra_factory):
    """Until issue 21 the newcomer was refused, the right password's too (now tests/test_auth_guard.py)."""
    server = ezra_factory("--password", "s3cret")  # the default limit, 100
    waiting = open_unauthenticated(server.port, 100)
    waiting += open_unauthenticated(server.port, 1)  # served: the oldest is closed to make room
    closed = read_closed(waiting.pop(0))
    assert closed.startswith(MADE_ROOM.replace(b"{n}", b"100")) and closed.count(b"\r\n") == 1, closed
    assert b"--max-unauthenticated-per-host" in closed
    waiting[0].sendall(b"AUTH s3cret\r\n")  # one authenticates: it no longer counts
    assert waiting[0].recv(100) == b"+OK\r\n"
    waiting += open_unauthenticated(server.port, 1)  # 100 unauthenticated again: none closed
    waiting[1].sendall(b"PING\r\n")
    assert waiting[1].recv(100) == b"-NOAUTH Authentication required.\r\n"
    client = redis.Redis(port=server.port, password="s3cret", socket_timeout=30)  # 101st: served at once
    assert client.xlen("q") == 0
    assert read_closed(waiting[1]).startswith(MADE_ROOM.replace(b"{n}", b"100"))  # the oldest unauthenticated
    assert server.log().count("127.0.0.1 has more than 100 connections that have not authenticated") == 1
    for sock in waiting:
        sock.close()
    client.close()


@pytest.mark.parametrize("protocol", [2, 3])
def test_the_unauthenticated_limit_is_configurable_and_other_hosts_are_apart(ezra_factory, protocol):
    server = ezra_factory("--password", "s3cret", "--max-unauthenticated-per-host", "3")
    waiting = open_unauthenticated(server.port, 3)
    client = redis.Redis(port=server.port, password="s3cret", protocol=protocol, socket_timeout=30)
    assert client.xlen("q") == 0  # a stock client that arrives now is served; the oldest made room
    assert read_closed(waiting.pop(0)).startswith(MADE_ROOM.replace(b"{n}", b"3"))
    other = remote_client(server, protocol)  # another host is counted apart: it closes none of these
    with pytest.raises(redis.AuthenticationError):
        other.xlen("q")
    for sock in waiting:
        sock.sendall(b"PING\r\n")
        assert sock.recv(100) == b"-NOAUTH Authentication required.\r\n"
    other.close()
    client.close()
    for sock in waiting:
        sock.close()
    unlimited = ezra_factory("--password", "s3cret", "--max-unauthenticated-per-host", "0")
    more = open_unauthenticated(unlimited.port, 150)
    for sock in more:
        sock.close()
