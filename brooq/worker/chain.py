"""The middleware chain of a topic, composed once when the child starts (and after a
reload), never per job.

Owns `compose` (and `compose_async`, its twin for async handlers and middleware): the
Queue's middleware in registration order (the first is outermost),
then the topic's own, then the handler. With no middleware the runner is the handler
itself, so a topic without middleware pays nothing; each layer costs one Python call.

Must never: wrap brooq's own logging, metrics or outcome code (they stay outside the
chain, in brooq.worker.child, so no middleware can drop them), or catch what a layer
raises (a failing middleware fails the attempt like its handler).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from brooq.declare.handlers import HandlerFn, Middleware
from brooq.job import Claim


def compose(fn: HandlerFn, middlewares: Sequence[Middleware]) -> HandlerFn:
    """``fn`` wrapped by ``middlewares``, the first outermost."""
    call = fn
    for layer in reversed(middlewares):
        call = _link(layer, call)
    return call


def compose_async(fn: HandlerFn, middlewares: Sequence[Middleware]) -> HandlerFn:
    """The async twin: ``fn`` (an async handler) wrapped by async ``middlewares``, the
    first outermost; each layer awaits ``call_next(claim)``."""
    call = fn
    for layer in reversed(middlewares):
        call = _link_async(layer, call)
    return call


def _link_async(layer: Middleware, inner: HandlerFn) -> Callable[[Claim[Any]], Any]:
    async def run(claim: Claim[Any]) -> Any:
        return await layer(claim, inner)

    return run


def _link(layer: Middleware, inner: HandlerFn) -> Callable[[Claim[Any]], Any]:
    def run(claim: Claim[Any]) -> Any:
        return layer(claim, inner)

    return run
