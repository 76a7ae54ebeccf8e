// bee-queue (npm) against EZRA, driven by tests/test_worker_libs.py: node bee_queue.js <port> <queue>
// bee-queue keeps jobs in lists and hashes changed by Lua scripts and announces them on a
// pub/sub channel, so it cannot work on EZRA: this reports what a producer's save() and a
// worker's queue get, with the defaults and with getEvents: false (no SUBSCRIBE). One JSON line.
const Queue = require("bee-queue");
const [port, name] = process.argv.slice(2);

const within = (ms, promise) => Promise.race([promise, new Promise((_, reject) =>
  setTimeout(() => reject(new Error(`no answer in ${ms} ms`)), ms))]);

async function probe(settings) {
  const redis = { port: Number(port) };
  const out = { workerErrors: [] };
  // a producer, as its README shows: a Queue that is not a worker, and createJob().save()
  const producer = new Queue(name, { redis, isWorker: false, ...settings });
  producer.on("error", () => {}); // save() rejects with the same error
  try {
    await within(5000, producer.createJob({ n: 1 }).save());
    out.save = null;
  } catch (error) {
    out.save = error.message;
  }
  // then a worker: a Queue and process(handler)
  const worker = new Queue(name, { redis, ...settings });
  worker.on("error", (error) => out.workerErrors.push(error.message));
  worker.process(async () => 1);
  try {
    await within(5000, worker.ready());
    out.ready = null;
  } catch (error) {
    out.ready = error.message;
  }
  return out;
}

(async () => {
  const out = { defaults: await probe({}), noEvents: await probe({ getEvents: false }) };
  console.log(JSON.stringify(out));
  process.exit(0); // its clients would go on reconnecting
})().catch((error) => { console.error(error); process.exit(1); });
