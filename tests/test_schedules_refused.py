"""A schedule whose queue cannot take a push (issue 45 item 9): refused at XSCHEDULE SET, and a
schedule whose pushes start failing later is logged once per failure episode, not once per slot.

Before, `XSCHEDULE SET` into such a queue answered OK, then logged one ERROR per slot (86,400 a
day for an every-second schedule).
"""

from __future__ import annotations

import sqlite3
import time

import pytest
import redis

from support_servers import wait_until
from ezra.storage.row_ranges import MAX_QUEUE_NUMBER

TOP_ID = "9223372036854775807-9223372036854775807"  # the last id EZRA can store (2**63-1, twice)


def xschedule(client, *args):
    return client.execute_command("XSCHEDULE", *args)


def listed(client) -> dict[bytes, dict]:
    """XSCHEDULE LIST as {name: {field: value}} (RESP2 flat pairs or RESP3 maps; field names as text)."""
    out = {}
    for item in xschedule(client, "LIST"):
        if isinstance(item, list):
            item = dict(zip(item[::2], item[1::2]))
        item = {(key.decode() if isinstance(key, bytes) else key): value for key, value in item.items()}
        out[item["name"]] = item
    return out


def error_lines(server) -> list[str]:
    return [line for line in server.log().splitlines() if " ERROR " in line]


def slots_pass(client, name: bytes, n: int) -> None:
    """Wait until the every-second schedule `name` has moved n slots past now."""
    until = time.time() * 1000 + n * 1000
    wait_until(lambda: listed(client)[name]["next-run"] > until, 30, message=f"{n} slots to pass")


def test_a_queue_whose_ids_are_used_up_is_refused_at_set(ezra_factory, protocol):
    server = ezra_factory()
    client = server.client(protocol)
    client.xadd("full", {"n": "last"}, id=TOP_ID)
    with pytest.raises(redis.ResponseError) as pushed:
        client.xadd("full", {"n": "more"})  # what each firing met
    assert "exhausted the last possible ID" in str(pushed.value)
    with pytest.raises(redis.ResponseError) as refused:
        xschedule(client, "SET", "tick", "full", "* * * * * *", "FIELDS", "job", "tick")
    assert str(refused.value) == ("schedule not set: a push to its queue 'full' is refused: The stream has "
                                  "exhausted the last possible ID, unable to add more items")
    assert b"tick" not in listed(client)
    # the control: the same schedule into a queue that takes pushes is set, and fires
    assert xschedule(client, "SET", "tick", "fine", "* * * * * *", "FIELDS", "job", "tick") in (b"OK", "OK")
    wait_until(lambda: client.xlen("fine") >= 2, 30, message="two firings")
    assert error_lines(server) == []


def test_a_queue_that_cannot_be_made_is_refused_at_set(ezra_factory):
    """The database holds the most queues it can (the last queue number taken, here by hand while
    stopped): a new queue cannot be made, so a schedule into one is refused."""
    server = ezra_factory()
    client = server.client()
    client.xadd("jobs", {"n": "1"})
    assert server.stop() == 0
    db = sqlite3.connect(server.data_dir / "ezra.db")
    with db:
        db.execute("UPDATE queues SET number = ? WHERE name = 'jobs'", (MAX_QUEUE_NUMBER,))
    db.close()
    server.start()
    client = server.client()
    with pytest.raises(redis.ResponseError, match="no new queue can be made"):
        client.xadd("new", {"n": "1"})  # what each firing met
    with pytest.raises(redis.ResponseError) as refused:
        xschedule(client, "SET", "tick", "new", "* * * * * *", "FIELDS", "job", "tick")
    assert str(refused.value) == (f"schedule not set: a push to its queue 'new' is refused: this database holds "
                                  f"the most queues it can ({MAX_QUEUE_NUMBER:,}); no new queue can be made")
    assert xschedule(client, "SET", "tick", "jobs", "* * * * * *", "FIELDS", "job", "tick") in (b"OK", "OK")
    wait_until(lambda: client.xlen("jobs") >= 3, 30, message="two firings into the queue that exists")
    assert error_lines(server) == []


def test_a_schedule_that_starts_failing_logs_once_and_once_when_it_works_again(ezra_factory):
    server = ezra_factory()
    client = server.client()
    xschedule(client, "SET", "tick", "later", "* * * * * *", "FIELDS", "job", "tick")
    wait_until(lambda: client.xlen("later") >= 1, 30, message="a firing")
    client.xadd("later", {"n": "last"}, id=TOP_ID)  # from now on every push to 'later' is refused
    slots_pass(client, b"tick", 4)
    failing = error_lines(server)
    assert len(failing) == 1, failing
    assert "schedule 'tick': pushes to 'later' are refused" in failing[0]
    pushed = listed(client)[b"tick"]["firings"]
    # the episode ends: the schedule, pointed at a queue that takes pushes, fires again
    xschedule(client, "SET", "tick", "fine", "* * * * * *", "FIELDS", "job", "tick")
    wait_until(lambda: client.xlen("fine") >= 2, 30, message="two firings into 'fine'")
    assert error_lines(server) == failing
    assert server.log().count("schedule 'tick' pushes to 'fine' again") == 1
    assert listed(client)[b"tick"]["firings"] >= 2 and pushed >= 1
