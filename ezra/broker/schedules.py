"""Schedules: a task pushed at the times of a cron expression (XSCHEDULE, the config's schedule lines).

A plain object beside the Broker. Its verbs (connection greenlets call them; each submits a
transaction to the writer, as the Broker's parts do: writer/transactions.py):

    set           XSCHEDULE SET    define or replace a schedule (an identical definition keeps its runs)
    delete        XSCHEDULE DEL    remove one; its tasks stay
    rows_apart    XSCHEDULE LIST   every schedule with its next and last run (`rows` inside EXEC)
    shown         INFO, /metrics, the dashboard: the same without the fields
    apply_config  (start)          the config file's schedule lines; those the file dropped go
    start, stop                    the firing greenlet
    fire_due      (the greenlet, tests)  fire every schedule whose slot has come, at the clock's now

The schedules live in their table only (storage/schedules.py): nothing is cached but the
time the greenlet sleeps until, the earliest next slot, so a rolled-back batch leaves
nothing to rebuild. The greenlet keeps one timer, for that slot; a SET or DEL wakes it.

A firing pushes as XADD does (Tasks.push's body: the queue made, counts, waiters woken) and
records the slot in the same transaction, so a crash leaves both or neither: a slot never
fires twice. It then moves the schedule's next slot past the later of the slot and now:
after downtime the one slot that came first is fired, once, not one per slot missed.
On a full disk a firing is refused as a push is (disk_space.py): its slot waits, as through
downtime, and fires once when there is room again.

Slots are the system clock's times; the greenlet sees it step by comparing it with the server's
clock (clock.py), which only elapsed time moves. A step forward is as downtime: the slot that
came first fires once. A step back (NTP correcting a fast clock) would leave each next slot that
much further away: each schedule's next slot is moved back by the step, on to its expression's
first slot from there (`_realign`), so it keeps its pace. A step shorter than a schedule's
period fires no slot twice; after a longer one, the times the clock shows a second time come
round again, as an hourly schedule's do in the repeated hour of daylight saving. A step while
the server was stopped is found at the first look: a schedule that fired (or was set) later
than the clock's now is moved back by that much.
"""

from __future__ import annotations

import gevent
from gevent.event import Event
from loguru import logger

from .. import errors
from ..protocol import stream_ids
from ..settings.cron import Cron, CronError
from ..settings.schedule_settings import Definition
from ..storage import encode_fields, reads
from ..storage.schedules import NEVER
from ..writer.transactions import transaction
from .queues import MAX_QUEUE_NAME
from .tasks import Push, Tasks

MAX_SCHEDULES = 1000   # LIST, /metrics and the dashboard show every one
FIRE_BATCH = 100       # schedules fired per transaction
RETRY_MS = 1000        # a firing that failed (disk full, storage error) is tried again after this
# The timer is monotonic, slots are wall-clock times: a look at least this often (seconds) bounds
# how late a slot fires after the system clock is set forward, and a step back is found.
MAX_SLEEP = 60.0
STEP_MS = 1000  # the system clock moving this far against elapsed time is a step (logged)
COMMAND, CONFIG = "command", "config"  # who set a schedule last (origin column)


class Scheduler:
    """The schedules' verbs and the greenlet that fires them."""

    def __init__(self, broker):
        self.broker = broker
        self.db = broker.db
        self.writer = broker.writer
        self.clock = broker.wall_clock  # slots are the system clock's times
        self.server_clock = broker.clock
        self._skew: int | None = None  # the system clock less the server's at the last look (None: none yet)
        self._crons: dict[tuple[str, str], Cron] = {}  # parsed once per (expression, zone)
        self._wake = Event()
        self._greenlet = None
        self._failing = False  # the last firing failed (logged once until one works)
        self._refused: set[bytes] = set()  # schedules whose last push was refused (logged once until one works)

    # ------------------------------------------------------------ verbs

    def set(self, definition: Definition, origin: str = COMMAND):
        """XSCHEDULE SET; the request's result is True (made or changed) or False (unchanged)."""
        request = self._save(definition, origin)
        self._wake.set()  # its next slot may be the earliest now
        return request

    def delete(self, name: bytes):
        """XSCHEDULE DEL: 1 if it existed, else 0."""
        request = self._remove(name)
        self._wake.set()
        return request

    @transaction(durable=False)
    def rows(self):
        """XSCHEDULE LIST inside EXEC (which cannot wait): every schedule's row
        (storage.schedules.ScheduleRow), by name, read in the transaction."""
        return self.db.schedules.all()

    def rows_apart(self) -> list:
        """XSCHEDULE LIST: `rows`, read on a native thread: the fields of 300 schedules of 1 MB
        each took 1-1.6 s to read and decode, every other client waiting."""
        return self.broker.admin.read_apart(reads.schedule_rows)

    @transaction(durable=False)
    def shown(self):
        """Every schedule's row, by name, without its fields (None): a read of one small index."""
        return self.db.schedules.shown()

    def apply_config(self, definitions: list[Definition]) -> None:
        """At start: set the config file's schedules; remove those the config set before and dropped."""
        wanted = {definition.name for definition in definitions}
        for definition in definitions:
            try:
                changed = self._save(definition, CONFIG).wait()
            except errors.CommandError as exc:
                raise ValueError(f"schedule {text(definition.name)!r} of the config: "
                                 f"{exc.message.removeprefix('ERR ')}") from None
            logger.info("schedule {!r} from the config: {!r} in {}, queue {!r}{}", text(definition.name),
                        definition.cron.text, definition.cron.zone_name, text(definition.queue),
                        "" if changed else " (unchanged: its runs go on)")
        for name in self._config_names().wait():
            if name not in wanted:
                self._remove(name).wait()
                logger.info("schedule {!r} removed: the config no longer has it", text(name))

    def fire_due(self) -> tuple[bool, int | None]:
        """Fire what is due at the clock's now: (more are due, the earliest next slot or None)."""
        now = self.clock()
        self._follow_steps(now)
        earliest = self._earliest().wait()
        if earliest is None or earliest > now:  # a look, not a firing: no fsync for it
            return False, earliest
        # A firing adds rows, as a push does: on a full disk it is refused (DISK_FULL) before it
        # runs, and its slots wait; it must not use the reserve the workers' claims and acks need.
        return self._fire_batch(now).wait()

    def _follow_steps(self, now: int) -> None:
        """Realign the next slots at the first look and after the system clock stepped back."""
        skew = now - self.server_clock()
        if self._skew is None:  # the first look: a step while the server was stopped shows in the rows
            self._realign(now, None).wait()
        elif abs(skew - self._skew) >= STEP_MS:
            moved = (skew - self._skew) / 1000
            logger.warning("the system clock stepped {} {:.3f} s: {}; leases, delays and the times EZRA records "
                           "run on elapsed time ({:+.3f} s from the system clock until the next start)",
                           "back" if moved < 0 else "forward", abs(moved),
                           "schedules keep their pace" if moved < 0 else "each schedule fires the slot that came "
                           "first, once", -skew / 1000)
            if moved < 0:
                self._realign(now, self._skew - skew).wait()
        self._skew = skew  # once realigned: a failed realignment is tried again at the next look

    # ------------------------------------------------------------ the greenlet

    def start(self) -> None:
        self._greenlet = gevent.spawn(self._fire_forever)

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill()

    def _fire_forever(self) -> None:
        while True:
            self._wake.clear()  # before reading: a SET from here on wakes the wait below
            try:
                if self.db.integrity.corrupt:  # nothing is written to a corrupt file
                    more, earliest = False, None
                else:
                    more, earliest = self.fire_due()
            except Exception as exc:  # a storage error, a full disk: tried again shortly
                if not self._failing:  # once per episode: a full disk would log it every second
                    self._log_failure(exc)
                self._failing = True
                more, earliest = False, self.clock() + RETRY_MS
            else:
                if self._failing:
                    logger.info("schedules fire again")
                self._failing = False
            if more:
                gevent.sleep(0)
                continue
            self._wake.wait(None if earliest is None else min(max(earliest - self.clock(), 0) / 1000, MAX_SLEEP))

    @staticmethod
    def _log_failure(exc: Exception) -> None:
        """A firing failed: logged when an episode starts (the greenlet tries again every RETRY_MS)."""
        if isinstance(exc, errors.DISK_FULL):  # refused before it ran: nothing fired, the slots wait
            logger.warning("schedules wait: the disk is full; each schedule fires the slot it has due once "
                           "there is room again (tried every {} s)", RETRY_MS / 1000)
            return
        logger.opt(exception=not isinstance(exc, errors.CommandError)).error(
            "firing schedules failed (tried again every {} s until it works): {}", RETRY_MS / 1000, exc)

    # ------------------------------------------------------------ transactions

    def _cron(self, expression: str, zone: str) -> Cron:
        cron = self._crons.get((expression, zone))
        if cron is None:
            if len(self._crons) >= 2 * MAX_SCHEDULES:  # replaced definitions leave theirs behind
                self._crons.clear()
            cron = self._crons[(expression, zone)] = Cron(expression, zone)
        return cron

    @transaction()
    def _save(self, definition: Definition, origin: str) -> bool:
        """Define or replace a schedule: True, or False if identical (its runs go on)."""
        schedules = self.db.schedules
        row = schedules.get(definition.name)
        if row is not None and definition.same_as(row):
            if row.origin != origin:
                schedules.set_origin(definition.name, origin)
            return False
        self._check_queue(definition.queue)
        if row is None and schedules.count() >= MAX_SCHEDULES:
            raise errors.too_many_schedules(MAX_SCHEDULES)
        now = self.clock()
        next_at = definition.cron.next_after(now)
        schedules.save(definition.name, definition.queue, definition.cron.text, definition.cron.zone_name,
                       definition.fields, definition.skip_unfinished, definition.slot_field, origin,
                       NEVER if next_at is None else next_at, now)
        return True

    def _check_queue(self, name: bytes) -> None:
        """SET into a queue a push would be refused (its name, its ids or rows used up, no queue
        number left) is refused now, with the push's reason: every firing would be refused."""
        queue = self.broker.queues.get(name)
        try:
            if queue is None and len(name) > MAX_QUEUE_NAME:
                raise errors.queue_name_too_long(len(name), MAX_QUEUE_NAME)
            if queue is not None:
                stream_ids.new_id(None, queue.last_id, self.clock())
            self.db.check_room_for_push(name)
        except errors.CommandError as exc:
            raise errors.schedule_queue_refused(name, exc.message) from None

    @transaction()
    def _remove(self, name: bytes) -> int:
        self._refused.discard(name)
        return self.db.schedules.delete(name)

    @transaction(durable=False)
    def _realign(self, now: int, step: int | None) -> None:
        """The system clock went back `step` ms (None: unknown, after a start): each next slot
        moves back as far, on to the expression's first slot from there."""
        schedules = self.db.schedules
        for name, cron, zone, next_at, last_seen in schedules.timings():
            back = step if step is not None else last_seen - now  # fired (or set) in what is now the future
            if back <= 0 or next_at == NEVER:
                continue
            try:
                moved = self._cron(cron, zone).next_after(next_at - back - 1)
            except CronError:
                continue  # _fire says why when its slot comes
            if moved is not None and moved < next_at:
                schedules.move_next(name, moved)

    @transaction(durable=False)
    def _config_names(self) -> list[bytes]:
        return self.db.schedules.config_names()

    @transaction(durable=False)
    def _earliest(self) -> int | None:
        return self.db.schedules.earliest()

    @transaction(grows=True)
    def _fire_batch(self, now: int) -> tuple[bool, int | None]:
        """Fire up to FIRE_BATCH due slots: (more are due, the earliest next slot or None)."""
        schedules = self.db.schedules
        due = schedules.due(now, FIRE_BATCH)
        for row in due:
            self._fire(row, now)
        return len(due) == FIRE_BATCH, schedules.earliest()

    def _fire(self, row, now: int) -> None:
        """One slot of one schedule: push (unless skipped), record, move on past now."""
        slot = row.next_at
        try:
            cron = self._cron(row.cron, row.zone)
            next_at = cron.next_after(max(slot, now))
        except CronError as exc:  # zone data changed under a stored schedule: it cannot run
            logger.error("schedule {!r} cannot run: {}", text(row.name), exc)
            self.db.schedules.move_next(row.name, NEVER)
            return
        next_at = NEVER if next_at is None else next_at
        task_id = None
        if not (row.skip_unfinished and row.last_task and self.db.schedules.unfinished(row.queue, row.last_task)):
            fields = row.fields if row.slot_field is None else [*row.fields, row.slot_field, cron.local(slot).encode()]
            try:  # stored as JSON, the schedules table's form (task_fields.py reads both forms)
                (pushed,) = Tasks.push.body(self.broker.tasks, row.queue, [Push(encode_fields(fields))])  # in this batch
            except errors.CommandError as exc:  # refused before it wrote anything: the slot passes
                self._log_refused(row, cron.local(slot), exc)
                self.db.schedules.move_next(row.name, next_at)
                return
            task_id = stream_ids.parse_id(pushed)
            if row.name in self._refused:
                self._refused.discard(row.name)
                logger.info("schedule {!r} pushes to {!r} again", text(row.name), text(row.queue))
        self.db.schedules.record_firing(row.name, slot, next_at, now, task_id)

    def _log_refused(self, row, slot: str, exc: errors.CommandError) -> None:
        """Logged once per episode, from the first refusal until a push works: an every-second
        schedule into a queue that refuses pushes logged 86,400 errors a day."""
        if row.name in self._refused:
            logger.debug("schedule {!r}: slot {} passed over: {}", text(row.name), slot, exc)
            return
        self._refused.add(row.name)
        logger.error("schedule {!r}: pushes to {!r} are refused ({}); its slots pass over until one works "
                     "(logged again then), from slot {}", text(row.name), text(row.queue),
                     exc.message.removeprefix("ERR "), slot)


def text(name: bytes) -> str:
    return name.decode("utf-8", "replace")
