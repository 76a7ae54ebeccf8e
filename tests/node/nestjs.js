// NestJS microservices with the Redis transport against EZRA, driven by tests/test_worker_libs.py:
// node nestjs.js <port> <pattern> client|server
// The transport is Redis pub/sub: a ClientProxy PUBLISHes requests and SUBSCRIBEs to
// "<pattern>.reply"; the microservice SUBSCRIBEs to its patterns. EZRA has no pub/sub.
// client: what send() and emit() reject with (one JSON line). server: NestFactory.createMicroservice
// and listen(), as its docs show; prints {"listen": null} if it is still up after 3 s.
require("reflect-metadata");
const { Controller, Module } = require("@nestjs/common");
const { NestFactory } = require("@nestjs/core");
const { ClientProxyFactory, MessagePattern, Transport } = require("@nestjs/microservices");
const { firstValueFrom } = require("rxjs");
const [port, pattern, role] = process.argv.slice(2);
const options = { host: "127.0.0.1", port: Number(port) };

const within = (ms, promise) => Promise.race([promise, new Promise((_, reject) =>
  setTimeout(() => reject(new Error(`no answer in ${ms} ms`)), ms))]);

async function client() {
  const proxy = ClientProxyFactory.create({ transport: Transport.REDIS, options });
  const out = {};
  for (const [step, call] of [["send", () => firstValueFrom(proxy.send(pattern, { n: 1 }))],
                              ["emit", () => firstValueFrom(proxy.emit(pattern, { n: 2 }))]]) {
    try {
      out[step + "Reply"] = await within(5000, call());
      out[step] = null;
    } catch (error) {
      out[step] = error.message;
    }
  }
  return out;
}

async function server() {
  class Tasks {
    work(data) { return data.n; }
  }
  // what @MessagePattern(pattern) and @Controller() do in TypeScript
  MessagePattern(pattern)(Tasks.prototype, "work", Object.getOwnPropertyDescriptor(Tasks.prototype, "work"));
  Controller()(Tasks);
  class App {}
  Module({ controllers: [Tasks] })(App);
  const app = await NestFactory.createMicroservice(App, { transport: Transport.REDIS, options, logger: ["error"] });
  await within(5000, app.listen());
  await new Promise((resolve) => setTimeout(resolve, 3000));
  return { listen: null };
}

(role === "server" ? server() : client())
  .then((out) => { console.log(JSON.stringify(out)); process.exit(0); })
  .catch((error) => { console.error(error); process.exit(1); });
