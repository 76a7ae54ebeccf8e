"""Each queue's count of done and of available tasks, left beside a cleanly closed ezra.db for
the next start.

Done and available tasks are in no index (schemas 8 and 10: a push, a claim and an ack write
one B-tree less each; schema 14 dropped the primary key's index too), so counting them means
reading every row of the tasks table: 0.25 s a million tasks when the pages are cached, about
1 s when they are not, and a start that reads every page of the table is refused by any damaged
one. A server that stops cleanly knows the counts: it writes them to `ezra.counts` once the
database is closed, with the file's identity (size, inode, modification time to the
nanosecond). The next start takes them only if ezra.db is that file, unwritten since and with no
WAL frames: anything that wrote to it meanwhile (the sqlite3 shell, a restore, a copy over it) moved
its time or its inode (a stop that saw another connection write leaves counts that match no file).
Otherwise, as after a crash, start-up counts the rows.

The file is read and removed before the database is opened, so it never outlives the start it
served: a crash later finds none and counts.
"""

from __future__ import annotations

import json
import os

from loguru import logger

COUNTS_FILENAME = "ezra.counts"
FORMAT = 2  # 2: {queue: [done, available]} (1 had the done counts only: an older EZRA's file is counted)


def _identity(db_path: str) -> list[int]:
    st = os.stat(db_path)
    return [st.st_size, st.st_ino, st.st_mtime_ns]


def _wal_bytes(db_path: str) -> int:
    """The WAL's size: a reader that opened the closed file (read-only, it cannot remove it) leaves
    an empty one; frames in it are writes the file does not have yet."""
    try:
        return os.stat(db_path + "-wal").st_size
    except FileNotFoundError:
        return 0


def save(data_dir: str, db_path: str, counts: dict[bytes, tuple[int, int]], written_by_others: bool = False) -> None:
    """Write the counts, {queue: (done, available)}, beside the closed database (written whole,
    then renamed into place). `written_by_others`: another connection wrote to the file while the
    server ran (the sqlite3 shell: storage/hand_rows.py), so the next start must find it changed."""
    path = os.path.join(data_dir, COUNTS_FILENAME)
    record = {"format": FORMAT, "database": [0, 0, 0] if written_by_others else _identity(db_path),
              "queues": {name.hex(): list(pair) for name, pair in counts.items() if any(pair)}}
    temporary = path + ".new"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except OSError as exc:  # the next start counts the rows instead: slower, not wrong
        logger.warning("could not save the done-task counts to {}: {} (the next start counts them)", path, exc)


def take(data_dir: str, db_path: str) -> tuple[dict[bytes, tuple[int, int]] | None, bool]:
    """The counts a clean stop left, {queue: (done, available)}, if ezra.db is still the file they
    were taken of, else None (count the rows); and whether the file was written by another program
    since that stop, or while the server ran (None and False: no clean stop, a crash). Removes them."""
    path = os.path.join(data_dir, COUNTS_FILENAME)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None, False
    except OSError as exc:
        logger.warning("cannot read {}: {}; counting the tasks instead", path, exc)
        return None, True
    try:
        with os.fdopen(fd) as f:
            text = f.read()
        os.unlink(path)
    except OSError as exc:
        logger.warning("cannot read or remove {}: {}; counting the tasks instead", path, exc)
        return None, True
    try:
        record = json.loads(text)
        if _wal_bytes(db_path) or record.get("format") != FORMAT \
                or record.get("database") != _identity(db_path):
            logger.info("{} was changed after the last clean stop: counting the tasks", db_path)
            return None, True
        return {bytes.fromhex(name): (int(done), int(available))
                for name, (done, available) in record["queues"].items()}, False
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        logger.warning("ignoring {} ({}): counting the tasks instead", path, exc)
        return None, True
