"""Group limits, fair groups and the groups' own limits and rates across real brooq-master
processes (tests/apps/brooq_ratesapp.py stamps every start): never more of a group
running than its limit, never more of its starts than its own rate in any window, a small
tenant served while a big one's backlog is still there, a change from the command line
obeyed by every master. Apart from tests/process/test_rate_limits.py, whose rate nearly
reached needs the machine to itself (tests/conftest.py, SERIAL): these hold on a busy
machine too."""

from __future__ import annotations

import itertools
import os
import signal
import time
from typing import Any

import psycopg

import brooq
from tests.harness import wait_for
from tests.process.test_rate_limits import (
    APP,
    StartMaster,
    count,
    most_in_a_window,
    stamp_table,
    stamps,
    stop,
)

__all__ = ["stamp_table"]  # the fixture, used by name


def test_group_limit_holds_per_group_and_a_small_tenant_is_not_starved(
    queue: brooq.Queue,
    db: psycopg.Connection[Any],
    start_master: StartMaster,
    stamp_table: None,
) -> None:
    """group_limit=1, 1,000 jobs of tenant A enqueued before 10 of tenant B and 10 of
    tenant C, two masters of 3 children: B's and C's jobs have all run while most of A's
    backlog still waits (the masters are stopped then), and never did two jobs of one
    tenant run at once (from the handlers' start and end stamps)."""
    queue.enqueue_many([brooq.Job("tenant.work", group="A") for _ in range(1000)])
    queue.enqueue_many([brooq.Job("tenant.work", group=g) for g in "BC" for _ in range(10)])
    env = {"BROOQ_JOB_SLEEP": "0.005"}
    masters = [start_master(app=APP, workers=3, env=env) for _ in range(2)]
    for m in masters:  # both running before the stop: a SIGTERM during start-up ends by it
        m.wait_ready(3)
    wait_for(
        lambda: count(db, "group_key IN ('B', 'C') AND state = 'done'") == 20,
        timeout=60,
        what="the small tenants done",
    )
    a_left = count(db, "group_key = 'A' AND state <> 'done'")
    stop(masters)
    ran = stamps(db, "tenant.work")
    assert len(ran) == count(db, "state = 'done'")
    # A ran meanwhile, one at a time: the groups come in turn (C, B, then A), so A starts
    # about as often as each small tenant, one fewer when the last turn ends before A's.
    assert sum(1 for *_, g in ran if g == "A") >= 5
    for group in "ABC":
        spans = sorted((s, e) for _, s, e, _, g in ran if g == group)
        overlaps = [b[0] < a[1] for a, b in itertools.pairwise(spans)]
        assert not any(overlaps), f"two jobs of {group} ran at once"
    print(f"A's jobs still waiting when B and C were done: {a_left} of 1000")
    assert a_left > 500, a_left


def test_fair_groups_start_small_tenants_before_a_big_backlog(
    queue: brooq.Queue,
    db: psycopg.Connection[Any],
    start_master: StartMaster,
    stamp_table: None,
) -> None:
    """fair_groups, no cap: 2,000 jobs of tenant A enqueued before 3 of each of tenants B
    to F. The claims take the groups in turn, so the small tenants are done while nearly
    all of A's backlog still waits (in FIFO order they would wait for all of it)."""
    queue.enqueue_many([brooq.Job("tenant.fair", group="A") for _ in range(2000)])
    queue.enqueue_many([brooq.Job("tenant.fair", group=g) for g in "BCDEF" for _ in range(3)])
    masters = [start_master(app=APP, workers=2, env={"BROOQ_JOB_SLEEP": "0.002"})]
    wait_for(
        lambda: count(db, "group_key <> 'A' AND state = 'done'") == 15,
        timeout=60,
        what="the small tenants done",
    )
    a_left = count(db, "group_key = 'A' AND state <> 'done'")
    stop(masters)
    print(f"A's jobs still waiting when B to F were done: {a_left} of 2000")
    assert a_left > 1800, a_left


def test_group_limit_holds_under_two_masters_at_speed_and_through_a_kill(
    queue: brooq.Queue,
    db: psycopg.Connection[Any],
    dsn: str,
    start_master: StartMaster,
    stamp_table: None,
) -> None:
    """group_limit=2, 100 tenants of 30 jobs each, two masters of 3 children (batched
    claims of the groups in turn), one child SIGKILLed half-way: sampled every few
    milliseconds, no tenant ever has more than 2 jobs processing, and every job ends
    done."""
    queue.enqueue_many([brooq.Job("tenant.work", group=f"t{i % 100}") for i in range(3000)])
    env = {"BROOQ_GROUP_LIMIT": "2", "BROOQ_JOB_SLEEP": "0.002"}
    masters = [start_master(app=APP, workers=3, env=env) for _ in range(2)]
    most, samples = 0, 0
    killed = False
    with psycopg.connect(dsn, autocommit=True) as watcher:
        while count(db, "state = 'done'") < 3000:
            row = watcher.execute(
                "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM job "
                "WHERE state = 'processing' AND topic = 'tenant.work' GROUP BY group_key) g"
            ).fetchone()
            most, samples = max(most, int(row[0]) if row else 0), samples + 1
            if not killed and count(db, "state = 'done'") >= 1500:
                os.kill(masters[0].children()[0], signal.SIGKILL)
                killed = True
            assert samples < 20_000, "the jobs did not end"
    stop(masters)
    print(f"most jobs of one tenant processing at once: {most} ({samples} samples)")
    assert killed and 0 < most <= 2, most
    assert count(db, "state <> 'done'") == 0


def test_a_groups_own_limit_set_from_the_command_line_holds_on_every_master(
    queue: brooq.Queue,
    db: psycopg.Connection[Any],
    dsn: str,
    start_master: StartMaster,
    stamp_table: None,
) -> None:
    """group_limit=1 declared, two masters of 3 children running 50 ms jobs of tenant A:
    `brooq limits set tenant.work --group A --limit 3` lets three run at once on the
    fleet (and never more), `--limit 0` stops A's starts while its jobs wait."""
    import subprocess
    import sys

    def limits(*args: str) -> None:
        cmd = [sys.executable, "-m", "brooq", "--database", dsn, "limits", "set", *args]
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)

    queue.enqueue_many([brooq.Job("tenant.work", group="A") for _ in range(400)])
    env = {"BROOQ_GROUP_LIMIT": "1", "BROOQ_JOB_SLEEP": "0.05"}
    masters = [start_master(app=APP, workers=3, env=env) for _ in range(2)]
    busy = "state = 'processing' AND group_key = 'A'"
    wait_for(lambda: count(db, "state = 'done'") >= 3, what="A's jobs running one at a time")
    assert count(db, busy) <= 1
    limits("tenant.work", "--group", "A", "--limit", "3")
    seen: list[int] = []
    wait_for(lambda: seen.append(count(db, busy)) or seen[-1] == 3, what="three of A at once")
    for _ in range(100):
        seen.append(count(db, busy))
    assert max(seen) == 3, seen
    limits("tenant.work", "--group", "A", "--limit", "0")
    wait_for(lambda: count(db, busy) == 0, what="A's starts stopped")
    done = count(db, "state = 'done'")
    stop(masters)
    assert count(db, "state = 'done'") == done < 400  # none started since; the rest wait


def test_a_groups_own_rate_set_from_the_command_line_holds_on_every_master(
    queue: brooq.Queue,
    db: psycopg.Connection[Any],
    dsn: str,
    start_master: StartMaster,
    stamp_table: None,
) -> None:
    """group_rate_limit 100/s declared, two masters of 3 children: with `brooq limits set
    tenant.rated --group A --rate 5/s` A never starts more than 5 jobs in any second while
    B runs at the topic's rate; `brooq limits clear ... --rate` gives A the topic's back."""
    import subprocess
    import sys

    def limits(*args: str) -> None:
        cmd = [sys.executable, "-m", "brooq", "--database", dsn, "limits", *args]
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)

    limits("set", "tenant.rated", "--group", "A", "--rate", "5/s")
    queue.enqueue_many([brooq.Job("tenant.rated", group=g) for g in "AB" for _ in range(40)])
    masters = [start_master(app=APP, workers=3) for _ in range(2)]
    wait_for(lambda: count(db, "state = 'done' AND group_key = 'B'") == 40, what="B done")
    a_done = count(db, "state = 'done' AND group_key = 'A'")
    assert a_done < 20  # B's 40 took well under 4 s: A ran at its own 5/s meanwhile
    wait_for(lambda: count(db, "state = 'done' AND group_key = 'A'") >= 15, what="A at 5/s")
    cleared_ns = time.time_ns()  # every start before it was claimed under A's own rate
    limits("clear", "tenant.rated", "--group", "A", "--rate")
    wait_for(lambda: count(db, "state = 'done' AND group_key = 'A'") == 40, timeout=10,
             what="A at the topic's rate")  # fmt: skip
    stop(masters)
    ran = stamps(db, "tenant.rated")
    a_starts = [start for _, start, _, _, group in ran if group == "A"]
    before = [at for at in a_starts if at < cleared_ns]
    assert len(before) >= 15
    assert most_in_a_window(before, 1_000_000_000) <= 5
    assert len(ran) == 80
