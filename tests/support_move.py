"""What the tests of `ezra export` / `ezra import` share: the real program, redis-py clients
that leave XRANGE replies as they come, unique queue names."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import redis

from support_servers import ROOT


def ezra_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if not key.startswith("EZRA_")}
    return subprocess.run([sys.executable, "-m", "ezra", *args], cwd=ROOT, capture_output=True, text=True,
                          errors="replace", timeout=timeout, env=dict(env, PYTHONPATH=str(ROOT)))


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def raw_client(port: int, protocol: int = 2) -> redis.Redis:
    """redis-py with XRANGE replies left as they come: fields keep their order and repeats."""
    client = redis.Redis(port=port, protocol=protocol, socket_timeout=30)
    for command in ("XRANGE", "XREVRANGE", "XREADGROUP"):
        client.set_response_callback(command, lambda reply, **options: reply)
    return client


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"
