"""WAL frames and SQLite CPU per state change, for the tasks table's schema and variants of it.

BENCHMARKS.md, "Budget per command" and its findings: what each B-tree of the tasks table costs
a push, a claim and an ack, measured with sqlite3 alone. Each variant gets a fresh file with
EZRA's own schema.sql and pragmas, a backlog (done tasks of this queue, available tasks of
another), then three phases of one command kind, each command its own transaction, the WAL
fdatasync'ed after each commit as the writer does. Per command: WAL frames written (the WAL's
growth; nothing checkpoints during a phase) and the CPU of the statements and the commit
(median). The variants run in alternation, round after round, and the table shows medians.

    python3 scripts/pages.py --size 100 --tasks 2000 --backlog 20000 --rounds 3
    python3 scripts/pages.py --size 1000000 --tasks 30 --backlog 0 --rounds 1

Variants: base (schema.sql as it is: schema 14, each queue's tasks a range of row ids, no
tasks_available; the claim names the head's row id, as the broker's order in memory does),
with_available_index (schema 7's tasks_available index added back, the claim reading the head
from it), with_in_flight_index (schema 11's tasks_in_flight added back), primary_key (schema 13's
key on (queue, id_ms, id_seq) and its index, rows found by it), without_rowid (tasks keyed by that
primary key, no separate index for it), without_rowid with the index, integer_queue (queue INTEGER
instead of the name), no_auto_vacuum (for comparison: what pointer-map pages add when the file
grows).

    python3 scripts/pages.py --rebuild 1000000
    python3 scripts/pages.py --by-btree --commits 400

--by-btree: cycle-batched's shape through EZRA's own storage calls (Database.insert_available,
claim, ack), 50 tasks a commit (--per-commit) of 200-byte fields as bench.py sends: WAL frames per
commit, by the B-tree each frame's page belongs to (SQLite's dbstat), the pointer-map pages of
auto_vacuum as "ptrmap". Before schema 14 the primary key's index held 3.5 of a push
commit's 11.4 frames.

--rebuild N: what the order kept in memory costs to build without tasks_available: N
available tasks of one queue (and N/4 done ones), read in id order into two array('q') (id_ms,
id_seq), timed, with the process's RSS before and after.
"""
from __future__ import annotations

import argparse
from array import array
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ezra.storage.opening import _set_pragmas  # noqa: E402  (the server's own pragmas)

SCHEMA = (ROOT / "ezra" / "storage" / "schema.sql").read_text()
BASE_MS = 10 ** 12
# Schema 7's index of available tasks (schema 8 dropped it): the with_available_index variants.
AVAILABLE_INDEX = "CREATE INDEX IF NOT EXISTS tasks_available ON tasks (queue, id_ms, id_seq) WHERE state = 'available';"
# Schema 11's index of tasks in flight (schema 12 dropped it): the with_in_flight_index variant.
IN_FLIGHT_INDEX = ("CREATE INDEX IF NOT EXISTS tasks_in_flight ON tasks (queue, worker, id_ms, id_seq) "
                   "WHERE state = 'in_flight';")
INDEX_ANCHOR = "CREATE INDEX IF NOT EXISTS tasks_retained"  # added indexes go before it
PHASES = ("push", "claim", "ack")
ROW_BITS = 40  # ezra/storage/row_ranges.py: queue number n's tasks have row ids from n << 40
ROWID_COLUMN = "    rowid         INTEGER PRIMARY KEY,  -- storage/row_ranges.py; `rowid` in a query reads it\n"
TABLE_END = "    name          TEXT\n);"  # the last column of tasks in schema.sql


class Variant:
    def __init__(self, name: str, without_rowid=False, available_index=False, integer_queue=False,
                 auto_vacuum=True, in_flight_index=False, primary_key=False):
        self.name = name
        self.without_rowid = without_rowid
        self.primary_key = primary_key or without_rowid  # schema 13's key: rows found by (queue, id)
        self.available_index = available_index
        self.in_flight_index = in_flight_index
        self.integer_queue = integer_queue
        self.auto_vacuum = auto_vacuum

    def schema(self) -> str:
        text = SCHEMA
        if self.primary_key:
            text = replaced(text, ROWID_COLUMN, "")
            text = replaced(text, TABLE_END, TABLE_END[:-3] + ",\n    PRIMARY KEY (queue, id_ms, id_seq)\n)"
                            + (" WITHOUT ROWID;" if self.without_rowid else ";"))
        if self.available_index:
            text = replaced(text, INDEX_ANCHOR, AVAILABLE_INDEX + "\n" + INDEX_ANCHOR)
        if self.in_flight_index:
            text = replaced(text, INDEX_ANCHOR, IN_FLIGHT_INDEX + "\n" + INDEX_ANCHOR)
        if self.integer_queue:
            text = replaced(text, ROWID_COLUMN + "    queue         TEXT    NOT NULL,",
                            ROWID_COLUMN + "    queue         INTEGER NOT NULL,")
        return text


def replaced(text: str, old: str, new: str) -> str:
    """`text` with `old` replaced once; schema.sql changed if it is not there."""
    if old not in text:
        raise SystemExit(f"pages.py: schema.sql no longer has {old!r}; update the variant")
    return text.replace(old, new, 1)


VARIANTS = [
    Variant("base"),
    Variant("with_available_index", available_index=True),
    Variant("with_in_flight_index", in_flight_index=True),
    Variant("primary_key", primary_key=True),
    Variant("without_rowid", without_rowid=True),
    Variant("without_rowid + with_available_index", without_rowid=True, available_index=True),
    Variant("integer_queue", integer_queue=True),
    Variant("no_auto_vacuum", auto_vacuum=False),
]

CLAIM_SET = ("UPDATE tasks SET state = 'in_flight', worker = 'worker-1', deadline = ?, delivered_at = ?, "
             "attempts = attempts + 1, finished_at = NULL WHERE ")


class Run:
    """One variant's file and its three phases."""

    def __init__(self, variant: Variant, size: int, tasks: int, backlog: int):
        self.variant = variant
        self.tasks = tasks
        self.dir = tempfile.mkdtemp(prefix="ezra-pages-")
        self.path = os.path.join(self.dir, "ezra.db")
        self.conn = sqlite3.connect(self.path, isolation_level=None)
        _set_pragmas(self.conn)
        if not variant.auto_vacuum:
            self.conn.execute("PRAGMA auto_vacuum = NONE")
        self.conn.executescript(variant.schema())
        self.queue = 1 if variant.integer_queue else "emails.outbound"
        self.backlog = backlog
        self.fields = json.dumps(["body", "x" * size])
        self._fill(backlog, size)
        self.wal_fd = os.open(self.path + "-wal", os.O_RDONLY)

    def _fill(self, backlog: int, size: int) -> None:
        other = 2 if self.variant.integer_queue else "reports.nightly"
        old_fields = self.fields if size <= 10_000 else '["body", "x"]'
        self.conn.execute("BEGIN")
        for i in range(backlog):
            self.insert(self.rowid(1, i), "queue, id_ms, id_seq, state, fields, created_at, available_at, "
                        "finished_at", "?, ?, 0, 'done', ?, 0, 0, ?", (self.queue, i, old_fields, i))
            self.insert(self.rowid(2, i), "queue, id_ms, id_seq, state, fields, created_at, available_at",
                        "?, ?, 0, 'available', ?, 0, 0", (other, i, '["f", "v"]'))
        self.conn.execute("COMMIT")
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def rowid(self, number: int, i: int) -> int | None:
        """Task i's row id in queue number `number`'s range (None: a variant keyed by (queue, id))."""
        return None if self.variant.primary_key else (number << ROW_BITS) + i

    def where_task(self, i: int) -> tuple[str, tuple]:
        """The WHERE of pushed task i: its row id, or (queue, id) where that is the key."""
        if self.variant.primary_key:
            return "queue = ? AND id_ms = ? AND id_seq = 0", (self.queue, BASE_MS + i)
        return "rowid = ?", (self.rowid(1, self.backlog + i),)

    def insert(self, rowid: int | None, columns: str, values: str, params: tuple) -> None:
        """One row; its row id given where the variant has them (a WITHOUT ROWID table has none)."""
        if self.variant.without_rowid:
            self.conn.execute(f"INSERT INTO tasks ({columns}) VALUES ({values})", params)
        else:
            self.conn.execute(f"INSERT INTO tasks (rowid, {columns}) VALUES (?, {values})", (rowid, *params))

    def push(self, i: int) -> None:
        self.insert(self.rowid(1, self.backlog + i), "queue, id_ms, id_seq, state, fields, created_at, available_at",
                    "?, ?, 0, 'available', ?, 1, 1", (self.queue, BASE_MS + i, self.fields))

    def claim(self, i: int) -> None:
        if not self.variant.available_index:
            # The head's row id (or id) comes from the order in memory: update it, read its fields.
            where, params = self.where_task(i)
            self.conn.execute(CLAIM_SET + where + " AND state = 'available'", (5, 1, *params))
            self.conn.execute("SELECT fields, attempts FROM tasks WHERE " + where, params).fetchone()
            return
        key = "id_ms, id_seq" if self.variant.without_rowid else "rowid"
        # INDEXED BY: without it the planner walks the primary key of a WITHOUT ROWID table
        # past every claimed task (ms per claim).
        head = self.conn.execute(
            f"SELECT {key}, fields, attempts FROM tasks INDEXED BY tasks_available WHERE queue = ? "
            "AND state = 'available' ORDER BY id_ms, id_seq LIMIT 1", (self.queue,)).fetchone()
        if self.variant.without_rowid:
            self.conn.execute(CLAIM_SET + "queue = ? AND id_ms = ? AND id_seq = ? AND state = 'available'",
                              (5, 1, self.queue, head[0], head[1]))
        else:
            self.conn.execute(CLAIM_SET + "rowid = ? AND state = 'available'", (5, 1, head[0]))

    def ack(self, i: int) -> None:
        where, params = self.where_task(i)
        self.conn.execute("UPDATE tasks SET state = 'done', deadline = NULL, finished_at = ? WHERE "
                          + where + " AND state = 'in_flight'", (2, *params))

    def phase(self, name: str) -> tuple[float, float]:
        """(WAL frames per command, median µs of CPU per command's statements and commit)."""
        step = getattr(self, name)
        wal_before = os.fstat(self.wal_fd).st_size
        cpu = []
        for i in range(self.tasks):
            start = time.process_time_ns()
            self.conn.execute("BEGIN IMMEDIATE")
            step(i)
            self.conn.execute("COMMIT")
            cpu.append(time.process_time_ns() - start)
            os.fdatasync(self.wal_fd)
        frames = (os.fstat(self.wal_fd).st_size - wal_before) / (self.page_size() + 24) / self.tasks
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return frames, statistics.median(cpu) / 1000

    def page_size(self) -> int:
        return self.conn.execute("PRAGMA page_size").fetchone()[0]

    def close(self) -> None:
        os.close(self.wal_fd)
        self.conn.close()
        shutil.rmtree(self.dir)


def rss_kb() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def rebuild(tasks: int) -> None:
    variant = Variant("base")
    run = Run(variant, 100, 0, 0)
    try:
        run.conn.execute("BEGIN")
        run.conn.executemany(
            "INSERT INTO tasks (rowid, queue, id_ms, id_seq, state, fields, created_at, available_at) "
            "VALUES (?, ?, ?, 0, ?, ?, 1, 1)",
            ((run.rowid(1, i), run.queue, BASE_MS + i, "done" if i % 5 == 0 else "available", run.fields)
             for i in range(tasks + tasks // 4)))
        run.conn.execute("COMMIT")
        run.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        run.conn.close()
        run.conn = sqlite3.connect(run.path, isolation_level=None)  # a cold page cache, as at start-up
        _set_pragmas(run.conn)
        before = rss_kb()
        start = time.perf_counter()
        queue_rows = (1 << ROW_BITS, (2 << ROW_BITS) - 1)  # the queue's range of row ids, in id order
        first = run.conn.execute(
            "SELECT id_ms, id_seq FROM tasks WHERE rowid BETWEEN ? AND ? AND state = 'available' "
            "ORDER BY rowid LIMIT 1", queue_rows).fetchone()
        first_at = time.perf_counter() - start
        ms, seq = array("q"), array("q")
        for row in run.conn.execute(
                "SELECT id_ms, id_seq FROM tasks WHERE rowid BETWEEN ? AND ? AND state = 'available' "
                "ORDER BY rowid", queue_rows):
            ms.append(row[0])
            seq.append(row[1])
        took = time.perf_counter() - start
        print(f"{len(ms)} available of {tasks + tasks // 4} tasks: head {first} in {first_at * 1000:.1f} ms, "
              f"the whole order in {took:.2f} s, RSS {before / 1024:.1f} -> {rss_kb() / 1024:.1f} MB")
    finally:
        run.close()


def by_btree(commits: int, per_commit: int) -> None:
    """WAL frames per commit by B-tree, pushes, claims and acks of `per_commit` tasks each."""
    import base64
    import collections
    import struct
    from ezra.storage import acks, open_database
    from ezra.protocol.task_fields import stored

    directory = tempfile.mkdtemp(prefix="ezra-pages-btree-")
    db = open_database(directory)
    frames = {phase: collections.Counter() for phase in PHASES}
    wal_path = db.path + "-wal"

    def frame_pages(start: int) -> list[int]:
        """The page number of each frame from byte `start` of the WAL (32-byte header, 24 a frame)."""
        with open(wal_path, "rb") as wal:
            wal.seek(start)
            data = wal.read()
        step = 24 + db.page_size
        return [struct.unpack_from(">I", data, at)[0] for at in range(0, len(data) - step + 1, step)]

    def committed(phase: str, work) -> list:
        start = max(os.path.getsize(wal_path), 32)
        db.begin()
        result = work()
        db.commit()
        owners = dict(db.conn.execute("SELECT pageno, name FROM dbstat"))
        owners[1] = "page 1"  # the file's header (its page count grows) and sqlite_schema's root
        frames[phase].update(owners.get(page, "ptrmap") for page in frame_pages(start))
        return result

    now = BASE_MS
    db.begin()
    db.insert_queue(b"bench", now)
    db.commit()
    try:
        for batch in range(commits):
            tasks = [(now + batch, seq, stored([b"d", base64.b64encode(os.urandom(150))[:200]]))
                     for seq in range(per_commit)]
            rowids = list(committed("push", lambda: db.insert_available(b"bench", tasks, now)))
            committed("claim", lambda: db.claim(b"bench", rowids, b"worker-1", now, now + 30_000))
            committed("ack", lambda: acks.ack(db.conn, rowids, now))
            if batch % 50 == 49:
                db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        db.close()
        shutil.rmtree(directory)
    print(f"{per_commit} tasks a commit, {commits} commits a phase, 200-byte fields: WAL frames per commit by B-tree")
    print("| phase | frames | by B-tree |")
    print("|---|---:|---|")
    for phase, counts in frames.items():
        parts = ", ".join(f"{name} {n / commits:.2f}" for name, n in counts.most_common())
        print(f"| {phase} | {sum(counts.values()) / commits:.2f} | {parts} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100, help="bytes of the one field's value")
    parser.add_argument("--tasks", type=int, default=2000, help="commands per phase")
    parser.add_argument("--backlog", type=int, default=20000, help="done and other-queue tasks first")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rebuild", type=int, default=0, metavar="N",
                        help="time the start-up rebuild of an order in memory of N available tasks instead")
    parser.add_argument("--by-btree", action="store_true",
                        help="cycle-batched's shape: WAL frames per commit by B-tree (see above)")
    parser.add_argument("--commits", type=int, default=400, help="--by-btree: commits of each kind")
    parser.add_argument("--per-commit", type=int, default=50, help="--by-btree: tasks a commit")
    args = parser.parse_args()
    if args.by_btree:
        by_btree(args.commits, args.per_commit)
        return
    if args.rebuild:
        rebuild(args.rebuild)
        return
    results = {variant.name: {phase: [] for phase in PHASES} for variant in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            run = Run(variant, args.size, args.tasks, args.backlog)
            try:
                for phase in PHASES:
                    results[variant.name][phase].append(run.phase(phase))
            finally:
                run.close()
    print(f"{args.size}-byte field, {args.tasks} commands per phase, backlog {args.backlog}, "
          f"medians of {args.rounds} rounds: WAL frames / µs of CPU per command")
    print("| variant | push | claim | ack |")
    print("|---|---:|---:|---:|")
    for name, phases in results.items():
        cells = [f"{statistics.median(f for f, _ in phases[p]):.2f} / {statistics.median(u for _, u in phases[p]):.1f}"
                 for p in PHASES]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
