"""A group's own limit, set at runtime (Queue.set_group_limit, `brooq limits`): it
replaces the topic's group_limit for that group in the claims of a topic whose groups are
taken in turn, read at every claim; 0 holds the group's jobs; cleared, the topic's
applies again. Bad arguments are refused before anything is written."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import brooq
from brooq.worker.pacing import turns
from tests.db.test_rate_limits import handler


def claim(conn: psycopg.Connection[Any], h: Any, worker: str = "w", limit: int = 50) -> Counter:
    """One round trip of a child whose turn is ``h``'s topic: how many it took per group."""
    [turn] = turns({h.topic: h})
    assert turn.shape == "grouped"
    params = {
        "done": [],
        "topics": [],
        "limit": limit,
        "children": 1,
        "worker": worker,
        "lease": 30.0,
        "queues": ["default"],
        **turn.params,
    }
    cur = conn.cursor(row_factory=dict_row)
    rows = cur.execute(brooq.sql.Q.job_finish_and_claim_grouped, params).fetchall()
    ids = [r["id"] for r in rows if r["claimed"]]
    groups = conn.execute("SELECT group_key FROM job WHERE id = ANY(%s)", (ids,)).fetchall()
    return Counter(g for (g,) in groups)


def enqueue(queue: brooq.Queue, topic: str, groups: str, n: int = 10) -> None:
    queue.enqueue_many([brooq.Job(topic, group=g) for g in groups for _ in range(n)])


def test_a_groups_own_limit_replaces_the_topics(queue: brooq.Queue, db: Any) -> None:
    h = handler("tenant.work", group_limit=1)
    enqueue(queue, "tenant.work", "ABC")
    assert queue.set_group_limit("tenant.work", "A", 3) is True
    assert queue.set_group_limit("tenant.work", "B", 0) is True
    assert claim(db, h) == {"A": 3, "C": 1}  # B waits, C at the topic's limit
    assert claim(db, h, "w2") == {}  # every group at its limit
    assert queue.set_group_limit("tenant.work", "B", None) is True  # back to the topic's 1
    assert queue.set_group_limit("tenant.work", "B", None) is False  # nothing to clear
    assert claim(db, h, "w3") == {"B": 1}
    assert [(g.topic, g.group, g.limit) for g in queue.group_limits()] == [("tenant.work", "A", 3)]
    assert queue.group_limits("other.topic") == []


def test_an_own_limit_caps_a_group_of_a_fair_topic(queue: brooq.Queue, db: Any) -> None:
    h = handler("webhook.deliver", fair_groups=True)
    enqueue(queue, "webhook.deliver", "AB")
    queue.set_group_limit("webhook.deliver", "A", 2)
    assert claim(db, h, limit=20) == {"A": 2, "B": 10}


@pytest.mark.parametrize(
    ("topic", "group", "limit", "error", "text"),
    [
        ("Bad Topic", "A", 1, brooq.InvalidTopic, "does not match"),
        ("t", None, 1, brooq.InvalidGroup, "needs a group"),
        ("t", "x" * 200, 1, brooq.InvalidGroup, "200 characters"),
        ("t", "A", -1, brooq.BrooqError, "from 0 to 2147483647"),
        ("t", "A", 2**31, brooq.BrooqError, "from 0 to 2147483647"),
        ("t", "A", True, brooq.BrooqError, "whole number"),
        ("t", "A", 1.5, brooq.BrooqError, "whole number"),
    ],
)
def test_a_bad_own_limit_is_refused_before_anything_is_written(
    queue: brooq.Queue, db: Any, topic: Any, group: Any, limit: Any, error: type, text: str
) -> None:
    with pytest.raises(error, match=text):
        queue.set_group_limit(topic, group, limit)
    assert db.execute("SELECT count(*) FROM brooq_group_limit").fetchone() == (0,)


def test_the_command_line_sets_lists_and_clears(queue: brooq.Queue, dsn: str, db: Any) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "brooq", "--database", dsn, "limits", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    out = cli("set", "tenant.work", "--group", "acme", "--limit", "5")
    assert out.returncode == 0 and "group acme of tenant.work: at most 5" in out.stdout
    listed = cli("list", "--json")
    assert [(r["topic"], r["group"], r["limit"]) for r in json.loads(listed.stdout)] == [
        ("tenant.work", "acme", 5)
    ]
    assert cli().stdout.splitlines()[1].split()[:3] == ["tenant.work", "acme", "5"]
    for bad in (
        ["set", "tenant.work", "--group", "acme", "--limit", "-1"],
        ["set", "Bad Topic", "--group", "acme", "--limit", "1"],
        ["set", "tenant.work", "--limit", "1"],
    ):
        refused = cli(*bad)
        assert refused.returncode == 2, refused
        assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert db.execute("SELECT group_limit FROM brooq_group_limit").fetchall() == [(5,)]
    assert (
        "back to the topic's group_limit" in cli("clear", "tenant.work", "--group", "acme").stdout
    )
    assert "(no group has its own limit)" in cli("list").stdout
