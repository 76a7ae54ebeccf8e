#!/usr/bin/env python3
"""The benchmark's yardstick: the least a durable Redis-streams queue costs in Python. Not a product.

    python scripts/floor_server.py --port 6390 --data-dir /tmp/floor

scripts/bench.py runs it as server `floor` beside EZRA and shows EZRA's server CPU per
task as a multiple of this one's: how far EZRA is from what its prescribed stack (Python
3.11, gevent, stdlib sqlite3) allows, as opposed to how far it is from Redis (C).

It is the same stack with nothing else: a gevent StreamServer, a greenlet per
connection, hiredis.Reader for parsing, replies written as bytes by hand; sqlite3 in WAL
mode (synchronous=NORMAL) with one table and no secondary index; the order of available
tasks kept in memory (a deque of row ids per queue), so a claim needs no index.

Durability is EZRA's `--durability full`: the SQL runs in the connection's own greenlet;
one hub callback per loop turn commits everything that turn did (group commit; it lets
the turn's wake-ups of blocked readers run first, so their claims join it), then,
if any request of that commit needs it, fdatasyncs the WAL inline on the event loop (as
Redis does with appendfsync always). XADD and XACK replies are sent only after that
fsync; XREADGROUP claims are answered right after the commit. SQLite's automatic
checkpoints (every 1,000 WAL pages) run inside a commit too, on the loop; EZRA runs its
checkpoints beside the writer. Either way the process's CPU time counts them.

Commands: XADD q * f v [f v ...]; XREADGROUP GROUP g c [COUNT n] [BLOCK ms] STREAMS q >
(blocked readers of a queue are woken FIFO, one per pushed task); XACK q g id [id ...];
XPENDING q g (summary form, for the benchmark's checks); and what redis-py needs to
connect: HELLO [2|3], PING, CLIENT SETINFO, XGROUP CREATE (OK: there is one implicit
group), INFO (minimal). Everything else is -ERR. Replies are shaped as Redis's, in RESP2
or, after HELLO 3 (redis-py 8's default), RESP3: only XREADGROUP's reply and nulls differ.
Stream ids are `<ms>-<seq>` as Redis's; row id = ms * 10**6 + seq.
No visibility timeouts, retries, auth or limits: it measures the request path, nothing else.
"""
import argparse
import collections
import os
import signal
import socket
import sqlite3
import sys
import time

import gevent
import hiredis
from gevent.event import Event
from gevent.hub import Waiter, get_hub
from gevent.server import StreamServer

SCHEMA = """CREATE TABLE IF NOT EXISTS tasks (
    id INTEGER PRIMARY KEY,  -- <ms>-<seq> as ms * 10**6 + seq
    queue BLOB NOT NULL,
    fields BLOB NOT NULL,    -- the RESP2 array of field/value pairs, sent back as it is
    state TEXT NOT NULL,     -- available | in_flight (acked rows are deleted)
    worker BLOB,
    attempts INTEGER NOT NULL DEFAULT 0
)"""
SEQ_SPAN = 10**6  # ids per millisecond before the next millisecond is borrowed (Redis's seq is 64-bit)
READ_SIZE = 64 * 1024
NIL = {2: b"*-1\r\n", 3: b"_\r\n"}  # a null array by protocol version
OK = b"+OK\r\n"


def bulk(b):
    return b"$%d\r\n%s\r\n" % (len(b), b)


def error(msg):
    return b"-ERR %s\r\n" % msg.encode()


def stream_id(rowid):
    return b"%d-%d" % divmod(rowid, SEQ_SPAN)


def parse_id(raw):
    ms, _, seq = raw.partition(b"-")
    return int(ms) * SEQ_SPAN + int(seq or 0)


class Store:
    """The table, the in-memory order of available tasks, group commit and the WAL fsync."""

    def __init__(self, path):
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode = WAL").fetchone()
        self.db.execute("PRAGMA synchronous = NORMAL")
        self.db.execute(SCHEMA)
        self.available = collections.defaultdict(collections.deque)  # queue -> row ids, oldest first
        self.in_flight = collections.defaultdict(dict)  # queue -> {row id: worker}, for XPENDING
        self.last_id = 0
        rows = self.db.execute("SELECT id, queue, state, worker FROM tasks ORDER BY id")
        for rowid, queue, state, worker in rows:
            if state == "available":
                self.available[queue].append(rowid)
            else:
                self.in_flight[queue][rowid] = worker
            self.last_id = rowid
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()  # the -wal file exists from here on
        self.wal_fd = os.open(path + "-wal", os.O_RDONLY)
        self.loop = get_hub().loop
        self.in_tx = self.defer = False
        self.commit_waiters, self.fsync_waiters = [], []  # Waiters of the open transaction
        self.commits = self.fsyncs = 0  # shown in INFO

    def write(self, sql, params, many=False):
        """Run a statement (many: once per params) in this loop turn's transaction, opened (and its
        commit scheduled) on first use."""
        if not self.in_tx:
            self.db.execute("BEGIN")
            self.in_tx = True
            self.loop.run_callback(self.commit)
        return (self.db.executemany if many else self.db.execute)(sql, params)

    def commit(self):
        """Hub callback: commit the turn's transaction, wake claims, fdatasync the WAL, wake XADD/XACK."""
        if self.defer:  # readers woken by this turn's pushes run first: their claims join this commit
            self.defer = False
            self.loop.run_callback(self.commit)
            return
        try:
            self.in_tx = False
            self.db.execute("COMMIT")
            self.commits += 1
            commit_waiters, self.commit_waiters = self.commit_waiters, []
            fsync_waiters, self.fsync_waiters = self.fsync_waiters, []
            for w in commit_waiters:
                w.switch(None)
            if fsync_waiters:
                os.fdatasync(self.wal_fd)  # inline: the loop waits for the disk, as Redis's appendfsync always
                self.fsyncs += 1
                for w in fsync_waiters:
                    w.switch(None)
        except Exception as e:  # a commit or fsync that fails loses acknowledged work: stop loudly
            print(f"floor: commit failed: {e!r}", file=sys.stderr, flush=True)
            os._exit(70)

    def wait(self, durable):
        """Block the calling greenlet until this turn's commit (and, if durable, its fsync) is done."""
        w = Waiter()
        (self.fsync_waiters if durable else self.commit_waiters).append(w)
        w.get()

    def next_id(self):
        ms = int(time.time() * 1000) * SEQ_SPAN
        self.last_id = ms if ms > self.last_id else self.last_id + 1
        return self.last_id

    def close(self):
        if self.in_tx:
            self.in_tx = False
            self.db.execute("COMMIT")
        self.db.close()
        os.close(self.wal_fd)


class Conn:
    """A connection's session: only its protocol version (HELLO)."""
    __slots__ = ("proto",)

    def __init__(self):
        self.proto = 2


class Floor:
    """The commands. Each returns (reply bytes, needs: 0 nothing, 1 the commit, 2 the commit's fsync)."""

    def __init__(self, store):
        self.store = store
        self.waiting = collections.defaultdict(collections.deque)  # queue -> blocked readers, FIFO
        self.connected = self.blocked = 0
        self.commands = {b"XADD": self.xadd, b"XREADGROUP": self.xreadgroup, b"XACK": self.xack,
                         b"XPENDING": self.xpending, b"PING": self.ping, b"CLIENT": self.client,
                         b"XGROUP": self.xgroup, b"INFO": self.info, b"HELLO": self.hello}

    def xadd(self, conn, args):
        if len(args) < 5 or args[2] != b"*" or len(args) % 2 == 0:
            return error("the floor takes only XADD key * field value [field value ...]"), 0
        q, rowid = args[1], self.store.next_id()
        fields = b"*%d\r\n" % (len(args) - 3) + b"".join(bulk(a) for a in args[3:])
        self.store.write("INSERT INTO tasks (id, queue, fields, state) VALUES (?, ?, ?, 'available')",
                         (rowid, q, fields))
        self.store.available[q].append(rowid)
        self.wake_one(q)
        return bulk(stream_id(rowid)), 2

    def wake_one(self, q):
        waiting = self.waiting.get(q)
        while waiting:
            entry = waiting.popleft()
            if entry[1]:  # still blocked (not timed out)
                entry[1] = False
                self.store.loop.run_callback(entry[0].switch, None)
                self.store.defer = True
                return

    def xreadgroup(self, conn, args):
        """Returns (reply, needs) or, when the read must block, (None, (queue, consumer, count, timeout s))."""
        try:
            opts = [a.upper() for a in args]
            consumer = args[3]
            count = int(args[opts.index(b"COUNT") + 1]) if b"COUNT" in opts else 1
            block = int(args[opts.index(b"BLOCK") + 1]) if b"BLOCK" in opts else None
            streams = opts.index(b"STREAMS")
            if opts[1] != b"GROUP" or len(args) != streams + 3 or args[-1] != b">" or count < 1:
                raise ValueError
        except (ValueError, IndexError):
            return error("the floor takes only XREADGROUP GROUP g c [COUNT n] [BLOCK ms] STREAMS q >"), 0
        q = args[streams + 1]
        reply = self.claim(conn, q, consumer, count)
        if reply is None:
            return (None, (q, consumer, count, block / 1000)) if block is not None else (NIL[conn.proto], 0)
        return reply, 1

    def claim(self, conn, q, consumer, count):
        """Claim up to count tasks of q: the XREADGROUP reply, or None if q has none available."""
        available = self.store.available.get(q)
        if not available:
            return None
        ids = [available.popleft() for _ in range(min(count, len(available)))]
        rows = self.store.write("UPDATE tasks SET state = 'in_flight', worker = ?, attempts = attempts + 1 "
                                "WHERE id IN (%s) AND state = 'available' RETURNING id, fields"
                                % ",".join("?" * len(ids)), (consumer, *ids)).fetchall()
        rows.sort()
        in_flight = self.store.in_flight[q]
        out = [b"*1\r\n*2\r\n" if conn.proto == 2 else b"%1\r\n", bulk(q), b"*%d\r\n" % len(rows)]
        for rowid, fields in rows:
            in_flight[rowid] = consumer
            out += (b"*2\r\n", bulk(stream_id(rowid)), fields)
        return b"".join(out)

    def block(self, conn, q, consumer, count, timeout):
        """Wait (FIFO among q's readers) until a push wakes this reader or the timeout (0: none) passes."""
        deadline = time.monotonic() + timeout if timeout else None
        while True:
            entry = [Waiter(), True]
            self.waiting[q].append(entry)
            timer = None
            if deadline is not None:
                timer = self.store.loop.timer(max(0.0, deadline - time.monotonic()))
                timer.start(entry[0].switch, None)
            self.blocked += 1
            try:
                entry[0].get()
            finally:
                self.blocked -= 1
                entry[1] = False  # a push skips it from now on
                if timer is not None:
                    timer.close()
            reply = self.claim(conn, q, consumer, count)
            if reply is not None:
                return reply, 1
            if deadline is not None and time.monotonic() >= deadline:
                return NIL[conn.proto], 0

    def xack(self, conn, args):
        if len(args) < 4:
            return error("wrong number of arguments for 'xack' command"), 0
        try:
            ids = [parse_id(a) for a in args[3:]]
        except ValueError:
            return error("Invalid stream ID specified as stream command argument"), 0
        in_flight = self.store.in_flight.get(args[1], {})
        acked = [(rowid,) for rowid in ids if in_flight.pop(rowid, None) is not None]
        if not acked:
            return b":0\r\n", 0
        n = self.store.write("DELETE FROM tasks WHERE id = ? AND state = 'in_flight'", acked,
                             many=True).rowcount
        return b":%d\r\n" % n, 2

    def xpending(self, conn, args):
        if len(args) != 3:
            return error("the floor takes only XPENDING key group"), 0
        in_flight = self.store.in_flight.get(args[1])
        if not in_flight:
            nil = b"$-1\r\n" if conn.proto == 2 else b"_\r\n"
            return b"*4\r\n:0\r\n" + nil + nil + NIL[conn.proto], 0
        per_worker = collections.Counter(in_flight.values())
        return b"".join([b"*4\r\n:%d\r\n" % len(in_flight), bulk(stream_id(min(in_flight))),
                         bulk(stream_id(max(in_flight))), b"*%d\r\n" % len(per_worker)]
                        + [b"*2\r\n" + bulk(w) + bulk(b"%d" % n) for w, n in per_worker.items()]), 0

    def hello(self, conn, args):
        """HELLO [2|3]: redis-py 8 sends HELLO 3 by default, so the floor speaks both, as Redis does."""
        if len(args) > 2:
            return error("the floor takes only HELLO [protover]"), 0
        if len(args) == 2 and args[1] not in (b"2", b"3"):
            return b"-NOPROTO unsupported protocol version\r\n", 0
        conn.proto = int(args[1]) if len(args) == 2 else conn.proto
        pairs = [bulk(b"server"), bulk(b"redis"), bulk(b"version"), bulk(b"7.0.0"),
                 bulk(b"proto"), b":%d\r\n" % conn.proto, bulk(b"id"), b":%d\r\n" % id(conn),
                 bulk(b"mode"), bulk(b"standalone"), bulk(b"role"), bulk(b"master"),
                 bulk(b"modules"), b"*0\r\n"]
        return (b"*14\r\n" if conn.proto == 2 else b"%7\r\n") + b"".join(pairs), 0

    def ping(self, conn, args):
        return (b"+PONG\r\n" if len(args) == 1 else bulk(args[1])), 0

    def client(self, conn, args):
        ok = len(args) > 1 and args[1].upper() == b"SETINFO"
        return (OK if ok else error("unknown CLIENT subcommand")), 0

    def xgroup(self, conn, args):
        return (OK if len(args) > 1 and args[1].upper() == b"CREATE" else error("unknown XGROUP subcommand")), 0

    def info(self, conn, args):
        text = (f"# Server\r\nredis_version:7.0.0\r\nserver_name:ezra-bench-floor\r\n\r\n# Clients\r\n"
                f"connected_clients:{self.connected}\r\nblocked_clients:{self.blocked}\r\n\r\n# Floor\r\n"
                f"commits:{self.store.commits}\r\nfsyncs:{self.store.fsyncs}\r\n")
        return bulk(text.encode()), 0

    def handle(self, sock, _addr):
        """One connection: run every complete command received, then send their replies at once."""
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader, commands, store, conn = hiredis.Reader(), self.commands, self.store, Conn()
        self.connected += 1
        try:
            while True:
                data = sock.recv(READ_SIZE)
                if not data:
                    return
                reader.feed(data)
                out, needs = [], 0
                args = reader.gets()
                while args is not False:
                    if not isinstance(args, list) or not args:
                        return  # inline commands and other frames: not for the floor
                    cmd = commands.get(args[0].upper())
                    if cmd:
                        try:
                            reply, need = cmd(conn, args)
                        except Exception as e:  # a bug in the floor: say so, keep the connection
                            print(f"floor: {args[0]!r}: {e!r}", file=sys.stderr, flush=True)
                            reply, need = error("internal error"), 0
                    else:
                        reply, need = error(f"unknown command '{args[0][:64].decode(errors='replace')}'"), 0
                    if reply is None:  # XREADGROUP must block: send what is due before, then wait
                        if needs:
                            store.wait(needs == 2)
                        if out:
                            sock.sendall(b"".join(out))
                        out, needs = [], 0
                        reply, need = self.block(conn, *need)
                    out.append(reply)
                    needs = max(needs, need)
                    args = reader.gets()
                if needs:
                    store.wait(needs == 2)
                sock.sendall(b"".join(out))
        except (hiredis.ProtocolError, OSError):  # a broken frame, a reset: the connection ends
            return
        finally:
            self.connected -= 1
            sock.close()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--data-dir", required=True)
    a = ap.parse_args(argv)
    os.makedirs(a.data_dir, exist_ok=True)
    store = Store(os.path.join(a.data_dir, "floor.db"))
    server = StreamServer((a.host, a.port), Floor(store).handle, backlog=1024)
    server.start()
    stopping = Event()
    gevent.signal_handler(signal.SIGTERM, stopping.set)
    gevent.signal_handler(signal.SIGINT, stopping.set)
    stopping.wait()
    server.close()  # connections are not waited for: every reply sent was already durable
    store.close()


if __name__ == "__main__":
    main()
