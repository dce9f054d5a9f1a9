"""The application the failover tests (tests/ha/) run under two real brooq-masters.

Every run of a handler is recorded as two lines appended to the file named by
BROOQ_HA_RUNS, outside the database (a failover must not lose or fail the record):
``start <job id> <child pid> <master pid> <attempt> <unix time>`` when the handler begins
and ``end ...`` when it returns. Each line is one write(2) to a file opened with
O_APPEND, so the lines of every child of both masters never interleave. The payload's
``sleep`` makes a job run that many seconds.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import brooq

queue = brooq.Queue()

_fd = -1
_fd_pid = 0


def record(kind: str, claim: brooq.Claim[Any]) -> None:
    global _fd, _fd_pid
    if _fd < 0 or _fd_pid != os.getpid():
        _fd = os.open(os.environ["BROOQ_HA_RUNS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        _fd_pid = os.getpid()
    line = f"{kind} {claim.id} {os.getpid()} {os.getppid()} {claim.attempt} {time.time():.6f}\n"
    os.write(_fd, line.encode())


def _seconds(claim: brooq.Claim[Any]) -> float:
    payload = claim.payload
    return float(payload.get("sleep", 0)) if isinstance(payload, dict) else 0.0


@queue.handler("ha.work")
def work(claim: brooq.Claim[Any]) -> None:
    record("start", claim)
    if seconds := _seconds(claim):
        time.sleep(seconds)
    record("end", claim)


@queue.handler("ha.awork")
async def awork(claim: brooq.Claim[Any]) -> None:
    record("start", claim)
    if seconds := _seconds(claim):
        await asyncio.sleep(seconds)
    record("end", claim)
