"""The application the process tests run under a real brooq-master.

Every handler records its execution in the table `execution` over its own connection
(autocommit), so executions are counted apart from outcomes and survive rollbacks.
The payload steers what a handler does.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from typing import Any

import psycopg

import brooq

queue = brooq.Queue()
_conn: psycopg.Connection[Any] | None = None
_conn_pid = 0


def record(claim: brooq.Claim, note: str = "") -> None:
    global _conn, _conn_pid
    if _conn is None or _conn_pid != os.getpid() or _conn.closed:
        _conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
        _conn_pid = os.getpid()
    _conn.execute(
        "INSERT INTO execution (job_id, pid, attempt, note) VALUES (%s, %s, %s, %s)",
        (claim.id, os.getpid(), claim.attempt, note),
    )


@queue.handler("t.ok")
def ok(claim: brooq.Claim) -> None:
    record(claim)
    if isinstance(claim.payload, dict) and claim.payload.get("sleep"):
        time.sleep(float(claim.payload["sleep"]))


@queue.handler("t.echo")
def echo(claim: brooq.Claim) -> Any:
    """The payload back as the result (the payload's text through both directions)."""
    record(claim)
    return claim.payload


@queue.handler("t.fail", max_attempts=3, backoff_base="50ms", backoff_max="100ms")
def fail(claim: brooq.Claim) -> None:
    record(claim)
    raise ValueError(f"bad input on attempt {claim.attempt}")


def order_total(order: dict[str, Any]) -> int:
    return sum(order["prices"])


def share(total: float, count: int) -> float:
    return total / count


def price_per_item(order: dict[str, Any]) -> float:
    return share(order_total(order), len(order["prices"]))


@queue.handler("t.divide", max_attempts=2, backoff_base="50ms", backoff_max="100ms")
def divide(claim: brooq.Claim) -> None:
    """ZeroDivisionError two user functions down (an order without prices)."""
    record(claim)
    price_per_item({"prices": []})


def ping(n: int) -> int:
    return pong(n + 1)


def pong(n: int) -> int:
    return ping(n + 1)


@queue.handler("t.recurse", max_attempts=1)
def recurse(claim: brooq.Claim) -> None:
    """RecursionError through two functions calling each other: a traceback of about a
    thousand frames, which Python does not fold."""
    record(claim)
    ping(0)


@queue.handler("t.delay", max_attempts=3, backoff_max="30s")
def delay(claim: brooq.Claim) -> None:
    record(claim)
    raise brooq.Delay(claim.payload["seconds"])


@queue.handler("t.preserve", max_attempts=1, backoff_base="5s", backoff_max="10s")
def preserve(claim: brooq.Claim) -> None:
    record(claim)
    try:
        raise TimeoutError("upstream busy")
    except TimeoutError:
        raise RuntimeError("wrapped") from brooq.PreserveAttempt()  # signal as __cause__


@queue.handler("t.cancel")
def cancel(claim: brooq.Claim) -> None:
    record(claim)
    raise brooq.CancelJob("no longer relevant")


@queue.handler("t.chain")
def chain(claim: brooq.Claim) -> None:
    record(claim)
    claim.chain(brooq.Job("t.ok", {"parent": str(claim.id)}))
    # planner: enable_bitmapscan in the hook / the connection's own default, then the
    # same for enable_seqscan, enable_sort and plan_cache_mode
    claim.on_success(
        lambda conn: conn.execute(
            "INSERT INTO side_effect (job_id, planner) SELECT %s, "
            "string_agg(setting || '/' || reset_val, ' ' ORDER BY name) "
            "FROM pg_settings "
            "WHERE name IN ('enable_bitmapscan', 'enable_seqscan', 'enable_sort', "
            "'plan_cache_mode')",
            (claim.id,),
        )
    )
    if claim.payload.get("fail"):
        raise ValueError("parent failed")


@queue.handler("t.hookfail", max_attempts=2, backoff_base="50ms", backoff_max="100ms")
def hookfail(claim: brooq.Claim) -> None:
    record(claim)
    claim.chain(brooq.Job("t.ok", {"parent": str(claim.id)}))

    def broken(conn: psycopg.Connection[Any]) -> None:
        raise RuntimeError("hook exploded")

    claim.on_success(broken)


@queue.handler("t.slow", attempt_timeout="60s", max_execution_timeout="120s")
def slow(claim: brooq.Claim) -> None:
    record(claim, "start")
    deadline = time.monotonic() + float(claim.payload.get("seconds", 30))
    while time.monotonic() < deadline:
        time.sleep(0.05)
    record(claim, "end")


@queue.handler("t.soft", attempt_timeout="300ms", max_execution_timeout="10s", max_attempts=1)
def soft(claim: brooq.Claim) -> None:
    record(claim)
    try:
        time.sleep(5)
    finally:
        record(claim, "cleanup")


@queue.handler("t.spin", attempt_timeout="500ms", max_execution_timeout="1500ms", max_attempts=2)
def spin(claim: brooq.Claim) -> None:
    """Loops forever and swallows every exception, brooq's included."""
    record(claim)
    while True:
        try:
            while True:
                pass
        except BaseException:
            continue


@queue.handler("t.exit", max_attempts=3, backoff_base="50ms", backoff_max="100ms")
def exit_(claim: brooq.Claim) -> None:
    record(claim)
    os._exit(7)


@queue.handler("t.segv", max_attempts=2, backoff_base="50ms", backoff_max="100ms")
def segv(claim: brooq.Claim) -> None:
    record(claim)
    ctypes.string_at(0)


@queue.handler("t.selfkill", max_attempts=2, backoff_base="50ms", backoff_max="100ms")
def selfkill(claim: brooq.Claim) -> None:
    record(claim)
    os.kill(os.getpid(), signal.SIGKILL)


@queue.handler("t.cpu")
def cpu(claim: brooq.Claim) -> None:
    record(claim)
    n = 0
    for i in range(int(claim.payload.get("iterations", 300_000))):
        n += i * i % 7
    claim.on_success(lambda conn: None)


@queue.handler("t.memory")
def memory(claim: brooq.Claim) -> None:
    record(claim)
    global _ballast
    _ballast = bytearray(int(claim.payload["mib"]) * 1024 * 1024)
    for i in range(0, len(_ballast), 4096):
        _ballast[i] = 1


_ballast = bytearray()


# -- for tests/process/test_faults.py ------------------------------------------------------------


@queue.handler("t.tx", max_attempts=50, backoff_base="20ms", backoff_max="200ms")
def tx(claim: brooq.Claim) -> None:
    """Done through a transaction: the on_success side effect commits with the outcome, so
    exactly one side_effect row per done job proves the outcome was written once."""
    record(claim)
    claim.on_success(
        lambda conn: conn.execute("INSERT INTO side_effect (job_id) VALUES (%s)", (claim.id,))
    )


@queue.handler("t.hooksleep", max_attempts=50, backoff_base="20ms", backoff_max="200ms")
def hooksleep(claim: brooq.Claim) -> None:
    """The outcome transaction stays open (in pg_sleep, after the done UPDATE) for a while."""
    record(claim)
    seconds = float(claim.payload.get("seconds", 1))

    def slow_commit(conn: psycopg.Connection[Any]) -> None:
        conn.execute("INSERT INTO side_effect (job_id) VALUES (%s)", (claim.id,))
        conn.execute("SELECT pg_sleep(%s)", (seconds,))

    claim.on_success(slow_commit)


def _ordered(claim: brooq.Claim) -> None:
    """An ordered key's job: its start and end recorded, a short sleep between; the first
    attempt of a job whose payload says "fail_once" fails, and every attempt of one that
    says "die" raises."""
    record(claim, "start")
    time.sleep(float(claim.payload.get("sleep", 0.02)))
    record(claim, "end")
    if claim.payload.get("die") or (claim.payload.get("fail_once") and claim.attempt == 1):
        raise ValueError(f"ordered job fails on attempt {claim.attempt}")


queue.handler("t.ordered", max_attempts=3, backoff_base="50ms", backoff_max="100ms")(_ordered)
queue.handler("t.ordered_dead", max_attempts=1)(_ordered)
queue.handler("t.ordered_skip", max_attempts=1, ordering_skip_dead=True)(_ordered)
