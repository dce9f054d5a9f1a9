"""Turn a result dict (run.py's JSON) into a Markdown table and a PNG chart.

python benchmarks/report.py benchmarks/results/2025-01-01.json   # rewrite .md and .png

Also the held-snapshot workload's tables (snapshot.py's JSON: its .md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ORDER = ["brooq", "procrastinate", "pgqueuer", "celery", "celery-early-ack"]
HUNG_TARGET_S = 3.0  # max_execution_timeout (2 s) + 1 s
WORKLOAD_TITLES = {
    "enqueue_single": "enqueue one by one",
    "enqueue_bulk": "enqueue bulk",
    "drain": "drain",
    "cpu": "CPU-bound",
    "pickup": "pickup",
    "hung": "hung",
    "priority": "priority",
    "limited": "global_limit",
    "rated": "rate_limit",
    "grouped": "group_limit",
    "io": "I/O sleep",
    "io_http": "I/O HTTP",
    "io_best": "I/O steady",
    "durability": "durability",
}
# Targets: a single Queue.enqueue ahead of every peer and at this share of pgbench's
# prepared single insert; the children's synchronous_commit=on the default unless it
# costs more than DURABILITY_MAX_COST of the drain.
ENQUEUE_CEILING_SHARE = 0.85
DURABILITY_MAX_COST = 0.10
PRIORITY_TARGET_PCT = 5.0  # of the low jobs still to start when the high ones come
LIMITED_TARGET_SHARE = 0.9  # of cap / job time
# Target: brooq's I/O-bound figure against the best peer's. Judged for each async
# variant the run has (run.py's BROOQ_IO_VARIANTS: "async" at brooq's default
# concurrency, "async200" at 200); a run without them judges the sync `--workers 2`.
IO_TARGET_RATIO = 1.5
IO_ASYNC_VARIANTS = ("async", "async200")
# io_best (run.py): brooq's best against pgqueuer's best, and brooq's share of its bound
# at the slots pgqueuer is capped to in io (2 x 100, the "async" variant).
IO_BEST_SHARE = 90.0
IO_EQUAL_SLOTS_VARIANT = "async"
IO_SECONDS = 0.05  # each I/O-bound job's wait: a configuration's bound is slots / this


def _beside_the_drain(
    result: dict[str, Any], workload: str, title: str, what: str, column: str
) -> list[str]:
    """A brooq-only drain workload's section: its jobs/s beside the unlimited drain of the
    same run (2 children) and its share of it; nothing when the run did not measure it."""
    e = _s(result, "brooq", workload)
    if not e:
        return []
    plain = _med(_s(result, "brooq", "drain", "2"), "jobs_per_s")
    limited = _med(e, "jobs_per_s")
    share = f"{100 * limited / plain:.0f} %" if plain and limited else "–"
    return [
        "",
        title,
        "",
        what,
        "",
        f"| {column} | the unlimited drain, 2 children | share |",
        "| ---: | ---: | ---: |",
        f"| {fmt(e, 'jobs_per_s')} | {_num(plain) if plain else '–'} | {share} |",
    ]


def _s(result: dict[str, Any], system: str, workload: str, variant: str = "") -> dict[str, Any]:
    return result.get("summary", {}).get(f"{system}|{workload}|{variant}", {})


def _med(entry: dict[str, Any], metric: str) -> float | None:
    m = entry.get(metric)
    return None if not m else m.get("median")


def fmt(entry: dict[str, Any], metric: str, digits: int = 0, scale: float = 1.0) -> str:
    m = entry.get(metric)
    if not m or m.get("median") is None:
        errors = entry.get("errors")
        return "error" if errors else "–"
    med, lo, hi = (m[k] * scale for k in ("median", "min", "max"))
    if m.get("n", 1) <= 1:
        return f"{med:,.{digits}f}"
    return f"{med:,.{digits}f} ({lo:,.{digits}f}–{hi:,.{digits}f})"


def systems_in(result: dict[str, Any]) -> list[str]:
    names = list(result.get("systems", {}))
    return sorted(names, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER))


def best_peer(result: dict[str, Any], workload: str, metric: str) -> tuple[str, float] | None:
    best: tuple[str, float] | None = None
    for name in systems_in(result):
        if name == "brooq":
            continue
        v = _med(_s(result, name, workload), metric)
        if v is not None and (best is None or v > best[1]):
            best = (name, v)
    return best


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    pg = m["postgres"]
    reps = result["reps"]
    sizes = result["sizes"]
    placed = result.get("placement", "free (the scheduler's choice)")  # older runs: free
    lines = [
        f"# brooq benchmark, {result['started_at'][:10]}" + (" (quick)" if result["quick"] else ""),
        "",
        f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['memory']} RAM, Linux "
        f"{m['kernel']}, Python {m['python']}. PostgreSQL {pg['server_version']} "
        f"({m['postgres_where']}; synchronous_commit={pg['synchronous_commit']}, "
        f"fsync={pg['fsync']}, shared_buffers={pg['shared_buffers']}). Redis {m['redis']}.",
        "",
        "Versions: "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v is not None)
        + ".",
        "",
        f"Figures are the median of {reps} repetition{'s' if reps > 1 else ''}"
        + (" with the spread (min–max) in brackets" if reps > 1 else "")
        + f". Every run used a fresh database. Started {result['started_at']}, finished "
        f"{result.get('finished_at', '?')}.",
        "",
        f"Placement of the client and its PostgreSQL backends: {placed} (run.py --placement).",
        "",
    ]
    names = systems_in(result)
    skipped = {n: result["systems"][n]["skipped"] for n in names if result["systems"][n]["skipped"]}
    lines += glance(result)

    lines += [
        "## Enqueue",
        "",
        f"One by one: {sizes['enqueue']:,} jobs. Bulk: "
        # A result file without a bulk size enqueued the one-by-one count in bulk too.
        f"{sizes.get('bulk', sizes['enqueue']):,} jobs in one call of the bulk API.",
        "",
        "| system | one by one (jobs/s) | bulk API (jobs/s) |",
        "| --- | ---: | ---: |",
    ]
    for n in names:
        if n == "celery-early-ack":
            continue
        lines.append(
            f"| {n} | {fmt(_s(result, n, 'enqueue_single'), 'jobs_per_s')} "
            f"| {fmt(_s(result, n, 'enqueue_bulk'), 'jobs_per_s')} |"
        )
    for mode in ("prepared", "simple"):
        e = _s(result, "pgbench", "enqueue_single", mode)
        if e:
            lines.append(
                f"| pgbench ceiling, brooq's INSERT, `-M {mode}`, 1 client "
                f"| {fmt(e, 'jobs_per_s')} | |"
            )
    ceil = _med(_s(result, "pgbench", "enqueue_single", "prepared"), "jobs_per_s")
    mine = _med(_s(result, "brooq", "enqueue_single"), "jobs_per_s")
    if ceil and mine:
        lines += [
            "",
            f"One by one, each job is its own transaction (committed when the call returns); "
            f"brooq's single enqueue is {mine / ceil:.0%} of pgbench's prepared single "
            "insert in the same rounds (the same statement on the same table, its NOTIFY "
            "trigger included; the script is under Settings).",
        ]

    ceiling = result.get("ceiling") or {}
    csum = ceiling.get("summary", {})
    batched = result.get("ceiling_batched") or {}
    bsum = batched.get("summary", {})
    lines += [
        "",
        f"## No-op drain: {sizes['drain']:,} ready jobs",
        "",
        "Jobs/s from the first look that saw a job finished to the first that saw none left "
        "(the database, or Redis, looked at from outside: 50 ms apart at both ends, spaced "
        "between them so that the looks' counting takes little of the CPUs). The batched "
        "pgbench ceiling's repetitions run each right after one of brooq's drains of as many "
        "children.",
        "",
        "| system | worker processes | jobs/s | share of the pgbench ceiling "
        f"({batched.get('batch', '?')} per claim) |",
        "| --- | --- | ---: | ---: |",
    ]
    for n in names:
        if n == "brooq":
            for v in ("2", "4", "8"):
                e = _s(result, n, "drain", v)
                share = "–"
                ce = bsum.get(v, {})
                if _med(e, "jobs_per_s") and ce.get("median"):
                    share = f"{_med(e, 'jobs_per_s') / ce['median']:.0%}"  # type: ignore[operator]
                lines.append(f"| brooq | {v} children | {fmt(e, 'jobs_per_s')} | {share} |")
        else:
            procs = "2 (prefork pool)" if n.startswith("celery") else "2"
            lines.append(f"| {n} | {procs} | {fmt(_s(result, n, 'drain'), 'jobs_per_s')} | |")
    for c, e in csum.items():
        lines.append(f"| pgbench ceiling, 1 per claim | {c} clients | {fmt({'x': e}, 'x')} | |")
    for c, e in bsum.items():
        lines.append(
            f"| pgbench ceiling, {batched.get('batch')} per claim | {c} clients "
            f"| {fmt({'x': e}, 'x')} | 100% |"
        )

    lines += durability_section(result)
    lines += [
        "",
        f"## CPU-bound: {sizes['cpu']} jobs of ~25 ms pure Python "
        f"({result['cpu_iterations']:,} iterations, calibrated once)",
        "",
        "Wall time from the first handler start to the last handler end; parallelism = the "
        "handlers' summed CPU time (time.thread_time() around each job's work) ÷ wall time.",
        "",
        "| system | wall (s) | CPU (s) | parallelism | CPU per job (ms) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for n in names:
        if n == "celery-early-ack":
            continue
        e = _s(result, n, "cpu")
        lines.append(
            f"| {n} | {fmt(e, 'wall_s', 2)} | {fmt(e, 'cpu_s', 2)} | {fmt(e, 'parallelism', 2)} "
            f"| {fmt(e, 'job_cpu_ms_median', 1)} |"
        )

    lines += [
        "",
        f"## Pickup latency on an idle queue: {sizes['pickup']} single jobs",
        "",
        "From the producer's commit returning to the handler's first line (time.time() on "
        "both sides, same machine).",
        "",
        "| system | p50 (ms) | p95 (ms) | max (ms) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for n in names:
        if n == "celery-early-ack":
            continue
        ran = variants_run(result, n, ("pickup",)) or [""]
        for v in ran:
            e = _s(result, n, "pickup", v)
            # brooq with its async children too: each row says its command line.
            label = n if len(ran) == 1 else f"{n} {_command(result, n, 'pickup', v)}"
            lines.append(
                f"| {label} | {fmt(e, 'p50_ms', 1)} | {fmt(e, 'p95_ms', 1)} "
                f"| {fmt(e, 'max_ms', 1)} |"
            )

    lines += [
        "",
        "## Hung handler: 2 s limit",
        "",
        "As many never-returning jobs (a loop that swallows every exception) as the workers "
        "run at once (2; pgqueuer: 2 processes x max_concurrent_tasks 2), then one normal job. "
        "Times are from the first hung job's start "
        "to the normal job's start, and from the normal job's commit to its start; we wait "
        "15 s for it.",
        "",
        "| system | limit used | next job ran | after hung start (s) | after its commit (s) "
        "| hung jobs ended as |",
        "| --- | --- | --- | ---: | ---: | --- |",
    ]
    for n in names:
        if n == "celery-early-ack":
            continue
        e = _s(result, n, "hung")
        rec = e.get("recovered")
        ran = "–" if rec is None else ", ".join("yes" if r else "no (15 s)" for r in rec)
        states = e.get("hung_states") or []
        state = "; ".join(sorted({s for st in states[:1] for s in st.values()})) or "–"
        limit = result["systems"][n]["settings"]["hung"]["-"].get("timeout", "")
        lines.append(
            f"| {n} | {limit} | {ran} | {fmt(e, 'from_hung_start_s', 2)} "
            f"| {fmt(e, 'probe_wait_s', 2)} | {state} |"
        )

    lines += brooq_features(result)
    lines += io_section(result)
    lines += io_best_section(result)

    lines += ["", "## Targets", "", "| target | measured | met |", "| --- | --- | --- |"]
    lines += targets(result)

    lines += [
        "",
        "## Other load on the machine during the runs",
        "",
        "Share of the machine's CPU time used by processes that were neither the benchmark, "
        "its workers nor the PostgreSQL server (median over the repetitions, max in "
        "brackets). Anything but small figures means the runs competed for the 2 CPUs.",
        "",
        "| system | " + " | ".join(WORKLOAD_TITLES.values()) + " |",
        "| --- |" + " ---: |" * len(WORKLOAD_TITLES),
    ]
    for n in names:
        cells = []
        for wl in WORKLOAD_TITLES:
            vals = [
                r["load"]["other_cpu_pct"]
                for r in result["runs"]
                if r["system"] == n and r["workload"] == wl and "load" in r
            ]
            if vals:
                vals.sort()
                cells.append(f"{vals[len(vals) // 2]:.0f}% ({vals[-1]:.0f}%)")
            else:
                cells.append("–")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")

    skipped_wl: dict[tuple[str, str], list[str]] = {}  # (system, why) -> workloads
    for n in names:
        if skipped.get(n) or n == "celery-early-ack":  # that one runs the drain only
            continue
        for wl, why in result["systems"][n].get("skipped_workloads", {}).items():
            skipped_wl.setdefault((n, why), []).append(wl)
    if skipped or skipped_wl:
        lines += ["", "## Skipped", ""]
        lines += [f"- {n}: {why}" for n, why in skipped.items()]
        lines += [f"- {n}, {', '.join(wls)}: {why}" for (n, why), wls in skipped_wl.items()]
    errors = [r for r in result["runs"] if "error" in r]
    if errors:
        lines += ["", "## Errors", ""]
        lines += [
            f"- {r['system']} {r['workload']} {r['variant']} rep {r['rep'] + 1}: {r['error']}"
            for r in errors
        ]

    lines += ["", "## Settings", ""]
    for n in names:
        lines.append(f"### {n}")
        lines.append("")
        seen: dict[str, list[str]] = {}
        for wl, by_variant in result["systems"][n]["settings"].items():
            for v, st in by_variant.items():
                text = "; ".join(f"{k}: {val}" for k, val in st.items())
                seen.setdefault(text, []).append(wl + ("" if v == "-" else f" ({v})"))
        for text, wls in seen.items():
            lines.append(f"- {', '.join(wls)}: {text}")
        lines.append("")
    for c_result, what in (
        (ceiling, "one script run = one job"),
        (
            batched,
            f"one script run = {batched.get('batch')} jobs, "
            f"`PGOPTIONS='-c synchronous_commit={batched.get('synchronous_commit', 'on')}'` "
            "as brooq's children commit by default (`QUEUE_WORKER_SYNCHRONOUS_COMMIT`)",
        ),
    ):
        if c_result.get("script"):
            lines += [
                f"### pgbench ceiling, {c_result.get('batch', 1)} per claim",
                "",
                f"{c_result.get('pgbench', '')}, `-n -M prepared -c N -j min(N, nproc)`, {what}:",
                "",
                "```sql",
                c_result["script"].rstrip(),
                "```",
                "",
            ]
    if result.get("enqueue_ceiling_script") and _s(result, "pgbench", "enqueue_single", "prepared"):
        lines += [
            "### pgbench ceiling, single enqueue",
            "",
            "`-n -M prepared` and `-n -M simple`, `-c 1 -j 1 -t N` (N as enqueued one by one) "
            "on a database brooq's migrations made (the table and its NOTIFY trigger); one "
            "script run = one job, its own transaction:",
            "",
            "```sql",
            result["enqueue_ceiling_script"].rstrip(),
            "```",
            "",
        ]
    return "\n".join(lines) + "\n"


def brooq_features(result: dict[str, Any]) -> list[str]:
    """The priority, limited, rated and grouped workloads (brooq only), when the run had
    them."""
    lines: list[str] = []
    sizes = result["sizes"]
    e = _s(result, "brooq", "priority")
    if e:
        lines += [
            "",
            f"## Priority (brooq): {sizes.get('priority_high', '?')} high-priority jobs "
            f"into {sizes.get('priority_low', 0):,} draining low ones",
            "",
            "`--workers 2`, ~1 ms jobs. The high ones (priority 10, one statement) are "
            "enqueued once ~1,000 low ones (priority 0) have started; times from their "
            'commit. "Low meanwhile": low jobs that started after that commit and before '
            "the last high one started, of the low ones still to start then.",
            "",
            "| low meanwhile | of remaining | share | first high starts (ms) | last high "
            "starts (ms) | whole drain (s) | jobs/s |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            f"| {fmt(e, 'low_started_meanwhile')} | {fmt(e, 'low_remaining_at_high')} "
            f"| {fmt(e, 'low_meanwhile_pct', 2)} % | {fmt(e, 'high_first_start_ms', 1)} "
            f"| {fmt(e, 'high_last_start_ms', 1)} | {fmt(e, 'drain_s', 2)} "
            f"| {fmt(e, 'jobs_per_s')} |",
        ]
    e = _s(result, "brooq", "limited")
    if e:
        lines += [
            "",
            f"## global_limit (brooq): {sizes.get('limited', 0):,} jobs of 20 ms, "
            "`global_limit=4`, 2 masters x 8 children",
            "",
            "From the handlers' own (start, end) records (`time.time_ns()`, one host). The "
            'ideal is 4 ÷ 0.020 s = 200 jobs/s; "middle" counts the starts between the '
            "10th and the 90th percentile.",
            "",
            "| max running at once | time above the cap (ms) | jobs/s (whole run) | jobs/s "
            "(middle) | share of 200/s | job (ms, median) | children / masters that ran "
            "jobs |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            f"| {fmt(e, 'max_concurrency')} | {fmt(e, 'over_cap_ms', 1)} "
            f"| {fmt(e, 'jobs_per_s')} | {fmt(e, 'jobs_per_s_middle')} "
            f"| {fmt(e, 'share_of_ideal_pct')} % | {fmt(e, 'job_ms_median', 1)} "
            f"| {fmt(e, 'processes_seen')} / {fmt(e, 'masters_seen')} |",
        ]
    e = _s(result, "brooq", "rated")
    if e:
        lines += [
            "",
            f"## rate_limit (brooq): {sizes.get('rated', 0):,} jobs of 1 ms, "
            '`rate_limit="200/s"`, 2 masters x 8 children',
            "",
            "From the handlers' own start records. The most starts in any second must be at "
            "most 200; sustained: 200 per the median time from a start to the 200th before it "
            "(a start holds its place for the second plus a 50 ms allowance: 190.5/s at "
            "most).",
            "",
            "| most starts in 1 s | starts/s sustained | share of 200/s | drain (s) "
            "| children / masters that ran jobs |",
            "| ---: | ---: | ---: | ---: | ---: |",
            f"| {fmt(e, 'max_starts_in_1s')} | {fmt(e, 'starts_per_s')} "
            f"| {fmt(e, 'share_of_rate_pct')} % | {fmt(e, 'drain_s', 2)} "
            f"| {fmt(e, 'processes_seen')} / {fmt(e, 'masters_seen')} |",
        ]
    drain = sizes.get("drain", 0)
    lines += _beside_the_drain(
        result,
        "grouped_drain",
        f"## group_limit at speed (brooq): {drain:,} no-op jobs in 1,000 groups, "
        "`group_limit=2`, `--workers 2`",
        "The drain's jobs, each in a group; the claims take the groups in turn, a batch at a "
        "time, under the topic's lock. Beside the unlimited drain of the same run.",
        "jobs/s under group_limit",
    )
    lines += _beside_the_drain(
        result,
        "rated_drain",
        f'## Rates at speed (brooq): {drain:,} no-op jobs, `rate_limit="50000/s"`, `--workers 2`',
        "The drain's jobs under a rate that allows them: the claims take a batch at a time "
        "(as many as the handlers start within their allowance), each start taking its "
        "place in the window. Beside the unlimited drain.",
        "jobs/s under the rates",
    )
    lines += _beside_the_drain(
        result,
        "ordered_drain",
        f"## Ordered keys (brooq): {drain:,} no-op jobs over 1,000 ordering keys, `--workers 2`",
        "The drain's jobs, each with an ordering key: one job of a key at a time, the next "
        "one made pending as it ends. Beside the drain without keys of the same run.",
        "jobs/s with ordering keys",
    )
    e = _s(result, "brooq", "grouped")
    if e:
        lines += [
            "",
            f"## group_limit (brooq): {sizes.get('grouped', 0):,} jobs of 20 ms in 20 groups, "
            "`group_limit=1`, 2 masters x 8 children",
            "",
            "From the handlers' own (start, end) records. At most one job of a group at "
            "once; the ideal is the 16 children's 16 ÷ 0.020 s = 800 jobs/s (one claim of "
            "the topic at a time fleet-wide, under its lock, bounds it too).",
            "",
            "| most at once in a group | most at once | jobs/s | share of 800/s "
            "| children / masters that ran jobs |",
            "| ---: | ---: | ---: | ---: | ---: |",
            f"| {fmt(e, 'max_in_a_group')} | {fmt(e, 'max_concurrency')} "
            f"| {fmt(e, 'jobs_per_s')} | {fmt(e, 'share_of_ideal_pct')} % "
            f"| {fmt(e, 'processes_seen')} / {fmt(e, 'masters_seen')} |",
        ]
    return lines


def variants_run(result: dict[str, Any], system: str, workloads: tuple[str, ...]) -> list[str]:
    """The variants a system ran the workloads in, in the order they ran."""
    seen: list[str] = []
    for r in result["runs"]:
        if r["system"] == system and r["workload"] in workloads and r["variant"] not in seen:
            seen.append(r["variant"])
    return seen


def io_variants(result: dict[str, Any], system: str) -> list[str]:
    """The variants a system ran the I/O-bound workloads in, in the order they ran."""
    return variants_run(result, system, ("io", "io_http"))


def _command(result: dict[str, Any], system: str, workload: str, variant: str) -> str:
    st = result["systems"][system]["settings"].get(workload, {}).get(variant or "-", {})
    return f"`{st['command']}`" if st.get("command") else variant


def io_slots(result: dict[str, Any], system: str, variant: str) -> float | None:
    a, b = _s(result, system, "io", variant), _s(result, system, "io_http", variant)
    return _med(a, "slots") or _med(b, "slots")


def io_share(
    result: dict[str, Any], system: str, workload: str, variant: str, spread: bool = True
) -> str:
    """Jobs/s ÷ the bound (slots ÷ 50 ms), in %: recorded per run since the async
    variants (median and spread); computed from the medians for the runs before."""
    e = _s(result, system, workload, variant)
    if _med(e, "share_of_ideal_pct") is not None:
        if spread:
            return fmt(e, "share_of_ideal_pct")
        return f"{_med(e, 'share_of_ideal_pct'):.0f}"
    slots, jobs = _med(e, "slots"), _med(e, "jobs_per_s")
    return f"{100 * jobs * IO_SECONDS / slots:.0f}" if slots and jobs else "–"


def io_label(result: dict[str, Any], system: str, variant: str) -> str:
    settings = result["systems"][system]["settings"]
    for wl in ("io", "io_http"):
        st = settings.get(wl, {}).get(variant or "-")
        if st:
            return f"`{st['command']}`"
    return variant


def io_best_peer(result: dict[str, Any], workload: str) -> tuple[str, float, str] | None:
    """(system, median jobs/s, variant) of the peer with the most jobs/s."""
    best: tuple[str, float, str] | None = None
    for name in systems_in(result):
        if name == "brooq":
            continue
        for v in io_variants(result, name):
            med = _med(_s(result, name, workload, v), "jobs_per_s")
            if med is not None and (best is None or med > best[1]):
                best = (name, med, v)
    return best


def io_section(result: dict[str, Any]) -> list[str]:
    """The I/O-bound workloads, when the run had them."""
    names = [n for n in systems_in(result) if io_variants(result, n)]
    if not names:
        return []
    n_jobs = result["sizes"].get("io", 0)
    lines = [
        "",
        f"## I/O-bound: {n_jobs:,} ready jobs that each wait 50 ms",
        "",
        "`io`: each job sleeps 50 ms (async handlers `await asyncio.sleep(0.05)`, brooq's sync "
        "handlers `time.sleep(0.05)`). `io_http`: each job GETs a local server that answers "
        "after 50 ms (one connection per request; async handlers, brooq's async variants "
        "included, over `asyncio.open_connection`, sync ones with `urllib`). Jobs/s from the "
        "first handler start to the last handler end (the handlers' own `time.time_ns()` "
        "records); most at once from the same records; job time = end − start of each job. "
        "Slots are the jobs the configuration runs at once at most (brooq's async variants: "
        "children × `--concurrency`); the bound is what they allow, slots ÷ 50 ms, and no "
        "configuration exceeds it, so the share of it is the fairer figure to compare.",
        "",
        "| system | configuration | slots | bound (jobs/s) | io (jobs/s) | io_http (jobs/s) "
        "| ÷ bound, io / io_http (%) | most at once (io / io_http) "
        "| io_http job p50 / p95 (ms) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n in names:
        for v in io_variants(result, n):
            a, b = _s(result, n, "io", v), _s(result, n, "io_http", v)
            slots = io_slots(result, n, v)
            bound = f"{slots / IO_SECONDS:,.0f}" if slots else "–"
            lines.append(
                f"| {n} | {io_label(result, n, v)} | {f'{slots:,.0f}' if slots else '–'} "
                f"| {bound} | {fmt(a, 'jobs_per_s')} | {fmt(b, 'jobs_per_s')} "
                f"| {io_share(result, n, 'io', v)} / {io_share(result, n, 'io_http', v)} "
                f"| {fmt(a, 'max_concurrency')} / {fmt(b, 'max_concurrency')} "
                f"| {fmt(b, 'job_ms_p50', 1)} / {fmt(b, 'job_ms_p95', 1)} |"
            )
    return lines


def io_best_of(result: dict[str, Any], system: str) -> tuple[str, float] | None:
    """(variant, median jobs/s) of a system's fastest io_best configuration."""
    best: tuple[str, float] | None = None
    for v in variants_run(result, system, ("io_best",)):
        med = _med(_s(result, system, "io_best", v), "jobs_per_s")
        if med is not None and (best is None or med > best[1]):
            best = (v, med)
    return best


def io_best_command(result: dict[str, Any], system: str, variant: str) -> str:
    st = result["systems"][system]["settings"].get("io_best", {}).get(variant or "-", {})
    return f"`{st['command']}`" if st.get("command") else variant


def io_best_section(result: dict[str, Any]) -> list[str]:
    """io_best: the io jobs in a steady state, each system at equal slots and at its best."""
    names = [n for n in systems_in(result) if variants_run(result, n, ("io_best",))]
    if not names:
        return []
    n_jobs = result["sizes"].get("io_best", 0)
    lines = [
        "",
        f"## I/O-bound, steady state: {n_jobs:,} ready jobs that each wait 50 ms",
        "",
        "The `io` jobs (`await asyncio.sleep(0.05)`), enough of them that the run is mostly "
        "steady state rather than ramp-up, at each system's best configuration on this "
        "machine (brooq's async children at 2 × 500 and 2 × 1,000 slots; pgqueuer without "
        "`max_concurrent_tasks`) and at equal slots (2 × 100 for both). Timed as `io`.",
        "",
        "| system | configuration | slots | bound (jobs/s) | jobs/s | ÷ bound (%) "
        "| most at once | job p50 / p95 (ms) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n in names:
        for v in variants_run(result, n, ("io_best",)):
            e = _s(result, n, "io_best", v)
            slots = _med(e, "slots")
            lines.append(
                f"| {n} | {io_best_command(result, n, v)} "
                f"| {f'{slots:,.0f}' if slots else 'no cap'} "
                f"| {f'{slots / IO_SECONDS:,.0f}' if slots else '–'} | {fmt(e, 'jobs_per_s')} "
                f"| {fmt(e, 'share_of_ideal_pct') if slots else '–'} "
                f"| {fmt(e, 'max_concurrency')} "
                f"| {fmt(e, 'job_ms_p50', 1)} / {fmt(e, 'job_ms_p95', 1)} |"
            )
    return lines


def durability_cost(result: dict[str, Any]) -> tuple[float, float, float] | None:
    """(jobs/s with on, with off, cost of on as a share of off), from the medians."""
    on = _med(_s(result, "brooq", "durability", "on"), "jobs_per_s")
    off = _med(_s(result, "brooq", "durability", "off"), "jobs_per_s")
    if not on or not off:
        return None
    return on, off, 1 - on / off


def durability_section(result: dict[str, Any]) -> list[str]:
    if not any(_s(result, "brooq", "durability", v) for v in ("on", "off")):
        return []
    n = result["sizes"].get("durability", 0)
    lines = [
        "",
        f"## Durability: {n:,} ready no-op jobs, brooq --workers 2",
        "",
        "The children's `QUEUE_WORKER_SYNCHRONOUS_COMMIT` (their claims and outcomes); "
        "the variants alternate within each repetition. Timed like the drain.",
        "",
        "| children's synchronous_commit | jobs/s | I/O pressure during the drain (%) |",
        "| --- | ---: | ---: |",
    ]
    for v in ("on", "off"):
        e = _s(result, "brooq", "durability", v)
        lines.append(f"| {v} | {fmt(e, 'jobs_per_s')} | {fmt(e, 'io_pressure_pct')} |")
    cost = durability_cost(result)
    if cost:
        lines += [
            "",
            f"`on` costs {cost[2]:.1%} of the `off` figure (medians). I/O pressure is the "
            "share of the time some task waited on I/O (/proc/pressure/io): a durable commit "
            "waits for its WAL flush, so writes of other processes to the same disk slow "
            "`on` far more than `off`; compare the two within a run of low pressure.",
        ]
    return lines


def cpu_cell(result: dict[str, Any], system: str, workload: str, variant: str = "") -> str:
    """The median client and server CPU per job of a workload, in µs (a dash when the run
    measured none)."""
    e = _s(result, system, workload, variant)
    client, server = _med(e, "client_cpu_us_per_job"), _med(e, "server_cpu_us_per_job")
    if client is None or server is None:
        return "–"
    return f"{_us(client)} + {_us(server)} µs"


def _us(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}"


def glance(result: dict[str, Any]) -> list[str]:
    """One row per workload: brooq's best, the best peer's, the ceiling where the run has
    one, and brooq ÷ the best peer (for a latency, the best peer's ÷ brooq's: above 1 is
    brooq ahead), so that a regression shows without reading the sections below; beside
    them the CPU per job of brooq's figure and of the peer's, where the workload measures
    it, so that a rate that moves with the machine's load can be told from a cost that
    moved."""
    rows: list[tuple[str, ...]] = []

    def add(
        title: str,
        mine: tuple[str, float, str] | None,
        peer: tuple[str, float, str] | None,
        ceiling: tuple[str, float] | None = None,
        lower_is_better: bool = False,
        workload: str = "",
    ) -> None:
        """``mine``: (label, figure, variant); ``peer``: (system, figure, variant);
        ``workload``: whose CPU per job to show ("" for none)."""
        if mine is None:
            return
        ratio = "–"
        if peer is not None and peer[1] and mine[1]:
            value = peer[1] / mine[1] if lower_is_better else mine[1] / peer[1]
            ratio = f"{value:.2f}×"
        rows.append(
            (
                title,
                f"{_num(mine[1])} ({mine[0]})" if mine[0] else _num(mine[1]),
                f"{_num(peer[1])} ({peer[0]})" if peer else "–",
                f"{_num(ceiling[1])} ({ceiling[0]})" if ceiling else "–",
                ratio,
                cpu_cell(result, "brooq", workload, mine[2]) if workload else "–",
                cpu_cell(result, peer[0], workload, peer[2]) if workload and peer else "–",
            )
        )

    def brooq_best(
        workload: str, metric: str, variants: list[str]
    ) -> tuple[str, float, str] | None:
        best: tuple[str, float, str] | None = None
        for v in variants:
            value = _med(_s(result, "brooq", workload, v), metric)
            if value is not None and (best is None or value > best[1]):
                best = (_variant_label(workload, v), value, v)
        return best

    def peer_of(workload: str, metric: str) -> tuple[str, float, str] | None:
        found = best_peer(result, workload, metric)
        return (*found, "") if found else None

    single = brooq_best("enqueue_single", "jobs_per_s", [""])
    pg = _med(_s(result, "pgbench", "enqueue_single", "prepared"), "jobs_per_s")
    add(
        "single enqueue (jobs/s)",
        single,
        peer_of("enqueue_single", "jobs_per_s"),
        ("pgbench -M prepared", pg) if pg else None,
        workload="enqueue_single",
    )
    add(
        "bulk enqueue (jobs/s)",
        brooq_best("enqueue_bulk", "jobs_per_s", [""]),
        peer_of("enqueue_bulk", "jobs_per_s"),
        workload="enqueue_bulk",
    )
    batched = (result.get("ceiling_batched") or {}).get("summary", {})
    drain = brooq_best("drain", "jobs_per_s", ["2", "4", "8"])
    ceiling = None
    if drain is not None:
        clients = drain[0].split()[0]
        median = batched.get(clients, {}).get("median")
        ceiling = (f"pgbench, {clients} clients", median) if median else None
    add(
        "no-op drain (jobs/s)",
        drain,
        peer_of("drain", "jobs_per_s"),
        ceiling,
        workload="drain",
    )
    for wl in ("io", "io_http"):
        mine = brooq_best(wl, "jobs_per_s", io_variants(result, "brooq"))
        peer = io_best_peer(result, wl)
        bound = None
        if mine is not None:
            slots = io_slots(result, "brooq", mine[2])
            bound = ("slots ÷ 50 ms", slots / IO_SECONDS) if slots else None
        label = "I/O-bound, 50 ms sleeps" if wl == "io" else "I/O-bound, 50 ms HTTP calls"
        add(f"{label} (jobs/s)", mine, peer, bound, workload=wl)
    mine_best, peer_best = io_best_of(result, "brooq"), io_best_of(result, "pgqueuer")
    if mine_best is not None:
        add(
            "I/O-bound, steady state, best configurations (jobs/s)",
            (_variant_label("io", mine_best[0]), mine_best[1], mine_best[0]),
            ("pgqueuer", peer_best[1], peer_best[0]) if peer_best else None,
            workload="io_best",
        )
    cpu = _med(_s(result, "brooq", "cpu"), "parallelism")
    if cpu is not None:
        add(
            "CPU-bound parallelism, 2 workers",
            ("", cpu, ""),
            peer_of("cpu", "parallelism"),
            ("the CPUs", float(result["machine"]["nproc"])),
        )
    p50 = _med(_s(result, "brooq", "pickup"), "p50_ms")
    if p50 is not None:
        peer50: tuple[str, float, str] | None = None
        for name in systems_in(result):
            value = _med(_s(result, name, "pickup"), "p50_ms") if name != "brooq" else None
            if value is not None and (peer50 is None or value < peer50[1]):
                peer50 = (name, value, "")
        add("pickup p50 (ms; lower is better)", ("", p50, ""), peer50, lower_is_better=True)
    if not rows:
        return []
    out = [
        "## At a glance",
        "",
        "brooq's best configuration and the best peer's, per workload; details in the "
        "sections below. CPU per job: the client's (the worker processes the run started, "
        "and the producer for an enqueue) + the server's (the workload database's "
        "PostgreSQL backends; Celery's Redis server), in µs, over the measured window "
        "only: the timed enqueue call, or (a drain, the I/O-bound workloads) from the "
        "first job seen done to the last.",
        "",
        "| workload | brooq | best peer | ceiling | brooq ÷ best peer "
        "| brooq CPU/job (client + server) | best peer CPU/job (client + server) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return [*out, ""]


def _variant_label(workload: str, variant: str) -> str:
    if workload == "drain":
        return f"{variant} children"
    if workload in ("io", "io_http"):
        return variant if variant.startswith("async") else f"--workers {variant}"
    return variant


def targets(result: dict[str, Any]) -> list[str]:
    rows = []

    def row(target: str, measured: str, ok: bool | None) -> None:
        rows.append(f"| {target} | {measured} | {'–' if ok is None else ('yes' if ok else 'no')} |")

    drains = {v: _med(_s(result, "brooq", "drain", v), "jobs_per_s") for v in ("2", "4", "8")}
    best_v = max((v for v in drains if drains[v]), key=lambda v: drains[v] or 0, default=None)
    peer = best_peer(result, "drain", "jobs_per_s")
    if best_v and peer:
        ratio = drains[best_v] / peer[1]  # type: ignore[operator]
        row(
            "no-op drain ≥ 2× the best peer",
            f"brooq {drains[best_v]:,.0f} jobs/s ({best_v} children) vs {peer[0]} "
            f"{peer[1]:,.0f} = {ratio:.2f}×",
            ratio >= 2,
        )
    b = _med(_s(result, "brooq", "enqueue_bulk"), "jobs_per_s")
    peer = best_peer(result, "enqueue_bulk", "jobs_per_s")
    if b and peer:
        ratio = b / peer[1]
        row(
            "bulk enqueue ≥ 2× the best peer",
            f"brooq {b:,.0f} jobs/s vs {peer[0]} {peer[1]:,.0f} = {ratio:.2f}×",
            ratio >= 2,
        )
    single = _med(_s(result, "brooq", "enqueue_single"), "jobs_per_s")
    peer = best_peer(result, "enqueue_single", "jobs_per_s")
    ceil = _med(_s(result, "pgbench", "enqueue_single", "prepared"), "jobs_per_s")
    if single and peer and ceil:
        share = single / ceil
        row(
            "single enqueue: ahead of every peer, "
            f"≥ {ENQUEUE_CEILING_SHARE:.0%} of pgbench -M prepared",
            f"brooq {single:,.0f} jobs/s vs {peer[0]} {peer[1]:,.0f}; "
            f"{share:.0%} of pgbench's {ceil:,.0f}",
            single > peer[1] and share >= ENQUEUE_CEILING_SHARE,
        )
    cost = durability_cost(result)
    if cost:
        row(
            f"durability: synchronous_commit=on costs ≤ {DURABILITY_MAX_COST:.0%}",
            f"on {cost[0]:,.0f} jobs/s vs off {cost[1]:,.0f}: {cost[2]:.1%}",
            cost[2] <= DURABILITY_MAX_COST,
        )
    p = _med(_s(result, "brooq", "cpu"), "parallelism")
    if p is not None:
        row("CPU-bound parallelism ≥ 1.9 with --workers 2", f"{p:.2f}", p >= 1.9)
    e = _s(result, "brooq", "pickup")
    p50, p95 = _med(e, "p50_ms"), _med(e, "p95_ms")
    if p50 is not None and p95 is not None:
        row(
            "pickup p50 ≤ 4 ms, p95 ≤ 10 ms",
            f"p50 {p50:.1f} ms, p95 {p95:.1f} ms",
            p50 <= 4 and p95 <= 10,
        )
    sync_p95 = p95
    for v in variants_run(result, "brooq", ("pickup",)):
        p95 = _med(_s(result, "brooq", "pickup", v), "p95_ms")
        if not v or p95 is None:
            continue
        against = f" vs {sync_p95:.1f} ms with sync children" if sync_p95 is not None else ""
        row(
            f"pickup p95 with async children ({v}): unchanged",
            f"p95 {p95:.1f} ms{against}, same run",
            None,
        )
    e = _s(result, "brooq", "hung")
    h = e.get("from_hung_start_s")
    rec = e.get("recovered") or []
    if h and h.get("max") is not None:
        row(
            "hung handler: next job within max_execution_timeout + 1 s (3 s)",
            f"{h['median']:.2f} s after the hung job started (worst {h['max']:.2f} s)",
            all(rec) and h["max"] <= HUNG_TARGET_S,
        )
    elif rec:
        row("hung handler: next job within 3 s", "the next job did not run", False)
    e = _s(result, "brooq", "priority")
    pct = e.get("low_meanwhile_pct")
    if pct and pct.get("max") is not None:
        row(
            f"priority: all high jobs start before {PRIORITY_TARGET_PCT:g} % of the remaining "
            "low ones",
            f"{pct['median']:.2f} % (worst {pct['max']:.2f} %)",
            pct["max"] < PRIORITY_TARGET_PCT,
        )
    e = _s(result, "brooq", "limited")
    most, share = _med(e, "max_concurrency"), e.get("share_of_ideal_pct")
    if most is not None and share and share.get("min") is not None:
        worst = e["max_concurrency"]["max"]
        row(
            "global_limit=4: never more than 4 at once, ≥ 90 % of 200 jobs/s",
            f"max {worst:.0f} at once; {share['median']:.0f} % of 200/s "
            f"(worst {share['min']:.0f} %)",
            worst <= 4 and share["min"] >= 100 * LIMITED_TARGET_SHARE,
        )
    ran = io_variants(result, "brooq")
    judged = [v for v in IO_ASYNC_VARIANTS if v in ran] or [v for v in ("2",) if v in ran]
    for wl in ("io", "io_http"):
        peer = io_best_peer(result, wl)
        for v in judged:
            b = _med(_s(result, "brooq", wl, v), "jobs_per_s")
            if not b or not peer:
                continue
            ratio = b / peer[1]
            label = v if v in IO_ASYNC_VARIANTS else f"--workers {v}, sync"
            mine, theirs = io_slots(result, "brooq", v), io_slots(result, peer[0], peer[2])
            if mine:
                share = io_share(result, "brooq", wl, v, spread=False)
                label += f", {mine:,.0f} slots, {share} % of its bound"
            their = f" ({peer[2]})" if peer[2] else ""
            if theirs:
                share = io_share(result, peer[0], wl, peer[2], spread=False)
                their += f" ({theirs:,.0f} slots, {share} % of its bound)"
            row(
                f"{wl} ({v}): brooq ≥ {IO_TARGET_RATIO:g}× the best peer",
                f"brooq {b:,.0f} jobs/s ({label}) vs {peer[0]}{their} {peer[1]:,.0f} "
                f"= {ratio:.2f}×",
                ratio >= IO_TARGET_RATIO,
            )
    mine_best, peer_best = io_best_of(result, "brooq"), io_best_of(result, "pgqueuer")
    if mine_best and peer_best:
        ratio = mine_best[1] / peer_best[1]
        row(
            f"io_best: brooq's best ≥ {IO_TARGET_RATIO:g}× pgqueuer's best",
            f"brooq {mine_best[1]:,.0f} jobs/s ({mine_best[0]}) vs pgqueuer "
            f"{peer_best[1]:,.0f} ({peer_best[0] or 'capped'}) = {ratio:.2f}×",
            ratio >= IO_TARGET_RATIO,
        )
    e = _s(result, "brooq", "io_best", IO_EQUAL_SLOTS_VARIANT)
    share = _med(e, "share_of_ideal_pct")
    if share is not None:
        peer = _s(result, "pgqueuer", "io_best", "")
        theirs = _med(peer, "share_of_ideal_pct")
        against = f"; pgqueuer at its 2 × 100: {theirs:.0f} %" if theirs is not None else ""
        row(
            f"io_best at equal slots ({_med(e, 'slots') or 0:,.0f}): brooq ≥ "
            f"{IO_BEST_SHARE:g} % of slots ÷ 50 ms",
            f"{share:.0f} % ({_med(e, 'jobs_per_s') or 0:,.0f} jobs/s){against}",
            share >= IO_BEST_SHARE,
        )
    return rows


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in systems_in(result) if n != "celery-early-ack"]
    colours = {
        "brooq": "#1f77b4",
        "procrastinate": "#ff7f0e",
        "pgqueuer": "#2ca02c",
        "celery": "#d62728",
        "celery-early-ack": "#e377c2",
        "pgbench": "#7f7f7f",
    }
    io_names = [n for n in systems_in(result) if io_variants(result, n)]
    if io_names:  # a third row for the I/O-bound workloads, when the run had them
        fig = plt.figure(figsize=(16, 13.5))
        grid = fig.add_gridspec(3, 3)
        axes = [[fig.add_subplot(grid[r, c]) for c in range(3)] for r in range(2)]
        io_chart(result, fig.add_subplot(grid[2, :]), io_names, colours)
    else:
        fig, axes = plt.subplots(2, 3, figsize=(16, 9))

    def bars(
        ax: Any,
        labels: list[str],
        entries: list[dict[str, Any]],
        metric: str,
        cols: list[str],
        title: str,
        ylabel: str,
        scale: float = 1.0,
    ) -> None:
        meds, errs = [], [[], []]
        for e in entries:
            m = e.get(metric) or {}
            med = (m.get("median") or 0.0) * scale
            meds.append(med)
            errs[0].append(med - (m.get("min") or med / scale) * scale if m else 0)
            errs[1].append((m.get("max") or med / scale) * scale - med if m else 0)
        x = range(len(labels))
        ax.bar(x, meds, yerr=errs, color=cols, capsize=4)
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
        for i, v in enumerate(meds):
            ax.annotate(
                _num(v),
                (i, v),
                ha="center",
                va="bottom",
                fontsize=7,
                xytext=(0, 2),
                textcoords="offset points",
            )

    bars(
        axes[0][0],
        names,
        [_s(result, n, "enqueue_single") for n in names],
        "jobs_per_s",
        [colours.get(n, "k") for n in names],
        "Enqueue one by one",
        "jobs/s",
    )
    bars(
        axes[0][1],
        names,
        [_s(result, n, "enqueue_bulk") for n in names],
        "jobs_per_s",
        [colours.get(n, "k") for n in names],
        "Enqueue, bulk API",
        "jobs/s",
    )

    labels, entries, cols = [], [], []
    for n in systems_in(result):
        for v in ("2", "4", "8") if n == "brooq" else ("",):
            labels.append(f"brooq -w {v}" if v else n)
            entries.append(_s(result, n, "drain", v))
            cols.append(colours.get(n, "k"))
    for key, tag in (("ceiling", "1"), ("ceiling_batched", "b")):
        for c, e in (result.get(key) or {}).get("summary", {}).items():
            labels.append(f"pgbench{tag} -c {c}")
            entries.append({"jobs_per_s": e})
            cols.append(colours["pgbench"])
    bars(axes[0][2], labels, entries, "jobs_per_s", cols, "No-op drain", "jobs/s")

    bars(
        axes[1][0],
        names,
        [_s(result, n, "cpu") for n in names],
        "parallelism",
        [colours.get(n, "k") for n in names],
        "CPU-bound: CPU s ÷ wall s (2 cores)",
        "parallelism",
    )
    axes[1][0].axhline(2.0, color="k", lw=0.8, ls=":")

    ax = axes[1][1]
    x = range(len(names))
    for off, metric, hatch in ((-0.2, "p50_ms", ""), (0.2, "p95_ms", "//")):
        vals = [(_med(_s(result, n, "pickup"), metric) or 0.0) for n in names]
        ax.bar(
            [i + off for i in x],
            vals,
            width=0.4,
            hatch=hatch,
            color=[colours.get(n, "k") for n in names],
            label=metric[:3],
        )
        for i, v in enumerate(vals):
            ax.annotate(
                f"{v:.3g}",
                (i + off, v),
                ha="center",
                va="bottom",
                fontsize=7,
                xytext=(0, 2),
                textcoords="offset points",
            )
    ax.set_xticks(list(x))
    ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_title("Pickup latency, idle queue (p50 plain, p95 hatched)", fontsize=10)
    ax.set_ylabel("ms (log)")

    ax = axes[1][2]
    vals, texts = [], []
    for n in names:
        e = _s(result, n, "hung")
        rec = e.get("recovered") or []
        v = _med(e, "from_hung_start_s")
        if rec and all(rec) and v is not None:
            vals.append(v)
            texts.append(f"{v:.2f} s")
        else:
            vals.append(15.0)
            texts.append("not within 15 s" if rec else "–")
    ax.bar(range(len(names)), vals, color=[colours.get(n, "k") for n in names])
    for i, t in enumerate(texts):
        ax.annotate(
            t,
            (i, vals[i]),
            ha="center",
            va="bottom",
            fontsize=7,
            xytext=(0, 2),
            textcoords="offset points",
        )
    ax.axhline(HUNG_TARGET_S, color="k", lw=0.8, ls=":")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
    ax.set_title("Hung handler (2 s limit): next job starts after", fontsize=10)
    ax.set_ylabel("s from the hung jobs' start")

    m = result["machine"]
    fig.suptitle(
        f"brooq and peers — {m['nproc']} CPUs, PostgreSQL {m['postgres']['server_version']}, "
        f"median of {result['reps']} (bars: min–max)",
        fontsize=12,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def io_chart(result: dict[str, Any], ax: Any, names: list[str], colours: dict[str, str]) -> None:
    """Jobs/s of io (plain) and io_http (hatched) per configuration, log scale."""
    labels, cols, io, http = [], [], [], []
    for n in names:
        for v in io_variants(result, n):
            labels.append(f"{n} -w {v}" if n == "brooq" and v.isdigit() else f"{n} {v}".strip())
            cols.append(colours.get(n, "k"))
            io.append(_med(_s(result, n, "io", v), "jobs_per_s") or 0.0)
            http.append(_med(_s(result, n, "io_http", v), "jobs_per_s") or 0.0)
    x = range(len(labels))
    for off, vals, hatch in ((-0.2, io, ""), (0.2, http, "//")):
        ax.bar([i + off for i in x], vals, width=0.4, hatch=hatch, color=cols)
        for i, v in enumerate(vals):
            ax.annotate(
                _num(v),
                (i + off, v),
                ha="center",
                va="bottom",
                fontsize=7,
                xytext=(0, 2),
                textcoords="offset points",
            )
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("jobs/s (log)")
    ax.set_title(
        f"I/O-bound: {result['sizes'].get('io', 0):,} jobs of 50 ms; "
        "asyncio.sleep / time.sleep plain, HTTP GET hatched",
        fontsize=10,
    )


# -- the held snapshot (snapshot.py) ---------------------------------------------------------

MB = 1024 * 1024


def _n(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "–"
    return f"{v:,.{digits}f}"


def _mb(v: float | None) -> str:
    return "–" if v is None else f"{v / MB:,.1f}"


def _ratio(held: float | None, alone: float | None) -> str:
    if held is None or not alone:
        return "–"
    return f"{100 * held / alone:.0f} %"


def _lat(run: dict[str, Any], key: str) -> str:
    pick = run["pickup"]
    text = _n(pick.get(key), 1)
    return f"≥ {text}" if pick.get("censored") else text


def snapshot_targets(alone: dict[str, Any], held: dict[str, Any]) -> dict[str, Any]:
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


def side_by_side(alone: dict[str, Any], held: dict[str, Any]) -> list[str]:
    """The two runs' figures as a markdown table, then the targets."""
    rows = [
        (
            "offered jobs/s (achieved)",
            _n(alone["offered_per_s"]),
            _n(held["offered_per_s"]),
            _ratio(held["offered_per_s"], alone["offered_per_s"]),
        ),
        (
            "completed jobs/s",
            _n(alone["completed_per_s"]),
            _n(held["completed_per_s"]),
            _ratio(held["completed_per_s"], alone["completed_per_s"]),
        ),
        (
            "backlog when the offering ended",
            _n(alone["backlog_at_end"]),
            _n(held["backlog_at_end"]),
            "",
        ),
        ("pickup p50 (ms)", _lat(alone, "p50_ms"), _lat(held, "p50_ms"), ""),
        ("pickup p99 (ms)", _lat(alone, "p99_ms"), _lat(held, "p99_ms"), ""),
        ("pickup max (ms)", _lat(alone, "max_ms"), _lat(held, "max_ms"), ""),
        (
            "dead tuples, most sampled",
            _n(alone["max_dead_tuples"]),
            _n(held["max_dead_tuples"]),
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
            _n(alone["last_entries_per_scan"], 1),
            _n(held["last_entries_per_scan"], 1),
            "",
        ),
    ]
    lines = ["| | alone | snapshot held | held / alone |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {name} | {a} | {h} | {r} |" for name, a, h, r in rows]
    t = snapshot_targets(alone, held)
    lines += [
        "",
        f"Targets: held throughput ≥ 80 % of alone's: {100 * t['throughput_ratio']:.0f} % "
        f"({'met' if t['throughput_met'] else 'not met'}); held pickup p99 < 50 ms: "
        f"{_lat(held, 'p99_ms')} ms ({'met' if t['p99_met'] else 'not met'}).",
    ]
    return lines


def samples_table(run: dict[str, Any]) -> list[str]:
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
            f"| {w['t_end']:g} | {_n(w['offered_per_s'])} | {_n(w['completed_per_s'])} | "
            f"{_n(w['p50_ms'], 1)} / {_n(w['p99_ms'], 1)} | {_n(s.get('n_dead_tup'))} | "
            f"{_n(s.get('n_live_tup'))} | {_mb(s.get('heap_bytes'))} | "
            f"{_mb(s.get('index_bytes'))} | {_mb(s.get('ready_index_bytes'))} | "
            f"{_n(s.get('entries_per_scan'), 1)} | "
            f"{_n(buffers_per_job(by_k.get(w['k']), s, w['completed']))} | "
            f"{_n(s.get('autovacuum_count'))} |"
        )
    return lines


def buffers_per_job(
    before: dict[str, Any] | None, after: dict[str, Any], completed: int
) -> float | None:
    """The job table's heap and index buffers read (hit or not) between two samples, per
    job completed meanwhile: what the claims, outcomes and inserts of the window cost."""
    if before is None or not after or completed <= 0:
        return None
    read = (int(after["heap_blks"]) + int(after["idx_blks"])) - (
        int(before["heap_blks"]) + int(before["idx_blks"])
    )
    return round(read / completed, 1)


def snapshot_markdown(report: dict[str, Any]) -> str:
    """snapshot.py's report: the two runs side by side, then each run's samples."""
    lines = [
        f"# Held snapshot: {report['rate']:,} jobs/s offered for {report['duration']:g} s",
        "",
        f"{report['date']}, PostgreSQL {report['server']['server_version']} "
        f"({report['where']}), `brooq-master --workers {report['workers']}`, "
        f"{report['producers']} producer threads (`Queue.enqueue`, one job per call); "
        f"master settings {report['master_env'] or 'default'}.",
        "",
    ]
    runs = report["runs"]
    if "alone" in runs and "held" in runs:
        lines += [*side_by_side(runs["alone"], runs["held"]), ""]
    for label, run in runs.items():
        lines += [f"## {label}, every {report['every']:g} s", ""]
        lines += [*samples_table(run), ""]
        lines += [
            f"Master's own VACUUMs: {run['master_vacuums']}; producers at most "
            f"{run['producers_most_behind_s']} s behind their schedule.",
            "",
            f"EXPLAIN (ANALYZE, BUFFERS) of the claim at {100 * report['explain_at']:.0f} % "
            "of the offering, reading the ready index whole:",
            "",
            "```",
            run["explain"],
            "```",
            "",
            *(
                [
                    "And of the claim from floors (the ranges of a child whose last claim "
                    "returned a job of priority 0 made available a second before):",
                    "",
                    "```",
                    run["explain_floored"],
                    "```",
                    "",
                ]
                if run.get("explain_floored")
                else []
            ),
            "VACUUM (VERBOSE) when the offering ended:",
            "",
            "```",
            run["vacuum_verbose"],
            "```",
            "",
        ]
    return "\n".join(lines)


def redraw(src: Path) -> None:
    """A stored run's .md again (and run.py's .png): after a change to the tables."""
    data = json.loads(src.read_text())
    if isinstance(data.get("runs"), dict):  # snapshot.py's: alone and held
        src.with_suffix(".md").write_text(snapshot_markdown(data))
        return
    src.with_suffix(".md").write_text(markdown(data))
    chart(data, src.with_suffix(".png"))


if __name__ == "__main__":
    for name in sys.argv[1:]:
        redraw(Path(name))
