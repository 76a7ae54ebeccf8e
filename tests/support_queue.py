"""Driving a queue in tests: through redis-py (claim, configure, the queue's figures), or the
broker in process (on a clock the test moves; a request that fails inside its batch)."""

from __future__ import annotations

import threading

from support_servers import wait_until


OK_REPLIES = (True, b"OK", "OK")


def configure(r, queue, *settings):
    assert r.execute_command("XCFGSET", queue, *settings) in OK_REPLIES


def queue_figures(client, queue) -> dict:
    """One queue's counts and tallies since start, keyed as INFO's (`in_flight`), read with XINFO
    QUEUES: INFO lists only the first 100 queues by name, and a shared server holds more."""
    name = queue.encode() if isinstance(queue, str) else queue
    # AFTER is exclusive: from the name less its last byte, `name` is among the first few.
    for row in client.execute_command("XINFO", "QUEUES", "AFTER", name[:-1], "COUNT", 1000):
        fields = row if isinstance(row, dict) else dict(zip(row[::2], row[1::2]))
        fields = {text(key).replace("-", "_"): value for key, value in fields.items()}
        if fields.pop("name") in (name, name.decode(errors="replace")):
            return fields
    raise AssertionError(f"XINFO QUEUES does not list {name!r}")


def entries_of(reply, queue):
    """The entries for `queue` in an XREADGROUP reply, in either protocol's shape."""
    if not reply:
        return []
    key = queue.encode()
    if isinstance(reply, dict):  # RESP3: {queue: [entries]}
        items = reply.get(key, [])
        return items[0] if items and isinstance(items[0], list) else items
    return {name: items for name, items in reply}.get(key, [])


def claim(r, queue, worker="w1", count=None, block=None, **kwargs):
    return entries_of(r.xreadgroup("g", worker, {queue: ">"}, count=count, block=block, **kwargs), queue)


def pending(r, queue) -> list[dict]:
    return r.xpending_range(queue, "g", "-", "+", 100)


def text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Clock:
    """The broker's clock in process tests: ms since the epoch, moved by the test."""

    def __init__(self, now: int = 1_000_000):
        self.now = now

    def __call__(self) -> int:
        return self.now


def broker_on_clock(tmp_path):
    """A Broker on a real ezra.db in tmp_path, with a Clock the test moves as `broker.clock_`."""
    from ezra.broker import Broker  # here: the tests that drive servers only never import the broker
    from ezra.config import Settings
    from ezra.storage import open_database

    clock = Clock()
    broker = Broker(open_database(str(tmp_path / "data")), Settings(data_dir=str(tmp_path)), clock=clock)
    broker.clock_ = clock
    return broker


def queue_counts(broker) -> dict:
    """Every queue's counts by state, once what was submitted before has committed (Admin.figures)."""
    from ezra.broker import ALL_QUEUES
    return {name: shown["counts"] for name, shown in broker.admin.figures(ALL_QUEUES, head_since=False).queues.items()}


def submit_broken_request(broker) -> None:
    """A request whose statement fails: its whole batch rolls back and answers a storage error."""
    def broken():
        broker.db.conn.execute("INSERT INTO no_such_table VALUES (1)")

    try:
        broker.writer.submit(broken)
    except Exception as exc:
        assert "storage error" in str(exc)
    else:
        raise AssertionError("the broken request was answered")


def blocked(r) -> int:
    return int(r.info("clients")["blocked_clients"])


class BlockedReader:
    """An XREADGROUP ... COUNT 1 BLOCK in a thread, on a connection of its own; `reply` once it returns."""

    def __init__(self, server, protocol, queue, worker="blocked"):
        self.queue = queue
        self.client = server.client(protocol)
        self.done = threading.Event()
        self.reply = None
        self.thread = threading.Thread(target=self._read, args=(worker,), daemon=True)

    def _read(self, worker):
        self.reply = self.client.xreadgroup("g", worker, {self.queue: ">"}, count=1, block=20_000)
        self.done.set()

    def start(self, watcher) -> "BlockedReader":
        before = blocked(watcher)
        self.thread.start()
        wait_until(lambda: blocked(watcher) > before, message="the reader to block")
        return self

    def ids(self) -> list:
        assert self.done.wait(15), "the blocked reader was not woken"
        self.client.close()
        return [task_id for task_id, _ in entries_of(self.reply, self.queue)]
