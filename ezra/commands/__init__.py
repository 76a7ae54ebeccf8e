"""The commands: parse a command's arguments, call a broker verb, return a reply value. table.py
holds only the registry (COMMANDS, the `@command` decorator), dispatch/run and Deferred (the
writer's reply a handler may return), and imports nothing else of this package; args.py holds
the argument helpers the families share and replies.py the Redis shapes built from the broker's
plain values (entries, XREADGROUP's map); neither imports a family. Each family module registers
its commands in the table and may import only table.py, args.py and the layers below (broker,
lifecycle, stream_ids, errors, resp, options, queue_settings, trimming, storage's decoders), never another
family: push.py (XADD: the one check of a push), queue.py (XREADGROUP, XACK, XNACK, XRANGE, XPENDING...), ops.py (XCFGSET, XCLAIM,
XINFO, XREQUEUE, BACKUP...), connection.py (PING, HELLO, AUTH, CLIENT, MULTI/EXEC, INFO...) and
keys.py (EXISTS, TYPE), schedule.py (XSCHEDULE) and results.py (XRESULT, XPROGRESS); runs.py sends a pipeline's run of plain XADDs
(or single-id XACKs) to one queue down the verb's one route as one request (the connection calls it; it registers nothing). Importing this package imports the families, so every command is
registered before the first dispatch. Nothing here imports the front (ezra/front/server.py,
ezra/front/connection.py, ezra/front/session.py): a handler gets the connection's Session as an argument.
"""

# Each registers its commands in the table, in this order: the order COMMAND and COMMAND LIST answer in.
from . import push, queue, connection, ops, keys, schedule, results  # noqa: F401,I001
from .table import COMMANDS, Deferred, dispatch, resolved, run, supported_commands

__all__ = ["COMMANDS", "Deferred", "dispatch", "resolved", "run", "supported_commands"]
