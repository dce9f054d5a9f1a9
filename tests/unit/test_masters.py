"""brooq.operator.masters: the masters' table as its readers see it (pure)."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from brooq.operator.masters import MasterRow, handled, no_handler, pairs, unhandled

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=timezone.utc)


def row(pid: int, queues: list[str], topics: list[str], children: Any = "[]") -> MasterRow:
    return MasterRow.from_row(
        {
            "id": uuid.UUID(int=pid),
            "host": "h1",
            "pid": pid,
            "version": "0.1.0",
            "app": "app:queue",
            "queues": queues,
            "topics": topics,
            "children": children,
            "beat_seconds": 10.0,
            "started_at": T0,
            "seen_at": T0 + timedelta(seconds=30),
            "seen_seconds_ago": 1.25,
        }
    )


# -- brooq.operator.masters ----------------------------------------------------------------------


def test_a_master_handles_its_topics_in_every_queue_it_works() -> None:
    assert pairs(["default", "bulk"], ["a", "b"]) == {
        ("default", "a"),
        ("default", "b"),
        ("bulk", "a"),
        ("bulk", "b"),
    }
    live = handled([row(1, ["default"], ["a"]), row(2, ["bulk"], ["b"])])
    assert ("default", "a") in live and ("bulk", "b") in live
    assert ("default", "b") not in live and ("bulk", "a") not in live
    assert no_handler("default", "b", 3, live)  # b runs in bulk only
    assert not no_handler("default", "b", 0, live)  # nothing ready: nothing to say
    assert not no_handler("bulk", "b", 3, live)
    rows = [
        {"queue": "default", "topic": "a", "ready": 5},
        {"queue": "default", "topic": "typo", "ready": 2},
        {"queue": "default", "topic": "gone", "ready": 0},
        {"queue": "nobody", "topic": "a", "ready": 1},
    ]
    assert unhandled(rows, live) == {("default", "typo"): 2, ("nobody", "a"): 1}
    assert unhandled(rows, frozenset()) == {
        ("default", "a"): 5,
        ("default", "typo"): 2,
        ("nobody", "a"): 1,
    }


def test_a_row_as_read_and_as_json() -> None:
    child = {"pid": 7, "kind": "async", "generation": 2, "started_at": T0.isoformat()}
    for children in (json.dumps([child]), [child]):  # jsonb arrives parsed; text too
        m = row(5, ["default"], ["a"], children)
        assert m.children[0].pid == 7 and m.children[0].started_at == T0
    d = m.to_dict()
    assert d["children"] == [child] and d["seen_seconds_ago"] == 1.25
    assert d["id"] == str(uuid.UUID(int=5)) and d["started_at"] == T0.isoformat()
    assert json.loads(json.dumps(d)) == d


# -- the watch ---------------------------------------------------------------------------------


# -- the limits the masters publish ---------------------------------------------------------


def test_a_row_reads_its_limits_and_the_latest_master_gives_a_topics() -> None:
    from dataclasses import replace

    from brooq.operator.masters import MISSED_BEATS, topic_limits
    from brooq.sql import Q

    old = replace(row(1, ["default"], ["a"]), limits={"a": {"rate_limit": {"text": "5/s"}}})
    raw = {**old.to_dict(), "limits": json.dumps({"a": {"global_limit": 2}, "bad": 3})}
    for key in ("id", "started_at", "seen_at"):
        raw[key] = getattr(old, key)
    raw["seen_at"] = old.seen_at + timedelta(seconds=5)
    new = MasterRow.from_row(raw)
    assert new.limits == {"a": {"global_limit": 2}}  # what is not an object is left out
    assert row(2, ["default"], ["a"]).limits == {}  # an older brooq's row: none
    assert topic_limits([new, old]) == {"a": {"global_limit": 2}}
    assert new.to_dict()["limits"] == {"a": {"global_limit": 2}}
    # The statements of what the limits hold back count a row live as brooq.operator.masters does.
    for statement in (Q.topic_limits_held, Q.job_held_by_topic):
        assert f"m.beat_seconds * {MISSED_BEATS})" in statement
