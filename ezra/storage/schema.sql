-- EZRA's schema, read by ezra/storage/schema.py. A new file runs all of it; a migration picks
-- statements by the name of what they create (schema.SCHEMA_STATEMENTS["tasks"]), so every
-- statement here is a CREATE TABLE, VIEW or [UNIQUE] INDEX IF NOT EXISTS, ended by ';'.
-- Bump schema.SCHEMA_VERSION and add a migration step (storage/opening.py) when a table changes.

CREATE TABLE IF NOT EXISTS queues (
    name                  TEXT PRIMARY KEY,  -- queue name (BLOB if not UTF-8)
    last_id_ms            INTEGER NOT NULL DEFAULT 0,  -- the last id handed out, saved before
    last_id_seq           INTEGER NOT NULL DEFAULT 0,  -- tasks are deleted: ids never repeat
    -- Settings (XCFGSET, config file); NULL = the server's flag.
    visibility_timeout    REAL,     -- seconds
    max_attempts          INTEGER,
    retention_seconds     REAL,     -- seconds a done task is kept; -1 = forever
    backoff               TEXT,     -- 'fixed <s>' or 'exponential <base s> <max s>'
    release_on_disconnect REAL,     -- grace seconds; -1 = off
    idmp_duration         INTEGER,  -- seconds an idempotent id is remembered (NULL: 100)
    idmp_maxsize          INTEGER,  -- idempotent ids kept per producer (NULL: 100)
    paused                INTEGER,  -- 1: claims hand out nothing (pushes still land); NULL or 0: running
    max_in_flight         INTEGER,  -- MAX-IN-FLIGHT: at most this many leased at once; NULL: no cap
    rate_limit_count      INTEGER,  -- RATE-LIMIT: at most this many handed out in any window
    rate_limit_seconds    REAL,     --   of this many seconds; NULL: no rate limit
    partition_limit       INTEGER,  -- PARTITION-LIMIT: at most this many of one partition leased at once; NULL: 1
    -- 1: some task of the queue was pushed with PRIORITY or PARTITION (or imported with one), and
    -- its claims take the claim order by priority and partition (broker/lanes.py); set once, for good.
    lanes                 INTEGER NOT NULL DEFAULT 0,
    group_name            TEXT,     -- the name XGROUP CREATE gave the queue's one group
    deleted_count         INTEGER NOT NULL DEFAULT 0,  -- tasks removed for good (XINFO entries-added)
    max_deleted_ms        INTEGER NOT NULL DEFAULT 0,  -- the newest removed id (XINFO
    max_deleted_seq       INTEGER NOT NULL DEFAULT 0,  --   max-deleted-entry-id)
    created_at            INTEGER NOT NULL,  -- ms since the epoch
    -- 1: some done tasks may lack tasks.retained (acked while the queue kept them for ever); a
    -- retention limit marks them before it purges (Reaper._mark_retained). 0: all are marked.
    unmarked_done         INTEGER NOT NULL DEFAULT 1,
    -- The queue's tasks are the rows of tasks with row ids from number << 40 to that plus
    -- 2^40 - 1, in id order (storage/row_ranges.py). Given once, when the queue is made; never reused.
    number                INTEGER
);
CREATE UNIQUE INDEX IF NOT EXISTS queues_number ON queues (number);

-- The state CHECK is written as comparisons, not IN (...): for an IN list of constants SQLite
-- builds a temporary table each time a statement checks it (1.7 µs of every push, claim and
-- ack, measured). Schema 7 rewrote older files' CHECK to this text (storage/opening.py).
-- The id's text form, `id_ms-id_seq`, is the view's (tasks_readable), not a column here: SQLite
-- computes a table's generated columns on every INSERT and UPDATE of a row, used or not (2.2k
-- instructions each: a push, a claim and an ack paid it three times a task, measured). Schema 13
-- dropped the VIRTUAL column `id` older files have.
-- A task's row id is its queue's range (queues.number << 40) plus its push order in the queue,
-- so the queue's tasks are one range of the table's B-tree, in id order: no index on (queue, id)
-- (before schema 14, the primary key; its index cost every push 3.5 WAL pages a commit of 50).
-- Named as a column so that VACUUM keeps the values (it may renumber an implicit row id).
CREATE TABLE IF NOT EXISTS tasks (
    rowid         INTEGER PRIMARY KEY,  -- storage/row_ranges.py; `rowid` in a query reads it
    queue         TEXT    NOT NULL,
    id_ms         INTEGER NOT NULL,  -- the Redis stream id is id_ms-id_seq
    id_seq        INTEGER NOT NULL,
    state         TEXT    NOT NULL
                  CHECK (state = 'available' OR state = 'delayed' OR state = 'in_flight' OR state = 'done' OR state = 'dead' OR state = 'waiting'),
    fields        TEXT    NOT NULL,  -- BLOB: the RESP array of the names and values (*2 $1 n $1 v),
                                     -- replies send it as it is; TEXT: a JSON array [name, value, ...]
                                     -- (before schema 9, a schedule's push, by hand). tasks_readable: JSON
    attempts      INTEGER NOT NULL DEFAULT 0,  -- deliveries so far
    worker        TEXT,              -- the consumer holding it while in_flight
    created_at    INTEGER NOT NULL,  -- ms since the epoch
    available_at  INTEGER NOT NULL,  -- delayed: becomes available then (DELAY, backoff)
    deadline      INTEGER,           -- in_flight: redelivered after this
    delivered_at  INTEGER,           -- last delivery (XPENDING idle time)
    finished_at   INTEGER,           -- when it became done or dead
    ttl_ms        INTEGER,           -- XADD TTL: kept this long once done or dead (NULL: retention)
    unique_key    TEXT,              -- XADD UNIQUE key (BLOB if not UTF-8); NULL: pushed without one
    failure       TEXT,              -- its last failure, JSON {"cause", "reason", "worker", "at"};
                                     -- NULL: never failed (only failures write it, v5)
    -- retained: 1 if done while its queue had a retention limit (in tasks_retained, which the purge
    -- reads); NULL: kept for ever (the default), in no index. reserved: zeros while the task waits
    -- for its first claim, room for the columns the claim fills, so its row keeps its size
    -- (schema.py RESERVED_BYTES). priority: XADD PRIORITY, 0 to 9; NULL: pushed without it, the
    -- default (lifecycle.DEFAULT_PRIORITY, 5; tasks_readable shows it). partition_key: XADD PARTITION
    -- key (BLOB if not UTF-8); NULL: in no partition. A plain push binds neither (storage/database.py);
    -- no transition changes them. Schema 15 added both at the end (ALTER TABLE ADD COLUMN), so a
    -- new file has them there too. Their comments come first: ALTER TABLE DROP COLUMN of the last
    -- column (tests make older files with it) cuts the text back to the last comma before it.
    -- result: XACK ... RESULT's value, kept with the done task (bytes, at most --max-task-size);
    -- progress: XPROGRESS's last value for the task (at most 8 KB), kept across redeliveries.
    -- NULL: none given; a plain XACK writes neither. Schema 16 added both at the end.
    -- name: XADD NAME's (BLOB if not UTF-8), unique in its queue while the row exists (tasks_named);
    -- NULL: pushed without one (a plain push binds none). Schema 18 added it at the end.
    retained      INTEGER,
    reserved      BLOB,
    priority      INTEGER,
    partition_key TEXT,
    result        BLOB,
    progress      BLOB,
    name          TEXT
);

-- Few indexes on purpose: every index costs a page write per state change. Available tasks
-- have none: the broker keeps each queue's available order in memory (claims take the oldest)
-- and builds it from the queue's range of row ids after a start; schema 8 dropped tasks_available. Tasks in
-- flight have none either: the broker keeps their leases in memory (broker/in_flight.py), and
-- a start makes every one available again; schema 12 dropped tasks_in_flight.
-- Retention purges a queue's done tasks, oldest first: only those finished under a retention limit
-- are in it. Done tasks of a queue that keeps them for ever (the default) are in no index, so their
-- ack writes the row and the in-flight index only (schema 10 dropped tasks_done, every done task by
-- finish time: 1.7 µs and a page per commit of every ack). The predicate names no `state`, so
-- an ack's UPDATE finds the task outside the index before and after and writes nothing to it.
CREATE INDEX IF NOT EXISTS tasks_retained ON tasks (queue, finished_at) WHERE retained IS NOT NULL;
-- The dead-letter view (queue::dead) and start-up counts; tasks seldom die, so it costs little.
CREATE INDEX IF NOT EXISTS tasks_dead ON tasks (queue, id_ms, id_seq) WHERE state = 'dead';
-- XADD AFTER's waiting tasks have no index: start-up counts them from the dependencies table below.
-- A partial index on a state, even one no task is in, costs every push, claim and ack its test
-- (0.35 µs a task, measured); schema 18 dropped tasks_waiting.
-- The reaper makes delayed tasks available when their time comes (only delayed tasks are in it).
CREATE INDEX IF NOT EXISTS tasks_delayed ON tasks (available_at) WHERE state = 'delayed';
-- Finished tasks pushed with TTL, by expiry (tasks without TTL are never in it).
CREATE INDEX IF NOT EXISTS tasks_ttl ON tasks (finished_at + ttl_ms)
    WHERE ttl_ms IS NOT NULL AND state IN ('done', 'dead');
-- XADD UNIQUE: at most one unfinished task per key and queue. A task leaves the index when it is
-- done or dead (its state changes), so ack and death free the key with no write of their own;
-- tasks pushed without a key are never in it.
CREATE UNIQUE INDEX IF NOT EXISTS tasks_unique ON tasks (queue, unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('available', 'delayed', 'in_flight');
-- XADD NAME: at most one task per name and queue, in any state, for as long as its row exists (a
-- push with a name taken answers that task's id: storage/task_names.py). The predicate names no
-- `state`, so a claim's, an ack's or a nack's UPDATE writes nothing to it; the row's DELETE (TTL,
-- retention, XTRIM, XDEL, XACKDEL) frees the name. Tasks pushed without a name are never in it.
CREATE UNIQUE INDEX IF NOT EXISTS tasks_named ON tasks (queue, name) WHERE name IS NOT NULL;

-- The tasks for people (the sqlite3 shell, a SQLite browser): each column of tasks, with the id as
-- text (`1796319258949-0`) and the fields as a JSON array of text whichever form they are stored in, e.g.
--   SELECT id, state, json_extract(fields, '$[1]') FROM tasks_readable WHERE queue = 'emails';
-- The RESP array is read value by value: `*N\r\n`, then `$len\r\n<len bytes>\r\n` N times.
-- priority is the task's own, or the default (5, lifecycle.DEFAULT_PRIORITY) when it was pushed without one.
CREATE VIEW IF NOT EXISTS tasks_readable AS
SELECT queue, id_ms || '-' || id_seq AS id, id_ms, id_seq, state,
       CASE WHEN typeof(fields) = 'blob' THEN (
         WITH RECURSIVE part(n, rest, value) AS (
           SELECT 0, substr(fields, instr(fields, x'0d0a') + 2), NULL
           UNION ALL
           SELECT n + 1,
                  substr(rest, instr(rest, x'0d0a') + 4 + CAST(CAST(substr(rest, 2, instr(rest, x'0d0a') - 2) AS TEXT) AS INTEGER)),
                  substr(rest, instr(rest, x'0d0a') + 2, CAST(CAST(substr(rest, 2, instr(rest, x'0d0a') - 2) AS TEXT) AS INTEGER))
           FROM part WHERE length(rest) > 0)
         SELECT json_group_array(CAST(value AS TEXT)) FROM (SELECT value FROM part WHERE n > 0 ORDER BY n))
       ELSE fields END AS fields,
       attempts, worker, created_at, available_at, deadline, delivered_at, finished_at, ttl_ms, unique_key, failure,
       coalesce(priority, 5) AS priority, partition_key, result, progress, name
FROM tasks;

-- Tasks the start found unreadable (fields that are neither a JSON array of text nor a RESP array,
-- an id that is not two integers) or repeated (a second row with an id its queue has): rows written
-- by hand (storage/hand_rows.py). Moved here, never served; each with why and when. Fix a row and
-- INSERT it back into tasks while the server is stopped (docs/usage.md), or delete it.
CREATE TABLE IF NOT EXISTS unreadable_tasks (
    row           INTEGER,  -- its row id in tasks
    queue, id_ms, id_seq, state, fields, attempts, worker, created_at, available_at, deadline,
    delivered_at, finished_at, ttl_ms, unique_key, failure, retained, reserved, priority, partition_key, result, progress, name,  -- as tasks had them
    reason        TEXT    NOT NULL,  -- why it was set aside
    found_at      INTEGER NOT NULL   -- ms since the epoch
);

-- XADD AFTER (broker/dependencies.py): the dependent task waits until the dependency is done. Both
-- are tasks' row ids (unique across queues: storage/row_ranges.py). An edge goes when its dependency
-- is done, so a waiting task with no edge left is released (in the transaction of that ack). A
-- dependent that died with its dependency (dead or deleted) keeps its edges, so a requeue of it
-- waits again for what is not done yet; edges go with their dependent's row (XDEL, purge).
-- Keyed by the dependency: an ack finds its dependents in one search; the index finds what one waits for.
CREATE TABLE IF NOT EXISTS dependencies (
    dependency  INTEGER NOT NULL,  -- tasks.rowid of the task waited for
    dependent   INTEGER NOT NULL,  -- tasks.rowid of the waiting task
    PRIMARY KEY (dependency, dependent)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS dependencies_dependent ON dependencies (dependent);

-- Idempotent producers (XADD IDMP / IDMPAUTO): a retried push returns the first id.
CREATE TABLE IF NOT EXISTS idempotency (
    queue       TEXT    NOT NULL,
    producer    TEXT    NOT NULL,  -- IDMP <producer>
    iid         BLOB    NOT NULL,  -- the producer's idempotent id (IDMPAUTO: a digest of the fields)
    id_ms       INTEGER NOT NULL,  -- the task the first push created
    id_seq      INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,  -- ms; a push after this is new again
    UNIQUE (queue, producer, iid)
);
CREATE INDEX IF NOT EXISTS idempotency_expiry ON idempotency (expires_at);

-- Schedules (XSCHEDULE, the config file's schedule lines): each pushes a task at the times of
-- its cron expression. A firing updates this row in the transaction of its push, so a slot is
-- never fired twice; after downtime the one slot due is fired once and next_at moves past now.
CREATE TABLE IF NOT EXISTS schedules (
    name            TEXT    PRIMARY KEY,  -- schedule name (BLOB if not UTF-8)
    queue           TEXT    NOT NULL,     -- where its tasks are pushed
    cron            TEXT    NOT NULL,     -- five fields (six with seconds) or @daily-style name
    zone            TEXT    NOT NULL,     -- IANA time zone the expression is read in ('UTC')
    fields          TEXT    NOT NULL,     -- JSON array, as tasks.fields: each task's fields
    skip_unfinished INTEGER NOT NULL DEFAULT 0,  -- 1: no push while the last task is unfinished
    slot_field      TEXT,                 -- a field added to each task: its slot's time (NULL: none)
    origin          TEXT    NOT NULL CHECK (origin IN ('command', 'config')),  -- who set it last
    next_at         INTEGER NOT NULL,     -- ms since the epoch: the next slot to fire
    last_slot       INTEGER,              -- the last slot fired (NULL: none yet)
    last_fired_at   INTEGER,              -- when it fired
    last_task_ms    INTEGER,              -- the task it pushed then (NULL: skipped, or none)
    last_task_seq   INTEGER,
    firings         INTEGER NOT NULL DEFAULT 0,  -- tasks pushed
    skipped         INTEGER NOT NULL DEFAULT 0,  -- slots passed over: the last task was unfinished
    created_at      INTEGER NOT NULL      -- ms: when this definition was set
);
CREATE INDEX IF NOT EXISTS schedules_next ON schedules (next_at);
-- Every column but fields: INFO, /metrics and the dashboard list the schedules from it alone,
-- never reading their fields (up to a task's size each: 300 schedules of 1 MB took 0.2-0.8 s).
CREATE INDEX IF NOT EXISTS schedules_shown ON schedules (name, queue, cron, zone, skip_unfinished, slot_field,
    origin, next_at, last_slot, last_fired_at, last_task_ms, last_task_seq, firings, skipped, created_at);
