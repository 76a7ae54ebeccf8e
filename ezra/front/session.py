"""What a command handler sees of the server: the ServerState every connection shares, and
one connection's Session (protocol, name, authentication, MULTI, the worker names it used).

The connection (ezra/front/connection.py) builds its Session and hands it to the command table with
each command; the table and the handlers only read and set its fields, so neither this
module nor the commands import the server. It imports nothing of EZRA.
"""

from __future__ import annotations

import itertools
import time


class ServerState:
    """What every connection shares: the broker, settings, and figures for INFO."""

    def __init__(self, broker, settings, scheduler=None):
        self.broker = broker
        self.settings = settings
        self.scheduler = scheduler  # XSCHEDULE's (broker/schedules.py); None: schedules not served
        self.started = time.monotonic()  # for the uptime: a step of the system clock leaves it
        self.client_ids = itertools.count(1)
        self.sessions: dict[int, "Session"] = {}
        self.total_connections = 0
        self.total_commands = 0
        self.rejected_connections = 0
        self.slice_yields = 0  # times a connection let the others in mid-pipeline (connection.SLICE)
        self.parked_clients = 0  # connections idle without a greenlet (see ezra/front/server.py)
        self.port = settings.port
        self.max_clients = settings.max_clients  # the server lowers it if the open-files limit is lower


NO_WORKERS = frozenset()


class Session:
    """One connection's state: protocol, name, authentication, the worker names it used."""

    __slots__ = ("state", "id", "proto", "name", "lib_name", "lib_ver", "authenticated",
                 "closing", "addr", "created", "front", "workers", "queued", "queued_bytes",
                 "queue_failed", "in_exec", "last_claim")

    def __init__(self, state: ServerState, addr: str, front):
        self.state = state
        self.id = next(state.client_ids)
        self.proto = 2
        self.name = None
        self.lib_name = self.lib_ver = None
        self.authenticated = not state.settings.password
        self.closing = False
        self.addr = addr
        self.created = time.time()
        # The connection, for a blocking command: front.flush() sends the replies computed so far,
        # front.wait(event, seconds) -> True | False (timeout) | None (hung up). Not two bound
        # methods: they cost 128 bytes per connection.
        self.front = front
        # Consumer names this connection used (release on disconnect). Most connections are
        # producers or idle: they share one empty set until they name a worker (~0.2 KB each).
        self.workers: set[bytes] | frozenset = NO_WORKERS
        self.queued: list | None = None  # MULTI: the commands waiting for EXEC
        self.queued_bytes = 0            # ...and the size of their arguments
        self.queue_failed = False        # a queued command was refused: EXEC answers EXECABORT
        self.in_exec = False             # EXEC is running the queued commands: nothing blocks
        # (arguments, what they were read as) of the last plain XREADGROUP '>': a worker sends
        # the same one every time, read once (commands/queue.py). Let go when parked.
        self.last_claim: tuple | None = None

    def use_worker(self, worker: bytes) -> bytes:
        """This connection acts for `worker` (XREADGROUP, XCLAIM...): it holds the name while open."""
        if worker not in self.workers:
            if self.workers is NO_WORKERS:
                self.workers = set()
            self.workers.add(worker)
            self.state.broker.workers.seen(worker)
        return worker

    def close(self) -> None:
        """The connection closed: the worker names it used may be gone (release on disconnect)."""
        workers, self.workers = self.workers, NO_WORKERS
        for worker in workers:
            self.state.broker.workers.gone(worker)
