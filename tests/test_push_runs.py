"""A pipeline's run of plain XADDs to one queue is worked as one request (commands/runs.py):
each command still gets the reply XADD gives it alone, in order, errors included.

The real server is driven with raw RESP (the replies compared byte for byte, ids aside) and
with redis-py; the storage's row ids and the error that fails a whole run are checked in
process. Speed itself is measured by scripts/bench.py, never here.
"""

from __future__ import annotations

import re

import pytest

from support import wait_until
from support_resp import RespConnection, blocked_clients, encode_command

LIMIT = 1024  # --max-task-size of these servers: a task over it is refused inside a run

# Runs (plain XADDs to q), broken by everything that is not one: an odd field count, a task over
# the limit, another queue, an option, another spelling, the dead view, another command.
MIXED = [
    ["XADD", "q", "*", "n", "0"], ["XADD", "q", "*", "n", "1"], ["xadd", "q", "*", "n", "2"],
    ["XADD", "q", "*", "n"],
    ["XADD", "q", "*", "n", "3", "big", "x" * (LIMIT + 1)],
    ["XADD", "q", "*", "n", "4"], ["XADD", "q", "*", "n", "5", "m", "6"],
    ["XADD", "other", "*", "n", "7"], ["XADD", "other", "*", "n", "8"],
    ["XADD", "q", "NOMKSTREAM", "*", "n", "9"], ["XADD", "q", "*", "n", "10"],
    ["Xadd", "q", "*", "n", "11"], ["XADD", "q", "*", "n", "12"],
    ["XADD", "q::dead", "*", "n", "13"], ["XADD", "q::dead", "*", "n", "14"],
    ["XADD", "q", "*", "n", "15"], ["XADD", "q", "*", "n", "16"], ["XLEN", "q"],
    ["XADD", "q", "*", "n", "17"], ["XADD", "q", "*", "n", "18"],
]
ID_REPLY = re.compile(rb"^\$\d+\r\n(\d+)-(\d+)\r\n$")


def replies_of(conn: RespConnection, commands: list[list[str]], pipelined: bool) -> list[bytes]:
    if pipelined:
        conn.send(b"".join(map(encode_command, commands)))
        return [conn.read_reply() for _ in commands]
    return [conn.call(command) for command in commands]


def shapes(replies: list[bytes]) -> list[bytes]:
    """The replies with each id as ID (ids are times): the rest byte for byte."""
    return [b"ID" if ID_REPLY.match(reply) else reply for reply in replies]


def stored(conn: RespConnection) -> list[bytes]:
    """What each queue holds, ids aside."""
    return [re.sub(rb"\$\d+\r\n\d+-\d+\r\n", b"ID", conn.call(["XRANGE", name, "-", "+"]))
            for name in ("q", "other", "q::dead")]


@pytest.mark.parametrize("resp3", [False, True], ids=["resp2", "resp3"])
def test_a_pipeline_of_pushes_answers_as_the_same_commands_one_at_a_time(ezra_factory, resp3):
    answers, contents = [], []
    for pipelined in (False, True):
        conn = RespConnection(ezra_factory("--max-task-size", str(LIMIT)).port)
        if resp3:
            conn.call(["HELLO", "3"])
        replies = replies_of(conn, MIXED, pipelined)
        ids = [tuple(map(int, ID_REPLY.match(reply).groups()))
               for command, reply in zip(MIXED, replies) if command[1] == "q" and ID_REPLY.match(reply)]
        assert ids == sorted(ids) and len(set(ids)) == len(ids) == 13, "q's ids in the order its pushes were sent"
        answers.append(shapes(replies))
        contents.append(stored(conn))
    assert answers[1] == answers[0]
    assert contents[1] == contents[0]
    assert answers[0].count(b"ID") == 17
    assert answers[0][17] == b":11\r\n"


# Placed pushes (PRIORITY, PARTITION and nothing else) make runs too, plain ones joining them; every
# other shape is XADD's alone, with its error: a priority out of range, an option twice, an empty or
# long key, another option beside them, no field after the `*`.
PLACED = [
    ["XADD", "q", "PRIORITY", "7", "*", "n", "0"], ["XADD", "q", "*", "n", "1"],
    ["XADD", "q", "priority", "0", "*", "n", "2"], ["XADD", "q", "PARTITION", "a", "*", "n", "3"],
    ["XADD", "q", "PARTITION", "a", "PRIORITY", "0", "*", "n", "4"],
    ["XADD", "q", "PRIORITY", "1", "partition", "b", "*", "n", "5"],
    ["XADD", "q", "PRIORITY", "10", "*", "n", "x"], ["XADD", "q", "PRIORITY", "-1", "*", "n", "x"],
    ["XADD", "q", "PRIORITY", "01", "*", "n", "x"], ["XADD", "q", "PRIORITY", "1", "PRIORITY", "2", "*", "n", "x"],
    ["XADD", "q", "PRIORITY", "3", "*", "n", "6"],
    ["XADD", "q", "PARTITION", "", "*", "n", "x"], ["XADD", "q", "PARTITION", "k" * 257, "*", "n", "x"],
    ["XADD", "q", "PARTITION", "k" * 256, "*", "n", "7"], ["XADD", "q", "PARTITION", "*", "*", "n", "8"],
    ["XADD", "q", "PRIORITY", "2", "*", "n"], ["XADD", "q", "PRIORITY", "2", "*"],
    ["XADD", "q", "PRIORITY", "2", "*", "n", "9", "big", "x" * (LIMIT + 1)],
    ["XADD", "q", "PRIORITY", "2", "UNIQUE", "u", "*", "n", "10"], ["XADD", "q", "PRIORITY", "4", "*", "n", "11"],
    ["XADD", "q", "PRIORITY", "4", "DELAY", "0", "*", "n", "12"], ["XADD", "q", "PRIORITY", "2", "0-1", "n", "x"],
    ["XADD", "other", "PRIORITY", "0", "*", "n", "13"], ["XADD", "q", "PARTITION", "b", "*", "n", "14"],
    ["XADD", "q::dead", "PRIORITY", "0", "*", "n", "15"], ["XADD", "q", "PRIORITY", "9", "*", "n", "16"],
]


@pytest.mark.parametrize("resp3", [False, True], ids=["resp2", "resp3"])
def test_pipelined_pushes_with_priority_or_partition_answer_and_order_as_one_at_a_time(ezra_factory, resp3):
    """The replies byte for byte (ids aside), what each queue holds, and the claim order the stored
    priorities and partitions give (PARTITION-LIMIT 1: one task of a partition at a time)."""
    answers, contents, orders = [], [], []
    for pipelined in (False, True):
        conn = RespConnection(ezra_factory("--max-task-size", str(LIMIT)).port)
        if resp3:
            conn.call(["HELLO", "3"])
        answers.append(shapes(replies_of(conn, PLACED, pipelined)))
        contents.append(stored(conn))
        conn.call(["XGROUP", "CREATE", "q", "g", "0"])
        claimed = [conn.call(["XREADGROUP", "GROUP", "g", "w", "COUNT", "100", "STREAMS", "q", ">"])]
        orders.append([re.sub(rb"\$\d+\r\n\d+-\d+\r\n", b"ID", reply) for reply in claimed])
    assert answers[1] == answers[0]
    assert contents[1] == contents[0]
    assert orders[1] == orders[0]
    assert answers[0].count(b"ID") == 16  # the control: 16 stored, 10 refused
    names = re.findall(rb"\$1\r\nn\r\n\$\d+\r\n(\d+)\r\n", orders[0][0])
    # priority 0: 2 (no partition) and 4 (a); 1: 5 (b); 2: 10 (with UNIQUE); 3: 6; 4: 11, 12; 5: 1, 7, 8;
    # 7: 0; 9: 16. Partition a's 3 and b's 14 wait for their partition's task in flight.
    assert names == [b"2", b"4", b"5", b"10", b"6", b"11", b"12", b"1", b"7", b"8", b"0", b"16"]


def test_pipelined_pushes_with_priority_and_partition_are_one_request(ezra_factory):
    """20 pipelined XADDs with PRIORITY and PARTITION: one writer request, each task in its place."""
    client = ezra_factory().client(2)
    client.xgroup_create("q", "g", "0", mkstream=True)
    client.execute_command("XCFGSET", "q", "PARTITION-LIMIT", "20")
    used = []
    for _ in range(3):  # the reaper commits a pass of its own now and then: the least of three counts
        before = client.info("persistence")["committed_requests"]
        pipe = client.pipeline(transaction=False)
        for i in range(20):
            pipe.execute_command("XADD", "q", "PRIORITY", 9 - i % 10, "PARTITION", f"p{i % 3}", "*", "n", i)
        pushed = pipe.execute()
        used.append(client.info("persistence")["committed_requests"] - before)
        claimed = client.xreadgroup("g", "w", {"q": ">"}, count=100)[0][1]
        assert [int(fields[b"n"]) for _, fields in claimed] == sorted(range(20), key=lambda i: (9 - i % 10, i))
        assert client.xack("q", "g", *pushed) == 20
    assert min(used) == 1, f"20 pipelined pushes took {used} requests"


def test_short_pushes_in_a_run_get_xadds_arity_error(ezra_factory):
    """XADD with too few arguments, pipelined beside plain ones: XADD's own error, the connection kept."""
    conn = RespConnection(ezra_factory().port)
    commands = [["XADD"], ["XADD", "q"], ["XADD", "q", "*"], ["XADD", "q", "*", "n"], ["XADD", "q", "*", "n", "0"],
                ["XADD"], ["XADD", "q", "*", "n", "1"], ["XADD", "q", "*", "n", "2"], ["XLEN", "q"]]
    replies = shapes(replies_of(conn, commands, pipelined=True))
    arity = b"-ERR wrong number of arguments for 'xadd' command\r\n"
    assert replies == [arity] * 4 + [b"ID", arity, b"ID", b"ID", b":3\r\n"]


def test_pushes_to_one_queue_in_one_pipeline_are_one_request(ezra_factory):
    """20 pipelined XADDs: one writer request (20 before: a Request, a Deferred and an INSERT each)."""
    client = ezra_factory().client(2)
    client.xgroup_create("q", "g", "0", mkstream=True)
    used = []
    for _ in range(3):  # the reaper commits a pass of its own now and then: the least of three counts
        before = client.info("persistence")["committed_requests"]
        pipe = client.pipeline(transaction=False)
        for i in range(20):
            pipe.xadd("q", {"n": str(i)})
        pushed = pipe.execute()
        used.append(client.info("persistence")["committed_requests"] - before)
        claimed = client.xreadgroup("g", "w", {"q": ">"}, count=100)[0][1]
        assert [(task_id, fields[b"n"]) for task_id, fields in claimed] == \
            [(task_id, str(i).encode()) for i, task_id in enumerate(pushed)]
        assert client.xack("q", "g", *pushed) == 20
    assert min(used) == 1, f"20 pipelined pushes took {used} requests"


def test_a_blocked_worker_gets_the_first_task_of_a_run(ezra_factory):
    server = ezra_factory()
    client = server.client(2)
    client.xgroup_create("q", "g", "$", mkstream=True)
    worker = RespConnection(server.port)
    worker.send(encode_command(["XREADGROUP", "GROUP", "g", "w1", "COUNT", "1", "BLOCK", "4000", "STREAMS", "q", ">"]))
    admin = RespConnection(server.port)
    wait_until(lambda: blocked_clients(admin) == 1, message="the worker to block")
    pipe = client.pipeline(transaction=False)
    for i in range(3):
        pipe.xadd("q", {"n": str(i)})
    pushed = pipe.execute()
    assert pushed[0] in worker.read_reply()
    rest = client.xreadgroup("g", "w2", {"q": ">"}, count=10)[0][1]
    assert [task_id for task_id, _ in rest] == pushed[1:]


def test_pushes_inside_multi_are_queued_and_before_auth_refused(ezra_factory):
    server = ezra_factory("--password", "s3cret")
    conn = RespConnection(server.port)
    before_auth = [["XADD", "q", "*", "a", "1"], ["XADD", "q", "*", "a", "2"], ["AUTH", "s3cret"],
                   ["MULTI"], ["XADD", "q", "*", "a", "3"], ["XADD", "q", "*", "a", "4"], ["EXEC"],
                   ["XADD", "q", "*", "a", "5"], ["XADD", "q", "*", "a", "6"], ["XLEN", "q"]]
    replies = shapes(replies_of(conn, before_auth, pipelined=True))
    assert [reply[:7] for reply in replies[:2]] == [b"-NOAUTH"] * 2
    assert replies[2:6] == [b"+OK\r\n", b"+OK\r\n", b"+QUEUED\r\n", b"+QUEUED\r\n"]
    assert re.match(rb"^\*2\r\n(\$\d+\r\n\d+-\d+\r\n){2}$", replies[6])
    assert replies[7:] == [b"ID", b"ID", b":4\r\n"]


def test_a_run_on_a_queue_whose_ids_are_exhausted_answers_each_push_the_error(ezra_factory):
    conn = RespConnection(ezra_factory().port)
    top = "%d-%d" % (2 ** 63 - 1, 2 ** 63 - 1)
    assert conn.call(["XADD", "q", top, "a", "0"]) == b"$%d\r\n%s\r\n" % (len(top), top.encode())
    alone = conn.call(["XADD", "q", "*", "a", "1"])
    assert alone.startswith(b"-ERR The stream has exhausted the last possible ID")
    replies = replies_of(conn, [["XADD", "q", "*", "a", "2"], ["XADD", "q", "*", "a", "3"], ["XLEN", "q"]], True)
    assert replies == [alone, alone, b":1\r\n"]


# ---------------------------------------------------------------- in process: rows and a failed run

def test_the_row_ids_a_run_gets_are_the_rows_it_wrote(tmp_path):
    """insert_available's ids are the rows' own, in the queue's range of row ids: after deletions
    at the top (row ids used again), and beside another queue's pushes."""
    from ezra.storage import open_database

    db = open_database(str(tmp_path / "data"))
    try:
        def rows_of(ids: list[tuple]) -> list[int]:
            return [db.conn.execute("SELECT rowid FROM tasks WHERE queue = 'q' AND id_ms = ? AND id_seq = ?",
                                    task_id).fetchone()[0] for task_id in ids]

        def push(ms: int) -> None:
            tasks = [(ms, seq, b"*2\r\n$1\r\nn\r\n$1\r\nv\r\n") for seq in range(5)]
            db.begin()
            rowids = list(db.insert_available(b"q", tasks, 1))
            db.insert_available(b"other", tasks, 1)
            db.commit()
            assert rowids == rows_of([task[:2] for task in tasks])
            low, high = db.span(b"q")
            assert all(low <= rowid <= high for rowid in rowids)

        db.begin()
        db.insert_queue(b"q", 1)
        db.insert_queue(b"other", 1)
        db.commit()
        push(1)
        db.conn.execute("DELETE FROM tasks WHERE id_seq >= 3")  # the top rows go: their ids come back
        push(2)
        push(3)
    finally:
        db.close()


def test_a_run_whose_batch_rolls_back_answers_each_push_the_error(clocked_broker):
    """A run is one request: when its batch fails, the error is the reply of every push in it."""
    from support_queue import submit_broken_request

    import socket

    from gevent import socket as gevent_socket

    from ezra.commands import Deferred
    from ezra.front.connection import Connection
    from ezra.front.gate import Gate
    from ezra.protocol.resp import Replies
    from ezra.front.session import ServerState

    request = clocked_broker.tasks.push(b"q", [b"*2\r\n$1\r\nn\r\n$1\r\nv\r\n"] * 3)
    submit_broken_request(clocked_broker)  # the same batch: it rolls back whole
    server_end, client_end = gevent_socket.socketpair()  # a connection's socket is gevent's
    with server_end, client_end:
        settings = clocked_broker.settings
        conn = Connection(ServerState(clocked_broker, settings), server_end, "test:1", Gate(settings))
        conn.replies, conn.reads = [(2, Deferred(request, Replies, replies=3)), (2, 7)], 0
        conn.flush()  # waits for the batch, then sends the replies on the socket
        server_end.shutdown(socket.SHUT_WR)
        sent = []
        while chunk := client_end.recv(65536):
            sent.append(chunk)
    error = re.escape(b"-ERR storage error")
    assert re.match(rb"^(%s[^\r\n]*\r\n){3}:7\r\n$" % error, b"".join(sent)), sent
    assert clocked_broker.db.conn.execute("SELECT count(*) FROM tasks").fetchone()[0] == 0

