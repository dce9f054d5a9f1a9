"""The job page reads bounded values: the tails of the kept logs (however much each
attempt kept), a traceparent of its W3C size, the first jobs of a graph with their true
count; so a page stays small whatever a row holds."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from brooq.page import reads
from brooq.page.routes import serve

Conn = psycopg.Connection[Any]
MIB = 1024 * 1024
PAGE_BOUND = 2 * 1000 * 1000  # bytes


@pytest.fixture
def db(connect: Callable[..., Conn]) -> Conn:
    return connect()


def insert(db: Conn, **columns: Any) -> uuid.UUID:
    columns.setdefault("id", uuid.uuid4())
    columns.setdefault("topic", "t")
    if "logs" in columns:
        columns["logs"] = json.dumps(columns["logs"])
    names = ", ".join(columns)
    values = ", ".join(f"%({n})s" for n in columns)
    db.execute(f"INSERT INTO job ({names}) VALUES ({values})", columns)
    job_id: uuid.UUID = columns["id"]
    return job_id


def page(db: Conn, job_id: uuid.UUID) -> str:
    response = serve(db, "GET", f"/jobs/{job_id}", actions_enabled=False)
    assert response.status == 200
    assert len(response.body) < PAGE_BOUND, len(response.body)
    return response.body.decode()


def test_twenty_attempts_of_a_mebibyte_of_logs_make_a_small_page_that_says_it_was_cut(
    db: Conn,
) -> None:
    # Escaping makes "<" four bytes: the worst text for the page's size.
    logs = [
        {"attempt": i, "at": f"2030-01-01T00:{i:02}:00+00:00", "text": f"start {i}\n" + "<" * MIB}
        for i in range(1, 21)
    ]
    logs[-1]["text"] = "x" * MIB + "\nthe last line of attempt 20"
    job_id = insert(db, state="dead", attempts=20, logs=logs, traceparent="0" * MIB)
    body = page(db, job_id)
    # Every attempt is there, its last lines shown, the rest named with where to read it.
    for i in range(1, 21):
        assert f"Logs of attempt {i}, ended" in body
    assert "the last line of attempt 20" in body and "start 1\n" not in body
    assert body.count("bytes more before this, see <code>brooq jobs logs") == 20
    more = MIB + len("start 1\n") - reads.LOG_TAIL_CHARS
    assert f"… {more:,} bytes more before this" in body
    assert f"not a W3C traceparent ({MIB:,} characters)" in body
    # The read itself carries the tails only, not the column.
    row = reads.job(db, job_id)
    assert row is not None and row["traceparent"] is None
    assert sum(len(entry["text"]) for entry in row["logs"]) == 20 * reads.LOG_TAIL_CHARS


def test_only_the_last_attempts_and_a_w3c_traceparent_are_shown(db: Conn) -> None:
    logs = [{"attempt": i, "at": "t", "text": f"attempt {i} said"} for i in range(1, 31)]
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    job_id = insert(db, state="failed", attempts=30, logs=logs, traceparent=traceparent)
    body = page(db, job_id)
    shown = reads.LOG_ATTEMPTS
    assert f"the last {shown} of 30 attempts" in body
    assert "attempt 30 said" in body and f"attempt {30 - shown + 1} said" in body
    assert f"attempt {30 - shown} said" not in body
    assert body.index("attempt 11 said") < body.index("attempt 30 said")  # oldest first
    assert "bytes more before this" not in body
    assert f"<th>traceparent</th><td>{traceparent}</td>" in body
    assert "traceparent_chars" not in body and "downstream_total" not in body


def test_a_fan_out_shows_its_true_count(db: Conn) -> None:
    parent = insert(db, state="done")
    children = [uuid.uuid4() for _ in range(5000)]
    with db.cursor() as cur:
        cur.executemany(
            "INSERT INTO job (id, topic, state) VALUES (%s, 'child', 'waiting')",
            [(c,) for c in children],
        )
        cur.executemany(
            "INSERT INTO brooq_job_edge (downstream_id, position, upstream_id) VALUES (%s, 1, %s)",
            [(c, parent) for c in children],
        )
    body = page(db, parent)
    assert f"Waited for by ({reads.GRAPH_LIMIT} of 5,000)" in body
    assert f"only the first {reads.GRAPH_LIMIT} shown" in body
    # One child, one parent: shown whole, no "of".
    child_page = page(db, children[0])
    assert "Waits for (upstream) (1)" in child_page
    assert "only the first" not in child_page
