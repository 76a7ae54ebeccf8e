"""All of EZRA's SQL, and the only package that imports sqlite3: schema.sql (the
tables and indexes, plain DDL read with importlib.resources and bundled into the
binary), schema.py (the file's mark and version, how names and fields sit in
rows, StorageError), database.py (the Database: the server's connection and
every query it runs, named; the broker calls them on the event loop inside the
writer's transaction of the current loop turn), opening.py (open_database:
own-file checks, pragmas, migrations), dirlock.py (ezra.lock: one server per data
directory), integrity.py (a corrupt file: found, reported, no longer written) and
snapshots.py (hot backup, the export's read-only snapshot, the import's in-use
check: connections of their own, on a native thread or in a command-line
program). schedules.py holds the schedules table's queries (XSCHEDULE), which the
Database carries as `db.schedules`; unique_keys.py those of XADD UNIQUE
(`db.unique_keys`); task_names.py those of XADD NAME (`db.task_names`); producers.py those of XADD IDMP (`db.producers`); results.py those of
XRESULT and XPROGRESS (`db.results`); acks.py the
ack's statements, by row id (`db.ack`, `db.delete_acked`); wal_file.py the WAL file's own
descriptor (fdatasync, size, zeros kept ahead; `db.wal`). row_ranges.py says where a queue's
tasks sit (a range of row ids, in id order: schema 14) and finds an id's row by a binary search
of it. hand_rows.py finds rows written by hand at a start (out of place, unreadable: set aside in
unreadable_tasks) and notices the sqlite3 shell writing while the server runs (`db.hand_rows`).
reads.py holds the
reads whose cost grows with the data (XINFO's idempotency counts, the done listing), which
the Database runs in its transaction and the broker on a native thread
(`read_apart`). The modules import one another in that order (schema <- row_ranges <- dirlock,
integrity, reads, acks, hand_rows <- database <- opening <- snapshots);
the package imports nothing of EZRA but lifecycle (the states), stream_ids (the largest id)
and errors (a push past its queue's range), so the broker, the writer, web/ and tools/
import it and it imports none of them.
"""

from .dirlock import LOCK_FILENAME, DataDirLock, DataDirLocked
from .integrity import Integrity, QuickCheck
from .database import DEFAULT_RESERVE_BYTES, RESERVE_FILENAME, Database
from .opening import DB_FILENAME, open_database
from .schema import (SCHEMA, SCHEMA_VERSION, SETTING_COLUMNS, StorageError, decode_failure, decode_fields,
                     encode_failure, encode_fields, name_bytes, name_value)
from .snapshots import Snapshot, backup_database, database_in_use

__all__ = [
    "DB_FILENAME", "DEFAULT_RESERVE_BYTES", "LOCK_FILENAME", "DataDirLock", "DataDirLocked",
    "Integrity", "RESERVE_FILENAME", "SCHEMA", "SCHEMA_VERSION", "SETTING_COLUMNS",
    "Database", "Snapshot", "StorageError", "backup_database", "database_in_use", "decode_failure",
    "decode_fields", "encode_failure", "encode_fields", "name_bytes", "name_value", "open_database", "QuickCheck",
]
