"""The broker: EZRA's queue state machine. `from ezra.broker import Broker`.

The Broker's verbs (the public methods the command handlers call; each runs in
a connection greenlet and submits a `_tx_*` script to the writer):

    verb                 command                  what it does
    push                 XADD                     add a task (delayed, TTL, idempotent, dead)
    claim                XREADGROUP >             claim tasks, or block until one comes
    claim_own            XREADGROUP <id>          claim the worker's own tasks in flight again
    ack                  XACK                     a task is done
    fail                 XNACK / XDEL             a delivery failed: back (with backoff) or dead
    delete_dead          XDEL q::dead             remove dead letters
    create_queue         XGROUP CREATE            make the queue (and name its group)
    destroy_group        XGROUP DESTROY           forget the group name; tasks stay
    delete_worker        XGROUP DELCONSUMER       the worker's tasks in flight go back
    trim                 XTRIM                    remove done tasks
    length, range        XLEN, XRANGE/XREVRANGE   read a queue or its dead view
    pending_summary      XPENDING q g             tasks in flight, per worker
    pending_entries      XPENDING q g - + n       tasks in flight, one by one
    take_over            XCLAIM                   heartbeat, or take a task in flight over
    autoclaim            XAUTOCLAIM               take over tasks idle for long enough
    worker_seen/_gone    (connections)            release a gone worker's tasks after a grace
    configure            XCFGSET                  a queue's settings (pause, lease, backoff...)
    requeue              XREQUEUE                 dead letters back to the queue
    ack_delete           XACKDEL                  ack and remove
    stream_info, tasks   XINFO                    a queue's figures and tasks
    figures              INFO, /metrics, dashboard  one snapshot of the figures (a Figures)
    backup               BGSAVE / SAVE            hot backup of the database
    look, observe        XREAD                    read without claiming; block for new entries
    existing             EXISTS, TYPE             which names are queues
    names_after          XINFO QUEUES, INFO       a page of the queue names, in byte order
    queue_counts         (tests)                  every queue's counts by state
    blocked_clients      (figures)                blocked XREADGROUPs and XREADs
    maintain             (the reaper, tests)      one reaper pass: expire, promote, purge, trim
    start_reaper, stop, cancel_waiters            life: reaper, shutdown

What they return are plain values, never a reply type: task rows as storage reads them
(id_ms, id_seq, fields JSON, ...), ids as (ms, seq), tuples, and the broker's own dataclasses
(Figures, StreamInfo). The commands build Redis's shapes from them (commands/replies.py).

The parts (mixins of Broker, in its bases' order; each is a class over BrokerCore):

    base.py       BrokerCore: the attributes and helpers the parts share through `self`
    core.py       Broker: push, ack, fail; per-queue state (QueueState), the settings in force
    claims.py     XREADGROUP's claims; the workers blocked waiting for one (Waiter), woken per batch
    leases.py     XCLAIM / XAUTOCLAIM / XREADGROUP CLAIM; release on disconnect
    upkeep.py     the reaper: expiry, delayed tasks coming due, retention, TTL, vacuum
    admin.py      XCFGSET, XREQUEUE, XACKDEL, XINFO's figures, figures(), hot backup
    observers.py  XREAD: a read-only look at a queue, woken by pushes without taking them

Beside them, not a part: schedules.py's Scheduler (XSCHEDULE), a plain object over the Broker
that fires periodic pushes through `_tx_push` in its own writer scripts.

What the parts may import: the layers below (storage, writer, lifecycle, stream_ids,
errors, queue_settings, trimming), gevent and loguru; never resp or commands (the broker
returns plain values: rows, tuples, its own dataclasses; commands/ build Redis's shapes),
server, web, tools or app, which call the broker, not the other way round. A part
reaches another only through `self`, by names BrokerCore declares
(scripts/broker_xrefs.py counts the undeclared ones: keep it at 0).
"""

from .admin import ALL_QUEUES, Figures
from .core import Broker

__all__ = ["ALL_QUEUES", "Broker", "Figures"]
