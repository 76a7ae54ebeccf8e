"""/metrics: the broker's figures in the Prometheus text format, read at scrape time.

Nothing here runs on the command path: the broker keeps plain counters
(QueueState.totals) and the writer fixed-bucket histograms. A scrape copies them
on the event loop (`snapshot`: Admin.figures, the snapshot INFO and the
dashboard read too), then formats the copy on a native thread (`render`), so a
server with many queues does not pause its clients while prometheus_client
writes the text. Imported only when --http-port is set, so a
server without it never loads prometheus_client.

Per-queue series are bounded: the --metrics-queues queues with the most
unfinished tasks (available, delayed, in flight, dead) get their own; the rest
are summed into series whose queue label is empty, which Prometheus stores
without the label, so a sum over every series stays exact however many queues
there are (10,000 queues made a 7 MB scrape that took 2 s).
"""

from __future__ import annotations


from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from .. import __version__, lifecycle
from ..storage.schedules import NEVER
from . import shown_name

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# (event, as QueueState.totals counts it; metric name without _total; help) per queue.
QUEUE_COUNTERS = (
    ("pushed", "ezra_pushes", "Tasks pushed (XADD)."),
    ("delivered", "ezra_deliveries", "Deliveries of tasks to workers (XREADGROUP, XCLAIM take-overs)."),
    ("redelivered", "ezra_redeliveries", "Deliveries of tasks that had been delivered before."),
    ("acked", "ezra_acks", "Tasks acknowledged (XACK, XACKDEL)."),
    ("failed", "ezra_nacks", "Failures reported by workers (XNACK, XDEL of an in-flight task)."),
    ("expired", "ezra_timeouts", "Leases that ran out (visibility timeout) before an ack."),
    ("released", "ezra_releases", "Tasks given back because their worker disconnected (release on disconnect)."),
    ("dead", "ezra_dead_letters", "Tasks moved to the dead-letter queue (attempts exhausted or FATAL)."),
    ("requeued", "ezra_requeues", "Dead tasks sent back to their queue (XREQUEUE, the dashboard)."),
    ("purged", "ezra_purged", "Finished tasks removed by retention, TTL or trimming."),
)


def queue_label(name: bytes) -> str:
    """The queue label: the name, cut when an older EZRA let it grow past today's limit (a 1 MB name
    was 16 MB of each scrape, once per series)."""
    return shown_name(name).decode("utf-8", "backslashreplace")


def snapshot(state) -> dict:
    """Everything /metrics shows, read on the event loop (one writer round trip): the broker's
    figures (its --metrics-queues busiest queues, the rest summed) and the server's."""
    scheduler = getattr(state, "scheduler", None)
    return {"figures": state.broker.admin.figures(busiest=state.settings.metrics_queues),
            "schedules": [] if scheduler is None else scheduler.shown().wait(),
            "connected": len(state.sessions), "parked": state.parked_clients,
            "durability": state.settings.durability, "database_corrupt": state.broker.db.integrity.corrupt}


class SnapshotCollector:
    """The metric families of one snapshot (built off the event loop, see render)."""

    def __init__(self, snap: dict):
        self.snap = snap

    def collect(self):
        snap, figures = self.snap, self.snap["figures"]
        tasks = GaugeMetricFamily("ezra_tasks", "Tasks in each queue by state (waiting: XADD AFTER, until the "
                                  "tasks it names are done).", labels=["queue", "state"])
        oldest = GaugeMetricFamily(
            "ezra_oldest_available_age_seconds",
            "How long the next task to be delivered has been waiting (0 when none is available).",
            labels=["queue"])
        paused = GaugeMetricFamily(
            "ezra_queue_paused",
            "1 while the queue is paused (XCFGSET PAUSED 1: pushes land, nothing is handed out); the "
            "series with an empty queue label counts the paused queues among the rest.", labels=["queue"])
        held = GaugeMetricFamily(
            "ezra_queue_held_back",
            "1 while the queue hands out nothing because of `reason`: paused, cap (XCFGSET MAX-IN-FLIGHT) or "
            "rate limit (XCFGSET RATE-LIMIT); no series while nothing holds it back.", labels=["queue", "reason"])
        partitions = GaugeMetricFamily(
            "ezra_queue_partitions_with_work",
            "Partitions (XADD PARTITION) with available tasks; only for queues whose tasks have partitions "
            "or priorities.", labels=["queue"])
        counters = {name: CounterMetricFamily(name, help_text, labels=["queue"])
                    for _, name, help_text in QUEUE_COUNTERS}
        for name, queue in sorted(figures.queues.items()):
            label = queue_label(name)
            for state in lifecycle.COUNTED:
                tasks.add_metric([label, state], queue["counts"][state])
            since = queue["head_since"]
            oldest.add_metric([label], 0.0 if since is None else max(figures.now - since, 0) / 1000)
            paused.add_metric([label], int(queue["paused"]))
            if queue["held_back"] is not None:
                held.add_metric([label, queue["held_back"]], 1)
            if queue["partitions"] is not None:
                partitions.add_metric([label], queue["partitions"])
            for event, metric, _ in QUEUE_COUNTERS:
                counters[metric].add_metric([label], queue["totals"][event])
        rest = figures.rest
        if rest is not None:  # summed, with an empty queue label (Prometheus keeps such series without it)
            for state in lifecycle.COUNTED:
                tasks.add_metric(["", state], rest["counts"][state])
            paused.add_metric([""], rest["paused"])
            for event, metric, _ in QUEUE_COUNTERS:
                counters[metric].add_metric([""], rest["totals"][event])
        yield tasks
        yield oldest
        yield paused
        yield held
        yield partitions
        yield from counters.values()
        yield from schedule_families(snap["schedules"])
        yield gauge("ezra_queues", "Queues (the --metrics-queues busiest have their own series, the rest "
                                   "are summed in series with an empty queue label).", figures.queue_count)
        yield histogram("ezra_commit_batch_size", "Requests committed together in one transaction.",
                        figures.batch_sizes)
        yield histogram("ezra_commit_duration_seconds",
                        "Seconds from BEGIN to COMMIT of a batch (the WAL write, without its fsync).",
                        figures.commit_seconds)
        if figures.fsync_seconds is not None:  # --durability normal does not fsync per commit
            yield histogram("ezra_fsync_duration_seconds",
                            "Seconds per fdatasync of the WAL before durable replies.", figures.fsync_seconds)
        yield gauge("ezra_disk_full", "1 while pushes are refused because the disk is full.",
                    int(figures.disk_full))
        yield gauge("ezra_database_corrupt", "1 once ezra.db was found corrupt: writes are refused from then on.",
                    int(snap["database_corrupt"]))
        yield gauge("ezra_connected_clients", "Client connections open on the Redis-protocol port.",
                    snap["connected"])
        yield gauge("ezra_blocked_clients", "Clients waiting in a blocking XREADGROUP, XREAD or XRESULT.", figures.blocked)
        yield gauge("ezra_parked_clients", "Idle connections kept without a greenlet (quiet for a second or more).",
                    snap["parked"])
        yield gauge("ezra_database_bytes", "Size of ezra.db and its WAL.", figures.database_bytes)
        info = GaugeMetricFamily("ezra_info", "The server's version and durability mode.",
                                 labels=["version", "durability"])
        info.add_metric([__version__, snap["durability"]], 1)
        yield info


def schedule_families(rows) -> list:
    """Per schedule (XSCHEDULE; at most 1,000, names at most 256 bytes): next and last run, firings, skips."""
    next_run = GaugeMetricFamily("ezra_schedule_next_run_timestamp_seconds",
                                 "When the schedule fires next (Unix time).", labels=["schedule"])
    last_run = GaugeMetricFamily("ezra_schedule_last_run_timestamp_seconds",
                                 "The slot the schedule fired last (Unix time; absent before its first).",
                                 labels=["schedule"])
    firings = CounterMetricFamily("ezra_schedule_firings", "Tasks the schedule pushed (since it was defined).",
                                  labels=["schedule"])
    skipped = CounterMetricFamily("ezra_schedule_skipped", "Slots passed over, the last task being unfinished "
                                  "(SKIP-IF-UNFINISHED).", labels=["schedule"])
    for row in rows:
        label = queue_label(row.name)
        if row.next_at < NEVER:
            next_run.add_metric([label], row.next_at / 1000)
        if row.last_slot is not None:
            last_run.add_metric([label], row.last_slot / 1000)
        firings.add_metric([label], row.firings)
        skipped.add_metric([label], row.skipped)
    return [gauge("ezra_schedules", "Schedules defined (XSCHEDULE, config schedule lines).", len(rows)),
            next_run, last_run, firings, skipped]


def gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=value)


def histogram(name: str, help_text: str, source: tuple) -> HistogramMetricFamily:
    """A copied histogram.Histogram ((cumulative buckets, sum)) as a Prometheus histogram family."""
    buckets, total = source
    return HistogramMetricFamily(name, help_text, buckets=buckets, sum_value=total)


def render(snap: dict) -> bytes:
    """The text exposition of a snapshot, plus the process's own metrics. Safe on a native
    thread: it touches nothing of the server's (formatting 1,000 queues takes ~100 ms,
    which must not stall the event loop)."""
    registry = CollectorRegistry(auto_describe=False)  # this scrape's own, never the global one
    registry.register(SnapshotCollector(snap))
    ProcessCollector(registry=registry)  # process_resident_memory_bytes, cpu seconds, open fds
    return generate_latest(registry)
