"""One client's long pipeline of big reads does not hold the other clients (issue 45, item 3).

A connection runs a read's commands one after another; after a slice of a few ms it lets the
loop serve the other clients before it goes on (INFO `pipeline_yields` counts those turns).
The replies stay byte for byte what the same commands answer one at a time, in RESP2 and RESP3.
"""

from __future__ import annotations

import re
import time

import pytest

from support_latency import Pinger
from support_resp import RespConnection, encode_command, parse_reply

READS = [["XPENDING", "q", "g", "-", "+", "{n}"], ["XRANGE", "q", "-", "+", "COUNT", "{n}"],
         ["XINFO", "STREAM", "q", "FULL", "COUNT", "{n}"]]


def fill(server, tasks: int) -> None:
    """`tasks` tasks in flight in queue q, held by worker w."""
    client = server.client()
    for start in range(0, tasks, 1000):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(start + 1000, tasks)):
            pipe.xadd("q", {"n": str(i), "pad": "x" * 40})
        pipe.execute()
    client.xgroup_create("q", "g", id="0")
    while client.xreadgroup("g", "w", {"q": ">"}, count=10000):
        pass
    client.close()


def pipeline_yields(conn: RespConnection) -> int:
    info = parse_reply(conn.call(["INFO", "stats"]))[0].value
    return int(re.search(rb"pipeline_yields:(\d+)", info).group(1))


def without_idle(reply: bytes) -> bytes:
    """The reply, XPENDING's idle times (the third item of each entry) blanked."""
    return re.sub(rb"(\*4\r\n\$\d+\r\n[\d-]+\r\n\$\d+\r\n\w+\r\n):\d+", rb"\1:0", reply)


def pipelined(conn: RespConnection, commands: list[list[str]]) -> bytes:
    """Every reply to `commands`, sent in one write, as the bytes read: up to the PONG of a PING
    sent after them (one look at the end per read, not a parse of what came so far)."""
    conn.send(b"".join(map(encode_command, [*commands, ["PING"]])))
    data = bytearray(conn.buffer)
    while not data.endswith(b"+PONG\r\n"):
        chunk = conn.sock.recv(1 << 20)
        assert chunk, "closed by the server"
        data += chunk
    conn.buffer = b""
    return bytes(data[:-len(b"+PONG\r\n")])


def split_replies(data: bytes) -> list[bytes]:
    replies, pos = [], 0
    while pos < len(data):
        end = parse_reply(data, pos)[1]
        replies.append(data[pos:end])
        pos = end
    return replies


@pytest.mark.parametrize("protocol", [2, 3], ids=["resp2", "resp3"])
def test_a_pipeline_of_big_reads_lets_the_others_in_and_answers_the_same(ezra_factory, protocol):
    server = ezra_factory("--visibility-timeout", "3600")
    fill(server, 600)
    conn, observer = RespConnection(server.port, timeout=60, protocol=protocol), RespConnection(server.port, timeout=60, protocol=2)
    commands = [[arg.format(n=600) for arg in read] for read in READS]
    alone = [pipelined(conn, [command]) for command in commands]
    assert all(len(reply) > 20_000 for reply in alone)  # big reads: each takes ms of the loop
    before = pipeline_yields(observer)
    piped = split_replies(pipelined(conn, commands * 16))  # 48 reads in one write
    turns = pipeline_yields(observer) - before
    # Each read takes a millisecond or more of the loop, so 48 of them pass the slice many times
    # (the old code ran them all in one go: no such field, no turn for anyone else).
    assert turns >= 3, turns
    for got, expected in zip(piped, alone * 16):  # byte for byte, in order (XPENDING's idle times move on)
        assert without_idle(got) == without_idle(expected)
    conn.close()
    observer.close()


@pytest.mark.slow
def test_a_ping_waits_for_one_big_read_not_the_whole_pipeline(ezra_factory):
    """Positive control: the pipeline's whole duration. A PING sent meanwhile waited all of it
    (issue 45: 4.9-6.5 s with 200,000 in flight); now at most about one read's own work."""
    server = ezra_factory("--visibility-timeout", "3600")
    fill(server, 50_000)
    for read in READS:
        command = [arg.format(n=10000) for arg in read]
        conn = RespConnection(server.port, timeout=60, protocol=2)
        started = time.perf_counter()
        single = pipelined(conn, [command])
        one_read = time.perf_counter() - started
        with Pinger(server.port) as pinger:
            started = time.perf_counter()
            replies = pipelined(conn, [command] * 64)
            whole = time.perf_counter() - started
        conn.close()
        assert without_idle(replies) == without_idle(single) * 64
        assert whole > 10 * one_read, (whole, one_read)  # the pipeline's work is long
        assert pinger.worst < whole / 4, (read[0], pinger.worst, whole, one_read)


@pytest.mark.parametrize("protocol", [2, 3], ids=["resp2", "resp3"])
def test_a_pick_among_many_leases_on_a_thread_answers_as_in_the_transaction(ezra_factory, protocol):
    """Over 10,000 tasks in flight, XPENDING's extended form and XINFO STREAM FULL's pending list
    are picked on a thread from a copy of the leases; inside EXEC (which cannot wait) in the
    transaction. Both answer the same bytes (XPENDING's idle times aside)."""
    server = ezra_factory("--visibility-timeout", "3600")
    fill(server, 10_050)
    conn = RespConnection(server.port, timeout=60, protocol=protocol)
    reads = [["XPENDING", "q", "g", "-", "+", "10000"], ["XPENDING", "q", "g", "5000", "+", "7", "w"],
             ["XPENDING", "q", "g", "IDLE", "0", "-", "+", "3"], ["XINFO", "STREAM", "q", "FULL", "COUNT", "600"]]
    apart = split_replies(pipelined(conn, reads))
    in_exec = split_replies(pipelined(conn, [["MULTI"], *reads, ["EXEC"]]))
    assert in_exec[:len(reads) + 1] == [b"+OK\r\n"] + [b"+QUEUED\r\n"] * len(reads)
    assert without_idle(in_exec[-1]) == without_idle(b"*%d\r\n" % len(reads) + b"".join(apart))
    assert apart[0].startswith(b"*10000\r\n") and apart[1].startswith(b"*7\r\n")
    conn.close()
