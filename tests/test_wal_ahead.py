"""While a reader pins the WAL (Litestream, an export), commits write over zeros kept past the
WAL's end instead of growing the file at each commit (an fdatasync after growth also journals
the size), and those zeros are no data: a crash in the middle loses no acknowledged push."""

import sqlite3

from support_servers import wait_until

from ezra.storage import DEFAULT_RESERVE_BYTES
from ezra.storage.wal_file import AHEAD_BYTES

WAL_LIMIT = DEFAULT_RESERVE_BYTES // 2  # the server's db.wal_limit with the default --disk-reserve
EXTENDS_PAST = 2 * WAL_LIMIT  # the writer keeps zeros ahead once a pinned WAL is this big
FIELDS = {"d": b"x" * 200}


def wal_size(server) -> int:
    return (server.data_dir / "ezra.db-wal").stat().st_size


def pin(server) -> sqlite3.Connection:
    """Another process's snapshot, as Litestream holds: an open read transaction."""
    reader = sqlite3.connect(server.data_dir / "ezra.db", isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM tasks").fetchone()
    return reader


def push_until_extended(client, server) -> list[bytes]:
    """XADDs until the pinned WAL is past the size where zeros are kept ahead."""
    ids = []

    def extended():
        ids.append(client.xadd("q", FIELDS))
        return wal_size(server) > EXTENDS_PAST + AHEAD_BYTES

    wait_until(extended, timeout=120, interval=0, message=f"the pinned WAL past {EXTENDS_PAST + AHEAD_BYTES} bytes")
    return ids


def test_a_pinned_wal_grows_by_steps_not_at_every_commit(ezra_factory):
    server = ezra_factory()
    client = server.client()
    client.xadd("q", FIELDS)
    reader = pin(server)
    try:
        push_until_extended(client, server)
        sizes = []
        for _ in range(300):  # ~10 KB of frames each: about 3 MB
            client.xadd("q", FIELDS)
            sizes.append(wal_size(server))
        changes = sum(1 for before, after in zip(sizes, sizes[1:]) if after != before)
        # Each AHEAD_BYTES: one commit past the zeros grows the file, the next batch adds zeros.
        # Before: the file grew at 299 of the 299 commits; now 6 (3 MB).
        steps = 2 * ((sizes[-1] - sizes[0]) // AHEAD_BYTES + 1) + 1
        assert changes <= steps, f"the WAL's size changed at {changes} of 299 commits: {sizes[::30]}"
        assert "a reader holds a snapshot" in server.log()
    finally:
        reader.close()


def test_a_crash_with_zeros_past_the_wal_loses_no_acknowledged_push(ezra_factory):
    server = ezra_factory()
    client = server.client()
    ids = [client.xadd("q", FIELDS)]
    reader = pin(server)
    try:
        ids += push_until_extended(client, server)
        ids += [client.xadd("q", FIELDS) for _ in range(20)]
        assert wal_size(server) > EXTENDS_PAST
        server.kill9()
    finally:
        reader.close()
    server.start()
    client = server.client()
    assert client.xlen("q") == len(ids)
    assert [entry_id for entry_id, _ in client.xrange("q", count=len(ids) + 1)] == ids
    assert client.xadd("q", FIELDS) > ids[-1]


def test_the_zeros_go_once_the_reader_lets_go(ezra_factory):
    server = ezra_factory()
    client = server.client()
    client.xadd("q", FIELDS)
    reader = pin(server)
    push_until_extended(client, server)
    reader.close()

    def folded_in():
        client.xadd("q", FIELDS)
        return wal_size(server) <= WAL_LIMIT + AHEAD_BYTES  # the restart cuts the file to journal_size_limit

    wait_until(folded_in, timeout=60, interval=0, message="the WAL cut back after the reader let go")
    assert "no reader holds a snapshot any more" in server.log()


def test_no_zeros_ahead_on_a_disk_near_full(small_fs, ezra_factory):
    """The disk's last room is for commits and the reserve's checkpoint: on a 16 MB file system
    (less than 64 MB free past the reserve) a pinned WAL grows at each commit, as before."""
    server = ezra_factory(data_dir=small_fs)
    client = server.client()
    client.xadd("q", FIELDS)
    reader = pin(server)
    try:
        wait_until(lambda: client.xadd("q", FIELDS) and wal_size(server) > EXTENDS_PAST + 64 * 1024,
                   timeout=120, interval=0, message=f"the pinned WAL past {EXTENDS_PAST} bytes")
        sizes = []
        for _ in range(50):
            client.xadd("q", FIELDS)
            sizes.append(wal_size(server))
        assert all(after > before for before, after in zip(sizes, sizes[1:])), sizes
    finally:
        reader.close()
