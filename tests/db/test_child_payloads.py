"""What the child's connection (brooq.worker.connection) reads of a json or jsonb payload:
what json reads of the text PostgreSQL sends, or an Undecodable that fails the job."""

from __future__ import annotations

import json
from typing import Any

import pytest

from brooq.settings import Settings
from brooq.worker.connection import ChildConnection, Undecodable
from brooq.worker.state import ChildState

VALUES = [
    "null",
    "{}",
    '{"a": [1, 2.5, -0, 1e400, true, null, "\\u00e9\\ud83d\\ude00 \\\\ \\""]}',
    '"é✓𝄞"',
    "[" * 3000 + "]" * 3000,  # deeper than Python's recursion limit: Undecodable
]


@pytest.mark.parametrize("kind", ["json", "jsonb"])
def test_the_child_reads_a_payload_as_json_reads_its_text(dsn: str, kind: str) -> None:
    db = ChildConnection(dsn, "test:1:payloads", Settings(), ChildState())
    try:
        conn = db.get()
        for value in VALUES:
            row = conn.execute(f"SELECT %s::{kind}, %s::{kind}::text", (value, value)).fetchone()
            assert row is not None
            got, text = row
            try:
                expected: Any = json.loads(text)
            except RecursionError:
                assert isinstance(got, Undecodable) and str(got).startswith("RecursionError")
                continue
            assert repr(got) == repr(expected), value[:20]
    finally:
        db.drop()
