"""INFO's default sections against redis-server 7's (issue 45 item 11): the fields that tools and
clients read (redis-py's own test session reads `cluster_enabled`; monitoring reads role, run_id,
the memory and persistence figures) are there, in Redis's sections and order, and parse with
redis-py in RESP2 and RESP3."""

from __future__ import annotations

import re

import redis

# Fields of redis-server 7's default INFO that tools rely on, by section.
RELIED_ON = {
    "Server": ["redis_version", "redis_mode", "os", "arch_bits", "process_id", "run_id", "tcp_port",
               "server_time_usec", "uptime_in_seconds", "uptime_in_days", "hz", "executable", "config_file"],
    "Clients": ["connected_clients", "maxclients", "blocked_clients"],
    "Memory": ["used_memory", "used_memory_human", "used_memory_rss", "used_memory_rss_human", "used_memory_peak",
               "used_memory_peak_human", "maxmemory", "maxmemory_human", "maxmemory_policy"],
    "Persistence": ["loading", "rdb_changes_since_last_save", "rdb_bgsave_in_progress", "rdb_last_save_time",
                    "rdb_last_bgsave_status", "aof_enabled", "aof_rewrite_in_progress"],
    "Stats": ["total_connections_received", "total_commands_processed", "rejected_connections", "expired_keys",
              "evicted_keys", "keyspace_hits", "keyspace_misses", "pubsub_channels", "pubsub_patterns"],
    "Replication": ["role", "connected_slaves", "master_replid", "master_repl_offset"],
    "CPU": ["used_cpu_sys", "used_cpu_user"],
    "Cluster": ["cluster_enabled"],
}


def sections(text: str) -> dict[str, list[str]]:
    """{section title: [field names]} of an INFO reply, in order."""
    found: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# "):
            current = found.setdefault(line[2:].strip(), [])
        elif line and current is not None:
            current.append(line.split(":", 1)[0])
    return found


def raw_info(client) -> str:
    """INFO's text as the server sent it (redis-py's info() would parse it)."""
    conn = client.connection_pool.get_connection("INFO")
    try:
        conn.send_command("INFO")
        reply = conn.read_response(disable_decoding=True)
    finally:
        client.connection_pool.release(conn)
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def test_the_fields_tools_read_are_where_redis_has_them(shared_server, redis_server_port, protocol):
    ezra = shared_server.client(protocol)
    real = redis.Redis(port=redis_server_port, protocol=protocol)
    theirs, ours = sections(raw_info(real)), sections(raw_info(ezra))
    for title, fields in RELIED_ON.items():
        assert set(fields) <= set(theirs[title]), (title, "redis-server itself: the list above is wrong")
        assert title in ours, f"EZRA's INFO has no '# {title}' section"
        missing = [field for field in fields if field not in ours[title]]
        assert not missing, (title, missing)
    shared = [title for title in theirs if title in ours]
    assert shared == [title for title in ours if title in theirs], "sections in Redis's order"
    real.close()
    ezra.close()


def test_redis_py_reads_cluster_mode_and_role(r):
    info = r.info()
    assert info["cluster_enabled"] == 0 and info["redis_mode"] == "standalone"  # redis-py's conftest reads it
    assert r.info("cluster") == {"cluster_enabled": 0}
    replication = r.info("replication")
    assert replication["role"] == "master" and replication["connected_slaves"] == 0
    assert re.fullmatch(r"[0-9a-f]{40}", info["run_id"]) and re.fullmatch(r"[0-9a-f]{40}", replication["master_replid"])
    assert info["run_id"] == r.info("server")["run_id"]  # one per server start
    assert info["rdb_last_bgsave_status"] == "ok" and info["maxmemory_policy"] == "noeviction"
    assert info["used_cpu_user"] >= 0 and isinstance(info["used_memory_human"], str)
    assert "queues" in info  # EZRA's own sections still follow
