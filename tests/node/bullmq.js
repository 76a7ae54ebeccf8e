// BullMQ (npm) against EZRA, driven by tests/test_worker_libs.py: node bullmq.js <port> <queue>
// BullMQ keeps its jobs in lists, hashes and sorted sets changed by Lua scripts, so it
// cannot work on EZRA: this reports the error a Queue.add gets, and the first error a
// Worker emits. Prints one JSON line.
const { Queue, Worker } = require("bullmq");
const [port, name] = process.argv.slice(2);

(async () => {
  const connection = { port: Number(port) };
  const out = {};
  const queue = new Queue(name, { connection });
  try {
    await queue.add("job", { n: 1 });
    out.add = null;
  } catch (error) {
    out.add = error.message;
  }
  const worker = new Worker(name, async () => 1, { connection, autorun: true });
  out.workerErrors = 0;
  out.worker = await new Promise((resolve) => worker.on("error", (error) => {
    if (++out.workerErrors === 3) resolve(error.message); // it retries: the same error again and again
  }));
  console.log(JSON.stringify(out));
  process.exit(0); // the worker would go on retrying
})().catch((error) => { console.error(error); process.exit(1); });
