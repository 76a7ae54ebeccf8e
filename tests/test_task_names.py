"""Task names (XADD ... NAME name, XRESULT queue NAME name): a task's own name, unique in its queue for
as long as its row exists, whatever its state; a push whose name is taken answers the existing task's
id and stores nothing (get-or-create). Through real servers with redis-py in RESP2 and RESP3: each
state, kill -9, the name freed with its row (XDEL, XACKDEL, TTL), XRESULT NAME with and without BLOCK,
the errors, how NAME combines with the other options, a schema-17 file's upgrade, a hand-written
duplicate, and the frameworks' result slots, which find their slot by name now, not by IDMP."""

from __future__ import annotations

import sqlite3
import threading

import pytest
import redis

from support_queue import blocked, claim, configure
from support_servers import wait_until
from ezra.adapters.result_slots import ResultSlots


def push(r, queue, name, *options, fields=("n", "1"), task_id="*"):
    return r.execute_command("XADD", queue, *options, "NAME", name, task_id, *fields)


def outcome(r, queue, *task) -> dict:
    """XRESULT queue <id> / XRESULT queue NAME <name> [BLOCK ms], as a dict keyed by text (RESP2 and RESP3)."""
    reply = r.execute_command("XRESULT", queue, *task)
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    return {key.decode(): value for key, value in pairs}


def tasks(r, queue, state="unfinished") -> list[dict]:
    reply = r.execute_command("XINFO", "TASKS", queue, state, "COUNT", 1000)
    return [t if isinstance(t, dict) else dict(zip(t[::2], t[1::2])) for t in reply]


def xinfo_stream(r, queue) -> dict:
    info = r.execute_command("XINFO", "STREAM", queue)
    return info if isinstance(info, dict) else dict(zip(info[::2], info[1::2]))


def ids_of(entries) -> list[bytes]:
    return [task_id for task_id, _ in entries]


def test_a_name_answers_its_task_in_every_state_and_stores_nothing_more(r, queue):
    first = push(r, queue, "report-7", fields=("v", "1"))
    assert push(r, queue, "report-7", fields=("v", "2")) == first  # available
    assert r.xlen(queue) == 1 and tasks(r, queue)[0][b"fields"] == [b"v", b"1"]  # the first's fields stay
    assert outcome(r, queue, "NAME", "report-7") == outcome(r, queue, first) == {
        "state": b"available", "result": None, "progress": None, "attempts": 0, "failure-reason": None,
        "name": b"report-7"}
    assert ids_of(claim(r, queue)) == [first]
    assert push(r, queue, "report-7") == first  # in flight
    assert r.execute_command("XACK", queue, "g", first, "RESULT", "42") == 1
    assert push(r, queue, "report-7") == first  # done: the name stays with the row (UNIQUE's key would not)
    assert outcome(r, queue, "NAME", "report-7")["result"] == b"42"
    delayed = push(r, queue, "later", "DELAY", 3600)
    assert push(r, queue, "later", "DELAY", 5) == delayed and tasks(r, queue, "delayed")[0][b"name"] == b"later"
    waiting = push(r, queue, "after", "AFTER", 1, queue, delayed)
    assert push(r, queue, "after") == waiting and outcome(r, queue, "NAME", "after")["state"] == b"waiting"
    dying = push(r, queue, "dies")
    assert ids_of(claim(r, queue)) == [dying]
    assert r.execute_command("XNACK", queue, "g", "FATAL", "IDS", 1, dying) == 1
    assert push(r, queue, "dies") == dying  # dead
    assert r.execute_command("XADD", f"{queue}::dead", "NAME", "dies", "*", "n", "1") == dying
    assert outcome(r, queue, "NAME", "dies")["state"] == b"dead"
    assert r.xlen(queue) == 2 and r.xlen(f"{queue}::dead") == 1  # delayed + waiting; one dead; nothing more
    # XINFO TASKS shows each task's name; plain pushes have none, and another queue has its own names
    plain = r.xadd(queue, {"n": "plain"})
    assert {t[b"id"]: t[b"name"] for t in tasks(r, queue)} == {delayed: b"later", waiting: b"after", plain: None}
    assert tasks(r, queue, "done")[0][b"name"] == b"report-7"
    push(r, f"{queue}-other", "report-7")
    assert r.xlen(f"{queue}-other") == 1 and outcome(r, f"{queue}-other", "NAME", "report-7")["state"] == b"available"
    assert "name" not in outcome(r, queue, plain)  # an unnamed task's map is as it was before names


def test_binary_names_and_explicit_ids(r, queue):
    binary = b"\xff\x00name\r\n"
    task_id = push(r, queue, binary, task_id="5-1")
    assert task_id == b"5-1"
    assert push(r, queue, binary, task_id="9-1") == b"5-1"  # taken: its id, whatever id was asked
    assert outcome(r, queue, "NAME", binary)["name"] == binary
    assert push(r, queue, b"other", task_id="9-1") == b"9-1"


def test_the_name_is_free_again_once_its_row_is_gone(r, queue):
    cancelled = push(r, queue, "a")
    assert r.xdel(queue, cancelled) == 1  # available: XDEL deletes it
    again = push(r, queue, "a")
    assert again != cancelled
    assert ids_of(claim(r, queue)) == [again]
    assert r.execute_command("XACKDEL", queue, "g", "IDS", 1, again) == [1]
    third = push(r, queue, "a")
    assert third not in (cancelled, again)
    assert ids_of(claim(r, queue)) == [third]
    r.execute_command("XNACK", queue, "g", "FATAL", "IDS", 1, third)
    assert push(r, queue, "a") == third  # the control: dead, it still holds the name
    assert r.xdel(f"{queue}::dead", third) == 1
    assert push(r, queue, "a") not in (cancelled, again, third)
    with pytest.raises(redis.ResponseError, match="no task named 'gone'"):
        outcome(r, queue, "NAME", "gone")


def test_a_ttl_frees_the_name_with_the_row(ezra_factory, protocol):
    server = ezra_factory()
    r = server.client(protocol)
    first = push(r, "ttl", "slot", "TTL", 1)
    assert ids_of(claim(r, "ttl")) == [first]
    assert r.execute_command("XACK", "ttl", "g", first, "RESULT", "v") == 1
    assert push(r, "ttl", "slot") == first  # the control: done, kept for its TTL, the name held

    def gone():
        try:
            outcome(r, "ttl", "NAME", "slot")
        except redis.ResponseError as exc:
            assert "no task named 'slot' in queue 'ttl'" in str(exc)
            return True
        return False

    wait_until(gone, timeout=30, message="the TTL to remove the done task")
    assert push(r, "ttl", "slot") != first


def test_names_survive_kill_9_and_restart(ezra_factory, protocol):
    server = ezra_factory()
    r = server.client(protocol)
    named = {state: push(r, "durable", state) for state in ("in-flight", "done", "dead", "available")}
    [leased, acked, dying] = ids_of(claim(r, "durable", count=3))
    assert [leased, acked, dying] == [named["in-flight"], named["done"], named["dead"]]
    assert r.execute_command("XACK", "durable", "g", acked, "RESULT", "r") == 1
    assert r.execute_command("XNACK", "durable", "g", "FATAL", "IDS", 1, dying) == 1
    server.kill9()
    server.start()
    r = server.client(protocol)
    for name, task_id in named.items():
        assert push(r, "durable", name) == task_id
    assert outcome(r, "durable", "NAME", "done")["result"] == b"r"
    assert outcome(r, "durable", "NAME", "in-flight")["state"] == b"available"  # the restart gave it back
    assert r.xlen("durable") == 2 and r.xlen("durable::dead") == 1


class BlockedResult:
    """XRESULT queue NAME name BLOCK ms in a thread, on a connection of its own."""

    def __init__(self, server, protocol, queue, name):
        self.reply = self.error = None
        self.done = threading.Event()
        client = server.client(protocol)

        def run():
            try:
                self.reply = outcome(client, queue, "NAME", name, "BLOCK", 20000)
            except Exception as exc:  # reported by the test
                self.error = exc
            finally:
                client.close()
                self.done.set()
        threading.Thread(target=run, daemon=True).start()


def test_xresult_name_block_is_woken_by_the_ack(shared_server, protocol, queue):
    r = shared_server.client(protocol)
    task_id = push(r, queue, "job")
    claim(r, queue)
    before = blocked(r)
    waiting = BlockedResult(shared_server, protocol, queue, "job")
    wait_until(lambda: blocked(r) >= before + 1, message="XRESULT NAME BLOCK to wait")
    assert not waiting.done.is_set()  # the control: it waits while the task is in flight
    assert r.execute_command("XACK", queue, "g", task_id, "RESULT", "42") == 1
    assert waiting.done.wait(30), "XRESULT NAME BLOCK was not woken by the ack"
    assert waiting.error is None, waiting.error
    assert waiting.reply == {"state": b"done", "result": b"42", "progress": None, "attempts": 1,
                             "failure-reason": None, "name": b"job"}
    # ended already: BLOCK answers at once
    assert outcome(r, queue, "NAME", "job", "BLOCK", 0)["state"] == b"done"
    assert outcome(r, queue, "NAME", "job", "BLOCK", 10)["result"] == b"42"


def test_errors_say_what_is_wrong_and_store_nothing(r, queue):
    cases = [(["XADD", queue, "NAME", "a", "NAME", "b", "*", "n", "1"], "NAME specified multiple times"),
             (["XADD", queue, "NAME", "", "*", "n", "1"], "NAME requires a non-empty name"),
             (["XADD", queue, "NAME", "x" * 257, "*", "n", "1"], "NAME is 257 bytes long; at most 256 bytes"),
             (["XADD", queue, "NAME", "a", "*"], "wrong number of arguments for 'xadd' command")]
    for command, message in cases:
        with pytest.raises(redis.ResponseError) as raised:
            r.execute_command(*command)
        assert str(raised.value) == message
    assert r.exists(queue) == 0  # nothing stored, not even the queue
    push(r, queue, "x" * 256)  # the bound itself is fine
    for command, message in [(["XRESULT", queue, "NAME", "nobody"],
                              f"no task named 'nobody' in queue '{queue}' (never pushed, or removed: "
                              "retention, TTL, XTRIM, XDEL)"),
                             (["XRESULT", f"{queue}-none", "NAME", "a"], f"no such queue '{queue}-none'"),
                             (["XRESULT", queue, "NAME"], "syntax error"),
                             (["XRESULT", queue, "NAME", "a", "BLOCK"], "syntax error"),
                             (["XRESULT", queue, "NAME", "x" * 256, "WAIT", "5"], "syntax error")]:
        with pytest.raises(redis.ResponseError) as raised:
            r.execute_command(*command)
        assert str(raised.value) == message


def test_name_with_the_other_options(r, queue):
    """NAME is looked up first: a name taken answers its task whatever the rest; a free name leaves the
    push as it is without it (IDMP, UNIQUE answer their own ids then, and the name stays free)."""
    idmp = r.execute_command("XADD", queue, "IDMP", "p", "i1", "NAME", "n1", "*", "n", "1")
    assert r.execute_command("XADD", queue, "IDMP", "p", "i1", "NAME", "n1", "*", "n", "1") == idmp
    assert r.execute_command("XADD", queue, "IDMP", "p", "i1", "NAME", "n2", "*", "n", "1") == idmp  # IDMP's
    with pytest.raises(redis.ResponseError, match="no task named 'n2'"):
        outcome(r, queue, "NAME", "n2")  # IDMP answered: nothing stored, the name not taken
    assert r.execute_command("XADD", queue, "IDMP", "p", "i2", "NAME", "n1", "*", "n", "1") == idmp  # the name's
    held = r.execute_command("XADD", queue, "UNIQUE", "k", "NAME", "u1", "*", "n", "1")
    assert r.execute_command("XADD", queue, "UNIQUE", "k", "NAME", "u2", "*", "n", "1") == held  # UNIQUE's
    assert r.execute_command("XADD", queue, "UNIQUE", "other", "NAME", "u1", "*", "n", "1") == held  # the name's
    # AFTER a task that does not exist: refused, unless the name is taken (nothing is looked up then)
    with pytest.raises(redis.ResponseError, match="AFTER names a task that does not exist"):
        r.execute_command("XADD", queue, "AFTER", 1, queue, "1-1", "NAME", "w", "*", "n", "1")
    assert r.execute_command("XADD", queue, "AFTER", 1, queue, "1-1", "NAME", "u1", "*", "n", "1") == held
    # ezra import's done push with its result, and the MAXLEN ~ trim, with a name
    done = r.execute_command("XADD", queue, "RESULT", "v", "NAME", "imported", "*", "n", "1")
    assert outcome(r, queue, "NAME", "imported") | {} == {
        "state": b"done", "result": b"v", "progress": None, "attempts": 0, "failure-reason": None, "name": b"imported"}
    assert r.execute_command("XADD", queue, "MAXLEN", "~", 1, "NAME", "imported", "*", "n", "1") == done
    assert r.execute_command("XADD", queue, "NOMKSTREAM", "NAME", "a", "*", "n", "1") is not None
    assert r.execute_command("XADD", f"{queue}-none", "NOMKSTREAM", "NAME", "a", "*", "n", "1") is None


def test_a_pipeline_of_pushes_with_names_among_plain_ones_answers_each(r, queue):
    with r.pipeline(transaction=False) as pipe:
        pipe.xadd(queue, {"n": "1"})
        pipe.execute_command("XADD", queue, "NAME", "a", "*", "n", "2")
        pipe.xadd(queue, {"n": "3"})
        pipe.execute_command("XADD", queue, "NAME", "a", "*", "n", "4")
        pipe.xadd(queue, {"n": "5"})
        replies = pipe.execute()
    assert replies[1] == replies[3] and len(set(replies)) == 4
    assert [t[b"fields"] for t in tasks(r, queue)] == [[b"n", b"1"], [b"n", b"2"], [b"n", b"3"], [b"n", b"5"]]


def test_a_schema_17_file_with_tasks_in_every_state_upgrades_to_names(ezra_factory, tmp_path, protocol):
    from support_files import hand_rowids, schema_17_text, write_old_file
    from ezra.storage import SCHEMA_VERSION

    data_dir = tmp_path / "old"
    db = write_old_file(data_dir, schema_17_text(), 17)
    db.execute("INSERT INTO queues (name, created_at) VALUES ('old', 1)")
    states = ("available", "delayed", "in_flight", "done", "dead", "waiting")
    for rowid, (seq, state) in zip(hand_rowids(db, "old", len(states)), enumerate(states)):
        db.execute("INSERT INTO tasks (rowid, queue, id_ms, id_seq, state, fields, created_at, available_at, "
                   "finished_at, worker, deadline) VALUES (?, 'old', 5, ?, ?, '[\"n\", \"1\"]', 1, ?, ?, ?, ?)",
                   (rowid, seq, state, 4102444800000 if state == "delayed" else 1,
                    1 if state in ("done", "dead") else None, "w" if state == "in_flight" else None,
                    2 if state == "in_flight" else None))
    db.commit()
    with pytest.raises(sqlite3.OperationalError, match="no column named name"):
        db.execute("INSERT INTO tasks (queue, id_ms, id_seq, state, fields, created_at, available_at, name) "
                   "VALUES ('old', 9, 0, 'available', '[]', 1, 1, 'x')")
    db.close()
    server = ezra_factory(data_dir=data_dir)
    assert f"from schema 17 to {SCHEMA_VERSION}" in server.log()
    r = server.client(protocol)
    assert {t[b"name"] for t in tasks(r, "old")} == {None}
    assert r.xlen("old") == 4 and r.xlen("old::dead") == 1  # every task kept (the one in flight given back)
    assert [outcome(r, "old", f"5-{seq}")["state"] for seq in range(6)] == [
        b"available", b"delayed", b"available", b"done", b"dead", b"waiting"]
    named = push(r, "old", "new")
    assert push(r, "old", "new") == named
    db = sqlite3.connect(data_dir / "ezra.db")
    assert db.execute("SELECT name FROM tasks_readable WHERE name IS NOT NULL").fetchall() == [("new",)]
    assert "name" in {row[1] for row in db.execute("PRAGMA table_info(unreadable_tasks)")}
    db.close()


def test_a_hand_written_row_with_a_name_taken_is_refused_by_the_index(ezra_factory, tmp_path):
    """The sqlite3 shell cannot write a second task with a name its queue has: the unique index
    refuses the INSERT, so a start never meets one (a row with a free name is served with it)."""
    from support_files import hand_rowids

    server = ezra_factory(data_dir=tmp_path / "hand")
    r = server.client()
    first = push(r, "hand", "taken")
    assert server.stop() == 0
    db = sqlite3.connect(tmp_path / "hand" / "ezra.db")
    [rowid, free_row] = hand_rowids(db, "hand", 2)
    with pytest.raises(sqlite3.IntegrityError, match="UNIQUE constraint failed: tasks.queue, tasks.name"):
        db.execute("INSERT INTO tasks (rowid, queue, id_ms, id_seq, state, fields, created_at, available_at, name) "
                   "VALUES (?, 'hand', 9999999999999, 0, 'available', '[\"n\", \"2\"]', 1, 1, 'taken')", (rowid,))
    db.execute("INSERT INTO tasks (rowid, queue, id_ms, id_seq, state, fields, created_at, available_at, name) "
               "VALUES (?, 'hand', 9999999999999, 0, 'available', '[\"n\", \"3\"]', 1, 1, 'free')", (rowid,))
    db.commit()
    db.close()
    server.start()
    r = server.client()
    assert push(r, "hand", "taken") == first
    assert push(r, "hand", "free") == b"9999999999999-0"  # the hand-written row holds its name
    assert r.xlen("hand") == 2


def test_a_result_slot_is_found_by_name_after_idmp_s_window_is_gone(shared_server, queue):
    """The result backends' slot (adapters/result_slots.py) was found through XADD IDMP, whose window is
    at most a day and 10,000 ids a producer: past it, a stored result read PENDING, and a new empty
    slot was made. Here IDMP's window is cut to 1 s (an XCFGSET of its limits empties it at once) and
    another process's ResultSlots reads the result: found by its name, with no second slot."""
    client = shared_server.client()
    slots = ResultSlots(client, queue, ttl=3600)
    assert slots.outcome("celery-uuid-1").state == b"missing"  # a look makes no slot...
    assert client.exists(queue) == 0
    assert slots.store("celery-uuid-1", b"the value")  # ...a store does
    configure(client, queue, "IDMP-DURATION", "1")
    wait_until(lambda: xinfo_stream(client, queue)[b"iids-tracked"] == 0, message="no IDMP id remembered")
    reader = ResultSlots(shared_server.client(), queue, ttl=3600)  # another process: its own setup
    found = reader.outcome("celery-uuid-1")
    assert (found.state, found.result) == (b"done", b"the value")
    assert reader.outcome("celery-uuid-1", block=True, timeout=5).result == b"the value"
    assert client.xlen(queue) == 0 and len(tasks(client, queue, "done")) == 1  # one slot, done
    assert tasks(client, queue, "done")[0][b"name"] == b"celery-uuid-1"
    reader.close()
    slots.close()


def test_names_are_shown_by_ezra_ls_and_the_dashboards_task_page(ezra_factory):
    import subprocess
    import sys

    from support_http import http
    from support_servers import ROOT

    server = ezra_factory("--http-port", "0")
    r = server.client()
    named, plain = push(r, "shown", "<order-1017>"), r.xadd("shown", {"n": "2"})
    listing = subprocess.run([sys.executable, "-m", "ezra", "ls", "shown", "--port", str(server.port)], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0, listing.stderr
    assert " name " in listing.stdout.splitlines()[0] and "<order-1017>" in listing.stdout

    def page(task_id) -> bytes:
        status, _, body = http(f"{server.http_url}/task?queue=shown&id={task_id.decode()}")
        assert status == 200
        return body

    assert b'<tr data-fact="name"><th>name</th><td><span class="name">&lt;order-1017&gt;</span>' in page(named)
    assert b'<tr data-fact="name"><th>name</th><td><span class="name"><span class="muted">' in page(plain)
