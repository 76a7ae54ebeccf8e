// redis-streams-broker (npm) against EZRA, driven by tests/test_worker_libs_trim.py:
//   node streams_broker.js <port> <queue> <tasks>
// As its README shows, with its defaults: two consumers of one group subscribe and markAsRead,
// a producer publishes with publish(payload), which trims (XADD MAXLEN ~ 100). A first round
// of <tasks> tasks and a tail task, then a second of 150 and a tail, after which the queue
// holds 100 entries (the done tasks above 100 trimmed). Also tries what cannot work
// (publish with a Lua script) and markAsRead(true) (MULTI, XACK, XDEL, EXEC). Prints one JSON line.
const Redis = require("ioredis");
const { StreamChannelBroker } = require("redis-streams-broker");
const [port, queue, tasks] = process.argv.slice(2);
const N = Number(tasks);
const OVERFLOW = 150;

async function refusal(promise) {
  try {
    await promise;
    return null;
  } catch (error) {
    return error.message;
  }
}

(async () => {
  const clients = [0, 1, 2].map(() => new Redis({ port: Number(port) }));
  const [producer, ...consumers] = clients.map((client) => new StreamChannelBroker(client, queue));
  const result = { pushed: [], done: { c1: [], c2: [] }, acked: 0, badPayloads: 0, dropped: null };
  let handled = 0;
  const groups = [];
  for (const broker of consumers) groups.push(await broker.joinConsumerGroup("workers", "0"));
  const handler = (name) => async (payloads) => {
    for (const p of payloads) {
      if (p.payload === null || p.payload.n === undefined) result.badPayloads++;
      if (result.dropped === null) {
        // the first one with markAsRead(true), "ack and drop": MULTI, XACK, XDEL, EXEC
        result.dropped = p.id;
        result.dropAck = await refusal(p.markAsRead(true));
      } else if (await p.markAsRead()) result.acked++;
      result.done[name].push(p.id);
      handled++;
    }
  };
  groups[0].subscribe("c1", handler("c1"), 200, 1);
  groups[1].subscribe("c2", handler("c2"), 200, 1);
  const handledAll = async (count) => {
    const deadline = Date.now() + 30000;
    while (handled < count) {
      if (Date.now() > deadline) throw new Error(`${handled} of ${count} tasks handled`);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  };
  for (let i = 0; i < N; i++) result.pushed.push(await producer.publish({ n: String(i) }));
  await handledAll(N);
  result.tail = await producer.publish({ n: "tail" });
  await handledAll(N + 1);
  result.entriesAfterTail = (await clients[0].xrange(queue, "-", "+")).length;
  result.limitPublish = await refusal(producer.publish({ n: "limited" }, 1000, true));
  for (let i = 0; i < OVERFLOW; i++) await producer.publish({ n: `overflow ${i}` });
  await handledAll(N + 1 + OVERFLOW);
  await producer.publish({ n: "overflow tail" });
  await handledAll(N + 2 + OVERFLOW);
  result.overflow = { entries: (await clients[0].xrange(queue, "-", "+")).length,
                      pending: (await groups[0].pendingSummary()).total, xlen: await clients[0].xlen(queue) };
  result.handled = handled;
  result.pending = (await groups[0].pendingSummary()).total;
  console.log(JSON.stringify(result));
  process.exit(0); // its subscriptions keep polling: destroy() does not stop them
})().catch((error) => { console.error(error); process.exit(1); });
