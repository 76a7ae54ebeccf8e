"""The Database: the server's connection and every query EZRA runs, named.

The queries run on the event loop, inside the writer's transaction of the
current loop turn (writer.py opens it at the turn's first submit and commits it
from a hub callback); only start-up (`recover`, `load_queues`, `count_states`,
before the port opens) and the broker's reload after a rollback read outside
one. They are the hot path (insert_task, claim, ack...), so each is a plain
method that runs its statement directly. Two methods run on native threads:
`checkpoint`, on a connection of its own, and `sync_wal` while fsyncs are slow
(inline on the loop otherwise). Every query is parameterised.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from functools import partial
from itertools import chain, repeat

from loguru import logger

from .. import errors, lifecycle
from . import acks, done_counts, hand_rows, reads, row_ranges
from .reads import tasks_by_id
from .file_space import FileSpace
from .integrity import Integrity
from .producers import IdempotentProducers
from .retention import Retention
from .schedules import Schedules
from .unique_keys import UniqueKeys
from .task_names import TaskNames
from .wal_file import WalFile
from .placements import Placements
from .results import Results
from .dependencies import Dependencies
from .schema import ROOM_SQL, SETTING_COLUMNS, claim_room, encode_failure, name_bytes, name_value, row_list

# A checkpoint never waits for a reader: a snapshot held elsewhere (ezra export, a BACKUP,
# Litestream) made each RESTART wait this out and fail, with every write paused meanwhile.
CHECKPOINT_WAIT_MS = 0
RESERVE_FILENAME = "ezra.reserve"  # space set aside so acks and claims still commit on a full disk
DEFAULT_RESERVE_BYTES = 4 * 1024 * 1024  # as config.Settings.disk_reserve (--disk-reserve), which servers use

TASK_COLUMNS = "id_ms, id_seq, fields"


# set_outcome's statements, built once (an f-string per call cost a format and a hash of its
# text for the statement cache, on every nack). Unfinished is spelled out, not IN: see schema.sql.
_UNFINISHED = "(state = 'in_flight' OR state = 'available' OR state = 'delayed')"
_SET_OUTCOME_SQL = ("UPDATE tasks SET state = ?, attempts = ?, worker = NULL, deadline = NULL, available_at = ?, "
                    f"reserved = NULL, finished_at = CASE WHEN ? = 'dead' THEN ? END WHERE rowid = ? AND {_UNFINISHED}")
_SET_OUTCOME_WITH_FAILURE_SQL = (
    "UPDATE tasks SET state = ?, attempts = ?, worker = NULL, deadline = NULL, available_at = ?, "
    f"reserved = NULL, finished_at = CASE WHEN ? = 'dead' THEN ? END, failure = ? WHERE rowid = ? AND {_UNFINISHED}")
# A push's row: a plain push (Database.insert_plain), or one with options, every column bound.
_INSERT_PLAIN_SQL = ("INSERT INTO tasks (rowid, queue, id_ms, id_seq, state, fields, created_at, available_at, "
                     f"reserved) VALUES (?, ?, ?, ?, 'available', ?, ?, ?, {ROOM_SQL})")
_INSERT_TASK_SQL = ("INSERT INTO tasks (rowid, queue, id_ms, id_seq, state, fields, attempts, created_at, "
                    "available_at, finished_at, ttl_ms, failure, unique_key, priority, partition_key, reserved, name) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
# A push run's rows go in as statements of 64, 32, ... 1 rows (50 = 32 + 16 + 2): one INSERT of many
# rows costs 1.56 µs a row against executemany's 2.65, which binds, steps and resets each (measured).
INSERT_ROWS = 64
_INSERT_AVAILABLE_SQL, _INSERT_PLACED_SQL = ({rows: f"INSERT INTO tasks (rowid, queue, id_ms, id_seq, state, fields, "
    f"created_at, available_at{more}, reserved) VALUES " + ", ".join([f"(?, ?, ?, ?, 'available', ?, ?, ?{values}, "
    f"{ROOM_SQL})"] * rows) for rows in (1 << power for power in range(INSERT_ROWS.bit_length()))}
    for more, values in (("", ""), (", priority, partition_key", ", ?, ?")))  # plain pushes, placed ones
# A claim of many rows (Database.claim): only the queue's own (its range of row ids), as a guard.
# attempts + 1: this delivery counted (the broker counts redeliveries). reserved: schema.py.
_CLAIMABLE = "rowid IN (SELECT value FROM json_each(?)) AND rowid BETWEEN ? AND ? AND state = 'available'"
_CLAIMABLE_SQL = f"SELECT {TASK_COLUMNS}, attempts + 1, rowid FROM tasks WHERE {_CLAIMABLE}"
_CLAIM_SQL = ("UPDATE tasks SET state = ?, worker = ?, deadline = ?, delivered_at = ?, attempts = attempts + 1, "
              f"finished_at = ?, retained = ?, reserved = NULL WHERE {_CLAIMABLE}")
_BY_ID_SQL: dict[tuple[str, tuple], str] = {}  # _tasks_by_id's SELECT per (columns, states)


class Database:
    """The connection and every query EZRA runs, named."""

    def __init__(self, conn: sqlite3.Connection, path: str, reserve_bytes: int = DEFAULT_RESERVE_BYTES):
        self.conn = conn
        self.path = path
        self.wal_path = path + "-wal"
        self.reserve_bytes = reserve_bytes  # the disk reserve's size (ezra/writer/disk_space.py holds the file)
        # The WAL's size tells what a checkpoint would copy: SQLite cuts it back to `wal_limit` when it starts
        # over (journal_size_limit), so more is written since (or WalFile.extend_ahead's zeros past its end).
        self.wal_limit = max(reserve_bytes // 2, 1024 * 1024)
        conn.execute(f"PRAGMA journal_size_limit = {self.wal_limit}").fetchone()
        self.wal = WalFile(self.wal_path)
        # fdatasync the WAL: what was committed before a call is durable after it (a call less per fsync).
        self.sync_wal = self.wal.sync
        self.page_size = conn.execute("PRAGMA page_size").fetchone()[0]  # fixed once the file is in WAL mode
        self.file_space = FileSpace(conn, path, self.page_size)  # free pages, the incremental vacuum
        self._checkpointer: sqlite3.Connection | None = None  # checkpoints' own connection
        self.integrity = Integrity(conn)  # read-only once found corrupt
        self.schedules = Schedules(conn)  # XSCHEDULE's table (storage/schedules.py)
        self.unique_keys = UniqueKeys(conn)  # XADD UNIQUE (storage/unique_keys.py)
        self.task_names = TaskNames(conn)  # XADD NAME (storage/task_names.py)
        self.producers = IdempotentProducers(conn)  # XADD IDMP (storage/producers.py)
        self.placements = Placements(conn, self.span)  # priorities and partitions (storage/placements.py)
        self.results = Results(conn, self.span)  # XRESULT, XPROGRESS (storage/results.py)
        self.dependencies = Dependencies(conn, self.span)  # XADD AFTER (storage/dependencies.py)
        # Each queue's done and available tasks, {queue: (done, available)} (in no index): as the last clean
        # stop left them (opening.py, storage/done_counts.py), and as this server leaves them at `close`.
        self.counts_at_close: dict[bytes, tuple[int, int]] | None = None
        self.counts_to_save: dict[bytes, tuple[int, int]] | None = None
        self.retention = Retention(conn, self.span)  # what goes: purges, trims, TTL (storage/retention.py)
        # in_flight -> done (storage/acks.py), bound here, not wrapped in methods: a call less per ack.
        self.ack = partial(acks.ack, conn)
        self.delete_acked = partial(acks.delete_acked, conn)
        self.ack_with_results = partial(acks.ack_with_results, conn)  # XACK ... RESULT
        self.in_flight_recovered = False  # `recover` ran: no task is in flight in the file
        self.lanes_read_ahead: dict = {}  # the start's read of the lanes queues' tasks (opening.py), taken once
        # Each queue's range of row ids (storage/row_ranges.py), and the row id its next push takes: read
        # from the file once, forgotten at a rollback (a queue made in the batch is gone again).
        self._spans: dict[bytes, tuple[int, int]] = {}
        self._next_rows: dict[bytes, tuple[int, int]] = {}  # (next row id, the range's last)
        self.hand_rows = hand_rows.HandRows(conn, path)  # rows set aside at start; the sqlite3 shell meanwhile

    # -- transactions (driven by writer.py)

    def begin(self) -> None:
        self.conn.execute(self.integrity.begin_sql)

    def commit(self) -> None:
        self.conn.execute("COMMIT")

    def rollback(self) -> None:
        self._spans.clear()
        self._next_rows.clear()
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    def close(self) -> None:
        written_by_others = self.counts_to_save is not None and self.hand_rows.written_meanwhile()
        self.wal.close()
        if self._checkpointer is not None:
            self._checkpointer.close()
        self.conn.close()  # the last connection: SQLite checkpoints and removes the WAL
        if self.counts_to_save is not None and not self.integrity.corrupt:
            done_counts.save(os.path.dirname(self.path), self.path, self.counts_to_save, written_by_others)

    def wal_size(self) -> int:
        """Bytes in the WAL file (one fstat): above `wal_limit`, time for a checkpoint."""
        return self.wal.size()

    def bytes_on_disk(self) -> int:
        """The database file and its WAL (INFO's database_bytes, /metrics' ezra_database_bytes)."""
        return os.path.getsize(self.path) + self.wal_size()

    @staticmethod
    def is_disk_full(exc: BaseException) -> bool:
        """True for SQLITE_FULL and ENOSPC: no room left on the database's file system."""
        if isinstance(exc, sqlite3.Error):
            return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
        return isinstance(exc, OSError) and exc.errno == errno.ENOSPC

    def checkpoint(self, mode: str = "PASSIVE") -> tuple[int, int, int]:
        """Copy committed WAL frames into the database file (both fsynced), on a thread, on its own
        connection; SQLite's (busy, frames in the WAL, frames copied). PASSIVE never blocks the writer;
        RESTART (while the writer pauses) copies the few frames left and makes the next commit start
        the WAL over. Neither waits for readers (CHECKPOINT_WAIT_MS): a reader's snapshot leaves frames
        uncopied (PASSIVE) or busy = 1 (RESTART)."""
        if self._checkpointer is None:
            self._checkpointer = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._checkpointer.execute(f"PRAGMA busy_timeout = {CHECKPOINT_WAIT_MS}")
        return tuple(self._checkpointer.execute(f"PRAGMA wal_checkpoint({mode})").fetchone())

    @staticmethod
    def is_busy(exc: BaseException) -> bool:
        """True for SQLITE_BUSY: a checkpoint that would have had to wait for a reader."""
        return isinstance(exc, sqlite3.Error) and getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY

    # -- start-up

    def recover(self) -> int:
        """Every in_flight task back to available (start-up, before the port opens). Tasks in
        flight have no index (schema 12), so this reads every row of the table, as the counts do
        after a crash. After a clean stop there is nothing to do: the stopping server gave its
        tasks in flight back (`give_back`), and the file is unchanged since (counts_at_close)."""
        self.in_flight_recovered = True
        if self.counts_at_close is not None:
            return 0
        return self.conn.execute(
            "UPDATE tasks SET state = 'available', worker = NULL, deadline = NULL "
            "WHERE state = 'in_flight'").rowcount

    def give_back(self, rowids: list[int]) -> int:
        """These tasks in flight back to available, as start-up's recovery does (a clean stop)."""
        return self.conn.execute(
            "UPDATE tasks SET state = 'available', worker = NULL, deadline = NULL "
            "WHERE rowid IN (SELECT value FROM json_each(?)) AND state = 'in_flight'",
            (row_list(rowids),)).rowcount

    def in_flight_tasks(self) -> list[tuple]:
        """(queue, id_ms, id_seq, rowid, worker, deadline, delivered_at, attempts) of every task in
        flight: a start without recovery (tests, tools) reads them once, a pass over the table."""
        return self.conn.execute(
            "SELECT queue, id_ms, id_seq, rowid, worker, deadline, delivered_at, attempts FROM tasks "
            "WHERE state = 'in_flight'").fetchall()

    def shrink_memory(self) -> None:
        """Free the page cache start-up filled (recovery and the counts read every index once)."""
        self.conn.execute("PRAGMA shrink_memory")

    def load_queues(self) -> list[dict]:
        """Every queue's row, with `newest_id`: the newest task's id (or None)."""
        newest = f"(SELECT {{}} FROM tasks WHERE {row_ranges.IN_QUEUE_RANGE} ORDER BY rowid DESC LIMIT 1)"
        cur = self.conn.execute(
            f"SELECT *, {newest.format('id_ms')} AS newest_ms, {newest.format('id_seq')} AS newest_seq "
            "FROM queues")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]

    def count_states(self, done: dict[bytes, int] | None = None, in_flight: dict | None = None,
                     available: dict[bytes, int] | None = None) -> list[tuple]:
        """(queue, state, count) for every queue; start-up and a rollback build the counters from it.

        Delayed and dead tasks have a partial index each, already in queue order: counted there,
        with no sort of the whole table; waiting tasks are the dependencies table's (Dependencies.waiting_counts). Tasks in flight are the broker's to count (`in_flight`:
        {queue name: count}, broker/in_flight.py). Available and done tasks have no index
        (schemas 8 and 10: each would cost every push, claim or ack a B-tree write), nor has a
        queue's count of tasks (schema 14). After a clean stop and after a rolled-back batch,
        `done` and `available` give them (storage/done_counts.py; the broker's counts once its batch journal undid the batch), and
        no row is read. Otherwise every row is: with `done` alone (a start without recovery, once
        it knows the tasks in flight) each queue's rows are counted and the available are the
        rest; without it each row's state is read too (0.25 s a million, cached). Queue by queue,
        each its range of row ids: one GROUP BY queue would sort the table (0.7 s and +45 MB).
        """
        rows = self.conn.execute(" UNION ALL ".join(
            f"SELECT queue, '{state}', count(*) FROM tasks INDEXED BY tasks_{state} "
            f"WHERE state = '{state}' GROUP BY queue" for state in (lifecycle.DELAYED, lifecycle.DEAD))).fetchall()
        rows += [(queue, lifecycle.WAITING, n) for queue, n in self.dependencies.waiting_counts()]
        rows += [(name_value(name), lifecycle.IN_FLIGHT, n) for name, n in (in_flight or {}).items() if n]
        if done is not None and available is not None:
            return rows + [(name_value(name), state, n) for state, counts in
                           ((lifecycle.DONE, done), (lifecycle.AVAILABLE, available)) for name, n in counts.items() if n]
        others: dict = {}
        for queue, _, count in rows:
            others[queue] = others.get(queue, 0) + count
        counts = list(rows)
        done_rows = "0" if done is not None else "sum(state = 'done')"  # given, or read from each row
        for queue, count, done_here in self.conn.execute(
                f"SELECT queues.name, count(*), {done_rows} FROM queues INDEXED BY queues_number "
                f"JOIN tasks ON {row_ranges.IN_QUEUE_RANGE} WHERE number IS NOT NULL GROUP BY number"):
            if done is not None:
                done_here = done.get(name_bytes(queue), 0)
                if done_here > count - others.get(queue, 0):  # not these rows' counts: read the rows
                    logger.warning("queue {!r}: {} done tasks given, more than its {} tasks not in "
                                   "flight, delayed or dead; counting them", queue, done_here, count)
                    return self.count_states(None, in_flight)
            if done_here:
                counts.append((queue, lifecycle.DONE, done_here))
            if count - done_here - others.get(queue, 0) > 0:
                counts.append((queue, lifecycle.AVAILABLE, count - done_here - others.get(queue, 0)))
        return counts

    # -- queues

    def insert_queue(self, name: bytes, now: int) -> None:
        """A new queue's row, with the next number (its range of row ids, storage/row_ranges.py)."""
        number = self._next_queue_number()
        self.conn.execute("INSERT OR IGNORE INTO queues (name, created_at, number) VALUES (?, ?, ?)",
                          (name_value(name), now, number))

    def check_room_for_push(self, queue: bytes) -> None:
        """Raise what the queue's next push would for want of a queue number or a row id (XSCHEDULE SET)."""
        if self.span(queue) == row_ranges.NO_ROWS:
            self._next_queue_number()
        else:
            self._new_rows(queue, 1)

    def _next_queue_number(self) -> int:
        number = self.conn.execute("SELECT coalesce(max(number), 0) + 1 FROM queues").fetchone()[0]
        if number > row_ranges.MAX_QUEUE_NUMBER:
            raise errors.too_many_queues(row_ranges.MAX_QUEUE_NUMBER)
        return number

    def span(self, queue: bytes) -> tuple[int, int]:
        """The queue's range of row ids (storage/row_ranges.py); an empty range for a queue not in the file."""
        span = self._spans.get(queue)
        if span is None:
            row = self.conn.execute("SELECT number FROM queues WHERE name = ?", (name_value(queue),)).fetchone()
            if row is None:
                return row_ranges.NO_ROWS
            number = row[0]
            if number is None:  # a row made by hand (the sqlite3 shell): it gets its number now
                number = self._next_queue_number()
                self.conn.execute("UPDATE queues SET number = ? WHERE name = ?", (number, name_value(queue)))
            span = self._spans[queue] = row_ranges.span(number)
        return span

    def _new_rows(self, queue: bytes, n: int) -> tuple[int, int]:
        """The first of the n row ids the queue's next n pushes take (the rows after its last), and
        the last of its range; the caller marks them taken (`_next_rows`) once written."""
        next_row = self._next_rows.get(queue)
        if next_row is None:
            low, high = self.span(queue)
            last = self.conn.execute("SELECT rowid FROM tasks WHERE rowid BETWEEN ? AND ? ORDER BY rowid DESC "
                                     "LIMIT 1", (low, high)).fetchone()
            next_row = self._next_rows[queue] = (low if last is None else last[0] + 1, high)
        if next_row[0] + n - 1 > next_row[1]:
            raise errors.queue_rows_used(row_ranges.QUEUE_ROWS)
        return next_row

    def save_last_id(self, name: bytes, last_id: tuple) -> None:
        self.conn.execute("UPDATE queues SET last_id_ms = ?, last_id_seq = ? WHERE name = ?",
                          (last_id[0], last_id[1], name_value(name)))

    def save_deleted(self, name: bytes, count: int, max_id: tuple) -> None:
        self.conn.execute("UPDATE queues SET deleted_count = ?, max_deleted_ms = ?, max_deleted_seq = ? "
                          "WHERE name = ?", (count, max_id[0], max_id[1], name_value(name)))

    def save_settings(self, name: bytes, changes: dict) -> None:
        """Store XCFGSET's changes ({column: value}); columns come from SETTING_COLUMNS only."""
        columns = [column for column in changes if column in SETTING_COLUMNS]
        if columns:
            self.conn.execute(f"UPDATE queues SET {', '.join(c + ' = ?' for c in columns)} WHERE name = ?",
                              (*(changes[c] for c in columns), name_value(name)))

    def save_group_name(self, name: bytes, group: bytes | None) -> None:
        """The name XGROUP CREATE gave the queue's group; None: forgotten (XGROUP DESTROY)."""
        self.conn.execute("UPDATE queues SET group_name = ? WHERE name = ?",
                          (None if group is None else name_value(group), name_value(name)))

    # -- tasks

    def insert_plain(self, queue: bytes, task_id: tuple, fields: bytes | str, now: int, available_at: int) -> int:
        """A plain push (`XADD q * field value...`), available: its row id (the queue's next). The other
        columns' defaults are the schema's, so 7 values are bound, not 16, and nothing is looked at to
        choose (when it was 6 values against 10: 0.8 µs less per push, 5.4 -> 4.6 µs a statement)."""
        rowid, high = self._new_rows(queue, 1)
        try:
            self.conn.execute(_INSERT_PLAIN_SQL, (rowid, name_value(queue), task_id[0], task_id[1], fields, now,
                                                  available_at))
        except sqlite3.IntegrityError as exc:  # a row written by hand meanwhile? (or raises exc)
            self.hand_rows.make_way(queue, (rowid, rowid), exc, self._next_rows)
            return self.insert_plain(queue, task_id, fields, now, available_at)
        self._next_rows[queue] = (rowid + 1, high)
        return rowid

    def insert_task(self, queue: bytes, task_id: tuple, fields: bytes | str, now: int,
                    available_at: int, state: str = lifecycle.AVAILABLE, ttl_ms: int | None = None,
                    attempts: int = 0, failure: dict | None = None, unique_key: bytes | None = None,
                    priority: int | None = None, partition: bytes | None = None, name: bytes | None = None) -> int:
        """A pushed task with options: as insert_plain; `fields` as stored (task_fields.py: a push's RESP
        bytes, or a schedule's JSON text); `attempts`, `failure` and a dead `state` come from imports
        (XADD ATTEMPTS, FAILURE, XADD q::dead); `unique_key` from XADD UNIQUE (storage/unique_keys.py:
        the caller asked for the key's holder first); `priority` and `partition` from XADD PRIORITY
        and PARTITION (NULL when not given: the default priority, no partition); `name` from XADD NAME
        (storage/task_names.py: the caller asked whether the name is taken first)."""
        if (state == lifecycle.AVAILABLE and not attempts and ttl_ms is None and failure is None
                and unique_key is None and priority is None and partition is None and name is None):
            return self.insert_plain(queue, task_id, fields, now, available_at)
        rowid, high = self._new_rows(queue, 1)
        try:
            self.conn.execute(_INSERT_TASK_SQL, (
                rowid, name_value(queue), task_id[0], task_id[1], state, fields, attempts, now, available_at,
                now if state == lifecycle.DEAD else None, ttl_ms, encode_failure(failure),
                None if unique_key is None else name_value(unique_key), priority,
                None if partition is None else name_value(partition), claim_room(state),
                None if name is None else name_value(name)))
        except sqlite3.IntegrityError as exc:  # a row written by hand meanwhile? (or raises exc)
            self.hand_rows.make_way(queue, (rowid, rowid), exc, self._next_rows)
            return self.insert_task(queue, task_id, fields, now, available_at, state, ttl_ms, attempts, failure,
                                    unique_key, priority, partition, name)
        self._next_rows[queue] = (rowid + 1, high)
        return rowid

    def insert_available(self, queue: bytes, tasks: list[tuple], now: int) -> range | list[int]:
        """Pushed tasks, (id_ms, id_seq, fields as stored[, priority, partition key]) each, available now: their
        row ids, the queue's next ones (a list if a hand-written row was in the way). Statements of INSERT_ROWS."""
        first, high = self._new_rows(queue, len(tasks))
        name, start = name_value(queue), 0
        mss, seqs, fields, *placed = zip(*tasks)  # by column: each statement's parameters made in C, no loop
        if placed:  # priority, partition key
            placed[1] = [None if key is None else name_value(key) for key in placed[1]]
        while start < len(tasks):  # a statement of the most rows that fit, down to one row
            rows = min(INSERT_ROWS, 1 << (len(tasks) - start).bit_length() - 1)
            end = start + rows
            params = list(chain.from_iterable(zip(range(first + start, first + end), repeat(name, rows),
                                                  mss[start:end], seqs[start:end], fields[start:end],
                                                  repeat(now, rows), repeat(now, rows), *(c[start:end] for c in placed))))
            try:
                self.conn.execute((_INSERT_PLACED_SQL if placed else _INSERT_AVAILABLE_SQL)[rows], params)
            except sqlite3.IntegrityError as exc:  # the statement wrote nothing; those before it stay
                self.hand_rows.make_way(queue, (first + start, first + end - 1), exc, self._next_rows)
                return [*range(first, first + start), *self.insert_available(queue, tasks[start:], now)]
            start = end
        self._next_rows[queue] = (first + len(tasks), high)
        return range(first, first + len(tasks))

    def claim(self, queue: bytes, rowids: list[int], worker: bytes, now: int, deadline: int | None,
              state: str = lifecycle.IN_FLIGHT, retained: int | None = None) -> list[tuple]:
        """Lease these tasks (the queue's available order, broker/available.py): (id_ms, id_seq,
        fields, attempts, rowid) of each that is still an available task of the queue, in no set
        order (the broker sorts what its passes gathered), attempts counting this delivery. Others
        (a stale entry of the order) are left alone. NOACK (state done): `retained` as `ack`'s."""
        finished = now if state == lifecycle.DONE else None
        low, high = self.span(queue)
        # The rows, then the guarded update of them: UPDATE ... RETURNING costs more than the SELECT
        # it saves (1 row: 27.6 against 14.5 µs; 50 rows: 2.5 against 2.1 µs a row, measured).
        if len(rowids) == 1:  # workers' usual COUNT 1: the row by its id
            if not low <= rowids[0] <= high:
                return []
            row = self.conn.execute(
                "SELECT id_ms, id_seq, fields, attempts FROM tasks WHERE rowid = ? AND state = 'available'",
                (rowids[0],)).fetchone()
            if row is None or not self.conn.execute(
                    "UPDATE tasks SET state = ?, worker = ?, deadline = ?, delivered_at = ?, "
                    "attempts = attempts + 1, finished_at = ?, retained = ?, reserved = NULL "
                    "WHERE rowid = ? AND state = 'available'",
                    (state, name_value(worker), deadline, now, finished, retained, rowids[0])).rowcount:
                return []
            return [(row[0], row[1], row[2], row[3] + 1, rowids[0])]
        listed = row_list(rowids)
        rows = self.conn.execute(_CLAIMABLE_SQL, (listed, low, high)).fetchall()
        if rows:
            self.conn.execute(_CLAIM_SQL, (state, name_value(worker), deadline, now, finished, retained, listed,
                                           low, high))
        return rows

    def available_after(self, queue: bytes, after: int | None, limit: int) -> list[tuple]:
        """A slice of the queue's available order: (rowid, id_ms, id_seq) of up to `limit` available
        tasks after the row id `after` (None: from the start), in id order: the queue's range of row
        ids, no sort."""
        low, high = self.span(queue)
        return self.conn.execute(  # queue = ?: a row written by hand in its range meanwhile is not its task
            "SELECT rowid, id_ms, id_seq FROM tasks WHERE rowid BETWEEN ? AND ? AND state = 'available' AND queue = ? "
            "ORDER BY rowid LIMIT ?", (low if after is None else after + 1, high, name_value(queue), limit)).fetchall()

    def renew(self, rowids: list[int], now: int, deadline: int) -> list[tuple]:
        """XREADGROUP with an id: these in-flight tasks (a worker's own, broker/in_flight.py) are
        delivered again, leased from now: (id_ms, id_seq, fields, attempts) of each, in id order."""
        rows = self.conn.execute(
            "UPDATE tasks SET deadline = ?, delivered_at = ?, attempts = attempts + 1 "
            "WHERE rowid IN (SELECT value FROM json_each(?)) AND state = 'in_flight' "
            f"RETURNING {TASK_COLUMNS}, attempts",
            (deadline, now, row_list(rowids))).fetchall()
        rows.sort()
        return rows

    def delete_by_id(self, queue: bytes, task_id: tuple, states: tuple) -> tuple | None:
        """Delete one task if it is in one of `states` (XACKDEL: in flight or done; XDEL: available,
        delayed or waiting, nobody holds it): (its former state, its row id, priority, partition_key), or None."""
        rowid = row_ranges.row_of(self.conn, self.span(queue), task_id)
        return None if rowid is None else self.conn.execute(
            f"DELETE FROM tasks WHERE rowid = ? AND state IN ({','.join('?' * len(states))}) "
            "RETURNING state, rowid, priority, partition_key",
            (rowid, *states)).fetchone()

    def unfinished_attempts(self, queue: bytes, ids: list[tuple], states: tuple) -> list[tuple]:
        """(rowid, attempts, state, worker, (id_ms, id_seq)) of the given tasks that are in one of
        `states` (XNACK FORCE: tasks in flight, available or delayed)."""
        return [(rowid, attempts, state, worker, (ms, seq)) for rowid, attempts, state, worker, ms, seq
                in self._tasks_by_id("rowid, attempts, state, worker, id_ms, id_seq", queue, ids, states)]

    def _tasks_by_id(self, columns: str, queue: bytes, ids: list[tuple], states: tuple) -> list[tuple]:
        """`columns` of the given tasks (each once, in the order given) that are in one of `states`:
        each found by a search of the queue's row ids (storage/row_ranges.py)."""
        sql = _BY_ID_SQL.get((columns, states))
        if sql is None:  # built once per shape (a handful: XNACK's, XCLAIM's), not per call
            marks = ",".join("?" * len(states))
            sql = _BY_ID_SQL[columns, states] = f"SELECT {columns} FROM tasks WHERE rowid = ? AND state IN ({marks})"
        span, rows = self.span(queue), []
        for task_id in dict.fromkeys(ids):
            rowid = row_ranges.row_of(self.conn, span, task_id)
            row = None if rowid is None else self.conn.execute(sql, (rowid, *states)).fetchone()
            if row:
                rows.append(row)
        return rows

    def set_outcome(self, rowid: int, state: str, attempts: int, now: int, available_at: int,
                    failure: dict | None = None) -> int:
        """Apply the result of a failure (lifecycle.after_failure) to one unfinished task, and record
        why (lifecycle.failure_record; None: keep the record it has, as a SILENT nack without
        REASON). 1 if it moved, 0 if the task was done or dead (the caller's SELECT said otherwise)."""
        if failure is None:
            return self.conn.execute(_SET_OUTCOME_SQL, (state, attempts, available_at, state, now, rowid)).rowcount
        return self.conn.execute(_SET_OUTCOME_WITH_FAILURE_SQL, (state, attempts, available_at, state, now,
                                                                 encode_failure(failure), rowid)).rowcount

    def promote_due(self, now: int, limit: int) -> list:
        """Delayed tasks whose time came become available; (queue, row id, priority, partition_key) of each."""
        return self.conn.execute(
            "UPDATE tasks SET state = 'available' WHERE rowid IN (SELECT rowid FROM tasks "
            "WHERE state = 'delayed' AND available_at <= ? ORDER BY available_at LIMIT ?) "
            "RETURNING queue, rowid, priority, partition_key",
            (now, limit)).fetchall()

    def next_due(self) -> int | None:
        return self.conn.execute(
            "SELECT min(available_at) FROM tasks WHERE state = 'delayed'").fetchone()[0]

    def requeue(self, queue: bytes, ids: list[tuple] | None, now: int) -> list[int]:
        """dead -> available with attempts reset: the given ids, or all of the queue's (None);
        (row id, priority, partition_key) of those moved."""
        sql = ("UPDATE tasks SET state = 'available', attempts = 0, worker = NULL, deadline = NULL, "
               "finished_at = NULL, available_at = ? WHERE queue = ? AND state = 'dead'")
        q = name_value(queue)
        if ids is None:
            return self.conn.execute(sql + " RETURNING rowid, priority, partition_key", (now, q)).fetchall()
        sql += " AND id_ms = ? AND id_seq = ? RETURNING rowid, priority, partition_key"
        return [row for ms, seq in dict.fromkeys(ids) for row in self.conn.execute(sql, (now, q, ms, seq))]

    def delete_dead(self, queue: bytes, ids: list[tuple]) -> list[tuple]:
        """Delete dead tasks for good; the ids deleted."""
        q = name_value(queue)
        deleted = []
        for ms, seq in dict.fromkeys(ids):
            if self.conn.execute("DELETE FROM tasks WHERE queue = ? AND id_ms = ? AND id_seq = ? "
                                 "AND state = 'dead'", (q, ms, seq)).rowcount:
                deleted.append((ms, seq))
        return deleted

    # -- leases: XCLAIM, XAUTOCLAIM, XREADGROUP CLAIM

    LEASE_COLUMNS = "rowid, id_ms, id_seq, state, worker, delivered_at, attempts, fields"

    def lease_rows(self, queue: bytes, ids: list[tuple], states: tuple) -> list[tuple]:
        """The given tasks in one of `states`, in the order given (LEASE_COLUMNS)."""
        return self._tasks_by_id(self.LEASE_COLUMNS, queue, ids, states)

    def lease_rows_of(self, rowids: list[int]) -> dict[int, tuple]:
        """These rows (tasks in flight the broker chose: XAUTOCLAIM, XREADGROUP CLAIM) by row id
        (LEASE_COLUMNS)."""
        return {row[0]: row for row in self.conn.execute(
            f"SELECT {self.LEASE_COLUMNS} FROM tasks WHERE rowid IN (SELECT value FROM json_each(?))",
            (row_list(rowids),))}

    def set_lease(self, rowid: int, worker: bytes, delivered_at: int, deadline: int, attempts: int) -> int:
        """Take over or renew an in-flight task, or FORCE an available one: 1 if it moved, else 0."""
        return self.conn.execute(
            "UPDATE tasks SET state = 'in_flight', worker = ?, delivered_at = ?, deadline = ?, attempts = ?, "
            "reserved = NULL WHERE rowid = ? AND (state = 'in_flight' OR state = 'available')",
            (name_value(worker), delivered_at, deadline, attempts, rowid)).rowcount

    # -- reads

    def range(self, queue: bytes, states: tuple, start: tuple, end: tuple, count: int | None,
              reverse: bool) -> list[tuple]:
        """XRANGE, XREVRANGE: tasks in `states` with ids from `start` to `end`, in id order (`reverse`:
        newest first), up to `count`."""
        if start > end:
            return []
        low, high = row_ranges.rows_between(self.conn, self.span(queue), start, end)
        marks = ",".join("?" * len(states))
        return self.conn.execute(  # queue = ?: as available_after's
            f"SELECT {TASK_COLUMNS} FROM tasks WHERE rowid BETWEEN ? AND ? AND state IN ({marks}) AND queue = ? "
            f"ORDER BY rowid {'DESC' if reverse else 'ASC'} LIMIT ?",
            (low, high, *states, name_value(queue), -1 if count is None else count)).fetchall()

    def entries_after(self, queue: bytes, states: tuple, after: tuple, count: int) -> list[tuple]:
        """XREAD: up to `count` tasks in `states` with ids above `after`, oldest first."""
        if states == (lifecycle.DEAD,):  # the dead view's partial index serves it, in id order
            return self.conn.execute(
                f"SELECT {TASK_COLUMNS} FROM tasks WHERE queue = ? AND (id_ms, id_seq) > (?, ?) AND state = 'dead' "
                "ORDER BY id_ms, id_seq LIMIT ?", (name_value(queue), after[0], after[1], count)).fetchall()
        span = self.span(queue)
        low = row_ranges.lowest_row(self.conn, span, after, above=True)
        return self.conn.execute(  # queue = ?: as available_after's
            f"SELECT {TASK_COLUMNS} FROM tasks WHERE rowid BETWEEN ? AND ? AND state IN ({','.join('?' * len(states))}) "
            "AND queue = ? ORDER BY rowid LIMIT ?", (low, span[1], *states, name_value(queue), count)).fetchall()

    def last_delivered(self, queue: bytes) -> tuple | None:
        """The newest id ever delivered (XINFO GROUPS last-delivered-id after a restart)."""
        return self.conn.execute(
            "SELECT id_ms, id_seq FROM tasks WHERE rowid BETWEEN ? AND ? AND attempts > 0 "
            "ORDER BY rowid DESC LIMIT 1", self.span(queue)).fetchone()

    # -- inspection (the dashboard, /metrics, XINFO TASKS)

    def tasks_in_state(self, queue: bytes, state: str, count: int, after: tuple = (0, 0),
                       head: int | None = None) -> list[tuple]:
        """Up to `count` tasks of one state, in flight aside (reads.tasks_in_state)."""
        return reads.tasks_in_state(self.conn, self.span(queue), queue, state, count, after, head)

    def tasks_by_rowid(self, rowids: list[int]) -> list[tuple]:
        """These rows, tasks in flight the broker chose (the dashboard, XINFO TASKS): INSPECT_COLUMNS, by id."""
        return reads.tasks_by_rowid(self.conn, rowids)

    def tasks_by_id(self, queue: bytes, states: tuple, count: int, after: tuple = (0, 0)) -> list[tuple]:
        """Up to `count` tasks in any of `states` in id order (XINFO TASKS unfinished)."""
        return tasks_by_id(self.conn, queue, states, count, after)

    def head_available_since(self, rowid: int | None) -> int | None:
        """When the next task to be delivered (the head of its queue's order) became available
        (ms), or None if none is."""
        row = None if rowid is None else self.conn.execute(
            "SELECT available_at FROM tasks WHERE rowid = ? AND state = 'available'", (rowid,)).fetchone()
        return None if row is None else row[0]
