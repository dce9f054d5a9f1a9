"""The claim rows read by name (brooq.worker.roundtrip.claim_row)."""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timezone

import pytest

from brooq.sql import Q
from brooq.worker.roundtrip import ClaimRow, claim_row

# -- the claim rows, by name -----------------------------------------------------------------


def test_the_claim_row_fields_are_the_columns_of_the_claim_statement() -> None:
    """ClaimRow names the columns of each claim statement's result, in order."""
    for name in ("", "_queues", "_limited", "_results", "_queues_results", "_limited_results"):
        statement = getattr(Q, f"job_finish_and_claim{name}")
        select = re.search(r"^SELECT true AS claimed, (.*?)\nFROM", statement, re.M | re.S)
        assert select is not None, name
        columns = ["claimed"] + [c.strip() for c in select.group(1).split(",")]
        assert tuple(columns) == ClaimRow._fields, name


class _FakeResult:
    def __init__(self, names: list[str]) -> None:
        self.names = [n.encode() for n in names]
        self.nfields = len(names)

    def fname(self, i: int) -> bytes:
        return self.names[i]


class _FakeCursor:
    def __init__(self, names: list[str] | None) -> None:
        self.pgresult = None if names is None else _FakeResult(names)


def test_claim_row_makes_named_rows_from_the_positions() -> None:
    make = claim_row(_FakeCursor(list(ClaimRow._fields)))  # type: ignore[arg-type]
    job_id = uuid.uuid4()
    now = datetime.now(timezone.utc)
    row = make([True, job_id, "t", {"n": 1}, 2, "h:1:x", now, now, "bulk", 7])
    assert (row.claimed, row.id, row.topic, row.payload) == (True, job_id, "t", {"n": 1})
    assert (row.attempts, row.locked_by, row.locked_until, row.available_at) == (
        2,
        "h:1:x",
        now,
        now,
    )
    assert (row.queue, row.priority) == ("bulk", 7)


@pytest.mark.parametrize(
    "names",
    [
        None,
        ["claimed", "id", "topic", "payload", "attempts", "locked_by", "locked_until"],
        ["claimed", "id", "topic", "payload", "attempt", "locked_by", "locked_until", "at"],
        ["id", "claimed", "topic", "payload", "attempts", "locked_by", "locked_until", "x"],
    ],
)
def test_claim_row_refuses_columns_that_are_not_its_fields(names: list[str] | None) -> None:
    import psycopg

    with pytest.raises(psycopg.ProgrammingError):
        claim_row(_FakeCursor(names))  # type: ignore[arg-type]
