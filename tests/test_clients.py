"""The client matrix: stock Redis clients, with their DEFAULT connection settings, drive EZRA.

Each client runs the same scenario: a producer pushes N tasks while two workers (own
connections) read with `>` and ack; every task must be done exactly once, nothing stays
pending; then a blocking read on an empty queue must wake when a task is pushed.
Also runs the examples/ programs so they cannot rot.

Missing runtimes skip with the reason (scripts/test.sh installs them in CI). Every case
records client / version / protocol / status in build/compat/clients.json, which
scripts/compat_table.py turns into docs/compatibility.md's table.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from support_compat import NODE_SRC, node_env, node_version, python_venv, record_results, run_examples
from support_servers import ROOT, wait_until

pytestmark = pytest.mark.slow  # other runtimes and clients: not in `pytest -m "not slow"`

N = 40
EXAMPLES = ROOT / "examples"
ID = re.compile(r"(?<![\w-])\d+-\d+(?![\w-])")  # a task id anywhere in redis-cli's output

RESULTS: list[dict] = []


@pytest.fixture(scope="module", autouse=True)
def compat_json():
    yield
    record_results("clients", RESULTS)


class Record:
    def __init__(self, client: str, version: str, protocol: str, settings: str):
        self.entry = dict(client=client, version=version, protocol=protocol, settings=settings,
                          status="fail", when=time.strftime("%Y-%m-%d %H:%M:%S"))
        RESULTS.append(self.entry)

    def passed(self) -> None:
        self.entry["status"] = "pass"


def check_scenario(pushed: list[str], done: dict[str, list[str]], pending: int) -> None:
    """Every pushed task done exactly once, by the two workers, nothing pending."""
    all_done = [task for tasks in done.values() for task in tasks]
    assert len(pushed) == N and len(set(pushed)) == N
    assert sorted(all_done) == sorted(pushed), "every task exactly once"
    assert pending == 0


# ------------------------------------------------------------------ redis-py

def redis_py_client(port: int, variant: str) -> redis.Redis:
    from redis._parsers import _RESP2Parser, _RESP3Parser
    client = redis.Redis(port=port, protocol=2 if variant.startswith("resp2") else None)
    if variant.endswith("python-parser"):  # redis-py's own parser instead of hiredis
        parser = _RESP2Parser if variant.startswith("resp2") else _RESP3Parser
        client.connection_pool.connection_kwargs["parser_class"] = parser
    return client  # everything else: redis-py's defaults


REDIS_PY = {  # variant -> (protocol, settings)
    "default": ("RESP3 (default)", "redis.Redis(port=...) with hiredis"),
    "resp3-python-parser": ("RESP3 (default)", "redis.Redis(port=...), pool parser_class=_RESP3Parser (no hiredis)"),
    "resp2": ("RESP2", "protocol=2 with hiredis"),
    "resp2-python-parser": ("RESP2", "protocol=2, pool parser_class=_RESP2Parser (no hiredis)"),
}


@pytest.mark.parametrize("variant", list(REDIS_PY))
def test_redis_py(shared_server, queue, variant):
    protocol, settings = REDIS_PY[variant]
    uses_hiredis = "hiredis" in settings and "no hiredis" not in settings
    if uses_hiredis:
        try:
            import hiredis
        except ImportError:
            pytest.skip("hiredis is not installed (pip install hiredis)")
        settings += f" {hiredis.__version__}"
    rec = Record("redis-py (Python)", redis.__version__, protocol, settings)
    producer = redis_py_client(shared_server.port, variant)
    expected = 3 if "RESP3" in protocol else 2
    assert producer.connection_pool.get_connection().protocol in (expected, str(expected))
    parser = type(producer.connection_pool.get_connection()._parser).__name__
    assert ("Hiredis" in parser) == uses_hiredis, parser
    done: dict[str, list[str]] = {"w1": [], "w2": []}
    errors = []

    def work(name):
        client = redis_py_client(shared_server.port, variant)
        try:
            while sum(map(len, done.values())) < N:
                for _, tasks in client.xreadgroup("workers", name, {queue: ">"}, count=1, block=500) or []:
                    for task_id, fields in tasks:
                        assert fields[b"payload"] == b"task " + fields[b"n"]
                        assert client.xack(queue, "workers", task_id) == 1
                        done[name].append(task_id.decode())
        except Exception as error:  # reported by the main thread
            errors.append(error)
        finally:
            client.close()

    threads = [threading.Thread(target=work, args=(name,)) for name in done]
    for thread in threads:
        thread.start()
    pushed = [producer.xadd(queue, {"n": str(i), "payload": f"task {i}"}).decode() for i in range(N)]
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    check_scenario(pushed, done, producer.xpending(queue, "workers")["pending"])

    # a blocking read wakes on a push
    blocked = redis_py_client(shared_server.port, variant)
    wake = queue + "-wake"
    got = []
    reader = threading.Thread(target=lambda: got.append(
        blocked.xreadgroup("workers", "w1", {wake: ">"}, count=1, block=10000)))
    started = time.monotonic()
    reader.start()
    wait_until(lambda: producer.info("clients")["blocked_clients"] >= 1, message="a blocked reader")
    task_id = producer.xadd(wake, {"n": "wake"})
    reader.join(10)
    assert time.monotonic() - started < 5
    assert [t[0] for _, tasks in got[0] for t in tasks] == [task_id]
    for client in (producer, blocked):
        client.close()
    rec.passed()


# ------------------------------------------------------------------ redis-py 5 (its own venv)

PY_SCENARIO = r"""
import json, sys, threading, time
import redis
port, queue, n, protocol = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
kwargs = {} if protocol == "default" else {"protocol": int(protocol)}
producer = redis.Redis(port=port, **kwargs)  # everything else: this redis-py's defaults
try:
    connection = producer.connection_pool.get_connection()
except TypeError:  # redis-py before 5.3 wants a command name
    connection = producer.connection_pool.get_connection("_")
used = {"protocol": str(connection.protocol), "parser": type(connection._parser).__name__}
producer.connection_pool.release(connection)
done, errors = {"w1": [], "w2": []}, []
def streams(reply):  # [(queue, entries)]; redis-py 5 turns RESP3's map into {queue: [entries]}
    if isinstance(reply, dict):
        return [(key, value[0]) for key, value in reply.items()]
    return reply or []
def work(name):
    client = redis.Redis(port=port, **kwargs)
    try:
        while sum(map(len, done.values())) < n:
            for _, tasks in streams(client.xreadgroup("workers", name, {queue: ">"}, count=1, block=500)):
                for task_id, fields in tasks:
                    assert fields[b"payload"] == b"task " + fields[b"n"], fields
                    assert client.xack(queue, "workers", task_id) == 1
                    done[name].append(task_id.decode())
    except Exception as error:
        errors.append(repr(error))
threads = [threading.Thread(target=work, args=(name,)) for name in done]
for thread in threads:
    thread.start()
pushed = [producer.xadd(queue, {"n": str(i), "payload": f"task {i}"}).decode() for i in range(n)]
for thread in threads:
    thread.join(30)
pending = producer.xpending(queue, "workers")["pending"]
wake, got = queue + "-wake", []
reader = redis.Redis(port=port, **kwargs)
started = time.monotonic()
blocked = threading.Thread(target=lambda: got.append(
    reader.xreadgroup("workers", "w1", {wake: ">"}, count=1, block=10000)))
blocked.start()
deadline = time.monotonic() + 10  # poll until the reader is blocked, so the push wakes it
while producer.info("clients")["blocked_clients"] < 1:
    assert time.monotonic() < deadline, "the reader never blocked"
    time.sleep(0.01)
wake_id = producer.xadd(wake, {"n": "wake"}).decode()
blocked.join(10)
woke = [t[0].decode() for _, tasks in streams(got[0] if got else None) for t in tasks]
print(json.dumps(dict(version=redis.__version__, used=used, pushed=pushed, done=done, errors=errors,
                      pending=pending, wake=dict(pushed=wake_id, got=woke,
                                                 ms=round((time.monotonic() - started) * 1000)))))
"""

REDIS_PY5 = {  # protocol arg -> (protocol label, settings, protocol the connection must use)
    "default": ("RESP2 (default)", "redis.Redis(port=...), no hiredis, own venv", "2"),
    "3": ("RESP3", "protocol=3, no hiredis, own venv", "3"),
}


@pytest.fixture(scope="session")
def redis_py5() -> Path:
    return python_venv("venv-redispy5", ["redis>=5,<6"])


@pytest.mark.parametrize("protocol", list(REDIS_PY5), ids=["resp2-default", "resp3"])
def test_redis_py5(shared_server, queue, protocol, redis_py5):
    label, settings, expected = REDIS_PY5[protocol]
    version = subprocess.run([str(redis_py5), "-c", "import redis; print(redis.__version__)"],
                             capture_output=True, text=True).stdout.strip()
    assert version.startswith("5."), version
    rec = Record("redis-py (Python)", version, label, settings)
    result = subprocess.run([str(redis_py5), "-c", PY_SCENARIO, str(shared_server.port), queue, str(N), protocol],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["used"]["protocol"] == expected and "Hiredis" not in out["used"]["parser"], out["used"]
    assert not out["errors"], out["errors"]
    check_scenario(out["pushed"], out["done"], out["pending"])
    assert out["wake"]["got"] == [out["wake"]["pushed"]] and out["wake"]["ms"] < 5000, out["wake"]
    rec.passed()


# ------------------------------------------------------------------ Node.js

NODE = {  # id -> (package, resp, protocol label, settings); the npm aliases are in tests/node/package.json
    "ioredis5": ("ioredis", "default", "RESP2 (default; no RESP3)", "new Redis({port})"),
    "ioredis6-resp3": ("ioredis6", "default", "RESP3 (default)", "new Redis({port})"),
    "ioredis6-resp3-maps": ("ioredis6", "3maps", "RESP3 (default)", 'new Redis({port, replyMapping: "resp3"})'),
    "ioredis6-resp2": ("ioredis6", "2", "RESP2", "new Redis({port, protocol: 2})"),
    "redis4": ("redis4", "default", "RESP2 (default; no RESP3)", "createClient({socket: {port}})"),
    "redis5-resp2": ("redis5", "default", "RESP2 (default)", "createClient({socket: {port}})"),
    "redis5-resp3": ("redis5", "3", "RESP3", "createClient({socket: {port}, RESP: 3})"),
    "redis6-resp3": ("redis6", "default", "RESP3 (default)", "createClient({socket: {port}})"),
    "redis6-resp2": ("redis6", "2", "RESP2", "createClient({socket: {port}, RESP: 2})"),
}


@pytest.mark.parametrize("case", list(NODE))
def test_node(shared_server, queue, case):
    package, resp, protocol, settings = NODE[case]
    env = node_env()
    name = "ioredis (Node.js)" if package.startswith("ioredis") else "node-redis `redis` (Node.js)"
    rec = Record(name, node_version(package), protocol, settings)
    node = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    rec.entry["settings"] += f", node {node}"
    result = subprocess.run(
        ["node", str(NODE_SRC / "scenario.js"), package, resp, str(shared_server.port), queue, str(N)],
        capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    check_scenario(out["pushed"], out["done"], out["pending"])
    assert out["badFields"] == 0
    assert out["wake"]["got"] == [out["wake"]["pushed"]] and out["wake"]["ms"] < 5000, out["wake"]
    rec.passed()


# ------------------------------------------------------------------ Ruby (redis-rb)

RUBY_SCENARIO = r"""
require "redis"
require "json"
port, queue, n = Integer(ARGV[0]), ARGV[1], Integer(ARGV[2])
producer = Redis.new(port: port)  # redis-rb's defaults (RESP2)
done = { "w1" => [], "w2" => [] }
finished = 0
lock = Mutex.new
workers = done.keys.map do |name|
  Thread.new do
    client = Redis.new(port: port)
    while lock.synchronize { finished < n }
      reply = client.xreadgroup("workers", name, queue, ">", count: 1, block: 500)
      (reply[queue] || []).each do |id, fields|
        raise "bad fields #{fields}" unless fields["payload"] == "task #{fields['n']}"
        raise "xack" unless client.xack(queue, "workers", id) == 1
        lock.synchronize { done[name] << id; finished += 1 }
      end
    end
    client.close
  end
end
pushed = (0...n).map { |i| producer.xadd(queue, { "n" => i.to_s, "payload" => "task #{i}" }) }
workers.each(&:join)
pending = producer.xpending(queue, "workers")["size"]
wake = queue + "-wake"
reader = Redis.new(port: port)
started = Time.now
blocked = Thread.new { reader.xreadgroup("workers", "w1", wake, ">", count: 1, block: 10000) }
deadline = Time.now + 10  # poll until the reader is blocked, so the push wakes it
until producer.info("clients")["blocked_clients"].to_i >= 1
  raise "the reader never blocked" if Time.now > deadline
  sleep 0.01
end
wake_id = producer.xadd(wake, { "n" => "wake" })
got = blocked.value
puts JSON.generate(pushed: pushed, done: done, pending: pending,
                   wake: { pushed: wake_id, got: (got[wake] || []).map(&:first), ms: ((Time.now - started) * 1000).round })
"""


def test_ruby_redis(shared_server, queue):
    if shutil.which("ruby") is None:
        pytest.skip("Ruby is not installed (apt-get install ruby-redis)")
    probe = subprocess.run(["ruby", "-e", 'require "redis"; print Redis::VERSION'],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("the redis gem is not installed (apt-get install ruby-redis)")
    ruby_version = subprocess.run(["ruby", "-e", "print RUBY_VERSION"], capture_output=True, text=True).stdout
    rec = Record("redis-rb (Ruby, Debian ruby-redis)", probe.stdout, "RESP2 (default; no RESP3)",
                 f"Redis.new(port: ...), ruby {ruby_version}")
    result = subprocess.run(["ruby", "-e", RUBY_SCENARIO, str(shared_server.port), queue, str(N)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    check_scenario(out["pushed"], out["done"], out["pending"])
    assert out["wake"]["got"] == [out["wake"]["pushed"]] and out["wake"]["ms"] < 5000, out["wake"]
    rec.passed()


# ------------------------------------------------------------------ Go (redigo)

GO_SCENARIO = r"""package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gomodule/redigo/redis"
)

// entries: [[id, fields]] of an XREADGROUP reply (nil when it timed out).
func entries(reply interface{}) [][2]interface{} {
	var out [][2]interface{}
	streams, _ := redis.Values(reply, nil)
	for _, s := range streams {
		stream, _ := redis.Values(s, nil)
		items, _ := redis.Values(stream[1], nil)
		for _, item := range items {
			pair, _ := redis.Values(item, nil)
			fields, _ := redis.StringMap(pair[1], nil)
			id, _ := redis.String(pair[0], nil)
			out = append(out, [2]interface{}{id, fields})
		}
	}
	return out
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func main() {
	addr, queue := "127.0.0.1:"+os.Args[1], os.Args[2]
	n, _ := strconv.Atoi(os.Args[3])
	producer, err := redis.Dial("tcp", addr) // redigo's defaults (RESP2)
	must(err)
	done := map[string][]string{"w1": {}, "w2": {}}
	finished, bad := 0, 0
	var lock sync.Mutex
	var wg sync.WaitGroup
	for _, name := range []string{"w1", "w2"} {
		wg.Add(1)
		go func(name string) {
			defer wg.Done()
			c, err := redis.Dial("tcp", addr)
			must(err)
			defer c.Close()
			for {
				lock.Lock()
				left := finished < n
				lock.Unlock()
				if !left {
					return
				}
				reply, err := c.Do("XREADGROUP", "GROUP", "workers", name, "COUNT", 1, "BLOCK", 500, "STREAMS", queue, ">")
				must(err)
				for _, e := range entries(reply) {
					fields := e[1].(map[string]string)
					if fields["payload"] != "task "+fields["n"] {
						bad++
					}
					acked, err := redis.Int(c.Do("XACK", queue, "workers", e[0]))
					must(err)
					if acked != 1 {
						bad++
					}
					lock.Lock()
					done[name] = append(done[name], e[0].(string))
					finished++
					lock.Unlock()
				}
			}
		}(name)
	}
	pushed := []string{}
	for i := 0; i < n; i++ {
		id, err := redis.String(producer.Do("XADD", queue, "*", "n", i, "payload", fmt.Sprintf("task %d", i)))
		must(err)
		pushed = append(pushed, id)
	}
	wg.Wait()
	summary, err := redis.Values(producer.Do("XPENDING", queue, "workers"))
	must(err)
	pending, _ := redis.Int(summary[0], nil)

	wake := queue + "-wake"
	reader, err := redis.Dial("tcp", addr)
	must(err)
	started := time.Now()
	result := make(chan interface{})
	go func() {
		reply, err := reader.Do("XREADGROUP", "GROUP", "workers", "w1", "COUNT", 1, "BLOCK", 10000, "STREAMS", wake, ">")
		must(err)
		result <- reply
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		info, err := redis.String(producer.Do("INFO", "clients")) // until the reader is blocked
		must(err)
		if !strings.Contains(info, "blocked_clients:0") {
			break
		}
		if time.Now().After(deadline) {
			panic("the reader never blocked")
		}
	}
	wakeID, err := redis.String(producer.Do("XADD", wake, "*", "n", "wake"))
	must(err)
	got := []string{}
	for _, e := range entries(<-result) {
		got = append(got, e[0].(string))
	}
	out, _ := json.Marshal(map[string]interface{}{"pushed": pushed, "done": done, "pending": pending, "bad": bad,
		"wake": map[string]interface{}{"pushed": wakeID, "got": got, "ms": time.Since(started).Milliseconds()}})
	fmt.Println(string(out))
}
"""
REDIGO_SRC = Path("/usr/share/gocode/src/github.com/gomodule/redigo")


def test_go_redigo(shared_server, queue, tmp_path):
    if shutil.which("go") is None:
        pytest.skip("Go is not installed (apt-get install golang-go golang-github-gomodule-redigo-dev)")
    if not (REDIGO_SRC / "redis").is_dir():
        pytest.skip(f"redigo is not in {REDIGO_SRC} (apt-get install golang-github-gomodule-redigo-dev)")
    version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "golang-github-gomodule-redigo-dev"],
                             capture_output=True, text=True).stdout or "unknown"
    go_version = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True).stdout.strip()
    rec = Record("redigo (Go, Debian golang-github-gomodule-redigo-dev)", version,
                 "RESP2 (default; no RESP3)", f"redis.Dial(\"tcp\", addr), {go_version}, GOPATH mode")
    source = tmp_path / "scenario.go"
    source.write_text(GO_SCENARIO)
    env = dict(os.environ, GO111MODULE="off", GOPATH="/usr/share/gocode", GOFLAGS="",
               GOCACHE=str(ROOT / "build" / "go-cache"))  # no module proxy: GOPATH mode
    result = subprocess.run(["go", "run", str(source), str(shared_server.port), queue, str(N)],
                            capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    check_scenario(out["pushed"], out["done"], out["pending"])
    assert out["bad"] == 0
    assert out["wake"]["got"] == [out["wake"]["pushed"]] and out["wake"]["ms"] < 5000, out["wake"]
    rec.passed()


# ------------------------------------------------------------------ redis-cli

def redis_cli_version() -> str:
    if shutil.which("redis-cli") is None:
        pytest.skip("redis-cli is not installed (apt-get install redis-tools; scripts/test.sh does)")
    out = subprocess.run(["redis-cli", "--version"], capture_output=True, text=True).stdout
    return out.split()[1]


@pytest.mark.parametrize("flag", ["", "-3"], ids=["resp2", "resp3"])
def test_redis_cli(shared_server, queue, flag):
    rec = Record("redis-cli", redis_cli_version(), "RESP3 (-3)" if flag else "RESP2 (default)",
                 "redis-cli -p PORT " + (flag + " " if flag else "") + "(output not a tty)")

    def cli(*args, timeout=20):
        command = ["redis-cli", "-p", str(shared_server.port), *([flag] if flag else []), *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        assert result.returncode == 0 and not result.stdout.startswith("ERR"), (command, result)
        return result.stdout.splitlines()

    n = 12  # a process per command: fewer tasks
    done: dict[str, list[str]] = {"w1": [], "w2": []}
    errors = []

    def work(name):
        try:
            while sum(map(len, done.values())) < n:
                lines = cli("XREADGROUP", "GROUP", "workers", name, "COUNT", "1", "BLOCK", "500",
                            "STREAMS", queue, ">")
                for task_id in ID.findall("\n".join(lines)):
                    assert cli("XACK", queue, "workers", task_id) == ["1"]
                    done[name].append(task_id)
        except Exception as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(name,)) for name in done]
    for thread in threads:
        thread.start()
    pushed = [cli("XADD", queue, "*", "n", str(i))[0] for i in range(n)]
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    all_done = [t for tasks in done.values() for t in tasks]
    assert sorted(all_done) == sorted(pushed) and len(set(pushed)) == n
    assert cli("XPENDING", queue, "workers")[0] == "0"

    wake = queue + "-wake"
    reader = subprocess.Popen(["redis-cli", "-p", str(shared_server.port), *([flag] if flag else []),
                               "XREADGROUP", "GROUP", "workers", "w1", "BLOCK", "10000",
                               "STREAMS", wake, ">"], stdout=subprocess.PIPE, text=True)
    probe = shared_server.client()
    wait_until(lambda: probe.info("clients")["blocked_clients"] >= 1, message="a blocked reader")
    started = time.monotonic()
    task_id = cli("XADD", wake, "*", "n", "wake")[0]
    out, _ = reader.communicate(timeout=10)
    assert time.monotonic() - started < 5
    assert ID.findall(out) == [task_id], out
    probe.close()
    rec.passed()


# ------------------------------------------------------------------ examples/

def test_python_examples(shared_server, queue):
    run_examples(shared_server.port, [sys.executable, str(EXAMPLES / "python" / "producer.py")],
                 [sys.executable, str(EXAMPLES / "python" / "worker.py")], queue, dict(os.environ))
    assert shared_server.client().xpending(queue, "workers")["pending"] == 0


def test_node_examples(shared_server, queue):
    run_examples(shared_server.port, ["node", str(EXAMPLES / "node" / "producer.js")],
                 ["node", str(EXAMPLES / "node" / "worker.js")], queue, node_env())
    assert shared_server.client().xpending(queue, "workers")["pending"] == 0


def test_python_worker_exits_when_idle(shared_server, queue):
    started = time.monotonic()
    result = subprocess.run([sys.executable, str(EXAMPLES / "python" / "worker.py"), str(shared_server.port)],
                            env=dict(os.environ, QUEUE=queue, IDLE_TIMEOUT="0.5"),
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and result.stdout == "", result
    assert time.monotonic() - started < 10
