"""The sizing model of one server (benchmarks/sizing.py) and the simulation of several
(benchmarks/fleet_sim.py), with plain numbers: no database."""

from __future__ import annotations

import itertools
import json
import math
import random
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import fleet_sim  # noqa: E402
import sizing  # noqa: E402

# -- one server --------------------------------------------------------------------------


def test_the_cpu_bound_is_cores_times_a_million_over_the_work_per_job() -> None:
    assert sizing.cpu_bound(8, 40.0) == 200_000
    assert sizing.cpu_bound(1, 25.0) == 40_000
    assert sizing.cpu_bound(4, 0.0) == math.inf
    with pytest.raises(ValueError, match="cores"):
        sizing.cpu_bound(0, 40.0)


def test_the_commit_bound_is_shared_flushes_over_the_synchronous_commits_per_job() -> None:
    # One connection, one commit per job, 1 ms a flush: 1,000 jobs/s.
    assert sizing.commit_bound(1.0, 1, 1.0) == pytest.approx(1_000)
    # Group commit: ten connections waiting share each flush.
    assert sizing.commit_bound(1.0, 10, 1.0) == pytest.approx(10_000)
    # A commit per 200 jobs (a claim batch), 0.05 ms a flush, 2 children.
    assert sizing.commit_bound(0.05, 2, 1 / 200) == pytest.approx(8_000_000)
    assert sizing.commit_bound(1.0, 10, 0.0) == math.inf  # nothing waits for a flush
    with pytest.raises(ValueError, match="fsync_ms"):
        sizing.commit_bound(0.0, 1, 1.0)


def test_sustained_is_the_least_bound_and_names_it() -> None:
    enqueue = sizing.Phase(server_us=60.0, commits_per_job=1.0, sync_commit=True)
    drain = sizing.Phase(server_us=20.0, commits_per_job=0.005, sync_commit=False)
    # 8 cores, 80 us a job: 100,000 jobs/s of CPU; 50 connections at 1 ms: 50,000.
    est = sizing.sustained([enqueue, drain], 8, fsync_ms=1.0, committers=50)
    assert est.limit == "commit"
    assert est.jobs_s == pytest.approx(50_000)
    assert est.bounds["cpu"] == pytest.approx(100_000)
    # Only the synchronous commits count: the drain's do not wait.
    assert est.bounds["commit"] == pytest.approx(50 * 1000 / 1.0)
    more = sizing.sustained([enqueue, drain], 8, fsync_ms=1.0, committers=500)
    assert more.limit == "cpu" and more.jobs_s == pytest.approx(100_000)


def test_sustained_counts_the_clients_only_on_shared_cores_and_the_wal_when_given() -> None:
    phase = sizing.Phase(server_us=30.0, client_us=30.0, wal_bytes=1000.0, sync_commit=False)
    alone = sizing.sustained([phase], 2, fsync_ms=1.0, committers=1)
    shared = sizing.sustained([phase], 2, fsync_ms=1.0, committers=1, shared_client_cores=True)
    assert alone.jobs_s == pytest.approx(2e6 / 30)
    assert shared.jobs_s == pytest.approx(2e6 / 60)
    wal = sizing.sustained([phase], 2, fsync_ms=1.0, committers=1, wal_mb_s=10.0)
    assert wal.limit == "wal" and wal.jobs_s == pytest.approx(10_000)


def test_a_closed_loop_of_one_worker_adds_up_its_stations() -> None:
    stations = [sizing.Station("server", 1, 30.0), sizing.Station("clients", 1, 20.0)]
    assert sizing.closed_loop(stations, 1) == pytest.approx(1e6 / 50)


def test_two_workers_on_two_shared_cores_never_wait_for_each_other() -> None:
    shared = [sizing.Station("shared", 2, 58.5)]
    assert sizing.closed_loop(shared, 2) == pytest.approx(2e6 / 58.5)
    assert sizing.closed_loop(shared, 2) == pytest.approx(sizing.cpu_bound(2, 58.5))


def test_two_workers_through_two_single_cores_reach_less_than_the_bound() -> None:
    # By hand (mean value analysis): 1 customer: R = 30 + 28.5, queues .513 and .487;
    # 2 customers: R = 30 x 1.487 + 28.5 x 1.513 = 87.73 us for 2 jobs.
    stations = [sizing.Station("server", 1, 30.0), sizing.Station("clients", 1, 28.5)]
    two = sizing.closed_loop(stations, 2)
    assert two == pytest.approx(2e6 / (30 * (1 + 30 / 58.5) + 28.5 * (1 + 28.5 / 58.5)))
    assert two < sizing.split_cpu_bound(1, 30.0, 1, 28.5)
    # Many workers: the least of the bounds, the server's here.
    assert sizing.closed_loop(stations, 400) == pytest.approx(1e6 / 30, rel=1e-3)


def test_two_workers_in_step_through_two_single_cores_take_turns_with_both() -> None:
    # In step, each station works for both workers in turn while the other waits: a
    # cycle of 2 jobs costs 2 x 30 + 2 x 28.5 us.
    stations = [sizing.Station("server", 1, 30.0), sizing.Station("clients", 1, 28.5)]
    assert sizing.in_step(stations, 2) == pytest.approx(1e6 / 58.5)
    assert sizing.in_step(stations, 2) < sizing.closed_loop(stations, 2)
    # As many workers as cores: no one waits, in step or not.
    shared = [sizing.Station("shared", 2, 58.5)]
    assert sizing.in_step(shared, 2) == pytest.approx(sizing.closed_loop(shared, 2))
    # One worker: the stations one after the other, as closed_loop.
    assert sizing.in_step(stations, 1) == pytest.approx(sizing.closed_loop(stations, 1))


def test_in_step_refuses_no_worker_and_a_station_without_cores() -> None:
    with pytest.raises(ValueError, match="customers"):
        sizing.in_step([sizing.Station("s", 1, 1.0)], 0)
    with pytest.raises(ValueError, match="station 's'"):
        sizing.in_step([sizing.Station("s", 0, 1.0)], 1)


def test_closed_loop_refuses_no_worker_and_a_station_without_cores() -> None:
    with pytest.raises(ValueError, match="customers"):
        sizing.closed_loop([sizing.Station("s", 1, 1.0)], 0)
    with pytest.raises(ValueError, match="station 's'"):
        sizing.closed_loop([sizing.Station("s", 0, 1.0)], 1)


def test_the_error_is_a_share_of_the_measure() -> None:
    assert sizing.error_pct(20_000, 23_000) == pytest.approx(15.0)
    assert sizing.error_pct(20_000, 18_000) == pytest.approx(-10.0)


def test_per_job_divides_each_counter_by_the_jobs_and_reads_the_flushed_counters() -> None:
    a = sizing.Reading(0.0, 1.0, 1000, 10, 5, 2.0, 100, 0.5, 3.0)
    b = sizing.Reading(2.0, 1.5, 201000, 20, 15, 4.0, 110, 0.6, 4.0)
    later = sizing.Reading(3.0, 9.9, 999999, 30, 25, 6.0, 120, 9.9, 9.9)
    got = sizing.per_job(a, b, 1000, later)
    assert got["jobs_s"] == pytest.approx(500)
    assert got["server_us"] == pytest.approx(500)  # 0.5 s of CPU over 1,000 jobs
    assert got["client_us"] == pytest.approx(100)
    assert got["wal_bytes"] == pytest.approx(200)  # from b, not the later reading
    assert got["fsyncs"] == pytest.approx(0.02)  # 20 syncs by the later reading
    assert got["fsync_ms"] == pytest.approx(0.2)  # 4 ms over 20 syncs
    assert got["commits"] == pytest.approx(0.02)
    # 1 s of the machine's CPU, 0.5 the server's and 0.1 the clients': 0.2 cores other.
    assert got["other_cores"] == pytest.approx(0.2)


# -- several databases -------------------------------------------------------------------

COSTS = fleet_sim.Costs(server_us=32.0, sync_commits_per_job=0.0, empty_claim_us=50.0)


def test_zipf_weights_sum_to_one_and_fall() -> None:
    w = fleet_sim.zipf_weights(12, 1.1)
    assert sum(w) == pytest.approx(1.0)
    assert all(a > b for a, b in itertools.pairwise(w))
    assert fleet_sim.zipf_weights(4, 0.0) == pytest.approx([0.25] * 4)


def test_a_key_routes_to_the_same_database_every_time() -> None:
    assert {fleet_sim.route(42, 8) for _ in range(5)} == {fleet_sim.route(42, 8)}
    assert {fleet_sim.route(k, 8) for k in range(1000)} == set(range(8))


def test_split_keeps_each_queue_whole_in_one_database() -> None:
    fleet = fleet_sim.Fleet(8, "split", queues=12, queue_skew=1.1)
    shares = fleet_sim.shares(fleet)
    assert sum(shares) == pytest.approx(1.0)
    # The biggest queue goes whole to one database, alone there: the busiest database's
    # share is exactly that queue's, whatever the number of databases.
    assert max(shares) == pytest.approx(fleet_sim.zipf_weights(12, 1.1)[0])


def test_routed_spreads_the_keys_over_every_database() -> None:
    shares = fleet_sim.shares(fleet_sim.Fleet(4, "routed", keys=10_000, key_skew=0.0))
    assert sum(shares) == pytest.approx(1.0)
    assert all(s == pytest.approx(0.25, abs=0.03) for s in shares)


def test_every_child_of_a_routed_fleet_holds_a_connection_to_each_database() -> None:
    split = fleet_sim.Fleet(4, "split", producers=10, job_ms=1.0)
    routed = fleet_sim.Fleet(4, "routed", producers=10, job_ms=1.0)
    # 80,000 jobs/s of 1 ms at 80 % busy: 100 children in all.
    conns_split, children = fleet_sim.connections(split, 80_000, 0.25)
    conns_routed, _ = fleet_sim.connections(routed, 80_000, 0.25)
    assert children == 100
    assert conns_routed - conns_split == (100 - 25) + (7 - 2) * fleet_sim.MASTER_CONNECTIONS
    assert conns_split == 10 * fleet_sim.PRODUCER_POOL + 25 + 2 * fleet_sim.MASTER_CONNECTIONS


def test_a_backlog_grows_only_above_the_capacity() -> None:
    fleet = fleet_sim.Fleet(1, "split", cores=1)
    capacity = 1e6 / COSTS.server_us
    under, _ = fleet_sim.simulate(fleet, COSTS, capacity * 0.95, 20.0, random.Random(3))
    over, backlog = fleet_sim.simulate(fleet, COSTS, capacity * 1.05, 20.0, random.Random(3))
    assert under and not over
    assert backlog[0] == pytest.approx(capacity * 0.05 * 20.0, rel=0.1)


def test_one_database_sustains_its_cpu_bound() -> None:
    out = fleet_sim.sustained(fleet_sim.Fleet(1, "split", cores=32), COSTS, seconds=10.0)
    assert out.jobs_s == pytest.approx(32e6 / COSTS.server_us, rel=0.02)
    assert out.bottleneck == "CPU"


def test_split_stops_growing_at_the_biggest_queue() -> None:
    four = fleet_sim.sustained(fleet_sim.Fleet(4, "split", cores=8), COSTS, seconds=10.0)
    sixteen = fleet_sim.sustained(fleet_sim.Fleet(16, "split", cores=8), COSTS, seconds=10.0)
    biggest = fleet_sim.zipf_weights(12, 1.1)[0]
    assert sixteen.jobs_s == pytest.approx(8e6 / COSTS.server_us / biggest, rel=0.03)
    assert sixteen.jobs_s == pytest.approx(four.jobs_s, rel=0.03)
    assert sixteen.bottleneck == "CPU of the busiest database"


def test_routed_runs_out_of_connections_as_the_children_grow() -> None:
    fleet = fleet_sim.Fleet(8, "routed", cores=32, max_connections=1000, job_ms=1.0)
    out = fleet_sim.sustained(fleet, COSTS, seconds=10.0)
    assert out.bottleneck == "connections per database"
    assert out.connections <= 1000
    assert out.jobs_s < 8 * 32e6 / COSTS.server_us / 2  # far below the CPU of 8


def test_costs_come_from_the_phases_of_a_jobs_life_in_the_results(tmp_path: Path) -> None:
    def m(v: float) -> dict[str, float]:
        return {"median": v}

    phases = {
        "enqueue_single": {"server_us": m(60.0), "commits": m(1.0)},
        "enqueue_bulk": {"server_us": m(5.0), "commits": m(0.001)},
        "drain": {"server_us": m(20.0), "commits": m(0.005)},
        "retention": {"server_us": m(2.0), "commits": m(0.002)},
        "empty_claim": {"server_us": m(40.0), "commits": m(1.0)},
    }
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"summary": {"inputs": {"on": phases, "off": phases}}}))
    on = fleet_sim.costs_from(path, "on", "single")
    assert on.server_us == pytest.approx(82.0)
    assert on.sync_commits_per_job == pytest.approx(1.007)
    assert on.empty_claim_us == 40.0
    off = fleet_sim.costs_from(path, "off", "bulk")
    assert off.server_us == pytest.approx(27.0) and off.sync_commits_per_job == 0.0


def test_the_scripts_refuse_bad_input_with_one_line_and_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert fleet_sim.run(["--databases", "0,2"]) == 2
    assert capsys.readouterr().err == "--databases wants numbers of at least 1, got '0,2'\n"
    missing = tmp_path / "none.json"
    assert fleet_sim.run(["--results", str(missing)]) == 2
    assert capsys.readouterr().err.startswith(f"--results {missing}: not a sizing.py results")
    assert sizing.run(["model", "--server-us", "0"]) == 2
    assert "--server-us" in capsys.readouterr().err
    assert sizing.run(["model", "--server-us", "40", "--cores", "2,x"]) == 2
    assert capsys.readouterr().err == "--cores wants whole numbers separated by commas, got '2,x'\n"
