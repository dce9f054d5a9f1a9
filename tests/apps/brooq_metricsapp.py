"""The application of tests/prometheus/: a topic of each kind the dashboard and the alerts
watch. `m.ok` is done, `m.dead` dies at its one attempt, `m.spin` outlives its
max_execution_timeout (the master kills its child), `m.paced` is rate-limited (its
backlog is held back by the limit)."""

from __future__ import annotations

import brooq

queue = brooq.Queue()


@queue.handler("m.ok")
def ok(claim: brooq.Claim) -> None:
    return None


@queue.handler("m.dead", max_attempts=1)
def dead(claim: brooq.Claim) -> None:
    raise ValueError("this job dies")


@queue.handler("m.spin", attempt_timeout="300ms", max_execution_timeout="1s", max_attempts=1)
def spin(claim: brooq.Claim) -> None:
    """Loops and swallows every exception, brooq's included: only a kill ends it."""
    while True:
        try:
            while True:
                pass
        except BaseException:
            continue


@queue.handler("m.paced", rate_limit="1/s")
def paced(claim: brooq.Claim) -> None:
    return None
