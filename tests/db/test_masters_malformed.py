"""A malformed or huge brooq_master row (bad children entries, limits that are not an
object, thousands of queues times thousands of topics) is read defensively and bounded:
`brooq fleet`, `stats` and `top` still answer, the row shown with a note."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest

from brooq.operator.masters import MAX_NAMES, handled, live
from brooq.sql import Q
from brooq.supervisor.duties.beat import BEAT_STATEMENT_TIMEOUT_MS
from tests.db.test_cli import ok, world  # noqa: F401  (a fixture)


def _bad_row(db: psycopg.Connection[Any], names: int) -> None:
    children = [{"pid": "x"}, "not an object", {"pid": 3, "started_at": "yesterday"},
                {"pid": 4, "kind": "sync", "generation": 1}]  # fmt: skip
    db.execute(
        "INSERT INTO brooq_master (id, host, pid, version, app, queues, topics, children,"
        " beat_seconds, started_at, limits) VALUES (%s, 'odd', 1, 'v', 'a', %s, %s, %s, 10,"
        " now(), %s)",
        (uuid.uuid4(), ["default", *(f"q{n}" for n in range(names))],
         ["mail", *(f"t{n}" for n in range(names))], json.dumps(children), "[1, 2]"),
    )  # fmt: skip


def test_a_huge_malformed_row_is_read_bounded_and_noted(db: psycopg.Connection[Any]) -> None:
    _bad_row(db, MAX_NAMES + 10)
    (row,) = live(db)
    assert len(row.queues) == len(row.topics) == MAX_NAMES
    assert [c.pid for c in row.children] == [4]
    assert "bad children entries" in row.malformed and "limits is not" in row.malformed
    assert ("default", "mail") in handled([row]) and ("default", "nope") not in handled([row])


@pytest.mark.usefixtures("world")
def test_the_commands_answer_with_a_huge_malformed_row(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    _bad_row(db, 3000)  # 9 million pairs, were they listed
    out = ok(dsn, "fleet")
    assert "malformed row" in out and "odd pid 1" in out
    assert json.loads(ok(dsn, "fleet", "--json"))["masters"][0]["malformed"]
    assert "mail" in ok(dsn, "stats")
    assert "IN FLIGHT" in ok(dsn, "top", "--once")
    ok(dsn, "queues")


@pytest.mark.usefixtures("world")
def test_a_limit_that_is_not_a_number_counts_as_none(dsn: str, db: psycopg.Connection[Any]) -> None:
    limits = {"mail": {"queue": "default", "global_limit": "lots", "group_limit": 1e30,
                       "rate_limit": {"limit": "x", "text": "x/s"}}}  # fmt: skip
    db.execute(
        "INSERT INTO brooq_master (id, host, pid, version, app, queues, topics, beat_seconds,"
        " started_at, limits) VALUES (%s, 'h', 1, 'v', 'a', %s, %s, 10, now(), %s)",
        (uuid.uuid4(), ["default"], ["mail"], json.dumps(limits)),
    )
    assert "mail" in ok(dsn, "stats")
    assert "mail" in ok(dsn, "queues")


def test_a_huge_row_does_not_stop_another_masters_beat(db: psycopg.Connection[Any]) -> None:
    """5,000 queues times 5,000 topics: the beat's read of the others is bounded, within
    the beat's own statement timeout."""
    _bad_row(db, 5000)
    db.execute(f"SET statement_timeout = {BEAT_STATEMENT_TIMEOUT_MS}")
    params = [str(uuid.uuid4()), "h2", "3", "0", "app:queue", '["default"]', '["mine"]',
              "[]", "2.0", "2030-01-01T00:00:00+00:00", "3", "false", "{}"]  # fmt: skip
    result = db.pgconn.exec_params(Q.master_beat.encode(), [p.encode() for p in params])
    assert result.status == psycopg.pq.ExecStatus.TUPLES_OK, result.error_message
    assert 0 < result.ntuples <= 100_000
