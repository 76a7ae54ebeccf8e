"""The broker: EZRA's queue state machine. `from ezra.broker import Broker`.

The verbs the command handlers call, in connection greenlets: a part's (`broker.tasks.trim(...)`),
or the Broker's own where they span parts. One with a policy is a transaction (writer/transactions.py)
and returns its Request (`.wait()`: the result), answered after the fsync that follows the commit
(`fsync`) or at the commit (`commit`); `grows`: refused on a full disk.

    verb                        policy        command                    what it does
    tasks.push                  fsync, grows  XADD                       add tasks: one XADD, or a pipeline's run of
                                                                         them (a Push: delayed, TTL, idempotent, dead)
    claim                       commit        XREADGROUP >               claim for a Claim (answered with the read's
                                                                         others), or, waiting, a Waiter in line
    unblock                     commit        XREADGROUP > BLOCK         the wait ends: what a commit just now claimed
    claims.claim_own            commit        XREADGROUP <id>            the worker's own tasks in flight, leased again
    tasks.ack                   fsync         XACK                       tasks done: one XACK's ids, or a pipeline's run
                                                                         (one id with RESULT: kept with the done task)
    tasks.fail                  fsync         XNACK                      a delivery failed: back (with backoff) or dead
    tasks.delete                fsync         XDEL                       cancel tasks nobody holds; fail those in flight
    tasks.cancel                fsync         (dashboard delete)         cancel available or delayed tasks
    tasks.delete_dead           fsync         XDEL q::dead               remove dead letters
    tasks.create_queue          fsync, grows  XGROUP CREATE              make the queue (and name its group)
    tasks.destroy_group         fsync         XGROUP DESTROY             forget the group name; tasks stay
    tasks.delete_worker         fsync         XGROUP DELCONSUMER         the worker's tasks in flight go back
    tasks.trim                  fsync         XTRIM                      remove done tasks
    tasks.length, tasks.range   commit        XLEN, XRANGE/XREVRANGE     read a queue or its dead view
    tasks.pending_summary       commit        XPENDING q g               tasks in flight, per worker
    pending_entries             commit        XPENDING q g - + n         tasks in flight, one by one (many: on a thread)
    tasks.existing              commit        EXISTS, TYPE               which names are queues
    leases.take_over            commit        XCLAIM                     heartbeat, or take a task in flight over
    leases.autoclaim            commit        XAUTOCLAIM                 take over tasks idle for long enough
    leases.release              fsync         (workers.py's timer)       a gone worker's tasks back, after the grace
    workers.seen, workers.gone                (connections)              a worker name used; its last user closed
    admin.configure             fsync, grows  XCFGSET                    a queue's settings (pause, lease, backoff...)
    admin.requeue               fsync         XREQUEUE                   dead letters back to the queue
    admin.ack_delete            fsync         XACKDEL                    ack and remove
    admin.stream_info           commit        XINFO STREAM/GROUPS/...    a queue's figures (a StreamInfo)
    admin.tasks                 commit        XINFO TASKS, dashboard     a queue's tasks in one state
    admin.task                                (dashboard task page)      one task, read on a native thread
    admin.figures               commit        INFO, /metrics, dashboard  one snapshot of the figures (a Figures)
    admin.backup                              BACKUP                     hot backup of the database
    views.look                  commit        XREAD                      read without claiming
    watch, observers.unwatch    commit        XREAD BLOCK                an Observer to wait on, after a first look
    results.outcome             commit        XRESULT                    a task's state, attempts, failure, result, progress
    results.watch, unwatch                    XRESULT BLOCK              an Observer of one task, woken after the batch that ends it
    results.report_progress     fsync         XPROGRESS                  progress kept on a task in flight; its lease renewed
    names_after                               XINFO QUEUES, INFO         a page of the queue names, in byte order
    reaper.maintain             commit        (the reaper, tests)        one pass: expire, promote, purge, trim
    reaper.start, stop, cancel_waiters                                   life: the reaper, shutdown

What they return are plain values, never a reply type: task rows as storage reads them
(id_ms, id_seq, fields JSON, ...), ids as (ms, seq), tuples, and the broker's own dataclasses
(Figures, StreamInfo). The commands build Redis's shapes from them (commands/replies.py).

The parts are plain objects, each given what it uses when the Broker builds them; none calls
back into the Broker but workers.py's release timer, which is handed the one function it
calls. From the bottom up (a part imports only those below it):

    clock.py        ServerClock: the time every part reads, the wall clock at start advanced by
                    elapsed time (a step of the system clock moves no lease); the wall clock
    journal.py      BatchJournal: the one way a rolled-back batch is taken back in memory, the
                    undo steps each shape records (count moves, leases) and the rebuilds after
    in_flight.py    QueueLeases: a queue's tasks in flight, by id (schema 12 keeps no index of
                    them); InFlight: their changes (journaled), their deadlines for the reaper,
                    and the reads XPENDING, XINFO and XAUTOCLAIM make
    available.py    AvailableOrder: a queue's available tasks by row id, oldest first (schema 8
                    keeps no index of them), read from the file a slice at a time after a start
    lanes.py        Lanes: the claim order of a queue whose tasks have priorities or partitions
                    (priority, then partitions in turn, then push order; PARTITION-LIMIT)
    flow.py         Flow: a queue's MAX-IN-FLIGHT and RATE-LIMIT, the room a claim has now
    observers.py    XREAD's blocked readers (Observer), per view, woken after a batch that grew it;
                    XRESULT BLOCK's, per task, woken after a batch that ended it
    queues.py       QueueState: one queue's counts, settings, and the policy they make with the
                    server's defaults, changed only through its own verbs (pushed, delivered,
                    finished, removed, tally...; `tally` is the one way to count an event);
                    Queues: the table of them, the names in order, the totals since start
    waiters.py      a Claim (what one XREADGROUP asks for); blocked workers (Waiter), a line per
                    queue, woken after a batch
    deadlines.py    the reaper's deadlines: the earliest time each kind of upkeep can be due
    workers.py      worker names: connections, queues where each was leased tasks, release timers
    transitions.py  the state changes verbs share, in a batch: a queue made, tasks claimed,
                    failures decided, deletions, purges, waiters served
    tasks.py        push, ack, fail, delete, create, and the reads of a queue's tasks
    leases.py       XCLAIM, XAUTOCLAIM, XREADGROUP CLAIM; a gone worker's tasks released
    claims.py       XREADGROUP's claims, a waiter put in line
    reaper.py       the reaper: expiry, delayed tasks coming due, retention, TTL, trimming, vacuum
    admin.py        XCFGSET, XREQUEUE, XACKDEL, XINFO's figures, figures(), hot backup
    views.py        XREAD's looks at a view after an id
    results.py      XRESULT's look at a task's outcome, XPROGRESS, XRESULT BLOCK's watch
    core.py         Broker: builds them, the verbs that span them, the writer's hooks (after a
                    batch, a reload)

Beside them, not a part: schedules.py's Scheduler (XSCHEDULE), a plain object over the Broker
that fires periodic pushes through `Tasks.push.body` (XADD's route) in its own writer transactions.

One route per verb: XADD, XREADGROUP and XACK each enter the broker by one method, whoever
sends them (a command alone, a pipeline's run: commands/runs.py, a framework), and a blocked
worker woken later was served by the same claim (Transitions.claim_rows) in the batch that
made a task available. A blocking read is the front's to wait for (commands/table.py): `claim`
with `wait` answers what it claimed or a registered Waiter; `watch` registers an Observer; `unblock` and
`observers.unwatch` end the wait.

What the parts may import: the layers below (storage, writer/, lifecycle, errors,
protocol/stream_ids and task_fields, settings/), gevent and loguru; never protocol/resp or
commands (the broker returns plain values: rows, tuples, its own dataclasses; commands/ build
Redis's shapes), front/, web, tools or app, which call the broker, not the other way round.
tests/test_layout.py finds no import circle, with the type checkers' imports counted too.
"""

from .admin import ALL_QUEUES, Figures
from .core import Broker

__all__ = ["ALL_QUEUES", "Broker", "Figures"]
