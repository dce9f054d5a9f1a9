"""The application of tests/process/test_ops_slow_clients.py: one handler that never returns.

`ops.hang` sleeps for ever and swallows every exception (AttemptTimeout included), so only
the master's hard timeout (SIGKILL at max_execution_timeout) ends it.
"""

from __future__ import annotations

import time

import brooq

queue = brooq.Queue()


@queue.handler("ops.hang", attempt_timeout="1s", max_execution_timeout="2s", max_attempts=1)
def hang(claim: brooq.Claim) -> None:
    while True:
        try:
            while True:
                time.sleep(0.05)
        except BaseException:
            continue


@queue.handler("ops.ok")
def ok(claim: brooq.Claim) -> None:
    return None
