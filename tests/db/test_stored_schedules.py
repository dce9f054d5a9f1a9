"""Periodic schedules stored in the database through Queue: added, listed, changed (cron
and every replace each other), paused and resumed, run now, removed; a bad schedule is
refused with every problem named before anything is written, as queue.periodic refuses
one."""

from __future__ import annotations

from typing import Any

import pytest

import brooq


def test_a_stored_schedule_round_trip(queue: brooq.Queue, db: Any) -> None:
    added = queue.add_schedule(
        "nightly", "report.build", {"kind": "daily"}, cron="0 3 * * *", tz="Europe/Paris"
    )
    assert (added.cron, added.every, added.tz, added.backfill) == (
        "0 3 * * *",
        None,
        "Europe/Paris",
        0,
    )
    [listed] = queue.stored_schedules()
    assert (listed.name, listed.topic, listed.payload) == (
        "nightly",
        "report.build",
        {"kind": "daily"},
    )
    assert listed.to_dict()["next_tick"].endswith("+00:00")
    changed = queue.change_schedule("nightly", every="15m", backfill=4)
    assert (changed.cron, changed.every, changed.backfill) == (None, 900, 4)
    assert queue.pause_schedule("nightly").paused
    assert queue.stored_schedules("nightly")[0].to_dict()["next_tick"] is None
    assert not queue.resume_schedule("nightly").paused
    job_id = queue.run_schedule("nightly")
    record = queue.get(job_id)
    assert record is not None and record.payload == {"kind": "daily"}
    assert queue.remove_schedule("nightly") is True
    assert queue.remove_schedule("nightly") is False
    assert queue.stored_schedules() == []


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"cron": "61 * * * *"}, brooq.InvalidSettings, "Bad minute"),
        ({"cron": "* * * * *", "every": "1m"}, brooq.InvalidSettings, "exactly one of"),
        ({}, brooq.InvalidSettings, "exactly one of"),
        ({"every": "0.5s"}, brooq.InvalidSettings, "at least 1s"),
        ({"every": "1m", "tz": "Mars/Olympus"}, brooq.InvalidSettings, "unknown time zone"),
        ({"every": "1m", "backfill": 5000}, brooq.InvalidSettings, "backfill"),
        ({"every": "1m", "topic": "Bad Topic"}, brooq.InvalidTopic, "does not match"),
        ({"every": "1m", "queue": "Bad"}, brooq.InvalidQueue, "does not match"),
        ({"every": "1m", "priority": 40000}, brooq.InvalidPriority, "-32768 to 32767"),
    ],
)
def test_a_bad_schedule_is_refused_before_anything_is_written(
    queue: brooq.Queue, db: Any, kwargs: dict[str, Any], error: type, text: str
) -> None:
    topic = kwargs.pop("topic", "report.build")
    with pytest.raises(error, match=text):
        queue.add_schedule("bad", topic, **kwargs)
    assert db.execute("SELECT count(*) FROM brooq_schedule").fetchone() == (0,)


def test_a_name_stored_twice_or_unknown_is_said(queue: brooq.Queue, db: Any) -> None:
    queue.add_schedule("once", "t.x", every="1m")
    with pytest.raises(brooq.BrooqError, match="a schedule named 'once' exists"):
        queue.add_schedule("once", "t.x", every="5m")
    with pytest.raises(brooq.BrooqError, match="no stored schedule named 'other'"):
        queue.change_schedule("other", every="1m")
    with pytest.raises(brooq.BrooqError, match="takes no zone"):
        queue.change_schedule("once", zone="UTC")
    assert queue.stored_schedules("once")[0].every == 60
