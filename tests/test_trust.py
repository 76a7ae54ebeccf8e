"""Trust, round two: protected mode, unauthenticated connections per host, HELLO that fails, settings' ranges.

A remote client is played by a client socket bound to 127.0.0.2 (a loopback
address that, as in Redis 7, does not count as local) talking to a server
bound to 0.0.0.0.
"""

from __future__ import annotations

import socket

import pytest
import redis

from conftest import EzraProcess, wait_until


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
