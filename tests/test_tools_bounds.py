"""Issue 21 item 12: the operator tools do not trust the server's replies.

`ezra stats`, `ls`, `ping` and `import --from` talk to a small hostile server (a socket in
this test) that answers every command with one of: an integer that is none (`:notanint`:
a ValueError traceback before), a bulk of 10^14 bytes (MemoryError), 100,000 nested
arrays (RecursionError), a well-formed reply of the wrong shape (a TypeError in `ezra ls`),
or a valid reply trickled a byte every 0.2 s (10 s for the first reply), which kept a
tool waiting past its --timeout (each recv got a byte in time). Each tool must exit non-zero
with one line on stderr, within its --timeout of the first byte it sent.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from support_servers import ROOT

TIMEOUT = 1.0  # the tools' --timeout
ANSWERS = {
    "not-an-integer": b":notanint\r\n",
    "huge-bulk": b"$99999999999999\r\n",
    "huge-array": b"*99999999999999\r\n",
    "deep-nesting": b"*1\r\n" * 100_000 + b":1\r\n",
    "bad-bulk-end": b"$3\r\nabcXY",
    "wrong-shape": b"*1\r\n:5\r\n",  # well formed, but no tool's reply is a list of one number
}
# A byte at a time, every TRICKLE_GAP: never late for one recv, but the first reply takes 10 s.
TRICKLE = (b"$41\r\n" + b"P" * 41 + b"\r\n") * 20
TRICKLE_GAP = 0.2


class HostileServer:
    """Accepts connections on a free port and answers whatever comes with `answer` (or trickles)."""

    def __init__(self, answer: bytes | None):
        self.answer = answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.first_request_at: float | None = None
        self.closing = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                while not self.closing.is_set():
                    if not conn.recv(65536):
                        return
                    if self.first_request_at is None:
                        self.first_request_at = time.monotonic()
                    if self.answer is not None:
                        conn.sendall(self.answer)
                        continue
                    for i in range(len(TRICKLE)):
                        if self.closing.wait(TRICKLE_GAP):
                            return
                        conn.sendall(TRICKLE[i:i + 1])
            except OSError:
                return  # the tool hung up: what it should do

    def close(self) -> None:
        self.closing.set()
        self.listener.close()


def tool_args(tool: str, port: int, ezra_port: int) -> list[str]:
    reach = ["--host", "127.0.0.1", "--port", str(port), "--timeout", str(TIMEOUT)]
    return {
        "stats": ["stats", *reach],
        "ls": ["ls", "q", *reach],
        "ping": ["ping", "--bind", "127.0.0.1", "--port", str(port), "--timeout", str(TIMEOUT)],
        "import": ["import", "--host", "127.0.0.1", "--port", str(ezra_port), "--timeout", str(TIMEOUT),
                   "--from", f"redis://127.0.0.1:{port}", "q"],
    }[tool]


def run_tool(args: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("EZRA_PASSWORD", None)
    result = subprocess.run([sys.executable, "-m", "ezra", *args], capture_output=True, text=True, env=env,
                            cwd=str(ROOT), timeout=60)
    return result, time.monotonic()


TOOLS = ["stats", "ls", "ping", "import"]


@pytest.mark.parametrize("answer", sorted(ANSWERS))
@pytest.mark.parametrize("tool", TOOLS)
def test_a_hostile_reply_is_one_line_and_a_failure(tool, answer, shared_server):
    server = HostileServer(ANSWERS[answer])
    try:
        result, _ = run_tool(tool_args(tool, server.port, shared_server.port))
    finally:
        server.close()
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0, result
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    if answer != "wrong-shape":  # the tool knows what it asked for, not where the reply went wrong
        assert f"127.0.0.1:{server.port}" in lines[0], lines[0]


@pytest.mark.parametrize("tool", TOOLS)
def test_a_trickling_server_does_not_hold_a_tool_past_its_timeout(tool, shared_server):
    server = HostileServer(None)
    try:
        result, ended = run_tool(tool_args(tool, server.port, shared_server.port))
    finally:
        server.close()
    assert result.returncode != 0, result
    assert server.first_request_at is not None, result.stderr
    waited = ended - server.first_request_at
    # --timeout from the first request; 3 s more for a loaded machine to end the process
    assert waited < TIMEOUT + 3, (waited, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "in time" in lines[0], result.stderr[-2000:]
