"""A parked connection (idle, its greenlet ended: server.py) keeps only its socket and session.

Before, it kept its last request's bytes in its reader: a producer that pushed a 500 KB
task and went quiet held half a megabyte for as long as it stayed connected.
"""

from __future__ import annotations

import socket

from support_servers import wait_until

CLIENTS = 100
GROUP = 25  # producers that go quiet together
TASK_BYTES = 500 * 1024


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def info_field(client, name: str) -> int:
    return int(client.info()[name])


def test_parked_producers_do_not_keep_their_last_task(ezra_factory):
    server = ezra_factory()
    admin = server.client()
    admin.ping()
    baseline = rss_mb(server.proc.pid)
    payload = b"x" * TASK_BYTES
    clients = [server.client() for _ in range(CLIENTS)]
    try:
        # Producers going quiet at different times: each sweep parks fewer than the 100 after which
        # server.py trims the heap for the ended greenlets; the dropped buffers must be trimmed anyway.
        for start in range(0, CLIENTS, GROUP):
            for client in clients[start:start + GROUP]:
                assert client.xadd("footprint", {"blob": payload})
            wait_until(lambda: info_field(admin, "parked_clients") >= start + GROUP, timeout=30,
                       message=f"{start + GROUP} parked connections")
        # old code: +68 MB (100 readers of 500 KB, SQLite's page cache); now +17: the page cache
        # (16 MB at most) and the heap's slack
        seen = []
        try:
            wait_until(lambda: seen.append(rss_mb(server.proc.pid)) or seen[-1] < baseline + 30, timeout=10,
                       interval=0.2, message="the parked connections' buffers to be freed")
        finally:
            print(f"RSS {baseline:.1f} MB before the pushes, {seen[-1]:.1f} MB with them parked")
        # parked connections still work, and their caps came back with them
        assert clients[0].xadd("footprint", {"blob": payload})
        assert clients[1].xlen("footprint") == CLIENTS + 1
    finally:
        for client in clients:
            client.close()


def test_a_parked_connection_half_way_through_nothing_resumes_with_its_session(ezra_factory):
    """Name, protocol and a half-queued MULTI survive parking; the reader starts afresh."""
    server = ezra_factory()
    admin = server.client()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"HELLO 3 SETNAME parked-one\r\n")
        reply = b""
        while b"modules" not in reply:
            reply += sock.recv(65536)
        sock.sendall(b"MULTI\r\n")
        assert sock.recv(100) == b"+OK\r\n"
        sock.sendall(b"XADD q * f v\r\n")
        assert sock.recv(100) == b"+QUEUED\r\n"
        wait_until(lambda: info_field(admin, "parked_clients") >= 1, timeout=30, message="a parked connection")
        sock.sendall(b"CLIENT GETNAME\r\n")
        assert sock.recv(100) == b"+QUEUED\r\n"
        sock.sendall(b"EXEC\r\n")
        reply = b""
        while not reply.endswith(b"parked-one\r\n"):
            reply += sock.recv(65536)
        assert reply.startswith(b"*2\r\n$")  # RESP3 kept: the id as a bulk, then the name
