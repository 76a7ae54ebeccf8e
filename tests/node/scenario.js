// The client-matrix scenario for one Node.js client (driven by tests/test_clients.py):
//   node scenario.js <ioredis|ioredis6|redis4|redis5|redis6> <resp: default|2|3|3maps> <port> <queue> <tasks>
// ("3maps": ioredis 6's RESP3 with replyMapping "resp3", maps as objects)
// A producer pushes <tasks> tasks while two workers (own connections) read with `>`, one
// task at a time, and ack; then a blocking read must wake on a push. Prints one JSON line.
const [lib, resp, port, queue, tasks] = process.argv.slice(2);
const N = Number(tasks);

async function connect() {
  if (lib.startsWith("ioredis")) {
    const Redis = require(lib);
    const options = { port: Number(port) }; // defaults: ioredis 5 RESP2 (no RESP3), ioredis 6 RESP3
    if (resp === "2") options.protocol = 2;
    if (resp === "3maps") options.replyMapping = "resp3";
    const c = new Redis(options);
    return {
      xadd: (q, f) => c.xadd(q, "*", ...Object.entries(f).flat()),
      read: (q, w, block) => c.xreadgroup("GROUP", "workers", w, "COUNT", 1, "BLOCK", block, "STREAMS", q, ">"),
      xack: (q, id) => c.xack(q, "workers", id),
      pending: (q) => c.xpending(q, "workers").then((r) => Number(r[0])),
      info: () => c.info("clients"),
      close: () => c.quit(),
    };
  }
  const { createClient } = require(lib);
  const options = { socket: { port: Number(port) } };
  if (resp !== "default") options.RESP = Number(resp);
  const c = createClient(options);
  await c.connect();
  return {
    xadd: (q, f) => c.xAdd(q, "*", f),
    read: (q, w, block) => c.xReadGroup("workers", w, { key: q, id: ">" }, { COUNT: 1, BLOCK: block }),
    xack: (q, id) => c.xAck(q, "workers", id),
    pending: (q) => c.xPending(q, "workers").then((r) => Number(r.pending)),
    info: () => c.info("clients"),
    close: () => c.quit(),
  };
}

// Polls INFO clients (with a deadline) until a reader is blocked, so the push below wakes it.
async function untilBlocked(client) {
  const deadline = Date.now() + 10000;
  while (!/blocked_clients:[1-9]/.test(String(await client.info()))) {
    if (Date.now() > deadline) throw new Error("the reader never blocked");
    await new Promise((r) => setTimeout(r, 10));
  }
}

// [[id, {field: value}]] from any client's XREADGROUP reply shape (null when it timed out).
function entries(reply) {
  if (!reply) return [];
  const streams = Array.isArray(reply) ? reply
    : reply instanceof Map ? [...reply.entries()] : Object.entries(reply);
  const out = [];
  for (const stream of streams) {
    const messages = Array.isArray(stream) ? stream[1] : stream.messages;
    for (const m of messages) {
      if (Array.isArray(m)) {
        const fields = {};
        for (let i = 0; i < m[1].length; i += 2) fields[m[1][i]] = String(m[1][i + 1]);
        out.push([String(m[0]), fields]);
      } else out.push([String(m.id), Object.fromEntries(Object.entries(m.message).map(([k, v]) => [k, String(v)]))]);
    }
  }
  return out;
}

(async () => {
  const producer = await connect(), workers = [await connect(), await connect()];
  const result = { pushed: [], done: { w1: [], w2: [] }, badFields: 0 };
  let finished = 0;
  const work = async (client, name) => {
    while (finished < N) {
      const got = entries(await client.read(queue, name, 500));
      for (const [id, fields] of got) {
        if (fields.n === undefined || fields.payload !== `task ${fields.n}`) result.badFields++;
        await client.xack(queue, id);
        result.done[name].push(id);
        finished++;
      }
    }
  };
  const running = [work(workers[0], "w1"), work(workers[1], "w2")];
  for (let i = 0; i < N; i++) result.pushed.push(String(await producer.xadd(queue, { n: String(i), payload: `task ${i}` })));
  await Promise.all(running);
  result.pending = await producer.pending(queue);

  // A blocking read on an empty queue wakes when a task is pushed.
  const wakeQueue = queue + "-wake";
  const started = Date.now();
  const blocked = workers[0].read(wakeQueue, "w1", 10000);
  await untilBlocked(producer);
  const wakeId = String(await producer.xadd(wakeQueue, { n: "wake" }));
  const woke = entries(await blocked);
  result.wake = { pushed: wakeId, got: woke.map((e) => e[0]), ms: Date.now() - started };
  await workers[0].xack(wakeQueue, wakeId);
  for (const c of [producer, ...workers]) await c.close();
  console.log(JSON.stringify(result));
})().catch((error) => { console.error(error); process.exit(1); });
