"""The beat's statement against a real database: its row, the others', the sweep."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from typing import Any

import psycopg

from brooq.operator import masters
from brooq.sql import Q

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=timezone.utc)


def test_master_beat_writes_its_row_reads_the_others_and_sweeps_when_asked(
    db: psycopg.Connection[Any],
) -> None:
    insert = (
        "INSERT INTO brooq_master (id, host, pid, version, app, queues, topics, beat_seconds, "
        "started_at, seen_at) VALUES (%s, 'h', %s, '0', 'a:q', %s, %s, 1, now(), "
        "now() - %s * interval '1 second')"
    )
    other, stale, me = uuid.UUID(int=1), uuid.UUID(int=2), uuid.UUID(int=3)
    db.execute(insert, [other, 1, ["default", "bulk"], ["a"], 0])
    db.execute(insert, [stale, 2, ["default"], ["gone"], 10])  # missed 10 beats of 1 s

    def beat(children: str, sweep: bool) -> set[tuple[str, str]]:
        params = [
            str(me), "h2", "3", "0.1.0", "app:queue", '["default"]', '["mine"]', children,
            "2.0", T0.isoformat(), "3", "true" if sweep else "false",
            '{"mine": {"queue": "default", "rate_limit": {"limit": 5, "per_seconds": 1.0, '
            '"text": "5/s"}}}',
        ]  # fmt: skip
        result = db.pgconn.exec_params(Q.master_beat.encode(), [p.encode() for p in params])
        assert result.status == psycopg.pq.ExecStatus.TUPLES_OK, result.error_message
        return {
            (result.get_value(r, 0).decode(), result.get_value(r, 1).decode())  # type: ignore[union-attr]
            for r in range(result.ntuples)
        }

    assert beat("[]", sweep=False) == {("default", "a"), ("bulk", "a")}  # not the stale one
    assert db.execute("SELECT count(*) FROM brooq_master").fetchone() == (3,)  # none swept
    child = [{"pid": 9, "kind": "sync", "generation": 0, "started_at": T0.isoformat()}]
    beat(json.dumps(child), sweep=True)
    rows = {m.id: m for m in masters.live(db)}
    assert set(rows) == {other, me}
    assert db.execute("SELECT count(*) FROM brooq_master").fetchone() == (2,)  # swept
    mine = rows[me]
    assert (mine.queues, mine.topics, mine.started_at) == (("default",), ("mine",), T0)
    assert [c.pid for c in mine.children] == [9] and mine.beat_seconds == 2.0
    assert mine.limits == {"mine": {"queue": "default", "rate_limit": {
        "limit": 5, "per_seconds": 1.0, "text": "5/s"}}}  # fmt: skip
    assert rows[other].limits == {}  # a row without (an older master's): none
    db.execute(Q.master_leave, {"id": me})
    assert [m.id for m in masters.live(db)] == [other]
