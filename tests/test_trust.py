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
