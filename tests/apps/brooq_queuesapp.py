"""The application of tests/process/test_queues.py: topics in two queues and one topic
under a global_limit. Each handler appends "topic job_id start_ns end_ns pid master_pid"
to a file of its own process in BROOQ_STAMPS (a directory), so tests read what ran, where
and when, without a database write inside the measured span.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import brooq

queue = brooq.Queue()


def stamp(claim: brooq.Claim, started: int) -> None:
    line = f"{claim.topic} {claim.id} {started} {time.time_ns()} {os.getpid()} {os.getppid()}\n"
    path = Path(os.environ["BROOQ_STAMPS"]) / f"{os.getpid()}.log"
    with open(path, "a", encoding="ascii") as fh:  # one short write: whole lines
        fh.write(line)


def sleep_for(claim: brooq.Claim) -> None:
    if isinstance(claim.payload, dict) and claim.payload.get("sleep"):
        time.sleep(float(claim.payload["sleep"]))


@queue.handler("q.default")
def in_default(claim: brooq.Claim) -> None:
    started = time.time_ns()
    sleep_for(claim)
    stamp(claim, started)


@queue.handler("q.bulk", queue="bulk")
def in_bulk(claim: brooq.Claim) -> None:
    started = time.time_ns()
    sleep_for(claim)
    stamp(claim, started)


@queue.handler("api.limited", global_limit=4, attempt_timeout="30s")
def limited(claim: brooq.Claim) -> None:
    started = time.time_ns()
    time.sleep(float(os.environ.get("BROOQ_LIMITED_SLEEP", "0.1")))
    stamp(claim, started)
