"""The application of tests/process/test_handlers.py: middleware, typed payloads, results and
retry policies. Middleware and handlers append "job_id what detail" lines to a file of
their own process in BROOQ_TRACE (a directory), so the tests read the order in which
things ran inside the real children.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import brooq

queue = brooq.Queue()


def trace(claim: brooq.Claim[Any], what: str, detail: object = "") -> None:
    path = Path(os.environ["BROOQ_TRACE"]) / f"{os.getpid()}.log"
    with open(path, "a", encoding="utf-8") as fh:  # one short write: whole lines
        fh.write(f"{claim.id} {what} {detail}\n")


def outer_name(name: str) -> brooq.declare.handlers.Middleware:
    def layer(claim: brooq.Claim[Any], call_next: brooq.declare.handlers.HandlerFn) -> Any:
        trace(claim, f"in:{name}", type(claim.payload).__name__)
        try:
            value = call_next(claim)
        except Exception as exc:
            trace(claim, f"raised:{name}", type(exc).__name__)
            raise
        trace(claim, f"out:{name}", repr(value))
        return value

    return layer


queue.middleware(outer_name("g1"))
queue.middleware(outer_name("g2"))


@queue.handler("h.order", middleware=[outer_name("topic")])
def order(claim: brooq.Claim[Any]) -> dict[str, int]:
    trace(claim, "handler")
    return {"n": 42}


@queue.handler("h.fails", max_attempts=1)
def fails(claim: brooq.Claim[Any]) -> None:
    trace(claim, "handler")
    raise ValueError("boom")


@dataclass
class Address:
    city: str
    zip: str


@dataclass
class Signup:
    user_id: int
    email: str
    address: Address
    tags: list[str] = field(default_factory=list)


@dataclass
class Receipt:
    user_id: int
    welcomed: bool


@queue.handler("h.typed", payload=Signup)
def typed(claim: brooq.Claim[Signup]) -> Receipt:
    signup = claim.payload
    trace(claim, "handler", f"{type(signup).__name__}:{signup!r}")
    return Receipt(user_id=signup.user_id, welcomed=True)


@queue.handler("h.sum")
def add(claim: brooq.Claim[Any]) -> dict[str, int]:
    time.sleep(float(claim.payload.get("sleep", 0)))
    return {"sum": claim.payload["a"] + claim.payload["b"]}


@queue.handler("h.too-big", max_attempts=1)
def too_big(claim: brooq.Claim[Any]) -> str:
    claim.chain(brooq.Job("h.order"))  # must not be written: the attempt fails
    return "x" * (2 * 1024 * 1024)


@queue.handler("h.unserialisable", max_attempts=1)
def unserialisable(claim: brooq.Claim[Any]) -> object:
    return {"when": object()}


@queue.handler("h.give-up", max_attempts=5, retry=lambda attempt, exc: None)
def give_up(claim: brooq.Claim[Any]) -> None:
    trace(claim, "handler", claim.attempt)
    raise RuntimeError("not worth retrying")


def later_each_time(attempt: int, exc: BaseException) -> timedelta | None:
    return timedelta(milliseconds=100 * attempt) if attempt < 3 else None


@queue.handler("h.policy", max_attempts=10, retry=later_each_time)
def with_policy(claim: brooq.Claim[Any]) -> None:
    trace(claim, "handler", claim.attempt)
    raise RuntimeError(f"attempt {claim.attempt} failed")


def broken_policy(attempt: int, exc: BaseException) -> timedelta | None:
    raise KeyError("policy bug")


@queue.handler("h.broken-policy", max_attempts=2, backoff_base="100ms", retry=broken_policy)
def with_broken_policy(claim: brooq.Claim[Any]) -> None:
    trace(claim, "handler", claim.attempt)
    raise RuntimeError("fails")


def hangs(claim: brooq.Claim[Any], call_next: brooq.declare.handlers.HandlerFn) -> Any:
    time.sleep(5)
    return call_next(claim)


@queue.handler("h.slow-middleware", attempt_timeout="300ms", max_attempts=1, middleware=[hangs])
def behind_a_slow_middleware(claim: brooq.Claim[Any]) -> None:
    trace(claim, "handler")


def swallows(claim: brooq.Claim[Any], call_next: brooq.declare.handlers.HandlerFn) -> Any:
    try:
        return call_next(claim)
    except ValueError:
        return "swallowed"


@queue.handler("h.swallowed", max_attempts=1, middleware=[swallows])
def swallowed(claim: brooq.Claim[Any]) -> None:
    raise ValueError("handled by a middleware")
