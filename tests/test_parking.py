"""Idle connections are parked (their greenlet ends) and resume with their state when the client sends again."""

from __future__ import annotations

import random
import socket
import threading
import time

import pytest
import redis

from support_queue import claim, configure
from support_servers import wait_until

PARK_DEADLINE = 20.0  # parking happens 1-2 s after a connection goes quiet; a loaded CI machine is slower


def clients_info(server, connect=None) -> dict:
    """INFO clients, asked on a new connection (`connect()` makes it; default: plain redis-py)."""
    with (connect or server.client)() as observer:
        return observer.info("clients")


def wait_parked(server, count: int, connect=None) -> dict:
    """The INFO clients section once at least `count` connections are parked."""
    def parked():
        info = clients_info(server, connect)
        return info if info["parked_clients"] >= count else None
    return wait_until(parked, timeout=PARK_DEADLINE, message=f"{count} connections parked")


def raw(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def pinged_connections(server, count: int) -> list[socket.socket]:
    """`count` raw connections that each had a PING answered, then sit idle."""
    socks = [raw(server) for _ in range(count)]
    each_answers(socks, b"PING\r\n", b"+PONG\r\n")
    return socks


def each_answers(socks: list[socket.socket], command: bytes, reply: bytes) -> None:
    """Send `command` on every connection, then read each one's reply: `reply`."""
    for sock in socks:
        sock.sendall(command)
    for sock in socks:
        assert recv_reply(sock) == reply


def recv_reply(sock: socket.socket) -> bytes:
    """One short reply (the tests' replies fit one segment): read up to its final CRLF."""
    data = sock.recv(65536)
    while not data.endswith(b"\r\n"):
        more = sock.recv(65536)
        assert more, f"connection closed after {data!r}"
        data += more
    return data


@pytest.mark.parametrize("protocol", [2, 3])
def test_parked_connections_resume_with_their_state(ezra_factory, protocol):
    server = ezra_factory()
    producer = server.client(protocol)
    producer.xgroup_create("jobs", "g", mkstream=True)
    named = server.client(protocol, client_name="mailer", decode_responses=True)
    clients = [server.client(protocol) for _ in range(20)]
    for client in clients:
        assert client.ping()
    assert named.client_getname() == "mailer"
    in_multi = raw(server)
    in_multi.sendall(b"MULTI\r\nXADD jobs * from multi\r\n")
    assert recv_reply(in_multi) == b"+OK\r\n+QUEUED\r\n"
    hello3 = raw(server)
    hello3.sendall(b"HELLO 3\r\n")
    assert recv_reply(hello3).startswith(b"%")

    wait_parked(server, 24)  # all but the observer asking
    # Parked, they are still connected (an observer closed just before may not be counted out yet).
    wait_until(lambda: clients_info(server)["connected_clients"] == 25, message="25 connections, observer included")

    assert [client.ping() for client in clients] == [True] * 20
    assert named.client_getname() == "mailer"
    in_multi.sendall(b"EXEC\r\n")
    assert recv_reply(in_multi).startswith(b"*1\r\n$"), "the transaction begun before parking"
    hello3.sendall(b"XINFO STREAM jobs\r\n")
    assert recv_reply(hello3).startswith(b"%"), "RESP3 chosen before parking"
    assert producer.xlen("jobs") == 1
    for sock in (in_multi, hello3):
        sock.close()
    for client in [producer, named, *clients]:
        client.close()


def test_a_parked_worker_that_disconnects_releases_its_task(ezra_factory):
    server = ezra_factory()
    admin = server.client()
    admin.xgroup_create("jobs", "g", mkstream=True)
    configure(admin, "jobs", "RELEASE-ON-DISCONNECT", "0.2")
    task_id = admin.xadd("jobs", {"job": 1})
    worker = server.client()
    assert [i for i, _ in claim(worker, "jobs", "w1")] == [task_id]
    wait_parked(server, 2)  # the worker and the admin
    worker.close()
    wait_until(lambda: clients_info(server)["connected_clients"] == 2, timeout=PARK_DEADLINE,
               message="the parked connection's close seen")
    [(got_id, _)] = wait_until(lambda: claim(admin, "jobs", "w2"), timeout=10, message="the release")
    assert got_id == task_id
    admin.close()


def test_blocked_reader_and_half_sent_command_are_not_parked(ezra_factory):
    server = ezra_factory()
    admin = server.client()
    admin.xgroup_create("jobs", "g", mkstream=True)
    blocked = raw(server)
    blocked.sendall(b"XREADGROUP GROUP g w1 BLOCK 0 STREAMS jobs >\r\n")
    half = raw(server)
    half.sendall(b"*2\r\n$4\r\nECHO\r\n$5\r\nhe")
    idle = pinged_connections(server, 5)
    wait_until(lambda: clients_info(server)["blocked_clients"] == 1, message="the reader to block")
    # The idle ones and admin went quiet after the other two were already waiting: once they
    # are parked, two sweeps have seen the blocked reader and the half command too.
    info = wait_parked(server, 6)
    assert info["parked_clients"] == 6
    half.sendall(b"llo\r\n")
    assert recv_reply(half) == b"$5\r\nhello\r\n"
    task_id = admin.xadd("jobs", {"job": 1})
    assert task_id in recv_reply(blocked)
    for sock in (blocked, half, *idle):
        sock.close()
    admin.close()


def test_sigterm_closes_parked_connections_cleanly(ezra_factory):
    server = ezra_factory()
    socks = pinged_connections(server, 10)
    wait_parked(server, 10)
    assert server.stop() == 0, server.log()
    assert "stopped cleanly" in server.log()
    for sock in socks:
        assert sock.recv(16) == b"", "the server closed the parked connection"
        sock.close()


def test_a_stop_after_parking_resuming_and_refusing_does_not_wait_out_the_grace(ezra_factory):
    """server.py counts every connection's greenlet until it ends, to wait for them at a stop: one
    counted for ever (resumed, refused, closed by its client) would hold each stop for the 5 s grace."""
    server = ezra_factory()
    socks = pinged_connections(server, 10)
    wait_parked(server, 10)
    each_answers(socks, b"PING\r\n", b"+PONG\r\n")  # each resumed in a new greenlet
    socks.pop().close()  # its greenlet ends with the connection
    refused = socket.create_connection(("127.0.0.1", server.port), timeout=30, source_address=("127.0.0.2", 0))
    assert refused.recv(16) == b"-DENIED EZRA is ", "protected mode: refused before any command"
    refused.close()
    started = time.monotonic()
    assert server.stop() == 0, server.log()
    took = time.monotonic() - started
    assert "stopped cleanly" in server.log()
    assert took < 4, f"the stop took {took:.1f} s: it waited for a greenlet that had ended"
    for sock in socks:
        assert sock.recv(16) == b"", "the server closed the idle connection"
        sock.close()


def test_many_parked_connections_all_answer(ezra_factory):
    """Enough to park at once that the sweep also hands the freed memory back (TRIM_AFTER_PARKING)."""
    server = ezra_factory()
    socks = pinged_connections(server, 300)
    wait_parked(server, 300)
    each_answers(socks, b"ECHO back\r\n", b"$4\r\nback\r\n")
    for sock in socks:
        sock.close()
    wait_until(lambda: clients_info(server)["connected_clients"] == 1,
               timeout=PARK_DEADLINE, message="every closed connection gone")
    assert "Traceback" not in server.log()


def test_tls_connections_park_and_resume(ezra_factory, certificates):
    """A TLS connection parks between TLS records; the session and the encryption carry on."""
    c = certificates
    server = ezra_factory("--tls-cert-file", str(c / "server.pem"), "--tls-key-file", str(c / "server.key"))

    def connect(protocol=2):
        return redis.Redis(host="localhost", port=server.port, protocol=protocol, ssl=True,
                           ssl_ca_certs=str(c / "ca.pem"), socket_timeout=30)

    clients = [connect(2), connect(3)]
    for client in clients:
        assert client.ping()
    task_id = clients[0].xadd("jobs", {"job": "x" * 20000})  # a reply of several TLS records after parking
    wait_parked(server, 2, connect)
    for client in clients:
        assert client.xrange("jobs") == [(task_id, {b"job": b"x" * 20000})]
        assert client.ping()
    for client in clients:
        client.close()
    assert "Traceback" not in server.log()


def test_clients_that_keep_going_quiet_get_every_reply(ezra_factory):
    """Churn: connections pause across sweeps (some mid-command) while others talk; parking and
    resuming race with data arriving, and every reply must still come back, whole and in order."""
    server = ezra_factory()
    failures, parked_seen = [], []

    def client(seed: int) -> None:
        rnd = random.Random(seed)
        with raw(server) as sock:
            sent = 0
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline and not failures:
                time.sleep(rnd.choice([0.0, 0.01, 1.1, 1.6, 2.2]))  # the long ones span a sweep or two
                names = [b"m%d-%d" % (seed, sent + j) for j in range(rnd.randint(1, 5))]
                request = b"".join(b"ECHO %s\r\n" % name for name in names)
                if rnd.random() < 0.2:  # half a command, a pause, the rest
                    cut = rnd.randint(1, len(request) - 1)
                    sock.sendall(request[:cut])
                    time.sleep(rnd.choice([0.01, 0.5]))
                    request = request[cut:]
                sock.sendall(request)
                expected = b"".join(b"$%d\r\n%s\r\n" % (len(name), name) for name in names)
                got = b""
                while len(got) < len(expected):
                    data = sock.recv(65536)
                    if not data:
                        break
                    got += data
                if got != expected:
                    failures.append((seed, expected, got))
                sent += len(names)

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(60)]
    for thread in threads:
        thread.start()
    with server.client() as observer:
        while any(thread.is_alive() for thread in threads):
            parked_seen.append(observer.info("clients")["parked_clients"])
            time.sleep(0.1)
    for thread in threads:
        thread.join()
    assert failures == []
    assert max(parked_seen) > 0, "no connection was ever parked: the churn tested nothing"
    wait_until(lambda: clients_info(server)["connected_clients"] == 1, timeout=PARK_DEADLINE,
               message="every client gone")
    assert clients_info(server)["parked_clients"] == 0
    assert "Traceback" not in server.log()
