"""`ezra export` / `ezra import` carry a queue's XCFGSET settings: kept in the hash q::ezra-settings
in Redis (which enforces none of them) and set again with XCFGSET by the import. Real EZRA
servers, a real redis-server, the real `python -m ezra export|import` programs; XINFO STREAM read
back with redis-py in RESP2 and RESP3."""

from __future__ import annotations

import pytest

from support_move import ezra_cli, ok, raw_client, unique

# Every setting XCFGSET takes, none at the server's default (VISIBILITY-TIMEOUT, MAX-ATTEMPTS: the
# target server's flags differ from them too, so a value that arrives is the queue's own).
SET = ["VISIBILITY-TIMEOUT", "45", "MAX-ATTEMPTS", "4", "RETENTION", "FOREVER", "BACKOFF", "EXPONENTIAL", "1", "60",
       "RELEASE-ON-DISCONNECT", "2.5", "IDMP-DURATION", "50", "IDMP-MAXSIZE", "7", "PAUSED", "1",
       "MAX-IN-FLIGHT", "5", "RATE-LIMIT", "100", "60"]
SHOWN = {b"VISIBILITY-TIMEOUT": b"45", b"MAX-ATTEMPTS": b"4", b"RETENTION": b"forever",
         b"BACKOFF": b"exponential 1 60", b"RELEASE-ON-DISCONNECT": b"2.5", b"IDMP-DURATION": b"50",
         b"IDMP-MAXSIZE": b"7", b"PAUSED": b"1", b"MAX-IN-FLIGHT": b"5", b"RATE-LIMIT": b"100 60"}
FIELDS = [b"visibility-timeout", b"max-attempts", b"retention", b"backoff", b"release-on-disconnect",
          b"idmp-duration", b"idmp-maxsize", b"paused", b"max-in-flight", b"rate-limit"]


def stream_settings(port: int, queue: str, protocol: int) -> dict:
    """XINFO STREAM's settings fields, as text, through redis-py in `protocol` (its reply unparsed)."""
    client = raw_client(port, protocol)
    client.set_response_callback("XINFO STREAM", lambda reply, **options: reply)
    reply = client.execute_command("XINFO", "STREAM", queue)
    fields = reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2]))
    client.close()
    return {field: fields[field] if isinstance(fields[field], bytes) else str(fields[field]).encode()
            for field in FIELDS if field in fields}


@pytest.mark.parametrize("protocol", [2, 3])
def test_settings_survive_a_round_trip_through_redis(ezra_factory, redis_server_port, protocol):
    """Every setting of a queue goes to q::ezra-settings (a summary line says Redis enforces none),
    and an import into a server with other flags sets them again: XINFO STREAM shows the same."""
    source = ezra_factory("--visibility-timeout", "30", "--max-attempts", "3")
    target = ezra_factory("--visibility-timeout", "9", "--max-attempts", "8")
    src, red = raw_client(source.port, protocol), raw_client(redis_server_port)
    queue, plain = unique("limited"), unique("plain")
    src.execute_command("XCFGSET", queue, *SET)
    task_id = src.xadd(queue, {"n": "1"})
    src.xadd(plain, {"n": "2"})
    before = stream_settings(source.port, queue, protocol)
    assert set(before) == set(FIELDS)
    redis_url = f"redis://127.0.0.1:{redis_server_port}"

    dry = ok(ezra_cli("export", "--port", str(source.port), "--to", redis_url, "--dry-run", queue))
    assert red.exists(f"{queue}::ezra-settings") == 0 and "settings" not in dry.stdout

    out = ok(ezra_cli("export", "--port", str(source.port), "--to", redis_url, queue, plain))
    assert red.hgetall(f"{queue}::ezra-settings") == SHOWN
    line = next(text for text in out.stdout.splitlines() if text.startswith(f"{queue}: settings"))
    assert line == (f"{queue}: settings kept in {queue}::ezra-settings: VISIBILITY-TIMEOUT 45, MAX-ATTEMPTS 4, "
                    "RETENTION forever, BACKOFF exponential 1 60, RELEASE-ON-DISCONNECT 2.5, IDMP-DURATION 50, "
                    "IDMP-MAXSIZE 7, PAUSED 1, MAX-IN-FLIGHT 5, RATE-LIMIT 100 60; Redis enforces none of them")
    # a queue left at the server's flags: what applies now is kept (no limits: none listed)
    assert red.hgetall(f"{plain}::ezra-settings") == {
        b"VISIBILITY-TIMEOUT": b"30", b"MAX-ATTEMPTS": b"3", b"RETENTION": b"forever", b"BACKOFF": b"fixed 0",
        b"RELEASE-ON-DISCONNECT": b"off", b"IDMP-DURATION": b"100", b"IDMP-MAXSIZE": b"100", b"PAUSED": b"0"}

    into = ok(ezra_cli("import", "--port", str(target.port), "--from", redis_url, queue, plain))
    assert f"{queue}: settings from {queue}::ezra-settings: VISIBILITY-TIMEOUT 45," in into.stdout
    assert "; set with XCFGSET" in into.stdout
    assert stream_settings(target.port, queue, protocol) == before
    assert stream_settings(target.port, plain, protocol)[b"visibility-timeout"] == b"30"  # not the target's 9
    dst = raw_client(target.port, protocol)
    dst.xreadgroup("g", "w", {queue: ">"})
    assert in_flight(dst, queue) == 0, "still paused after the import: nothing handed out"
    dst.execute_command("XCFGSET", queue, "PAUSED", "0")  # positive control: the task is there to take
    dst.xreadgroup("g", "w", {queue: ">"})
    assert in_flight(dst, queue) == 1
    assert list(dst.execute_command("XRANGE", queue, "-", "+")[0])[0] == task_id


def in_flight(client, queue: str) -> int:
    reply = client.execute_command("XINFO", "STREAM", queue)
    return (reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2])))[b"in-flight"]

def test_a_settings_hash_ezra_cannot_take_is_refused_and_nothing_is_copied(ezra_factory, redis_server_port):
    """A field that is no setting, or a value XCFGSET refuses: the queue is reported, nothing copied."""
    target = ezra_factory()
    red = raw_client(redis_server_port)
    unknown, refused = unique("unknown"), unique("refused")
    for queue in (unknown, refused):
        red.xadd(queue, {"n": "1"})
    red.hset(f"{unknown}::ezra-settings", mapping={"MAX-IN-FLIGHT": "5", "SPEED": "fast"})
    red.hset(f"{refused}::ezra-settings", mapping={"MAX-IN-FLIGHT": "0", "PAUSED": "1"})
    redis_url = f"redis://127.0.0.1:{redis_server_port}"
    result = ezra_cli("import", "--port", str(target.port), "--from", redis_url, unknown, refused)
    assert result.returncode == 1
    assert f"{unknown}: its ::ezra-settings hash holds 'SPEED': not a setting XCFGSET takes" in result.stderr
    assert f"{refused}: XCFGSET refused its ::ezra-settings hash: ERR MAX-IN-FLIGHT" in result.stderr
    client = target.client()
    assert client.exists(unknown, refused) == 0, "nothing copied, no setting made"
    good = unique("good")  # positive control: the same hash with a valid value is taken
    red.xadd(good, {"n": "1"})
    red.hset(f"{good}::ezra-settings", mapping={"MAX-IN-FLIGHT": "5", "PAUSED": "1"})
    ok(ezra_cli("import", "--port", str(target.port), "--from", redis_url, good))
    assert client.xlen(good) == 1


def test_export_from_the_data_dir_says_the_settings_stay_behind(ezra_factory, redis_server_port):
    source = ezra_factory()
    src, red = source.client(), raw_client(redis_server_port)
    queue = unique("fromfile")
    src.execute_command("XCFGSET", queue, "MAX-IN-FLIGHT", "5")
    src.xadd(queue, {"n": "1"})
    result = ok(ezra_cli("export", "--data-dir", str(source.data_dir), "--to", f"redis://127.0.0.1:{redis_server_port}",
                         queue))
    assert f"{queue}: its settings (XCFGSET) are not carried from --data-dir" in result.stderr
    assert red.exists(f"{queue}::ezra-settings") == 0 and red.xlen(queue) == 1
