"""`ezra backup <dest.db>`: a consistent copy of a running (or stopped) server's ezra.db.

It opens the data directory's ezra.db itself, with its own SQLite connection, and
copies it through SQLite's online backup API: one read snapshot, while the server
keeps writing (WAL mode lets a reader and the writer run side by side). It finds
the data directory as the server does (--data-dir, EZRA_DATA_DIR, --config).
"""

from __future__ import annotations

import os
import sys

import configargparse

from ..config import Settings
from ..storage import DB_FILENAME, StorageError, backup_database


def build_parser() -> configargparse.ArgParser:
    parser = configargparse.ArgParser(
        prog="ezra backup",
        description="Copy a live ezra.db to DEST with SQLite's online backup API. The copy is one "
                    "consistent file (no -wal beside it), written as DEST.partial-<random> and renamed to "
                    "DEST once whole: restore it by stopping EZRA and putting it in "
                    "place of ezra.db (removing ezra.db-wal and ezra.db-shm).",
        ignore_unknown_config_file_keys=True)
    parser.add_argument("--config", is_config_file=True, env_var="EZRA_CONFIG",
                        help="the server's config file (only data-dir is read from it)")
    parser.add_argument("--data-dir", default=Settings.data_dir, env_var="EZRA_DATA_DIR",
                        help="directory holding ezra.db")
    parser.add_argument("dest", help="file to create (refused if it exists)")
    return parser


def backup_main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    source = os.path.join(args.data_dir, DB_FILENAME)
    if not os.path.exists(source):
        print(f"ezra backup: no database at {source}", file=sys.stderr)
        return 1
    try:
        counts = backup_database(source, args.dest)
    except StorageError as exc:
        print(f"ezra backup: {exc}", file=sys.stderr)
        return 1
    shown = ", ".join(f"{state}={n}" for state, n in sorted(counts.items())) or "no tasks"
    print(f"backed up {source} to {args.dest} ({shown})")
    return 0
