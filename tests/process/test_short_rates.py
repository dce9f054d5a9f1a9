"""A rate of the shortest period, Rate(1, per=100ms), under a real brooq-master with a
backlog of a fixed number of jobs (tests/apps/brooq_shortrateapp.py stamps every start):
never two handler starts within the period, from the handlers' own start stamps. The
share of the rate reached and the claims given back late are printed (brooq.declare.rates has
the figures: they depend on the host's load, so they are not asserted)."""

from __future__ import annotations

import itertools
from typing import Any

import psycopg

import brooq
from tests.harness import StartMaster, wait_for

APP = "brooq_shortrateapp:queue"
JOBS = 40
PERIOD = 0.1


def starts(db: psycopg.Connection[Any]) -> list[int]:
    return [int(r[0]) for r in db.execute("SELECT started_ns FROM stamp ORDER BY started_ns")]


def test_the_shortest_period_holds_for_the_handlers(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    db.execute("CREATE TABLE stamp (job_id uuid, started_ns bigint)")
    queue.enqueue_many([brooq.Job("api.short", {"n": i}) for i in range(JOBS)])
    m = start_master(workers=2, app=APP, env={"BROOQ_RATE_PERIOD": str(PERIOD)})
    wait_for(lambda: len(starts(db)) >= JOBS, timeout=60, what="every job started")
    stamped = starts(db)
    assert len(stamped) == JOBS  # each job started once
    gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(stamped)]
    assert min(gaps) >= PERIOD, min(gaps)  # the rate, as the handlers see it
    reached = (JOBS - 1) * PERIOD / ((stamped[-1] - stamped[0]) / 1e9)
    late = m.log().count("because=late_start")
    print(f"Rate(1, per=100ms): {reached:.0%} of the rate reached, {late} given back late")
