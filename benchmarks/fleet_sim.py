"""Past one server, on paper: N databases at the per-job cost measured on one, and where
the first bottleneck moves as N grows.

    python benchmarks/fleet_sim.py [--results benchmarks/results/2026-12-05-sizing.json]
        [--sync off] [--life bulk] [--databases 1,2,4,8,16,32] [--cores 32]
        [--fsync-ms 1] [--job-ms 1] [--max-connections 5000] [--producers 64]
        [--queue-skew 1.1] [--key-skew 0.8] [--seconds 30] [--seed 1]

Two layouts (docs/explanation/one-server.md, "Past one server"):

- split: one brooq per database, the queues split between them (each queue whole in one
  database, the biggest first to the least loaded); each database has workers of its
  own; a producer keeps a pool to every database it enqueues to.
- routed: one logical queue over N databases; the producer routes each job by its key
  (a hash of it, modulo N), so a key's jobs, workflows, unique keys and group limits stay
  in one database; every worker claims from every database (a job in a database no
  worker watches would wait for ever), so each child holds a connection to each.

Each database: `--cores` cores at the measured server CPU per job, its commits waiting
`--fsync-ms` each (group commit: one flush serves every connection waiting), at most
`--max-connections` connections. The workers: enough children for the load at
`--job-ms` a job (80 % busy), 16 to a master. The offered load is a stream of jobs with
Zipf-distributed keys (and queues), arriving at random (Poisson) in 100 ms ticks; each
database serves what its bounds allow in a tick and keeps the rest as backlog. For each
N the script looks for the highest offered jobs/s whose backlog stays bounded over the
simulated half minute, then names what gave out first there. Runs in seconds, with no
database: the per-job costs come from the results file of benchmarks/sizing.py.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "results" / "2026-12-05-sizing-quiet.json"
LAYOUTS = ("split", "routed")
TICK = 0.1  # seconds
BACKLOG_LIMIT = 0.05  # seconds of a database's capacity: more at the end is not keeping up
CHILDREN_PER_MASTER = 16
MASTER_CONNECTIONS = 3  # a master's own: its duties, LISTEN, the reaper's
WORKER_BUSY = 0.8  # children provisioned so that they are this busy
PRODUCER_POOL = 5  # a producer's connections to one database: pool_size 4 and the line


@dataclass(frozen=True)
class Costs:
    """One job's cost to its database (the phases of its life summed), from sizing.py."""

    server_us: float  # CPU per job
    sync_commits_per_job: float  # commits that wait for the WAL flush
    empty_claim_us: float  # CPU of a claim that finds nothing (an idle child's poll)


@dataclass(frozen=True)
class Fleet:
    databases: int
    layout: str  # "split" or "routed"
    cores: float = 32
    fsync_ms: float = 1.0
    job_ms: float = 1.0  # a handler's run time: how many children the load needs
    max_connections: int = 5000
    producers: int = 64  # producer processes, each enqueuing to every database
    poll_interval: float = 1.0  # an idle child's wait between two empty claims
    queues: int = 12  # split: queues, Zipf-sized
    keys: int = 100_000  # routed: routing keys, Zipf-weighted
    queue_skew: float = 1.1  # Zipf exponent of the queues' sizes
    key_skew: float = 0.8  # Zipf exponent of the keys' weights

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.databases < 1:
            raise ValueError(f"databases must be at least 1, got {self.databases!r}")


@dataclass
class Outcome:
    databases: int
    layout: str
    jobs_s: float  # the highest offered load sustained
    bottleneck: str  # what gave out first there
    hottest_share: float  # the busiest database's share of the jobs
    connections: int  # on the busiest database, at that load
    children: int
    utilisation: dict[str, float] = field(default_factory=dict)  # of the busiest database


def zipf_weights(n: int, s: float) -> list[float]:
    """n weights, the i-th (from 1) proportional to 1 / i^s, summing to 1."""
    raw = [1.0 / (i**s) for i in range(1, n + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def route(key: int, databases: int) -> int:
    """The database of a key: a stable hash of it, modulo N (the producer's router)."""
    digest = hashlib.blake2b(key.to_bytes(8, "little"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % databases


@functools.lru_cache(maxsize=64)
def shares(fleet: Fleet) -> list[float]:
    """Each database's share of the jobs. split: whole queues, biggest first to the
    least loaded database; routed: the keys' weights summed per database."""
    out = [0.0] * fleet.databases
    if fleet.layout == "split":
        for w in zipf_weights(fleet.queues, fleet.queue_skew):  # biggest first
            out[out.index(min(out))] += w
    else:
        for key, w in enumerate(zipf_weights(fleet.keys, fleet.key_skew)):
            out[route(key, fleet.databases)] += w
    return out


def children_for(jobs_s: float, job_ms: float) -> int:
    """Children that run ``jobs_s`` jobs of ``job_ms`` each at WORKER_BUSY."""
    return max(1, math.ceil(jobs_s * job_ms / 1e3 / WORKER_BUSY))


def connections(fleet: Fleet, jobs_s: float, share: float) -> tuple[int, int]:
    """(connections on a database with ``share`` of ``jobs_s``, children in all)."""
    children = children_for(jobs_s, fleet.job_ms)
    producers = fleet.producers * PRODUCER_POOL
    # routed: every child on every database; split: the database's own workers.
    mine = children if fleet.layout == "routed" else children_for(jobs_s * share, fleet.job_ms)
    masters = math.ceil(mine / CHILDREN_PER_MASTER)
    return producers + mine + masters * MASTER_CONNECTIONS, children


def capacity(fleet: Fleet, costs: Costs, idle_children: float) -> dict[str, float]:
    """A database's bounds, jobs/s: its CPU (less what idle children's polls take) and
    its commits (the producers' connections commit at once at most)."""
    polls_us = idle_children / fleet.poll_interval * costs.empty_claim_us
    cpu = max(0.0, fleet.cores * 1e6 - polls_us) / costs.server_us
    committers = fleet.producers * PRODUCER_POOL
    if costs.sync_commits_per_job > 0:
        commit = committers * 1e3 / fleet.fsync_ms / costs.sync_commits_per_job
    else:
        commit = math.inf
    return {"cpu": cpu, "commit": commit}


def simulate(
    fleet: Fleet, costs: Costs, jobs_s: float, seconds: float, rng: random.Random
) -> tuple[bool, list[float]]:
    """Offer ``jobs_s`` for ``seconds``: True if every database's backlog ends under
    BACKLOG_LIMIT seconds of its own capacity; each database's backlog at the end."""
    share = shares(fleet)
    children = children_for(jobs_s, fleet.job_ms)
    backlog = [0.0] * fleet.databases
    caps = []
    for s in share:
        # A routed fleet's children poll every database; an idle one (its database's
        # load below its workers' capacity) sends empty claims. Split: its own only.
        mine = children if fleet.layout == "routed" else children_for(jobs_s * s, fleet.job_ms)
        busy = min(mine, jobs_s * s * fleet.job_ms / 1e3)
        caps.append(min(capacity(fleet, costs, mine - busy).values()))
    for _ in range(int(seconds / TICK)):
        for db, s in enumerate(share):
            mean = jobs_s * s * TICK
            arrived = max(0.0, rng.gauss(mean, math.sqrt(mean))) if mean > 0 else 0.0
            backlog[db] = max(0.0, backlog[db] + arrived - caps[db] * TICK)
    bounded = all(b <= c * BACKLOG_LIMIT for b, c in zip(backlog, caps, strict=True))
    return bounded, backlog


def sustained(fleet: Fleet, costs: Costs, seconds: float = 30.0, seed: int = 1) -> Outcome:
    """The highest offered jobs/s the fleet sustains (bisection on ``simulate``, the
    connections within the limit), and what gives out first there."""
    share = shares(fleet)
    hottest = max(range(fleet.databases), key=lambda i: share[i])
    lo, hi = 0.0, fleet.databases * fleet.cores * 1e6 / costs.server_us * 1.05
    why = ""
    for _ in range(30):
        mid = (lo + hi) / 2
        rng = random.Random(seed)
        conns = max(connections(fleet, mid, s)[0] for s in share)
        ok, _ = simulate(fleet, costs, mid, seconds, rng)
        if ok and conns <= fleet.max_connections:
            lo = mid
        else:
            hi = mid
            why = "connections" if conns > fleet.max_connections else "backlog"
        if hi - lo < max(1.0, hi * 1e-3):
            break
    conns, children = connections(fleet, lo, share[hottest])
    conns = max(connections(fleet, lo, s)[0] for s in share)
    mine = children if fleet.layout == "routed" else children_for(lo * share[hottest], fleet.job_ms)
    busy = min(mine, lo * share[hottest] * fleet.job_ms / 1e3)
    caps = capacity(fleet, costs, mine - busy)
    load = lo * share[hottest]
    use = {k: load / v if v else math.inf for k, v in caps.items()}
    use["connections"] = conns / fleet.max_connections
    if why == "connections":
        bottleneck = "connections per database"
    else:
        name = max(("cpu", "commit"), key=lambda k: use[k])
        bottleneck = {"cpu": "CPU", "commit": "commit (WAL flush)"}[name] + (
            " of the busiest database" if fleet.databases > 1 else ""
        )
        if fleet.layout == "routed" and caps["cpu"] < fleet.cores * 1e6 / costs.server_us * 0.9:
            bottleneck += ", a tenth or more of it empty claims"
    return Outcome(
        fleet.databases, fleet.layout, lo, bottleneck, share[hottest], conns, children, use
    )


def costs_from(results: Path, sync: str, life: str) -> Costs:
    """A job's costs from sizing.py's results: the phases of ``life`` (single or bulk
    enqueue, the drain, retention) summed, medians of the rounds."""
    data = json.loads(results.read_text())
    phases = data["summary"]["inputs"][sync]
    names = {"single": "enqueue_single", "bulk": "enqueue_bulk"}[life], "drain", "retention"
    server = sum(phases[n]["server_us"]["median"] for n in names)
    commits = sum(phases[n]["commits"]["median"] for n in names) if sync == "on" else 0.0
    empty = phases["empty_claim"]["server_us"]["median"]
    return Costs(server, commits, empty)


def table(outcomes: Sequence[Outcome]) -> str:
    lines = [
        "| layout | databases | jobs/s sustained | busiest database's share | its "
        "connections | children | first bottleneck |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for o in outcomes:
        lines.append(
            f"| {o.layout} | {o.databases} | {o.jobs_s:,.0f} | {o.hottest_share:.1%} | "
            f"{o.connections:,} | {o.children:,} | {o.bottleneck} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--sync", default="off", choices=("on", "off"))
    parser.add_argument("--life", default="bulk", choices=("single", "bulk"))
    parser.add_argument("--databases", default="1,2,4,8,16,32")
    parser.add_argument("--cores", type=float, default=32)
    parser.add_argument("--fsync-ms", type=float, default=1.0)
    parser.add_argument("--job-ms", type=float, default=1.0)
    parser.add_argument("--max-connections", type=int, default=5000)
    parser.add_argument("--producers", type=int, default=64)
    parser.add_argument("--queue-skew", type=float, default=1.1)
    parser.add_argument("--key-skew", type=float, default=0.8)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        counts = [int(x) for x in args.databases.split(",") if x]
    except ValueError:
        raise SystemExit(f"--databases wants whole numbers, got {args.databases!r}") from None
    if not counts or min(counts) < 1:
        raise SystemExit(f"--databases wants numbers of at least 1, got {args.databases!r}")
    if min(args.cores, args.fsync_ms, args.job_ms, args.seconds) <= 0:
        raise SystemExit("--cores, --fsync-ms, --job-ms and --seconds must be positive")
    path = Path(args.results)
    try:
        costs = costs_from(path, args.sync, args.life)
    except (OSError, KeyError, ValueError) as exc:
        raise SystemExit(f"--results {path}: not a sizing.py results file ({exc})") from None
    print(
        f"per job: {costs.server_us:.1f} us of server CPU, {costs.sync_commits_per_job:.3f} "
        f"synchronous commits; an empty claim {costs.empty_claim_us:.1f} us "
        f"(synchronous_commit {args.sync}, {args.life} enqueue)"
    )
    outcomes = []
    for layout in LAYOUTS:
        for n in counts:
            fleet = Fleet(
                n,
                layout,
                cores=args.cores,
                fsync_ms=args.fsync_ms,
                job_ms=args.job_ms,
                max_connections=args.max_connections,
                producers=args.producers,
                queue_skew=args.queue_skew,
                key_skew=args.key_skew,
            )
            outcomes.append(sustained(fleet, costs, args.seconds, args.seed))
    print(table(outcomes))
    return 0


def run(argv: Sequence[str] | None = None) -> int:
    """main, with a refusal as one line on stderr and exit status 2."""
    try:
        return main(argv)
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(run())
