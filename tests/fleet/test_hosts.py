"""Many hosts: three brooq-masters, each on a host of its own, draining
one queue in one PostgreSQL; then one host is lost.

A host is a Linux network namespace made by the test (tests/netns.py): a veth link to
this machine is all it has, and its masters reach the database through a relay on the
link's far end, so every claim, outcome and handler write crosses a network link as it
would between machines. Losing a host is SIGKILL of every process in its namespace at
once (the master and its children in one killpg): no child writes what it finished, no
master returns anything; only the lease and the other masters' reapers bring its jobs
back.

Where namespaces cannot be made (not root, no iproute2, no CAP_NET_ADMIN) the tests say
why and skip; BROOQ_REQUIRE_NETNS=1 (.ci/run) turns that into a failure.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import signal
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import brooq
from tests import audit, netns
from tests.harness import MasterProcess, prepare, process_alive, states, wait_for

LEASE = 2.0  # tests.harness.FAST
REAPER = 0.5
HOSTS = 3
WORKERS = 2  # children per master
APP = "brooq_fleetapp:queue"

# Every change of a job's state, with the lease it ended and the attempts before and
# after: the claims of the lost host, the reaper taking them back (and when, against the
# lease), the survivors' claims; and any write at all to a finished row (a late outcome
# written over another: the audit's outcome_log sees only changes of state). For this
# test's database only.
TRANSITIONS = """
CREATE TABLE transition_log (
    seq            bigserial PRIMARY KEY,
    job_id         uuid NOT NULL,
    old_state      text NOT NULL,
    new_state      text NOT NULL,
    old_locked_by  text,
    new_locked_by  text,
    old_until      timestamptz,
    old_attempts   int NOT NULL,
    new_attempts   int NOT NULL,
    at             timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION log_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO transition_log (job_id, old_state, new_state, old_locked_by, new_locked_by,
                                old_until, old_attempts, new_attempts)
    VALUES (NEW.id, OLD.state, NEW.state, OLD.locked_by, NEW.locked_by, OLD.locked_until,
            OLD.attempts, NEW.attempts);
    RETURN NULL;
END;
$$;
CREATE TRIGGER log_transition AFTER UPDATE ON job FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.state IN ('done', 'dead', 'canceled'))
    EXECUTE FUNCTION log_transition();
-- A finished row is in job_history (migration 0020): any write to it there.
CREATE TRIGGER log_transition AFTER UPDATE ON job_history FOR EACH ROW
    EXECUTE FUNCTION log_transition();
-- The claim statement's done writes no UPDATE: it deletes the processing row its worker
-- holds from job and inserts it into job_history as done, every other column kept (the
-- lease it ended, the attempts). Rows the move trigger or the master's partition upkeep
-- insert (brooq.moving on) had their UPDATE logged above, or are no outcome.
CREATE FUNCTION log_claimed_done() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO transition_log (job_id, old_state, new_state, old_locked_by, new_locked_by,
                                old_until, old_attempts, new_attempts)
    VALUES (NEW.id, 'processing', NEW.state, NEW.locked_by, NEW.locked_by, NEW.locked_until,
            NEW.attempts, NEW.attempts);
    RETURN NULL;
END;
$$;
CREATE TRIGGER log_claimed_done AFTER INSERT ON job_history FOR EACH ROW
    WHEN (current_setting('brooq.moving', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION log_claimed_done();
"""


@dataclass
class Fleet:
    """Three hosts, the relay and the masters started on them (stopped in this order)."""

    hosts: list[netns.Host]
    forwarder: netns.Forwarder
    dsn: str
    tmp_path: Path
    masters: dict[str, MasterProcess] = field(default_factory=dict)

    def start(self, host: netns.Host, **env: str) -> MasterProcess:
        m = MasterProcess(
            self.forwarder.dsn_for(host, self.dsn),
            self.tmp_path / f"master-{host.name}.log",
            workers=WORKERS,
            app=APP,
            env={"FLEET_HOST": host.name, **env},
            wrap=host.wrap(),
            new_session=True,
        )
        self.masters[host.name] = m
        return m

    def start_all(self) -> list[MasterProcess]:
        started = [self.start(h) for h in self.hosts]
        for m in started:
            m.wait_ready(WORKERS)
            wait_for(functools.partial(listening, m), what="the master up")
        return started


def listening(m: MasterProcess) -> bool:
    return "event=ops_listening" in m.log()


@pytest.fixture
def namespaces() -> None:
    """Skip (or fail, with BROOQ_REQUIRE_NETNS=1) before anything else is made."""
    try:
        netns.probe()
    except netns.Unavailable as exc:
        if os.environ.get("BROOQ_REQUIRE_NETNS") == "1":
            pytest.fail(f"no network namespaces: {exc} (BROOQ_REQUIRE_NETNS=1)", pytrace=False)
        pytest.skip(f"no network namespaces here: {exc}")


@pytest.fixture
def fleet(
    namespaces: None, dsn: str, db: psycopg.Connection[Any], tmp_path: Path
) -> Iterator[Fleet]:
    prepare(dsn)
    db.execute("ALTER TABLE execution ADD COLUMN host text")
    with netns.fleet(HOSTS) as hosts:
        forwarder = netns.Forwarder(dsn, hosts, tmp_path / "forwarder.log")
        made = Fleet(hosts, forwarder, dsn, tmp_path)
        try:
            yield made
        finally:
            for m in made.masters.values():
                m.stop()
            forwarder.stop()
            for m in made.masters.values():  # captured: pytest shows it when the test failed
                print(f"---- {m.log_path.name}\n{m.log()[-6000:]}")


def enqueue_at_once(queue: brooq.Queue, jobs: list[brooq.Job]) -> tuple[list[uuid.UUID], datetime]:
    """All jobs in one transaction, so every host sees them at the same commit; the ids
    and the database's clock just after it."""
    with queue.transaction() as conn:
        ids = [job_id for job_id, _ in brooq.enqueue_many(conn, jobs)]
    with queue.connection() as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return ids, row[0]


def drain_rate(db: psycopg.Connection[Any], total: int, since: datetime) -> tuple[float, float]:
    """(seconds from the commit to the last outcome, jobs per second)."""
    row = db.execute("SELECT max(updated_at) FROM job_all WHERE state = 'done'").fetchone()
    assert row is not None and row[0] is not None
    seconds = (row[0] - since).total_seconds()
    return seconds, total / seconds


def executions_by_host(db: psycopg.Connection[Any]) -> dict[str, int]:
    rows = db.execute("SELECT host, count(*) FROM execution GROUP BY host ORDER BY host")
    return dict(rows.fetchall())


def pid_of(locked_by: str | None) -> int | None:
    """The child's pid in a locked_by `host:pid:tag`."""
    if not locked_by:
        return None
    parts = locked_by.rsplit(":", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def transitions(db: psycopg.Connection[Any]) -> dict[uuid.UUID, list[dict[str, Any]]]:
    """transition_log per job, in order."""
    history: dict[uuid.UUID, list[dict[str, Any]]] = defaultdict(list)
    cursor = db.cursor(row_factory=dict_row)
    for row in cursor.execute("SELECT * FROM transition_log ORDER BY seq"):
        history[row["job_id"]].append(row)
    return history


def taken_back(
    history: dict[uuid.UUID, list[dict[str, Any]]], pids: set[int], since: datetime
) -> tuple[set[uuid.UUID], datetime]:
    """The jobs a claim by one of `pids` held that did not end in that holder's own
    outcome, and when the last of them came back. Each must have been taken back by a
    reaper, only after its lease had run out, with the attempt refunded; and no job's
    finished row may have been written again."""
    held: set[uuid.UUID] = set()
    back = since
    for job_id, steps in history.items():
        rewritten = [step for step in steps if step["old_state"] in audit.TERMINAL]
        assert not rewritten, f"a finished row written again: {rewritten}"
        for claim, after in itertools.pairwise(steps):
            holder = claim["new_locked_by"]
            if claim["new_state"] != "processing" or pid_of(holder) not in pids:
                continue
            if after["new_state"] == "done" and after["old_locked_by"] == holder:
                continue  # the holder wrote this outcome in time
            held.add(job_id)
            assert (after["old_state"], after["new_state"]) == ("processing", "pending")
            assert after["at"] > after["old_until"], (job_id, after)  # never before the lease
            assert after["new_attempts"] == after["old_attempts"] - 1, (job_id, after)
            back = max(back, after["at"])
    return held, back


def runs_by_host(db: psycopg.Connection[Any]) -> dict[uuid.UUID, Counter[str]]:
    """Executions of each job, counted per host."""
    runs: dict[uuid.UUID, Counter[str]] = defaultdict(Counter)
    for job_id, host in db.execute("SELECT job_id, host FROM execution").fetchall():
        runs[job_id][host] += 1
    return runs


def test_three_hosts_drain_one_queue(
    fleet: Fleet, queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    """The benchmark-like run, no fault: no-op jobs committed at once drain on all three
    hosts, each with one attempt. The rate is printed, never asserted."""
    total = 20_000
    fleet.start_all()
    pids = {h.name: set(h.pids()) for h in fleet.hosts}
    relay_before = fleet.forwarder.cpu_seconds()
    ids, committed = enqueue_at_once(queue, [brooq.Job("fleet.noop") for _ in range(total)])
    wait_for(lambda: states(db) == {"done": total}, timeout=120, what="every job done")
    seconds, rate = drain_rate(db, total, committed)
    relay = (fleet.forwarder.cpu_seconds() - relay_before) / seconds
    assert len(ids) == total
    assert db.execute("SELECT count(*) FROM job_all WHERE attempts <> 1").fetchone() == (0,)
    # A done row keeps its last holder: which host wrote each outcome.
    shares: Counter[str] = Counter()
    for holder, n in db.execute("SELECT locked_by, count(*) FROM job_all GROUP BY 1").fetchall():
        shares[next(name for name, p in pids.items() if pid_of(holder) in p)] += n
    assert set(shares) == set(pids), shares  # all three took part
    print(
        f"FLEET {HOSTS} hosts x {WORKERS} children, {total} no-op jobs over veth: "
        f"{seconds:.2f}s, {rate:,.0f} jobs/s aggregate; per host {sorted(shares.values())}; "
        f"the relay used {relay:.0%} of a core"
    )
    for m in fleet.masters.values():
        m.signal(signal.SIGTERM)
    for m in fleet.masters.values():
        assert m.wait() == 0


def test_a_lost_host_s_jobs_come_back_after_the_lease(
    fleet: Fleet, queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    """One host's processes all SIGKILLed at once while the fleet drains. What its
    children held comes back through the other hosts' reapers once each lease has run
    out (never before), with the attempt refunded, and runs on a survivor; nothing is
    lost, no outcome is written twice, and a job runs twice only if the lost host had
    claimed it and died before its outcome was written (at-least-once), counted."""
    audit.install(db)
    db.execute(TRANSITIONS)
    total = 3_000
    fleet.start_all()
    lost, survivors = fleet.hosts[1], [fleet.hosts[0], fleet.hosts[2]]
    lost_master = fleet.masters[lost.name]
    # 1 ms per job keeps each child inside a batch most of the time, so the kill finds
    # jobs held: claimed and not started, running, finished with the outcome unwritten.
    ids, committed = enqueue_at_once(
        queue, [brooq.Job("fleet.work", {"sleep": 0.001}) for _ in range(total)]
    )
    wait_for(lambda: states(db).get("done", 0) >= total // 3, timeout=60, what="a third done")
    lost_pids = set(lost.kill_all())
    killed = time.monotonic()
    killed_at = db.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
    lost_master.wait(5)
    wait_for(lambda: not lost.pids(), timeout=5, what="the namespace empty")
    assert lost_master.pid in lost_pids and len(lost_pids) >= 1 + WORKERS
    wait_for(lambda: states(db) == {"done": total}, timeout=60, what="every job done")
    recovered = time.monotonic() - killed
    seconds, rate = drain_rate(db, total, committed)

    report = audit.check(db, ids)
    print(report)
    report.assert_clean()  # nothing lost, no outcome written twice

    history = transitions(db)
    held, back = taken_back(history, lost_pids, since=killed_at)
    assert held, "the kill found no job held by the lost host: nothing was tested"

    finals = dict(db.execute("SELECT id, attempts FROM job_all").fetchall())
    runs = runs_by_host(db)
    twice = {job_id for job_id, hosts in runs.items() if sum(hosts.values()) > 1}
    for job_id in held:
        steps = history[job_id]
        assert steps[-1]["new_state"] == "done"
        assert pid_of(steps[-1]["old_locked_by"]) not in lost_pids  # a survivor's outcome
        assert runs[job_id][lost.name] <= 1, runs[job_id]
        assert sum(runs[job_id][h.name] for h in survivors) == 1, runs[job_id]
        assert finals[job_id] == 1, (job_id, finals[job_id])  # the lost attempt refunded
    # A second execution only of a job the lost host held: at-least-once, no more.
    assert twice <= held, sorted(map(str, twice - held))[:5]
    assert all(n == 1 for n in finals.values()), Counter(finals.values())
    reaped = sum(
        int(n)
        for h in survivors
        for n in re.findall(r"event=jobs_reaped count=(\d+)", fleet.masters[h.name].log())
    )
    assert reaped >= len(held)
    for h in survivors:
        m = fleet.masters[h.name]
        assert m.proc.poll() is None and all(process_alive(k) for k in m.children())
        assert "event=master_fatal" not in m.log()
    print(
        f"FLEET host lost: {total} jobs on {HOSTS} hosts x {WORKERS} children, "
        f"{len(lost_pids)} processes SIGKILLed with {len(held)} jobs held; reaped "
        f"{reaped}, the last {(back - killed_at).total_seconds():.1f}s after the kill "
        f"(lease {LEASE:g}s); {len(twice)} executed twice (at-least-once); all done "
        f"{recovered:.1f}s after the kill; {seconds:.2f}s in all, "
        f"{rate:,.0f} jobs/s; executions per host {dict(sorted(executions_by_host(db).items()))}"
    )
    for h in survivors:
        fleet.masters[h.name].signal(signal.SIGTERM)
    for h in survivors:
        assert fleet.masters[h.name].wait() == 0


def test_a_cut_off_host_heals_and_writes_no_outcome_twice(
    fleet: Fleet, queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    """One host's link cut while the fleet drains: its processes alive, their packets
    dropped, no connection closed (a network partition), for longer than the lease. The
    other hosts take back what it held once each lease has run out and finish the
    queue. Then the link comes back: the late outcomes of the cut-off host change
    nothing (no outcome twice), and it works again: new jobs run there too."""
    audit.install(db)
    db.execute(TRANSITIONS)
    total = 3_000
    fleet.start_all()
    cut, others = fleet.hosts[1], [fleet.hosts[0], fleet.hosts[2]]
    cut_master = fleet.masters[cut.name]
    ids, _ = enqueue_at_once(
        queue, [brooq.Job("fleet.work", {"sleep": 0.001}) for _ in range(total)]
    )
    wait_for(lambda: states(db).get("done", 0) >= total // 3, timeout=60, what="a third done")
    cut.link(up=False)
    cut_at = db.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
    try:
        wait_for(lambda: states(db) == {"done": total}, timeout=60, what="the rest done")
    finally:
        cut.link(up=True)
    healed = time.monotonic()
    # Every pid the cut-off master named (itself, its children, any it forked since).
    cut_pids = {int(p) for p in re.findall(r"pid=(\d+)", cut_master.log())}
    held, back = taken_back(transitions(db), cut_pids, since=cut_at)
    assert held, "the cut found no job held by the cut-off host: nothing was tested"

    more, _ = enqueue_at_once(queue, [brooq.Job("fleet.work") for _ in range(600)])
    wait_for(lambda: states(db) == {"done": total + 600}, timeout=60, what="the new jobs done")

    def worked_again() -> bool:
        row = db.execute(
            "SELECT count(*) FROM execution WHERE host = %s AND job_id = ANY(%s)",
            (cut.name, more),
        ).fetchone()
        return row is not None and row[0] > 0

    if not worked_again():  # all 600 went elsewhere: give it a job of its own to take
        more += [queue.enqueue(brooq.Job("fleet.work", {"sleep": 0.2}))[0] for _ in range(20)]
        wait_for(worked_again, timeout=30, what="the cut-off host working again")
    back_to_work = time.monotonic() - healed
    # The jobs given to it may still run on any host when it takes its first: all done
    # before the audit counts them.
    wait_for(lambda: states(db) == {"done": total + len(more)}, timeout=60, what="every job done")
    report = audit.check(db, ids + more)
    print(report)
    report.assert_clean()  # no late outcome of the cut-off host counted
    runs = runs_by_host(db)
    twice = {job_id for job_id, hosts in runs.items() if sum(hosts.values()) > 1}
    assert twice <= held, sorted(map(str, twice - held))[:5]
    finals = dict(db.execute("SELECT id, attempts FROM job_all").fetchall())
    assert all(finals[job_id] == 1 for job_id in held)
    log = cut_master.log()
    refused = log.count("event=outcome_skipped") + log.count("nothing written")
    assert cut_master.proc.poll() is None and "event=master_fatal" not in log
    for h in others:
        assert "event=master_fatal" not in fleet.masters[h.name].log()
    print(
        f"FLEET host cut off: {len(held)} jobs held, the last back "
        f"{(back - cut_at).total_seconds():.1f}s after the cut (lease {LEASE:g}s); "
        f"{len(twice)} executed twice; {refused} late outcomes dropped once the link was "
        f"back; working again {back_to_work:.1f}s after it"
    )
