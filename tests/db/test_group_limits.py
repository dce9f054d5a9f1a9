"""A group's own limit, set at runtime (Queue.set_group_limit, `brooq limits`): it
replaces the topic's group_limit for that group in the claims of a topic whose groups are
taken in turn, read at every claim; 0 holds the group's jobs; cleared, the topic's
applies again. Bad arguments are refused before anything is written."""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import brooq
from brooq.worker.pacing import turns
from tests.cliproc import run_brooq
from tests.db.test_rate_limits import handler


def claim(conn: psycopg.Connection[Any], h: Any, worker: str = "w", limit: int = 50) -> Counter:
    """One round trip of a child whose turn is ``h``'s topic: how many it took per group."""
    [turn] = turns({h.topic: h})
    assert turn.shape == "coordinated"
    params = {
        "done": [],
        "topics": [],
        "limit": limit,
        "children": 1,
        "worker": worker,
        "lease": 30.0,
        "queues": ["default"],
        **turn.params,
        "batch": limit,  # the child's pacing: its round trip's limit at most
    }
    cur = conn.cursor(row_factory=dict_row)
    rows = cur.execute(brooq.sql.Q.job_finish_and_claim_coordinated, params).fetchall()
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
        return run_brooq(["--database", dsn, "limits", *args], env=dict(os.environ), cwd=Path.cwd())

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


def test_a_groups_own_rate_replaces_the_topics_and_its_limit_stays(
    queue: brooq.Queue, db: Any
) -> None:
    """A rated topic (group_rate_limit 100/m): A's own rate 2/m holds A to two starts in
    the minute while B goes on at the topic's; its own limit beside stays when the rate
    is cleared, and the row goes with the last of the two."""
    h = handler("tenant.rated", group_rate_limit="100/m")
    enqueue(queue, "tenant.rated", "AB")
    assert queue.set_group_rate("tenant.rated", "A", "2/m") is True
    assert claim(db, h, limit=20) == {"A": 2, "B": 10}
    assert claim(db, h, "w2", limit=20) == {}  # A's window is full, B has nothing left
    assert queue.set_group_limit("tenant.rated", "A", 5) is True
    [own] = queue.group_limits("tenant.rated")
    assert (own.limit, own.rate, own.period, own.rate_text) == (5, 2, 60.0, "2/m")
    assert own.to_dict()["rate"] == "2/m"
    assert queue.set_group_rate("tenant.rated", "A", None) is True
    assert queue.set_group_rate("tenant.rated", "A", None) is False  # nothing to clear
    [own] = queue.group_limits("tenant.rated")
    assert (own.limit, own.rate) == (5, None)
    assert claim(db, h, "w3", limit=20) == {"A": 3}  # 5 at once, 2 already running
    assert queue.set_group_limit("tenant.rated", "A", None) is True
    assert queue.group_limits() == []


def test_an_own_rate_waits_for_its_window_and_says_when(queue: brooq.Queue, db: Any) -> None:
    h = handler("tenant.rated", group_rate_limit="100/s")
    enqueue(queue, "tenant.rated", "A", n=3)
    queue.set_group_rate("tenant.rated", "A", brooq.Rate(1, per=3600))
    assert claim(db, h) == {"A": 1}
    params = {
        "done": [],
        "topics": [],
        "limit": 5,
        "children": 1,
        "worker": "w9",
        "lease": 30.0,
        "queues": ["default"],
        **turns({h.topic: h})[0].params,
        "batch": 5,
    }
    rows = db.execute(brooq.sql.Q.job_finish_and_claim_coordinated, params).fetchall()
    [held] = [r for r in rows if r[0]]
    assert held[1] is None  # held back, with the time its window has room
    assert 3590 < (held[7] - held[6]).total_seconds() <= 3601


@pytest.mark.parametrize(
    ("rate", "text"),
    [("5/x", "must be 'N/s'"), ("0/s", "from 1"), (5, "must be 'N/s'")],
)
def test_a_bad_own_rate_is_refused_before_anything_is_written(
    queue: brooq.Queue, db: Any, rate: Any, text: str
) -> None:
    with pytest.raises(brooq.BrooqError, match=text):
        queue.set_group_rate("tenant.rated", "A", rate)
    assert db.execute("SELECT count(*) FROM brooq_group_limit").fetchone() == (0,)


def test_the_command_line_sets_and_clears_an_own_rate(dsn: str, db: Any) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_brooq(["--database", dsn, "limits", *args], env=dict(os.environ), cwd=Path.cwd())

    out = cli("set", "tenant.rated", "--group", "acme", "--rate", "50/s", "--limit", "4")
    assert out.returncode == 0, out.stderr
    assert "at most 4 processing at once and at most 50/s starts" in out.stdout
    [row] = json.loads(cli("list", "--json").stdout)
    assert (row["limit"], row["rate"]) == (4, "50/s")
    assert cli("list").stdout.splitlines()[1].split()[:4] == ["tenant.rated", "acme", "4", "50/s"]
    for bad in (
        ["set", "tenant.rated", "--group", "acme", "--rate", "fast"],
        ["set", "tenant.rated", "--group", "acme"],
    ):
        refused = cli(*bad)
        assert refused.returncode == 2, refused
        assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    out = cli("clear", "tenant.rated", "--group", "acme", "--rate")
    assert "back to the topic's group_rate_limit" in out.stdout
    [row] = json.loads(cli("list", "--json").stdout)
    assert (row["limit"], row["rate"]) == (4, None)
    assert "nothing changed" in cli("clear", "tenant.rated", "--group", "acme", "--rate").stdout
    assert (
        "back to the topic's group_limit" in cli("clear", "tenant.rated", "--group", "acme").stdout
    )
    assert db.execute("SELECT count(*) FROM brooq_group_limit").fetchone() == (0,)


def test_what_a_groups_own_limit_and_rate_hold_back_is_counted(queue: brooq.Queue, db: Any) -> None:
    """The held count (`brooq stats`, the master's gauges) and the groups held (`brooq
    queues`, the page) follow the groups' own limits as the claim does: on a fair topic
    without a declared limit, A's own limit of 1 holds A's ready jobs back once one runs,
    B's own 0 holds all of B's; on a rated topic, C's own rate once its window is full."""
    from brooq.operator import reads
    from brooq.sql import Q
    from tests.db.test_rate_limits import publish

    fair, rated = (
        handler("tenant.fair", fair_groups=True),
        handler("tenant.rated", rate_limit="100/m"),
    )
    publish(db, {"tenant.fair": {"queue": "default", **fair.limits()}})
    publish(db, {"tenant.rated": {"queue": "default", **rated.limits()}})
    enqueue(queue, "tenant.fair", "ABZ", n=4)
    enqueue(queue, "tenant.rated", "CD", n=4)
    # Before any own limit: a fair topic holds nothing back, and its rows are not read.
    assert reads.held_by_topic(db, Q).get(("default", "tenant.fair"), (0, 0.0))[0] == 0
    queue.set_group_limit("tenant.fair", "A", 1)
    queue.set_group_limit("tenant.fair", "B", 0)
    queue.set_group_rate("tenant.rated", "C", "2/m")
    assert claim(db, fair, limit=12) == {"Z": 4, "A": 1}  # B held at 0, A at 1
    assert claim(db, rated, "w2", limit=12) == {"C": 2, "D": 4}
    held = reads.held_by_topic(db, Q)
    assert held[("default", "tenant.fair")][0] == 3 + 4  # A's 3 left and B's 4
    assert held[("default", "tenant.rated")][0] == 2  # C's 2 left: its window is full
    groups_held = {t.topic: t.groups_held for t in queue.limits()}
    assert groups_held == {"tenant.fair": 2, "tenant.rated": 1}
    # A topic under a global_limit alone takes one job a claim and reads no own limit:
    # nor does the count.
    capped = handler("tenant.capped", global_limit=5)
    publish(db, {"tenant.capped": {"queue": "default", **capped.limits()}})
    enqueue(queue, "tenant.capped", "E", n=3)
    queue.set_group_limit("tenant.capped", "E", 0)
    assert reads.held_by_topic(db, Q)[("default", "tenant.capped")][0] == 0
