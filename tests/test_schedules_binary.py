"""Schedules in the one-file binary: cronsim and the zone data travel inside it (issue 26 item 2).

Slow: it builds (or reuses) the PyInstaller binary, as tests/test_binary.py does.
"""

from __future__ import annotations

import signal
import subprocess

import pytest
import redis

from conftest import wait_until
from test_binary import LISTENING, binary, isolated  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow


def test_a_schedule_in_a_zone_fires_from_the_binary_without_system_zone_data(isolated):  # noqa: F811
    log_path = isolated.parent / "ezra.log"
    with open(log_path, "w") as log:
        # PYTHONTZPATH at a directory with no zones: Europe/Paris can only come from the bundled tzdata
        proc = subprocess.Popen(
            [str(isolated), "--port", "0", "--schedule",
             "tick ticks '* * * * * *' TZ Europe/Paris SLOT-FIELD slot FIELDS job tick"],
            cwd=isolated.parent, env={"PYTHONTZPATH": str(isolated.parent)}, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT)
        try:
            def port():
                assert proc.poll() is None, log_path.read_text()
                match = LISTENING.search(log_path.read_text())
                return match and int(match.group(1))
            client = redis.Redis(port=wait_until(port, timeout=30, message="the binary to listen"),
                                 socket_timeout=10, retry=None)
            wait_until(lambda: client.xlen("ticks") >= 2, timeout=30, message="two firings")
            (_, fields), *_ = client.xrange("ticks")
            assert fields[b"job"] == b"tick" and fields[b"slot"].endswith((b"+01:00", b"+02:00"))
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(20) == 0, log_path.read_text()
