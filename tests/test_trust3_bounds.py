"""Issue 21, items 5, 6, 7, 10 and 15: what one name or one introspection call may cost.

redis-py in RESP2 and RESP3 against the real server. Tests poll with deadlines, never sleep
to synchronise; where a cost is checked, a structural figure is asserted (bytes written,
output size, another client's PING while the loop is busy) with a bound generous for a
loaded 2-core machine.
"""

from __future__ import annotations

import pytest
import redis
from conftest import wait_until
from support import claim, configure, pending

# ---------------------------------------------------------------- item 15: validate, then act

MALFORMED = {
    "xreadgroup": lambda q: ("XREADGROUP", "GROUP", "g", "leaver", "COUNT", "many", "STREAMS", q, ">"),
    "xclaim": lambda q: ("XCLAIM", q, "g", "leaver", "soon", "0-1"),
    "xautoclaim": lambda q: ("XAUTOCLAIM", q, "g", "leaver", "0", "0-0", "COUNT", "0"),
}


@pytest.mark.parametrize("command", sorted(MALFORMED))
def test_a_malformed_command_does_not_cancel_the_release_timer(shared_server, protocol, queue, command):
    """Before: the malformed command registered 'leaver' on the second connection, which
    cancelled the release and held the name: the task stayed in flight (never released)."""
    admin = shared_server.client(protocol)
    configure(admin, queue, "RELEASE-ON-DISCONNECT", "1")
    task_id = admin.xadd(queue, {"job": 1})
    worker, other = shared_server.client(protocol), shared_server.client(protocol)
    assert [i for i, _ in claim(worker, queue, "leaver")] == [task_id]
    worker.close()  # the release timer starts: 1 s of grace
    with pytest.raises(redis.ResponseError):
        other.execute_command(*MALFORMED[command](queue))
    wait_until(lambda: pending(admin, queue) == [], timeout=20, message="the release after the grace")
    assert [i for i, _ in claim(admin, queue, "next")] == [task_id]
    other.close()
    admin.close()


# ---------------------------------------------------------------- item 6: worker names are bounded

def database_bytes(r) -> int:
    return int(r.info("persistence")["database_bytes"])


def test_a_long_worker_name_is_refused_before_anything_is_written(shared_server, protocol, queue):
    """Before: a 1 MB name with COUNT 50 was copied into 50 rows (the file grew by ~50 MB)."""
    r = shared_server.client(protocol)
    for n in range(50):
        r.xadd(queue, {"n": n})
    before = database_bytes(r)
    huge = "w" * (1024 * 1024)
    for command in (("XREADGROUP", "GROUP", "g", huge, "COUNT", "50", "STREAMS", queue, ">"),
                    ("XCLAIM", queue, "g", huge, "0", "0-1"),
                    ("XAUTOCLAIM", queue, "g", huge, "0", "0-0")):
        with pytest.raises(redis.ResponseError, match=r"consumer name is 1048576 bytes long; EZRA takes "
                                                      r"at most 256"):
            r.execute_command(*command)
    assert pending(r, queue) == []
    assert r.xinfo_stream(queue)["available"] == 50
    assert database_bytes(r) - before < 1024 * 1024
    # 256 bytes is still a name; cleaning up under any name stays possible.
    assert len(claim(r, queue, "w" * 256, count=1)) == 1
    assert r.xpending_range(queue, "g", "-", "+", 10, consumername=huge) == []
    assert r.xgroup_delconsumer(queue, "g", huge) == 0
    r.close()
