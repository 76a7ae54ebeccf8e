// redis-streams-broker (npm) against EZRA, driven by tests/test_worker_libs.py:
//   node streams_broker.js <port> <queue> <tasks>
// As its README shows: a broker on an ioredis client, publish, joinConsumerGroup, two
// consumers subscribe and markAsRead. Also tries what cannot work (publish with MAXLEN
// trimming or a Lua script, markAsRead(true) with MULTI) and reports the errors. Prints
// one JSON line.
const Redis = require("ioredis");
const { StreamChannelBroker } = require("redis-streams-broker");
const [port, queue, tasks] = process.argv.slice(2);
const N = Number(tasks);

async function refusal(promise) {
  try {
    await promise;
    return null;
  } catch (error) {
    return error.message;
  }
}

(async () => {
  const clients = [new Redis({ port: Number(port) }), new Redis({ port: Number(port) })];
  const brokers = clients.map((client) => new StreamChannelBroker(client, queue));
  const result = { pushed: [], done: { c1: [], c2: [] }, acked: 0, badPayloads: 0 };
  let dropTried = false;
  // publish(payload, -1): a plain XADD. The default trims (XADD MAXLEN ~ 100).
  for (let i = 0; i < N; i++) result.pushed.push(await brokers[0].publish({ n: String(i) }, -1));
  result.defaultPublish = await refusal(brokers[0].publish({ n: "trimmed" }));
  result.limitPublish = await refusal(brokers[0].publish({ n: "limited" }, 1000, true));
  const groups = [await brokers[0].joinConsumerGroup("workers", "0"),
                  await brokers[1].joinConsumerGroup("workers", "0")];
  await new Promise((resolve, reject) => {
    const deadline = setTimeout(() => reject(new Error("not every task was delivered")), 20000);
    const handler = (name) => async (payloads) => {
      for (const p of payloads) {
        if (p.payload === null || p.payload.n === undefined) result.badPayloads++;
        if (!dropTried) {
          // the first one with markAsRead(true), "ack and drop": MULTI, XACK, XDEL, EXEC
          dropTried = true;
          result.dropAck = await refusal(p.markAsRead(true));
        } else if (await p.markAsRead()) result.acked++;
        result.done[name].push(p.id);
      }
      if (result.done.c1.length + result.done.c2.length >= N) {
        clearTimeout(deadline);
        resolve();
      }
    };
    groups[0].subscribe("c1", handler("c1"), 200, 1);
    groups[1].subscribe("c2", handler("c2"), 200, 1);
  });
  result.pending = (await groups[0].pendingSummary()).total;
  console.log(JSON.stringify(result));
  process.exit(0); // its subscriptions keep polling: destroy() does not stop them
})().catch((error) => { console.error(error); process.exit(1); });
