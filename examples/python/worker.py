"""Work tasks with redis-py until MAX_TASKS are done or none comes for IDLE_TIMEOUT seconds:
python worker.py [port]  (or EZRA_PORT, QUEUE, WORKER_NAME, MAX_TASKS (0 = no limit), IDLE_TIMEOUT)."""
import os
import sys

import redis

port = int(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("EZRA_PORT", 42002))
queue, name = os.environ.get("QUEUE", "emails"), os.environ.get("WORKER_NAME", f"worker-{os.getpid()}")
max_tasks, idle_ms = int(os.environ.get("MAX_TASKS", 0)), int(float(os.environ.get("IDLE_TIMEOUT", 5)) * 1000)

# redis-py 8 gives up on a reply after 5 s (socket_timeout) by default, and the blocking read
# below waits up to IDLE_TIMEOUT seconds: allow that plus a margin for a busy server (0: for ever)
r = redis.Redis(port=port, socket_timeout=idle_ms / 1000 + 10 if idle_ms else None)
try:
    r.xgroup_create(queue, "workers", id="0", mkstream=True)  # optional on EZRA, required on Redis
except redis.ResponseError as error:
    if "BUSYGROUP" not in str(error):  # Redis: the group exists already
        raise
done = 0
while not max_tasks or done < max_tasks:
    reply = r.xreadgroup("workers", name, {queue: ">"}, count=1, block=idle_ms)
    if not reply:
        break  # idle: nothing came for IDLE_TIMEOUT seconds
    for _, tasks in reply:
        for task_id, fields in tasks:
            print("done", task_id.decode(), fields[b"to"].decode(), flush=True)  # do the work here
            r.xack(queue, "workers", task_id)
            done += 1
