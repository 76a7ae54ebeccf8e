"""How long other clients wait while one client makes the server work: a PING sent over and over
from a process of its own (a thread of the test's process would share its GIL with the client
that parses the big replies, and time the test instead of the server)."""

from __future__ import annotations

import subprocess
import sys

PINGER = r"""
import socket, sys, threading, time
conn = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
worst = 0.0
print("ready", flush=True)
while not done.is_set():
    started = time.perf_counter()
    conn.sendall(b"PING\r\n")
    reply = b""
    while not reply.endswith(b"\r\n"):
        chunk = conn.recv(64)
        assert chunk, "closed by the server"
        reply += chunk
    assert reply == b"+PONG\r\n", reply
    worst = max(worst, time.perf_counter() - started)
    time.sleep(0.001)
print(worst, flush=True)
"""


class Pinger:
    """`with Pinger(port) as pinger: ...` pings while the block runs; `pinger.worst` is then the
    longest a PING waited for its PONG, in seconds."""

    def __init__(self, port: int):
        self.port = port
        self.worst: float | None = None
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Pinger":
        self.proc = subprocess.Popen([sys.executable, "-c", PINGER, str(self.port)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        return self

    def __exit__(self, *exc) -> None:
        out, _ = self.proc.communicate("", timeout=120)
        assert self.proc.returncode == 0, out
        self.worst = float(out.split()[-1])
