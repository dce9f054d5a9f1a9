"""Prometheus metrics in prometheus_client's multiprocess mode.

The master prepares PROMETHEUS_MULTIPROC_DIR before prometheus_client is first imported
(its value class is chosen at import time), children write into it after the fork, the
master calls mark_process_dead for every child it reaps, and one scrape of the master's
/metrics returns the whole fleet. Counter files of dead children stay and are summed, so
counters never go backwards when a child restarts.
"""

from __future__ import annotations

import bisect
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from brooq.ipc.reasons import DRAIN, DRAIN_TIMEOUT, KilledLabel, RestartReason

if TYPE_CHECKING:
    from prometheus_client import Counter, Gauge, Histogram

GaugeMode = Literal[
    "all",
    "liveall",
    "min",
    "livemin",
    "max",
    "livemax",
    "sum",
    "livesum",
    "mostrecent",
    "livemostrecent",
]

ENV = "PROMETHEUS_MULTIPROC_DIR"


def prepare_dir(given: str | None) -> Path:
    """Use ``given`` (wiped of old files) or a fresh temporary directory; export it."""
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        for f in path.glob("*.db"):
            f.unlink()
    else:
        path = Path(tempfile.mkdtemp(prefix="brooq-metrics-"))
    os.environ[ENV] = str(path)
    return path


def remove_dir(path: Path, owned: bool) -> None:
    if owned:
        shutil.rmtree(path, ignore_errors=True)


# Imported only after prepare_dir(): see the module docstring.
def definitions() -> Metrics:
    return Metrics()


_BUCKETS_SECONDS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
)
# The outcomes counted in brooq_outcomes_total, and why jobs are given back.
OUTCOMES = ("done", "failed", "dead", "canceled")
RETURNED = ("sibling_killed", "suspect", "returned")

_BUCKETS_BYTES = tuple(float(2**n) * 1024 * 1024 for n in range(4, 15))  # 16 MiB .. 16 GiB


@dataclass(frozen=True)
class Metric:
    """One metric of the table: the attribute of Metrics that holds it, its Prometheus
    name, kind (counter, gauge or histogram), help text and label names; a histogram's
    buckets; a gauge's multiprocess_mode (how the children's values are merged)."""

    attr: str
    name: str
    kind: Literal["counter", "gauge", "histogram"]
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    mode: GaugeMode = "all"


TABLE = (
    Metric("claims", "brooq_claims_total", "counter", "Jobs claimed", ("topic",)),
    Metric(
        "outcomes",
        "brooq_outcomes_total",
        "counter",
        "Outcomes written, by topic and outcome (done, failed, dead, canceled)",
        ("topic", "outcome"),
    ),
    Metric(
        "attempt_duration",
        "brooq_attempt_duration_seconds",
        "histogram",
        "Wall time of one attempt",
        ("topic",),
        buckets=_BUCKETS_SECONDS,
    ),
    Metric(
        "attempt_cpu",
        "brooq_attempt_cpu_seconds",
        "histogram",
        "CPU time (user+system) of one attempt",
        ("topic",),
        buckets=_BUCKETS_SECONDS,
    ),
    Metric(
        "attempt_rss",
        "brooq_attempt_peak_rss_bytes",
        "histogram",
        "Peak resident memory of the child after an attempt",
        ("topic",),
        buckets=_BUCKETS_BYTES,
    ),
    Metric("busy", "brooq_children_busy", "gauge", "Children running a job", mode="livesum"),
    # One series per live child (its pid label): how many jobs it runs now, 0 or 1 for
    # a sync child, up to --concurrency for an async one. Summed: jobs running.
    Metric(
        "child_jobs",
        "brooq_child_jobs_running",
        "gauge",
        "Jobs a child is running now (one series per child, label pid)",
        mode="liveall",
    ),
    Metric(
        "jobs_returned",
        "brooq_jobs_returned_total",
        "counter",
        "Jobs the master gave back with the attempt refunded after their child ended, "
        "by why (sibling_killed: another job got the child killed; suspect: the child "
        "died with jobs in flight and no culprit; returned: drain timeout, stall, a claim "
        "committed after the child died)",
        ("reason",),
    ),
    Metric(
        "configured",
        "brooq_children_configured",
        "gauge",
        "Children the master keeps",
        mode="livemax",
    ),
    Metric(
        "killed",
        "brooq_children_killed_total",
        "counter",
        "Children killed by the master (max_execution_timeout, hung after lease lost, "
        "loop_blocked, stalled, drain timeout)",
        ("reason",),
    ),
    Metric(
        "restarts",
        "brooq_child_restarts_total",
        "counter",
        "Children replaced, by why the old one ended",
        ("reason",),
    ),
    Metric(
        "lease_lost",
        "brooq_lease_lost_total",
        "counter",
        "Jobs whose lease was lost while running",
        ("topic",),
    ),
    Metric(
        "reaped",
        "brooq_reaped_total",
        "counter",
        "Jobs returned to pending by the reaper",
        ("topic",),
    ),
    Metric(
        "retention_deleted",
        "brooq_retention_deleted_total",
        "counter",
        "Terminal jobs deleted by retention",
        ("topic",),
    ),
    Metric(
        "periodic_enqueued",
        "brooq_periodic_enqueued_total",
        "counter",
        "Periodic ticks enqueued, by schedule (counted by the master that won the tick)",
        ("name",),
    ),
    # One label set per (queue, topic) that holds jobs or has a handler: queues x
    # topics at most, 8 series per pair. A pair whose jobs are gone reads 0. The state
    # label's values are the counts of docs/explanation/guarantees.md ("Counts") but held
    # (brooq_jobs_held): each unfinished or dead job is in exactly one.
    Metric(
        "jobs",
        "brooq_jobs",
        "gauge",
        "Jobs by topic, count (state: waiting, scheduled, ready, retrying, parked, "
        "on_hold, processing, dead) and queue, from the table",
        ("topic", "state", "queue"),
        mode="mostrecent",
    ),
    Metric(
        "oldest_ready",
        "brooq_ready_oldest_age_seconds",
        "gauge",
        "Age of the oldest ready job not held back by a limit, by topic and queue (0 when none)",
        ("topic", "queue"),
        mode="mostrecent",
    ),
    # Ready jobs a topic's limits hold back now (its global_limit or rate_limit, or
    # their group's group_limit or group_rate_limit): waiting their turn, not stuck;
    # brooq_ready_oldest_age_seconds leaves them out.
    Metric(
        "held",
        "brooq_jobs_held",
        "gauge",
        "Ready jobs held back by their topic's limits now (rate, group or global), "
        "by topic and queue",
        ("topic", "queue"),
        mode="mostrecent",
    ),
    # Ready jobs nothing will run (brooq.supervisor.unhandled): a misspelt topic, a
    # queue nobody works. 0 once handled again.
    Metric(
        "unhandled",
        "brooq_jobs_unhandled",
        "gauge",
        "Ready jobs whose queue and topic no live master handles, by topic and queue",
        ("topic", "queue"),
        mode="mostrecent",
    ),
    # The table's upkeep: what a big table needs watching for.
    Metric(
        "dead_tuples",
        "brooq_table_dead_tuples",
        "gauge",
        "Dead tuples in the job table (pg_stat estimate; vacuum reclaims them)",
        mode="mostrecent",
    ),
    Metric(
        "xid_age",
        "brooq_table_xid_age",
        "gauge",
        "Age in transactions of the job table's oldest unfrozen transaction ID",
        mode="mostrecent",
    ),
    # What holds the cleanup of those dead tuples back (brooq.operator.snapshots):
    # the oldest snapshot of the database, a standby's feedback, a slot, a prepared
    # transaction; 0 when none.
    Metric(
        "oldest_snapshot",
        "brooq_oldest_snapshot_age_seconds",
        "gauge",
        "Age of the oldest snapshot holding back the job table's cleanup (0 when none)",
        mode="mostrecent",
    ),
)


class Metrics:
    """Every metric of TABLE, each under its attr."""

    claims: Counter
    outcomes: Counter
    attempt_duration: Histogram
    attempt_cpu: Histogram
    attempt_rss: Histogram
    busy: Gauge
    child_jobs: Gauge
    jobs_returned: Counter
    configured: Gauge
    killed: Counter
    restarts: Counter
    lease_lost: Counter
    reaped: Counter
    retention_deleted: Counter
    periodic_enqueued: Counter
    jobs: Gauge
    oldest_ready: Gauge
    held: Gauge
    unhandled: Gauge
    dead_tuples: Gauge
    xid_age: Gauge
    oldest_snapshot: Gauge

    def __init__(self) -> None:
        for metric in TABLE:
            setattr(self, metric.attr, _create(metric))

    def zero(self, topics: Iterable[str]) -> None:
        """The counters' series whose labels are known in advance, written at 0 by the
        master at its start: the kill, restart and give-back reasons, the claims and
        outcomes of each topic it handles. A series first scraped at 1 shows Prometheus
        no increase until its second change, so without them rate() and increase() (and
        the alerts on the first kill, crash or dead job of a master) would miss the first
        event."""
        for killed in get_args(KilledLabel):
            self.killed.labels(killed)
        for group in get_args(RestartReason):
            for restart in get_args(group):
                if restart not in (DRAIN, DRAIN_TIMEOUT):  # never counted: no replacement
                    self.restarts.labels(restart)
        for returned in RETURNED:
            self.jobs_returned.labels(returned)
        for topic in topics:
            self.claims.labels(topic)
            for outcome in OUTCOMES:
                self.outcomes.labels(topic, outcome)


def _create(metric: Metric) -> Counter | Gauge | Histogram:
    from prometheus_client import Counter, Gauge, Histogram

    if metric.kind == "counter":
        return Counter(metric.name, metric.help, metric.labels)
    if metric.kind == "histogram":
        return Histogram(metric.name, metric.help, metric.labels, buckets=metric.buckets)
    return Gauge(metric.name, metric.help, metric.labels, multiprocess_mode=metric.mode)


def render(path: Path) -> bytes:
    """One scrape: every process's files merged."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(path))  # type: ignore[no-untyped-call]
    return generate_latest(registry)


def child_exited(pid: int) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


class Tally:
    """A child's per-attempt observations, added up in memory and written to the shared
    metric files once per claim round trip instead of once per job.

    Each write to a multiprocess metric takes a lock, looks up the pid and packs into an
    mmap: a job's seven writes cost more than a no-op job. Added up per batch, a batch
    of short jobs of one topic costs a handful. What a child that dies takes with it is
    its last batch's observations (at most about 100 ms of work).

    Histograms are added up per bucket and written through the labelled histogram's own
    bucket and sum values (prometheus_client's Histogram stores them as `_buckets`,
    `_sum` and `_upper_bounds`); the result is exactly what the same `observe` calls
    would have written (tests/unit/test_settings.py compares the two).
    """

    def __init__(self) -> None:
        self._counts: dict[Any, float] = {}
        self._histograms: dict[Any, Bins] = {}

    def inc(self, counter: Any, *labels: str, amount: float = 1) -> None:
        key = (counter, labels)
        self._counts[key] = self._counts.get(key, 0) + amount

    def observe(self, histogram: Any, label: str, value: float) -> None:
        self.bins(histogram, label).add(value)

    def bins(self, histogram: Any, label: str) -> Bins:
        """The tally of one labelled histogram, to add to directly (``add``): a caller
        that observes it per job looks it up once."""
        key = (histogram, label)
        bins = self._histograms.get(key)
        if bins is None:
            bins = self._histograms[key] = Bins(histogram.labels(label))
        return bins

    def flush(self) -> None:
        for (counter, labels), amount in self._counts.items():
            counter.labels(*labels).inc(amount)
        self._counts.clear()
        for bins in self._histograms.values():
            bins.flush()


class Bins:
    """One labelled histogram's observations since the last flush, per bucket."""

    def __init__(self, labelled: Any) -> None:
        self.labelled = labelled
        self.bounds: list[float] = list(labelled._upper_bounds)
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0
        self.dirty = False

    def add(self, value: float) -> None:
        # The first bucket whose upper bound is >= value, as Histogram.observe does.
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.dirty = True

    def flush(self) -> None:
        if not self.dirty:
            return
        self.labelled._sum.inc(self.sum)
        for i, n in enumerate(self.counts):
            if n:
                self.labelled._buckets[i].inc(n)
                self.counts[i] = 0
        self.sum = 0.0
        self.dirty = False
