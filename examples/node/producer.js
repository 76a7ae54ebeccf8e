// Push tasks with ioredis: node producer.js [port] [count]  (or EZRA_PORT, TASKS, QUEUE).
const Redis = require("ioredis");

const port = Number(process.argv[2] || process.env.EZRA_PORT || 42002);
const count = Number(process.argv[3] || process.env.TASKS || 10);
const queue = process.env.QUEUE || "emails";

(async () => {
  const redis = new Redis({ port });
  for (let i = 0; i < count; i++) {
    const id = await redis.xadd(queue, "*", "to", `user${i}@example.com`, "template", "welcome"); // durable now
    console.log("pushed", id);
  }
  redis.disconnect();
})();
