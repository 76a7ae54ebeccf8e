// Work tasks with ioredis until MAX_TASKS are done or none comes for IDLE_TIMEOUT seconds:
// node worker.js [port]  (or EZRA_PORT, QUEUE, WORKER_NAME, MAX_TASKS (0 = no limit), IDLE_TIMEOUT).
const Redis = require("ioredis");

const port = Number(process.argv[2] || process.env.EZRA_PORT || 42002);
const queue = process.env.QUEUE || "emails", name = process.env.WORKER_NAME || `worker-${process.pid}`;
const maxTasks = Number(process.env.MAX_TASKS || 0), idleMs = Number(process.env.IDLE_TIMEOUT || 5) * 1000;

(async () => {
  const redis = new Redis({ port });
  await redis.xgroup("CREATE", queue, "workers", "0", "MKSTREAM").catch((error) => {
    if (!String(error).includes("BUSYGROUP")) throw error; // Redis: the group exists already
  });
  for (let done = 0; !maxTasks || done < maxTasks; ) {
    const reply = await redis.xreadgroup("GROUP", "workers", name, "COUNT", 1, "BLOCK", idleMs, "STREAMS", queue, ">");
    if (!reply) break; // idle: nothing came for IDLE_TIMEOUT seconds
    for (const [, tasks] of reply) {
      for (const [id, fields] of tasks) {
        console.log("done", id, fields[fields.indexOf("to") + 1]); // do the work here
        await redis.xack(queue, "workers", id);
        done++;
      }
    }
  }
  redis.disconnect();
})();
