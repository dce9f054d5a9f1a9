"""brooq application of the groups workloads (benchmarks/groups.py): one no-op topic,
``bench.groups``, declared as BENCH_GROUPS asks: "fair" (fair_groups=True), "limit:N"
(group_limit=N), or "plain" (neither)."""

from __future__ import annotations

import os

import brooq

queue = brooq.Queue()
_MODE = os.environ.get("BENCH_GROUPS", "plain")
_OPTIONS: dict[str, object] = {}
if _MODE == "fair":
    _OPTIONS["fair_groups"] = True
elif _MODE.startswith("limit:"):
    _OPTIONS["group_limit"] = int(_MODE.split(":", 1)[1])


@queue.handler("bench.groups", **_OPTIONS)  # type: ignore[arg-type]
def noop(claim: brooq.Claim) -> None:
    return None
