"""The middleware chain (brooq.worker.chain): sync and async, the first middleware outermost."""

from __future__ import annotations

import asyncio
from typing import Any

from brooq.worker.chain import compose, compose_async

# -- middleware kinds, the async chain -------------------------------------------------------------


async def ahandler(claim: Any) -> Any:
    return ["handler"]


def test_compose_async_runs_the_first_middleware_outermost() -> None:
    def layer(name: str) -> Any:
        async def mw(claim: Any, call_next: Any) -> Any:
            return [f"{name}>", *(await call_next(claim)), f"<{name}"]

        return mw

    assert compose_async(ahandler, ()) is ahandler  # no middleware: the handler itself
    runner = compose_async(ahandler, [layer("a"), layer("b")])
    assert asyncio.run(runner(None)) == ["a>", "b>", "handler", "<b", "<a"]


def test_no_middleware_is_the_handler_itself() -> None:
    def fn(claim: Any) -> None:
        return None

    assert compose(fn, ()) is fn


def test_the_first_middleware_is_outermost() -> None:
    seen: list[str] = []

    def layer(name: str) -> Any:
        def run(claim: Any, call_next: Any) -> Any:
            seen.append(f"in:{name}")
            value = call_next(claim)
            seen.append(f"out:{name}")
            return (name, value)

        return run

    def fn(claim: Any) -> str:
        seen.append("fn")
        return "v"

    runner = compose(fn, (layer("a"), layer("b"), layer("c")))
    assert runner(None) == ("a", ("b", ("c", "v")))
    assert seen == ["in:a", "in:b", "in:c", "fn", "out:c", "out:b", "out:a"]
