"""Worker libraries whose DEFAULT producer trims approximately (`XADD ... MAXLEN ~ n`), with those defaults.

Each row: a producer and two consumers of one consumer group, every task done exactly once,
nothing pending, and the library's default trimming honored: the pushes are taken, and once
tasks are done a later push trims them down to the library's MAXLEN (EZRA removes done tasks
only: see ezra/settings/trimming.py). Before approximate trimming these producers were refused, and
edx-event-bus-redis's producer, which logs and swallows errors, lost every event.

- redis-streams-broker (npm, build/node): publish(payload) sends XADD MAXLEN ~ 100.
- edx-event-bus-redis (PyPI, build/venv-worker-libs-trim): stream.add(maxlen=10000, approximate=True).
  Its consumer uses a SIGALRM timeout, so each consumer runs in its own process, as its
  `consume_events` management command does.
- redisqueue (Go module): its default producer sends XADD MAXLEN ~ 1000. Go modules come only
  from the module proxy; where it cannot be reached the test skips with the reason.

The rows go to build/compat/worker_libs.json with tests/test_worker_libs.py's, which
scripts/compat_table.py turns into the README's table.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess

import pytest

from support_compat import NODE_SRC, node_env, node_version, python_venv
from support_servers import ROOT, wait_until
from support_worker_libs import Row, dist_version, record_worker_libs, run_json, short

pytestmark = pytest.mark.slow  # worker libraries in their own venvs: not in `pytest -m "not slow"`

N = 20
OVERFLOW = 150  # tests/node/streams_broker.js's second round: more than its MAXLEN ~ 100


@pytest.fixture(scope="module", autouse=True)
def compat_json():
    yield
    record_worker_libs()


def entries(client, queue: str) -> int:
    """The queue's entries as XRANGE shows them (available, delayed, in flight, done)."""
    return len(client.xrange(queue))


# ------------------------------------------------------------------ redis-streams-broker (npm)

def test_redis_streams_broker_default_publish(shared_server, queue):
    env = node_env()
    row = Row("redis-streams-broker (Node.js, on ioredis)", node_version("redis-streams-broker"))
    out = run_json(["node", str(NODE_SRC / "streams_broker.js"), str(shared_server.port), queue, str(N)],
                   env=env)
    total = N + 1 + OVERFLOW + 1  # a round of N, a tail, a round of OVERFLOW, a tail
    done = out["done"]["c1"] + out["done"]["c2"]
    assert out["handled"] == len(done) == len(set(done)) == total, "every task exactly once"
    assert set(out["pushed"] + [out["tail"]]) <= set(done) and out["done"]["c1"] and out["done"]["c2"], out
    assert out["acked"] == total - 1 and out["badPayloads"] == 0 and out["pending"] == 0, out
    assert out["dropAck"] is None, out  # MULTI, XACK, XDEL, EXEC: the transaction runs
    assert out["limitPublish"].startswith("ERR unknown command 'eval'"), out
    # Its default trim (~ 100): N + 1 entries are under it; after the second round the pushes
    # have trimmed done tasks down to 100 each time the queue went past 110 (trimming.slack)
    assert out["entriesAfterTail"] == N + 1, out
    assert 100 <= out["overflow"]["entries"] <= 110, out
    assert out["overflow"]["pending"] == 0 and out["overflow"]["xlen"] == 0, out
    client = shared_server.client()
    assert client.xpending(queue, "workers")["pending"] == 0 and client.xlen(queue) == 0
    assert 100 <= entries(client, queue) <= 110
    client.close()
    row.done("works",
             "joinConsumerGroup, publish(payload) with its default trim (XADD MAXLEN ~ 100), subscribe "
             "(XREADGROUP BLOCK), markAsRead (XACK), pendingSummary: two consumers, every task once, "
             f"nothing pending; with {OVERFLOW} more tasks, its pushes trim done tasks back to 100 entries "
             "whenever the queue is over 110 (never an unfinished task). publish(p, limit, true) runs a Lua script: "
             f"\"{short(out['limitPublish'])}\". markAsRead(true) (ack and drop) sends MULTI, XACK, XDEL, "
             "EXEC: the task is acked; the XDEL of a done task keeps its record (EZRA's XDEL reports a "
             "failure; trimming, retention or XACKDEL remove done tasks)")


# ------------------------------------------------------------------ edx-event-bus-redis (PyPI, own venv)

EDX_REQUIREMENTS = ["edx-event-bus-redis>=0.6,<2"]

EDX_SETUP = r"""
import json, logging, os, signal, sys
import django
from django.conf import settings
port, topic = int(sys.argv[1]), sys.argv[2]
configured = dict(EVENT_BUS_REDIS_CONNECTION_URL=f"redis://127.0.0.1:{port}/0", USE_TZ=True, INSTALLED_APPS=[],
                  DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}})
if os.environ.get("MAX_LEN"):  # the documented setting; unset: the library's default (10000)
    configured["EVENT_BUS_REDIS_STREAM_MAX_LEN"] = int(os.environ["MAX_LEN"])
settings.configure(**configured)
django.setup()
from openedx_events.content_authoring.data import XBlockData
from openedx_events.content_authoring.signals import XBLOCK_DELETED
"""

EDX_PRODUCER = EDX_SETUP + r"""
from opaque_keys.edx.keys import UsageKey
from edx_event_bus_redis import create_producer
errors = []
class Errors(logging.Handler):
    def emit(self, record):
        errors.append(record.getMessage()[:300])
logging.getLogger("edx_event_bus_redis").addHandler(Errors(level=logging.ERROR))
producer = create_producer()
first, count = int(sys.argv[3]), int(sys.argv[4])
for i in range(first, first + count):
    key = UsageKey.from_string(f"block-v1:edX+Demo+T1+type@problem+block@p{i}")
    producer.send(signal=XBLOCK_DELETED, topic=topic, event_key_field="xblock_info.usage_key",
                  event_data={"xblock_info": XBlockData(usage_key=key, block_type="problem")},
                  event_metadata=XBLOCK_DELETED.generate_signal_metadata())
print(json.dumps({"errors": errors}))
"""

EDX_CONSUMER = EDX_SETUP + r"""
import edx_event_bus_redis, importlib.metadata
from edx_event_bus_redis import RedisEventConsumer
name = sys.argv[3]
received = []
def handler(sender, xblock_info, **kwargs):
    received.append(str(xblock_info.usage_key).rsplit("@", 1)[1])
XBLOCK_DELETED.connect(handler)
consumer = RedisEventConsumer(topic, "workers", name)
signal.signal(signal.SIGTERM, lambda *_: consumer._shut_down())  # the loop stops after its current read
print("ready", flush=True)
consumer.consume_indefinitely()
print(json.dumps({"received": received, "version": importlib.metadata.version("edx-event-bus-redis")}))
"""


class EdxConsumers:
    """Two consumer processes of one group, each with its own name."""

    def __init__(self, python, port: int, topic: str, env: dict):
        self.procs = {name: subprocess.Popen([str(python), "-c", EDX_CONSUMER, str(port), topic, name],
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                      for name in ("c1", "c2")}
        for proc in self.procs.values():
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read()[-3000:]

    def stop(self) -> dict:
        results = {}
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            out, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, err[-3000:]
            results[name] = json.loads(out.strip().splitlines()[-1])
        return results

    def kill(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def edx_round(python, server, topic: str, first: int, count: int, env: dict) -> tuple[dict, dict]:
    """Two consumers, a producer sending `count` events; (what each consumer got, the producer's errors)."""
    client = server.client()
    blocked = client.info("clients")["blocked_clients"]
    consumers = EdxConsumers(python, server.port, topic, env)
    try:
        # both consumers are reading (their XREADGROUP ... BLOCK), as they would be in production
        wait_until(lambda: client.info("clients")["blocked_clients"] >= blocked + 2, timeout=30,
                   message="both consumers reading")
        produced = run_json([str(python), "-c", EDX_PRODUCER, str(server.port), topic, str(first), str(count)],
                            env=env, timeout=120)
        # every event pushed (entries-added counts trimmed ones too) and none left unfinished
        wait_until(lambda: client.xinfo_stream(topic)["entries-added"] >= first + count
                   and client.xlen(topic) == 0, timeout=60, message="every event handled")
        results = consumers.stop()
    finally:
        consumers.kill()
        client.close()
    return results, produced


def test_edx_event_bus_redis_defaults(shared_server, queue):
    python = python_venv("venv-worker-libs-trim", EDX_REQUIREMENTS)
    row = Row("edx-event-bus-redis (Python, Open edX event bus)", dist_version(python, "edx-event-bus-redis"))
    env = {k: v for k, v in os.environ.items() if k != "MAX_LEN"}
    results, produced = edx_round(python, shared_server, queue, 0, N, env)
    assert produced["errors"] == [], produced  # the producer logs and swallows errors: none here
    assert sorted(results["c1"]["received"] + results["c2"]["received"]) == sorted(f"p{i}" for i in range(N)), \
        "every event exactly once"
    client = shared_server.client()
    assert client.xpending(queue, "workers")["pending"] == 0 and client.xlen(queue) == 0
    # MAXLEN ~ 10000 keeps every done event; the placeholder {'': ''} that walrus's create() adds
    # and XDELs is gone (XDEL deletes a task nobody holds, as Redis deletes the entry)
    assert entries(client, queue) == N
    # Its documented setting EVENT_BUS_REDIS_STREAM_MAX_LEN makes the trim bite: 10 more events,
    # each push trims the done ones down to 10 entries (never an unhandled one).
    results, produced = edx_round(python, shared_server, queue, N, 10, dict(env, MAX_LEN="10"))
    assert produced["errors"] == [], produced
    assert sorted(sum((r["received"] for r in results.values()), [])) == sorted(f"p{i}" for i in range(N, N + 10))
    assert client.xpending(queue, "workers")["pending"] == 0
    assert 10 <= entries(client, queue) <= 11 and client.xlen(queue) == 0  # 10 + a tenth
    client.close()
    row.done("works",
             "create_producer().send() (XADD MAXLEN ~ 10000, its default) and two RedisEventConsumer "
             "processes of one group (XGROUP CREATE MKSTREAM, SETID $, XPENDING, XREADGROUP BLOCK, XACK): "
             "every event once, nothing pending; with EVENT_BUS_REDIS_STREAM_MAX_LEN=10 the pushes trim "
             "handled events down to 10 entries (11 at most). Its producer logs and swallows errors: before EZRA "
             "trimmed, every event was refused and lost with a log line. walrus's create() adds a "
             "placeholder {'': ''} and XDELs it: deleted, as on Redis (XDEL deletes a task nobody "
             "holds). Its consumer's SIGALRM timeout needs the main thread: one process "
             "per consumer")


# ------------------------------------------------------------------ redisqueue (Go module)

REDISQUEUE_MODULE = "github.com/robinjoseph08/redisqueue/v2"
REDISQUEUE_SCENARIO = r"""
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/robinjoseph08/redisqueue/v2"
)

func main() {
	addr, stream := "127.0.0.1:"+os.Args[1], os.Args[2]
	n, _ := strconv.Atoi(os.Args[3])
	redisOptions := &redisqueue.RedisOptions{Addr: addr}
	// NewProducer()'s own defaults (StreamMaxLength 1000, ApproximateMaxLength true: XADD MAXLEN ~ 1000),
	// spelt out only because NewProducer() connects to localhost:6379.
	producer, err := redisqueue.NewProducerWithOptions(&redisqueue.ProducerOptions{
		StreamMaxLength: 1000, ApproximateMaxLength: true, RedisOptions: redisOptions})
	if err != nil {
		panic(err)
	}
	var mu sync.Mutex
	done := map[string][]string{"c1": {}, "c2": {}}
	total := 0
	finished := make(chan struct{})
	consumers := []*redisqueue.Consumer{}
	for _, name := range []string{"c1", "c2"} {
		name := name
		consumer, err := redisqueue.NewConsumerWithOptions(&redisqueue.ConsumerOptions{
			Name: name, GroupName: "workers", VisibilityTimeout: 60 * time.Second, BlockingTimeout: time.Second,
			ReclaimInterval: time.Second, BufferSize: 100, Concurrency: 2, RedisOptions: redisOptions})
		if err != nil {
			panic(err)
		}
		consumer.Register(stream, func(msg *redisqueue.Message) error {
			mu.Lock()
			defer mu.Unlock()
			done[name] = append(done[name], msg.ID)
			total++
			if total == n {
				close(finished)
			}
			return nil
		})
		go func() {
			for err := range consumer.Errors {
				fmt.Fprintln(os.Stderr, "consumer error:", err)
			}
		}()
		consumers = append(consumers, consumer)
	}
	var running sync.WaitGroup
	for _, consumer := range consumers {
		running.Add(1)
		go func(c *redisqueue.Consumer) { defer running.Done(); c.Run() }(consumer)
	}
	pushed := []string{}
	for i := 0; i < n; i++ {
		msg := &redisqueue.Message{Stream: stream, Values: map[string]interface{}{"n": i}}
		if err := producer.Enqueue(msg); err != nil {
			panic(err)
		}
		pushed = append(pushed, msg.ID)
	}
	select {
	case <-finished:
	case <-time.After(60 * time.Second):
		panic("not every task was handled")
	}
	for _, consumer := range consumers {
		consumer.Shutdown()
	}
	running.Wait()
	out, _ := json.Marshal(map[string]interface{}{"pushed": pushed, "done": done})
	fmt.Println(string(out))
}
"""


def go_module_env() -> dict:
    """Go in module mode, its caches under build/ (the module proxy is the only source of modules)."""
    return dict(os.environ, GO111MODULE="on", GOFLAGS="-mod=mod", GOPATH=str(ROOT / "build" / "go-path"),
                GOCACHE=str(ROOT / "build" / "go-cache"))


def redisqueue_program() -> tuple[str, dict]:
    """build/go-redisqueue: the scenario with redisqueue/v2 as a module; skips if it cannot be fetched."""
    if shutil.which("go") is None:
        pytest.skip("Go is not installed (apt-get install golang-go)")
    work, env = ROOT / "build" / "go-redisqueue", go_module_env()
    work.mkdir(parents=True, exist_ok=True)
    (work / "main.go").write_text(REDISQUEUE_SCENARIO)
    if not (work / "go.mod").exists():
        subprocess.run(["go", "mod", "init", "ezra.test/redisqueue"], cwd=work, env=env, check=True,
                       capture_output=True)
    got = subprocess.run(["go", "get", REDISQUEUE_MODULE + "@latest"], cwd=work, env=env, capture_output=True,
                         text=True, timeout=300)
    if got.returncode != 0:
        pytest.skip(f"cannot fetch {REDISQUEUE_MODULE} from the Go module proxy: {got.stderr.strip()[-300:]}")
    listed = subprocess.run(["go", "list", "-m", "-f", "{{.Version}}", REDISQUEUE_MODULE], cwd=work, env=env,
                            capture_output=True, text=True)
    return listed.stdout.strip() or "unknown", env


def test_redisqueue_defaults(shared_server, queue):
    version, env = redisqueue_program()
    row = Row("redisqueue (Go)", version)
    work = ROOT / "build" / "go-redisqueue"
    n = 1200  # more than its default MAXLEN ~ 1000
    out = run_json(["go", "run", ".", str(shared_server.port), queue, str(n)], cwd=work, env=env, timeout=300)
    assert len(out["pushed"]) == n
    all_done = out["done"]["c1"] + out["done"]["c2"]
    assert sorted(all_done) == sorted(out["pushed"]), "every task exactly once"
    client = shared_server.client()
    assert client.xpending(queue, "workers")["pending"] == 0 and client.xlen(queue) == 0
    assert entries(client, queue) >= 1000, "approximate: at least 1000 entries stay"
    assert entries(client, queue) <= 1100, "its pushes trim done tasks to 1000 once 100 over"
    client.close()
    row.done("works", "Producer with its default options (XADD MAXLEN ~ 1000) and two Consumers of one group "
                      "(XGROUP CREATE MKSTREAM, XREADGROUP BLOCK, XPENDING, XCLAIM, XACK): every task once, "
                      "nothing pending; its pushes trim done tasks back to 1000 entries once the queue is 100 "
                      "over, never an unfinished one")
