"""The database file's free pages: how many, and giving them back to the file system (the
incremental vacuum the reaper runs a few pages at a time, broker/reaper.py)."""

from __future__ import annotations

import os


class FileSpace:
    """Free pages inside the file, read and given back on the writer's connection."""

    def __init__(self, conn, path: str, page_size: int):
        self.conn = conn
        self.path = path
        self.page_size = page_size

    def incremental_vacuum_enabled(self) -> bool:
        return self.conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # INCREMENTAL

    def free_pages(self) -> tuple[int, int]:
        """(free pages, all pages) of the file."""
        return (self.conn.execute("PRAGMA freelist_count").fetchone()[0],
                self.conn.execute("PRAGMA page_count").fetchone()[0])

    def free_bytes_inside(self) -> int:
        """Bytes of free pages in the database file: room for new rows even when the disk has none."""
        return self.conn.execute("PRAGMA freelist_count").fetchone()[0] * self.page_size

    def shrink_pending(self) -> bool:
        """The incremental vacuum shrank the database, and no checkpoint has cut the file yet."""
        return os.path.getsize(self.path) > self.conn.execute("PRAGMA page_count").fetchone()[0] * self.page_size

    def vacuum_some(self, pages: int) -> None:
        """Give up to `pages` free pages back to the file system (incremental vacuum)."""
        for _ in range(pages):
            # Each step of the pragma frees one page; Python's sqlite3 runs only the first
            # step of a statement whose rows have no columns, so step it one call at a time.
            self.conn.execute("PRAGMA incremental_vacuum(1)")
