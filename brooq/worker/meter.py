"""What a child measures of itself: its metrics, and its resident memory.

Owns the child's Tally (brooq.metrics: observations added up in memory and written to
the shared metric files once per claim round trip), the per-attempt duration, CPU and
peak RSS histograms, the claims and outcomes counters, the busy gauge, and the readings
of resident memory that max_memory_per_child compares against.

Must never write a metric per job (a multiprocess metric write costs more than a short
job: everything goes through the Tally), and never change what it measures: the metric
names and labels are the operator's interface.
"""

from __future__ import annotations

import os
import resource
import time
from typing import TYPE_CHECKING

from brooq.job import Claim
from brooq.metrics import Bins, Tally
from brooq.worker.state import PEAK_RSS_MAX_AGE

if TYPE_CHECKING:
    from brooq.metrics import Metrics


class Meter:
    def __init__(self, metrics: Metrics | None) -> None:
        self.metrics = metrics
        self.tally = Tally()
        self.peak_rss = 0.0
        self.peak_rss_at = -PEAK_RSS_MAX_AGE
        self.busy = False  # what the busy gauge shows
        self.jobs = 0  # what the jobs-running gauge shows (an async child)
        # Per topic: its duration and peak RSS histograms' tallies, found once.
        self._attempt_bins: dict[str, tuple[Bins, Bins]] = {}
        self._cpu_bins: dict[str, Bins] = {}  # and its CPU histogram's (a sync child)

    def cpu(self) -> float:
        """The CPU time so far, when metrics are kept (else 0: not worth a system call)."""
        return time.process_time() if self.metrics is not None else 0.0

    def attempt(
        self, topic: str, duration: float, cpu_before: float | None, now: float | None = None
    ) -> float | None:
        """``cpu_before`` None: an async job, whose siblings share the process's CPU time,
        so none is observed for it. ``now``: time.monotonic() at the attempt's end, when
        the caller has it. The process's CPU time read for the observation, if one was."""
        metrics = self.metrics
        if metrics is None:
            return None
        bins = self._attempt_bins.get(topic)
        if bins is None:
            bins = self._attempt_bins[topic] = (
                self.tally.bins(metrics.attempt_duration, topic),
                self.tally.bins(metrics.attempt_rss, topic),
            )
        bins[0].add(duration)
        cpu_now = None
        if cpu_before is not None:  # its series made only then (an async child has none)
            cpu = self._cpu_bins.get(topic)
            if cpu is None:
                cpu = self._cpu_bins[topic] = self.tally.bins(metrics.attempt_cpu, topic)
            cpu_now = time.process_time()
            cpu.add(cpu_now - cpu_before)
        # The peak RSS, read again only when the last reading is old (_peak_rss).
        if now is None:
            now = time.monotonic()
        if duration < PEAK_RSS_MAX_AGE and now - self.peak_rss_at < PEAK_RSS_MAX_AGE:
            bins[1].add(self.peak_rss)
        else:
            bins[1].add(self._peak_rss(duration, now))
            cpu_now = None  # getrusage ran since: not brooq's per-job steps alone
        return cpu_now

    def outcome(self, topic: str, state: str, jobs: int = 1) -> None:
        if self.metrics is not None:
            self.tally.inc(self.metrics.outcomes, topic, state, amount=jobs)

    def claimed(self, claims: list[Claim]) -> None:
        """Count the claims, set the busy gauge once per batch and write what the last
        batch tallied."""
        metrics = self.metrics
        if metrics is None:
            return
        self._count(metrics, claims)
        if bool(claims) != self.busy:
            self.busy = bool(claims)
            metrics.busy.set(1 if claims else 0)
            metrics.child_jobs.set(1 if claims else 0)
        self.tally.flush()

    def counted(self, claims: list[Claim]) -> None:
        """An async child's round trip: count the claims, write what was tallied (its
        gauges follow the jobs running: see running)."""
        metrics = self.metrics
        if metrics is None:
            return
        self._count(metrics, claims)
        self.tally.flush()

    def _count(self, metrics: Metrics, claims: list[Claim]) -> None:
        """The claims, counted once per topic."""
        counts: dict[str, int] = {}
        for c in claims:
            counts[c.topic] = counts.get(c.topic, 0) + 1
        for topic, n in counts.items():
            self.tally.inc(metrics.claims, topic, amount=n)

    def running(self, jobs: int) -> None:
        """An async child: the jobs it runs now (set at most once per round trip and
        completion; a gauge write is an mmap store). Busy while it runs any."""
        metrics = self.metrics
        if metrics is None or jobs == self.jobs:
            return
        self.jobs = jobs
        metrics.child_jobs.set(jobs)
        if bool(jobs) != self.busy:
            self.busy = bool(jobs)
            metrics.busy.set(1 if jobs else 0)

    def flush(self) -> None:
        self.tally.flush()

    def _peak_rss(self, duration: float, now: float) -> float:
        """The child's peak resident memory in bytes. getrusage costs more than a short
        job, so after short attempts a reading up to PEAK_RSS_MAX_AGE old is reused (the
        peak moves slowly and never down)."""
        if duration >= PEAK_RSS_MAX_AGE or now - self.peak_rss_at >= PEAK_RSS_MAX_AGE:
            self.peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0
            self.peak_rss_at = now
        return self.peak_rss


def resident_mib() -> float:
    """Current resident set size in MiB (Linux /proc), else the peak from getrusage."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / (1024 * 1024)
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
