"""brooq application of the groups workloads (benchmarks/groups.py, run.py's grouped and
rated drains): one no-op topic, ``bench.groups``, declared as BENCH_GROUPS asks, a comma
between options: "fair" (fair_groups=True), "limit:N" (group_limit=N), "rate:N/s"
(rate_limit), "grouprate:N/s" (group_rate_limit), or "plain" (none)."""

from __future__ import annotations

import os

import brooq

queue = brooq.Queue()
_MODE = os.environ.get("BENCH_GROUPS", "plain")
_OPTIONS: dict[str, object] = {}
for _option in _MODE.split(","):
    if _option == "fair":
        _OPTIONS["fair_groups"] = True
    elif _option.startswith("limit:"):
        _OPTIONS["group_limit"] = int(_option.split(":", 1)[1])
    elif _option.startswith("rate:"):
        _OPTIONS["rate_limit"] = _option.split(":", 1)[1]
    elif _option.startswith("grouprate:"):
        _OPTIONS["group_rate_limit"] = _option.split(":", 1)[1]


@queue.handler("bench.groups", **_OPTIONS)  # type: ignore[arg-type]
def noop(claim: brooq.Claim) -> None:
    return None
