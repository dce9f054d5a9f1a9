"""Async children (brooq.worker.aio): the await chain of a suspended task."""

from __future__ import annotations

import asyncio

from brooq.worker.traces import format_await_chain


def test_the_await_chain_of_a_suspended_task_names_every_coroutine_down_to_the_wait() -> None:
    async def inner() -> None:
        await asyncio.sleep(30)

    async def outer() -> None:
        await inner()

    async def main() -> str:
        task = asyncio.ensure_future(outer())
        await asyncio.sleep(0.01)
        text = format_await_chain(task)
        task.cancel()
        return text

    text = asyncio.run(main())
    assert text.startswith("Task await chain (most recent call last):")
    assert text.index("in outer") < text.index("in inner") < text.index("in sleep")
    assert "await inner()" in text
