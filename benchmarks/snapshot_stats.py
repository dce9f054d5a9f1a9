"""The held-snapshot workload's arithmetic and tables (benchmarks/snapshot.py): pure, no
database, no process, so that tests/unit can hold it.

A run is described by the producers' records (job id -> the time its enqueue returned),
the handlers' records (job id -> the time its handler started, time.time() on the same
host) and the database samples taken every `every` seconds from the start of the
offering (t0). From them:

- pickup: handler start minus enqueue return, in ms, as run.py's pickup workload measures
  it; a job that never started by `cutoff` counts with cutoff minus its enqueue (a lower
  bound: the figures are then marked censored);
- windows: for each `every`-second slice of the offering, the jobs offered in it, the
  jobs started in it (completed jobs/s: a no-op's handler start is its end), and the
  pickup p50/p99 of the jobs offered in it;
- the side-by-side table of two runs and the table of one run's samples.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from common import percentile

MB = 1024 * 1024


def pickups(
    enqueued: Mapping[str, float], started: Mapping[str, float], cutoff: float
) -> tuple[dict[str, float], int]:
    """Each offered job's pickup in ms (censored at ``cutoff`` when it never started),
    and how many were censored."""
    out: dict[str, float] = {}
    censored = 0
    for job, t_enq in enqueued.items():
        t_start = started.get(job)
        if t_start is None:
            censored += 1
            t_start = max(cutoff, t_enq)
        out[job] = (t_start - t_enq) * 1000.0
    return out, censored


def latency_summary(values: Sequence[float], censored: int = 0) -> dict[str, Any]:
    """p50/p95/p99/max of the pickups (ms); ``censored`` jobs are lower bounds within."""
    if not values:
        return {
            "jobs": 0,
            "censored": censored,
            "p50_ms": None,
            "p95_ms": None,
            "p99_ms": None,
            "max_ms": None,
        }
    return {
        "jobs": len(values),
        "censored": censored,
        "p50_ms": round(percentile(values, 0.50), 2),
        "p95_ms": round(percentile(values, 0.95), 2),
        "p99_ms": round(percentile(values, 0.99), 2),
        "max_ms": round(max(values), 2),
    }


def windows(
    enqueued: Mapping[str, float],
    started: Mapping[str, float],
    pickup_ms: Mapping[str, float],
    t0: float,
    duration: float,
    every: float,
) -> list[dict[str, Any]]:
    """The offering cut in ``every``-second windows (the last one may be shorter): jobs
    offered and started in each, their rates, and the pickup p50/p99 of the jobs
    offered in it."""
    count = max(1, math.ceil(duration / every - 1e-9))
    offered: list[list[float]] = [[] for _ in range(count)]
    completed = [0] * count

    def slot(t: float) -> int | None:
        k = math.floor((t - t0) / every)
        return k if 0 <= k < count and t - t0 < duration else None

    for job, t_enq in enqueued.items():
        k = slot(t_enq)
        if k is not None:
            offered[k].append(pickup_ms[job])
    for t_start in started.values():
        k = slot(t_start)
        if k is not None:
            completed[k] += 1
    out = []
    for k in range(count):
        length = min(every, duration - k * every)
        lat = offered[k]
        out.append(
            {
                "k": k,
                "t_end": round(k * every + length, 1),
                "offered": len(lat),
                "offered_per_s": round(len(lat) / length, 1),
                "completed": completed[k],
                "completed_per_s": round(completed[k] / length, 1),
                "p50_ms": round(percentile(lat, 0.50), 2) if lat else None,
                "p99_ms": round(percentile(lat, 0.99), 2) if lat else None,
            }
        )
    return out


def per_scan(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> float | None:
    """Index entries read per scan of the ready index between two samples (each holding
    the index's cumulative idx_scan and idx_tup_read), None without scans."""
    if before is None:
        return None
    scans = int(after["ready_idx_scan"]) - int(before["ready_idx_scan"])
    if scans <= 0:
        return None
    read = int(after["ready_idx_tup_read"]) - int(before["ready_idx_tup_read"])
    return round(read / scans, 1)


# -- tables -----------------------------------------------------------------------------------


def _num(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "–"
    return f"{v:,.{digits}f}"


def _mb(v: float | None) -> str:
    return "–" if v is None else f"{v / MB:,.1f}"


def _ratio(held: float | None, alone: float | None) -> str:
    if held is None or not alone:
        return "–"
    return f"{100 * held / alone:.0f} %"


def _lat(run: Mapping[str, Any], key: str) -> str:
    pick = run["pickup"]
    text = _num(pick.get(key), 1)
    return f"≥ {text}" if pick.get("censored") else text


def targets(alone: Mapping[str, Any], held: Mapping[str, Any]) -> dict[str, Any]:
    """The two targets: held throughput ≥ 80 % of alone's, held pickup p99 < 50 ms (a p99
    with censored jobs is a lower bound, so over 50 it fails and under it cannot pass)."""
    ratio = held["completed_per_s"] / alone["completed_per_s"] if alone["completed_per_s"] else 0
    p99 = held["pickup"]["p99_ms"]
    return {
        "throughput_ratio": round(ratio, 3),
        "throughput_met": ratio >= 0.8,
        "held_p99_ms": p99,
        "p99_met": p99 is not None and p99 < 50 and not held["pickup"]["censored"],
    }


def side_by_side(alone: Mapping[str, Any], held: Mapping[str, Any]) -> list[str]:
    """The two runs' figures as a markdown table, then the targets."""
    rows = [
        (
            "offered jobs/s (achieved)",
            _num(alone["offered_per_s"]),
            _num(held["offered_per_s"]),
            _ratio(held["offered_per_s"], alone["offered_per_s"]),
        ),
        (
            "completed jobs/s",
            _num(alone["completed_per_s"]),
            _num(held["completed_per_s"]),
            _ratio(held["completed_per_s"], alone["completed_per_s"]),
        ),
        (
            "backlog when the offering ended",
            _num(alone["backlog_at_end"]),
            _num(held["backlog_at_end"]),
            "",
        ),
        ("pickup p50 (ms)", _lat(alone, "p50_ms"), _lat(held, "p50_ms"), ""),
        ("pickup p99 (ms)", _lat(alone, "p99_ms"), _lat(held, "p99_ms"), ""),
        ("pickup max (ms)", _lat(alone, "max_ms"), _lat(held, "max_ms"), ""),
        (
            "dead tuples, most sampled",
            _num(alone["max_dead_tuples"]),
            _num(held["max_dead_tuples"]),
            "",
        ),
        (
            "table (heap) MB, start → end",
            f"{_mb(alone['heap_bytes'][0])} → {_mb(alone['heap_bytes'][1])}",
            f"{_mb(held['heap_bytes'][0])} → {_mb(held['heap_bytes'][1])}",
            "",
        ),
        (
            "indexes MB, start → end",
            f"{_mb(alone['index_bytes'][0])} → {_mb(alone['index_bytes'][1])}",
            f"{_mb(held['index_bytes'][0])} → {_mb(held['index_bytes'][1])}",
            "",
        ),
        (
            "ready-index entries read per scan, last window",
            _num(alone["last_entries_per_scan"], 1),
            _num(held["last_entries_per_scan"], 1),
            "",
        ),
    ]
    lines = ["| | alone | snapshot held | held / alone |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {name} | {a} | {h} | {r} |" for name, a, h, r in rows]
    t = targets(alone, held)
    lines += [
        "",
        f"Targets: held throughput ≥ 80 % of alone's: {100 * t['throughput_ratio']:.0f} % "
        f"({'met' if t['throughput_met'] else 'not met'}); held pickup p99 < 50 ms: "
        f"{_lat(held, 'p99_ms')} ms ({'met' if t['p99_met'] else 'not met'}).",
    ]
    return lines


def samples_table(run: Mapping[str, Any]) -> list[str]:
    """One run's windows beside the database samples taken at their ends."""
    by_k = {s["k"]: s for s in run["samples"]}
    lines = [
        "| t (s) | offered/s | completed/s | pickup p50 / p99 (ms) | dead tuples | live "
        "tuples | heap MB | indexes MB | ready index MB | entries read per ready-index scan "
        "| buffers per job | autovacuums |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for w in run["windows"]:
        s = by_k.get(w["k"] + 1, {})
        lines.append(
            f"| {w['t_end']:g} | {_num(w['offered_per_s'])} | {_num(w['completed_per_s'])} | "
            f"{_num(w['p50_ms'], 1)} / {_num(w['p99_ms'], 1)} | {_num(s.get('n_dead_tup'))} | "
            f"{_num(s.get('n_live_tup'))} | {_mb(s.get('heap_bytes'))} | "
            f"{_mb(s.get('index_bytes'))} | {_mb(s.get('ready_index_bytes'))} | "
            f"{_num(s.get('entries_per_scan'), 1)} | "
            f"{_num(buffers_per_job(by_k.get(w['k']), s, w['completed']))} | "
            f"{_num(s.get('autovacuum_count'))} |"
        )
    return lines


def buffers_per_job(
    before: Mapping[str, Any] | None, after: Mapping[str, Any], completed: int
) -> float | None:
    """The job table's heap and index buffers read (hit or not) between two samples, per
    job completed meanwhile: what the claims, outcomes and inserts of the window cost."""
    if before is None or not after or completed <= 0:
        return None
    read = (int(after["heap_blks"]) + int(after["idx_blks"])) - (
        int(before["heap_blks"]) + int(before["idx_blks"])
    )
    return round(read / completed, 1)
