"""The lease renewals of EZRA's framework brokers (ezra.adapters.leases), against a real server."""

from __future__ import annotations

from ezra.adapters.leases import LeaseKeeper
from support_queue import claim, pending


def test_a_renewal_never_takes_over_a_task_the_server_gave_back(ezra_factory, protocol):
    """Worker a holds a task; the server restarts (every task in flight is available again) and
    worker b reads it. a's next heartbeat (XCLAIM by a with min-idle 0) must leave it with b, not
    take it over (which would run it twice at once and count an attempt), and stop renewing it."""
    server = ezra_factory()
    client = server.client(protocol)
    client.xadd("jobs", {"n": "1"})
    [(task_id, _)] = claim(client, "jobs", "a")
    keeper = LeaseKeeper(client, "g", "a", period=3600)
    keeper.hold("jobs", task_id.decode())
    try:
        keeper.renew()  # the positive control: the task is a's, so the heartbeat keeps it
        assert keeper.held() == [("jobs", task_id.decode())]
        assert [p["consumer"] for p in pending(client, "jobs")] == [b"a"]

        client.close()
        server.restart()
        client = keeper.client = server.client(protocol)
        assert [entry[0] for entry in claim(client, "jobs", "b")] == [task_id]
        keeper.renew()
        [held] = pending(client, "jobs")
        assert (held["consumer"], held["times_delivered"]) == (b"b", 2), held
        assert keeper.held() == [], "a lost lease is not renewed again"
    finally:
        keeper.stop()
        client.close()
