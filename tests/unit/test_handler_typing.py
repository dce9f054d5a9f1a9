"""@queue.handler(...) returns the function it decorates, its type kept: a typed checker
sees the handler's own signature (its payload type, its return type, async or not) and
still calls it directly. This file is checked by mypy under the project's configuration
(strict) by the last test; the assert_type lines below are what mypy must confirm."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from typing_extensions import assert_type

import brooq

ROOT = Path(__file__).resolve().parents[2]
queue = brooq.Queue()


@dataclasses.dataclass
class Signup:
    user_id: int


@queue.handler("typing.signup", payload=Signup)
def signup(claim: brooq.Claim[Signup]) -> int:
    return claim.payload.user_id


@queue.handler("typing.async")
async def notify(claim: brooq.Claim[Any]) -> str:
    return "sent"


class Callable_:
    def __call__(self, claim: brooq.Claim[Any]) -> bytes:
        return b""


instance = queue.handler("typing.instance")(Callable_())


def test_the_decorator_returns_the_function_itself() -> None:
    assert queue.handlers["typing.signup"].fn is signup
    assert queue.handlers["typing.async"].fn is notify
    assert queue.handlers["typing.instance"].fn is instance
    assert signup.__name__ == "signup"


def checked_by_mypy_only() -> None:  # never called: what the types must be
    as_callable: Callable[[brooq.Claim[Signup]], int] = signup
    claim: brooq.Claim[Signup] = brooq.Claim.__new__(brooq.Claim)
    assert_type(signup(claim), int)
    assert_type(as_callable(claim), int)
    pending = assert_type(notify(claim), Coroutine[Any, Any, str])
    pending.close()
    assert_type(instance, Callable_)
    assert_type(instance(claim), bytes)


def test_mypy_sees_each_handler_with_its_own_type() -> None:
    from mypy import api

    out, err, code = api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--no-incremental",
            "--python-executable",
            sys.executable,
            __file__,
        ]
    )
    assert code == 0, out + err
