"""The reaper: a greenlet that runs a pass every REAPER_INTERVAL in the writer's batch.

Each pass, in order:
    expire   in-flight tasks whose lease ran out fail, through Transitions.apply_failures
    promote  delayed tasks whose time came (DELAY, backoff) become available; blocked
             workers are served in the same transaction
    open     a queue's RATE-LIMIT window that was full lets tasks out again: its blocked
             workers are served (flow.py)
    mark     a queue given a retention limit marks its done tasks finished while it kept
             them for ever (only marked ones are in the purge's index), a batch a pass
    purge    done tasks older than their queue's retention, and finished tasks whose
             own TTL ran out, are deleted in small batches
    forget   idempotent-producer ids past IDMP-DURATION
    vacuum   when purges left much of the file free and have stopped for a while, give
             some pages back (incremental vacuum); until then new tasks reuse them. While
             the disk is full, after a second of quiet, as many as pushes need to resume

Trimming (XADD/XTRIM MAXLEN|MINID ~, trimming.py) removes done tasks too, in the
push's or XTRIM's own transaction (`trim_done`), and counts them as purges do.

Idle cost is near zero: the reaper's deadlines (deadlines.py) keep the earliest time
anything can be due and no query runs before it. A pass that filled a batch reports
more work, and the next pass runs at once instead of after the interval.
"""

from __future__ import annotations

import gevent
from loguru import logger

from .. import lifecycle
from ..settings import trimming
from ..lifecycle import AVAILABLE, DEAD, DELAYED, DONE, GONE, IN_FLIGHT, WAITING
from ..storage import name_bytes
from ..protocol.stream_ids import TOP
from ..settings.trimming import MAXLEN, MINID
from ..writer.transactions import transaction
from .in_flight import failure_rows
from .deadlines import INF

REAPER_INTERVAL = 0.1  # seconds between passes when there is nothing to catch up on
EXPIRE_BATCH = 1000
PROMOTE_BATCH = 1000
PURGE_BATCH = 1000
MARK_BATCH = 1000  # tasks looked at per pass when a retention limit marks the done ones (_mark_retained)
TTL_RECHECK_MS = 1000  # a task with TTL that finishes is purged at most this late
FLUSH_MS = 1000        # removed-task counters are saved this often
VACUUM_AFTER_ROWS = 1000   # look at the free pages after this many deletions ...
VACUUM_QUIET_MS = 5000     # ... once deletions have stopped this long (pages are reused meanwhile;
                           # vacuuming while a queue drains would move pages about to be freed)
DISK_FULL_QUIET_MS = 1000  # ... or this long while the disk is full: pushes wait for it
VACUUM_MIN_FREE_PAGES = 2048
VACUUM_STEP_PAGES = 256    # pages given back per pass (1 MB at 4 KB pages)


class Reaper:
    """The reaper's greenlet and passes, over the file, the queues and the reaper's schedule."""

    def __init__(self, db, queues, in_flight, transitions, schedule, writer, clock):
        self.db = db
        self.queues = queues
        self.in_flight = in_flight
        self.transitions = transitions
        self.schedule = schedule
        self.writer = writer
        self.clock = clock
        self._greenlet = None
        self._can_vacuum = db.file_space.incremental_vacuum_enabled()

    # -- the loop

    def start(self) -> None:
        self._greenlet = gevent.spawn(self._reap_forever)

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill()

    def _reap_forever(self) -> None:
        more = False
        while True:
            gevent.sleep(0 if more else REAPER_INTERVAL)
            try:
                more = self.maintain()
            except Exception as exc:
                logger.opt(exception=exc).error("reaper pass failed: {}", exc)
                more = False

    def maintain(self) -> bool:
        """One reaper pass (expire leases, promote due tasks, purge, trim) in its own batch;
        True when a batch was full and the next pass should come at once."""
        if self.db.integrity.corrupt:  # nothing is written to a corrupt file: no expiry, no purge
            return False
        return self._reap().wait()

    @transaction(durable=False)
    def _reap(self) -> bool:
        """One pass; True when a batch was full and the next pass should come at once."""
        now = self.clock()
        more = False
        if now >= self.schedule.earliest_deadline:
            more |= self._expire(now)
        if now >= self.schedule.earliest_due:
            more |= self._promote(now)
        if now >= self.schedule.next_window:
            self._open_windows(now)
        for queue in list(self.queues.values()):
            if queue.counts[DONE] and now >= queue.next_purge:  # a queue kept for ever: INF
                if queue.unmarked_done and queue.retention() is not None:
                    more |= self._mark_retained(queue)  # first: the purge sees marked tasks only
                else:
                    more |= self._purge_done(queue, now)
        if now >= self.schedule.next_ttl_purge:
            more |= self._purge_ttl(now)
        if now >= self.schedule.next_idmp_purge:
            more |= self._forget_idmp(now)
        if self._can_vacuum and self.writer.disk.full:
            if now - self.schedule.last_delete_at >= DISK_FULL_QUIET_MS:
                self._give_back_free_pages()
        elif (self._can_vacuum and self.schedule.rows_since_vacuum >= VACUUM_AFTER_ROWS
                and now - self.schedule.last_delete_at >= VACUUM_QUIET_MS):
            self._vacuum()
        if now >= self.schedule.next_flush:
            self.transitions.flush_deleted()
            self.schedule.next_flush = now + FLUSH_MS
        return more

    # -- the passes

    def _expire(self, now: int) -> bool:
        """In-flight tasks whose lease ran out fail, through the same rule as a nack."""
        expired = self.in_flight.expired(now, EXPIRE_BATCH)
        by_queue: dict = {}
        for queue, task_id, lease in expired:
            by_queue.setdefault(queue, []).append((task_id, lease))
        for queue, held in by_queue.items():
            lease = f"{queue.lease_seconds():g} s"
            self.transitions.apply_failures(queue, failure_rows(held), lifecycle.FAIL, None, now,
                                            lifecycle.LEASE_EXPIRED,
                                            lambda held_by: f"lease expired after {lease} held by {held_by}")
            queue.tally("expired", len(held))
        if len(expired) >= EXPIRE_BATCH:
            return True
        next_deadline = self.in_flight.next_deadline()
        self.schedule.earliest_deadline = INF if next_deadline is None else next_deadline
        return False

    def _promote(self, now: int) -> bool:
        """Delayed tasks whose time came become available, and blocked workers get them."""
        rows = self.db.promote_due(now, PROMOTE_BATCH)
        by_queue: dict[bytes, list[tuple]] = {}
        for name, rowid, priority, partition in rows:
            by_queue.setdefault(name_bytes(name), []).append((rowid, (priority, partition)))
        for name, rowids in by_queue.items():
            queue = self.queues.get(name)
            if queue is not None:
                queue.move(DELAYED, AVAILABLE, len(rowids))
                for rowid, placed in rowids:
                    self.transitions.became_available(queue, rowid, placed)
                self.transitions.serve_waiters(queue, now)
        if len(rows) == PROMOTE_BATCH:
            return True
        next_due = self.db.next_due()
        self.schedule.earliest_due = INF if next_due is None else next_due
        return False

    def _open_windows(self, now: int) -> None:
        """RATE-LIMIT windows that were full have room again: their queues' blocked workers are
        served; the next pass is due when the earliest window still full opens."""
        self.schedule.next_window = INF
        blocked = self.transitions.waiters.blocked
        for queue in list(self.queues.values()):
            if queue.flow is not None and queue.flow.rate is not None:
                if queue.name in blocked:
                    self.transitions.serve_waiters(queue, now)
                self.transitions.window_full(queue, now)

    def _mark_retained(self, queue) -> bool:
        """The queue has a retention limit now, and some done tasks may lack `retained` (finished
        while it kept them for ever: Transitions.retained_mark): walk its tasks in id order,
        MARK_BATCH a pass, marking the done ones, so the purge sees them. At the walk's end the
        file says they are all marked, and the purge runs next. True: the next pass at once."""
        end = self.db.retention.mark_retained(queue.name, queue.mark_from, MARK_BATCH)
        queue.marked_to(end)  # at the end (None), the tasks just marked may be due already
        if end is None:
            self.db.retention.save_unmarked_done(queue.name, False)
        return True

    def _purge_done(self, queue, now: int) -> bool:
        """Done tasks past the queue's retention go, oldest first, a batch at a time."""
        retention = queue.retention()
        if retention is None:
            queue.purge_due_at(INF)  # forever; XCFGSET RETENTION resets it
            return False
        keep_ms = lifecycle.to_ms(retention)
        ids = self.db.retention.purge_done(queue.name, now - keep_ms, PURGE_BATCH)
        self.transitions.purged(queue, ids)
        if len(ids) == PURGE_BATCH:
            return True
        oldest = self.db.retention.oldest_done(queue.name)
        # Later acks finish later: nothing of this queue is due before the oldest's time.
        queue.purge_due_at((now if oldest is None else oldest) + keep_ms + 1)
        return False

    def trim_done(self, queue, trim) -> int:
        """XADD/XTRIM MAXLEN|MINID ~: done tasks go, lowest ids first, at most `trim.limit`;
        never an available, delayed, in-flight or dead one. How many went."""
        if trim.strategy == MAXLEN:  # the entries XRANGE shows: dead tasks are in q::dead
            entries = sum(queue.counts[state] for state in (AVAILABLE, DELAYED, IN_FLIGHT, DONE, WAITING))
            excess = entries - trim.threshold
            if excess <= trimming.slack(trim.threshold):
                return 0  # approximate: a queue a little over n waits, then many go in one statement
            wanted, below = min(queue.counts[DONE], excess, trim.limit), TOP
        else:
            wanted, below = min(queue.counts[DONE], trim.limit), trim.threshold
        if wanted <= 0 or below <= queue.trim_floor:
            return 0
        ids = self.db.retention.trim_done(queue.name, queue.trim_floor, below, wanted)
        if len(ids) == wanted:
            queue.trimmed_to(ids[-1])  # every done task below the last one removed is gone
        elif trim.strategy == MINID:
            queue.trimmed_to(below)  # every done task below the threshold is gone
        else:
            # Fewer done tasks above the floor than counted: the floor was too high (it is only
            # kept up by acks and NOACK claims); the next trim looks from the start.
            queue.trimmed_to((0, 0))
        self.transitions.purged(queue, ids)
        return len(ids)

    def _purge_ttl(self, now: int) -> bool:
        """Finished tasks pushed with TTL go when it runs out (done or dead)."""
        rows = self.db.retention.purge_expired_ttl(now, PURGE_BATCH)
        by_queue: dict[bytes, list] = {}
        for name, state, ms, seq, _ in rows:
            by_queue.setdefault(name_bytes(name), []).append((state, (ms, seq)))
        if rows and self.transitions.dependencies.any:  # a dead task that waited (XADD AFTER): its edges go
            self.transitions.dependencies.purged([row[4] for row in rows if row[1] == DEAD])
        for name, items in by_queue.items():
            queue = self.queues.get(name)
            if queue is not None:
                for state, _ in items:
                    queue.move(state, GONE)
                self.transitions.note_deleted(queue, [task_id for _, task_id in items])
                queue.tally("purged", len(items))
        if len(rows) == PURGE_BATCH:
            return True
        # An ack does not tell the reaper about TTLs: look again within TTL_RECHECK_MS.
        expiry = self.db.retention.next_ttl_expiry()
        self.schedule.next_ttl_purge = now + TTL_RECHECK_MS if expiry is None else min(expiry, now + TTL_RECHECK_MS)
        return False

    def _forget_idmp(self, now: int) -> bool:
        if self.db.producers.purge(now, PURGE_BATCH) == PURGE_BATCH:
            return True
        expiry = self.db.producers.next_expiry()
        self.schedule.next_idmp_purge = INF if expiry is None else expiry
        return False

    def _give_back_free_pages(self) -> None:
        """Disk full: free pages go back to the file system now, a step per checkpoint, so the reserve
        fits again and pushes resume (the file keeps its size until a checkpoint cuts it). Without
        this, a drained queue left the disk full for 500 batches, the next periodic checkpoint."""
        missing = self.writer.disk.room_missing()
        # Only what is missing (the other free pages are room too), and one step per checkpoint:
        # a step may move live pages into the WAL, which must fit in the released reserve.
        if missing <= 0 or self.db.file_space.shrink_pending():
            return
        free, _ = self.db.file_space.free_pages()
        if free:
            self.db.file_space.vacuum_some(min(free, VACUUM_STEP_PAGES, -(-missing // self.db.file_space.page_size)))
            self.writer.checkpoint_soon()

    def _vacuum(self) -> None:
        """Give free pages back to the file system, a step per pass, when much of the file is free."""
        free, total = self.db.file_space.free_pages()
        if free > max(VACUUM_MIN_FREE_PAGES, total // 4):
            self.db.file_space.vacuum_some(VACUUM_STEP_PAGES)
        else:
            self.schedule.rows_since_vacuum = 0
