"""Push tasks with redis-py: python producer.py [port] [count]  (or EZRA_PORT, TASKS, QUEUE)."""
import os
import sys

import redis

port = int(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("EZRA_PORT", 42002))
count = int(sys.argv[2] if len(sys.argv) > 2 else os.environ.get("TASKS", 10))
queue = os.environ.get("QUEUE", "emails")

r = redis.Redis(port=port)
for i in range(count):
    task_id = r.xadd(queue, {"to": f"user{i}@example.com", "template": "welcome"})  # durable when it returns
    print("pushed", task_id.decode(), flush=True)
