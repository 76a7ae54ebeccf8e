// @socket.io/redis-streams-adapter (npm) against EZRA, driven by tests/test_worker_libs_xread.py:
//   node socketio_adapter.js <port> <stream> <broadcasts> <adapter package> <redis5|ioredis> [startup]
// As its README shows: createAdapter(redisClient) with its defaults (maxLen 10000, readCount 100;
// 0.3: blockTimeInMs 5000), the stream named <stream> instead of "socket.io" so that each test has
// its own. Each publish is XADD <stream> MAXLEN ~ 10000 * ...; each server reads the stream with
// XREAD BLOCK ... STREAMS <stream> <last id>, no consumer group. Since 0.3 the adapter also
// SUBSCRIBEs, and sends serverSideEmit, emitWithAck and fetchSockets over pub/sub.
// - startup: one server, no handler for unhandled rejections (as its README shows); prints
//   {"started": true} after 2 s, unless the adapter's first commands end the process.
// - otherwise: servers A and B, two socket.io clients on each (one of them in room "room"),
//   warm-up broadcasts until each server reads the other's (and nudges: see warm), then <broadcasts> io.emit
//   alternately from A and B, a room broadcast from every third, an "end" from each, and one
//   serverSideEmit from A. Prints what each client got, as one JSON line. Every wait is bounded.
const http = require("http");
const { Server } = require("socket.io");
const { io: connect } = require("socket.io-client");
const [port, stream, broadcasts, adapterPackage, clientPackage, mode] = process.argv.slice(2);
const { createAdapter } = require(adapterPackage);
const N = Number(broadcasts);

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function until(what, condition, ms) {
  const deadline = Date.now() + ms;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`waited ${ms} ms for ${what}`);
    await sleep(10);
  }
}

async function redisClient() {
  if (clientPackage === "ioredis") {
    const Redis = require("ioredis");
    return new Redis({ port: Number(port) });
  }
  const { createClient } = require(clientPackage);
  const client = createClient({ url: `redis://127.0.0.1:${port}` });
  await client.connect();
  return client;
}

async function socketServer(name) {
  const httpServer = http.createServer();
  const io = new Server(httpServer, { adapter: createAdapter(await redisClient(), { streamName: stream }) });
  io.on("connection", (socket) => {
    if (socket.handshake.query.room === "1") socket.join("room");
  });
  const fromServers = [];
  io.on("hello", (...args) => fromServers.push(args)); // serverSideEmit from the other server
  await new Promise((resolve) => httpServer.listen(0, "127.0.0.1", resolve));
  return { name, io, port: httpServer.address().port, fromServers };
}

async function socketClient(server, room) {
  const got = { server: server.name, room, all: [], inRoom: [], warmups: { A: 0, B: 0 }, ends: [] };
  const socket = connect(`http://127.0.0.1:${server.port}`,
                         { query: { room: room ? "1" : "0" }, transports: ["websocket"], reconnection: false });
  socket.on("warmup", (from) => got.warmups[from]++);
  socket.on("all", (from, i) => got.all.push([from, i]));
  socket.on("room", (from, i) => got.inRoom.push([from, i]));
  socket.on("end", (from) => got.ends.push(from));
  await until("a socket.io connection", () => socket.connected, 10000);
  return got;
}

// The adapter reads from '$' ("after my first XREAD") until it has read an entry. On ioredis one
// connection carries a server's XREAD BLOCK 100 and its XADDs, so its XADDs run just after its own
// XREAD times out: should the other server's XREAD time out just before (the two loops have the
// same period, so the phases can stay locked), that server misses every one, on redis-server as
// on EZRA. Past NUDGE_AFTER warm-ups a nudge (an entry with no namespace, which the adapter skips
// but reads past) comes from a connection of its own, at another phase: once read, the reader
// is off '$' and misses nothing more.
const NUDGE_AFTER = 10;
const nudged = { count: 0, client: null };

async function nudge() {
  nudged.client = nudged.client || (await redisClient());
  if (clientPackage === "ioredis") await nudged.client.xadd(stream, "*", "type", "nudge");
  else await nudged.client.xAdd(stream, "*", { type: "nudge" });
  nudged.count++;
}

// Broadcast from one server until the other's clients got one.
async function warm(from, clients) {
  let sent = 0;
  while (!clients.every((got) => got.warmups[from.name] > 0)) {
    if (sent >= 200) {
      throw new Error(`the other server never read a warm-up broadcast: ${sent} sent by ${from.name}, ` +
                      `${nudged.count} nudges, got ${JSON.stringify(clients.map((got) => got.warmups))}`);
    }
    from.io.emit("warmup", from.name);
    sent++;
    await sleep(50);
    if (sent >= NUDGE_AFTER && !clients.every((got) => got.warmups[from.name] > 0)) {
      await sleep(Math.random() * 100);
      await nudge();
    }
  }
  return sent;
}

async function startup() {
  const io = new Server({ adapter: createAdapter(await redisClient(), { streamName: stream }) });
  io.listen(0);
  await sleep(2000);
  console.log(JSON.stringify({ started: true }));
  process.exit(0);
}

async function scenario() {
  const unhandled = [];
  process.on("unhandledRejection", (error) => unhandled.push(String(error && error.message)));
  const started = Date.now();
  const [A, B] = [await socketServer("A"), await socketServer("B")];
  const clients = [];
  for (const server of [A, B]) for (const room of [true, false]) clients.push(await socketClient(server, room));
  const warmups = { A: await warm(A, clients.filter((c) => c.server === "B")),
                    B: await warm(B, clients.filter((c) => c.server === "A")) };
  let rooms = 0;
  for (let i = 0; i < N; i++) {
    const from = i % 2 ? B : A;
    from.io.emit("all", from.name, i);
    if (i % 3 === 0) {
      from.io.to("room").emit("room", from.name, i);
      rooms++;
    }
  }
  A.io.emit("end", "A");
  B.io.emit("end", "B");
  await until("every client to get both ends", () => clients.every((got) => got.ends.length >= 2), 20000);
  A.io.serverSideEmit("hello", "from A");
  const publishRefused = () => unhandled.some((message) => message.includes("'PUBLISH'"));
  await until("serverSideEmit to arrive or be refused", () => B.fromServers.length || publishRefused(), 10000);
  console.log(JSON.stringify({ clients, warmups, nudges: nudged.count, rooms, serverSideEmit: B.fromServers,
                               unhandled, ms: Date.now() - started }));
  process.exit(0); // its readers go on polling; its servers hold their ports
}

(mode === "startup" ? startup() : scenario()).catch((error) => { console.error(error); process.exit(1); });
