"""Tags against a real PostgreSQL: written by every producer path (one job, COPY of ready
and scheduled jobs, the keyed batch, the debounced job taking the last enqueue's tags),
read back in JobRecord.tags, and filtering the API's listing, `brooq jobs list --tag`,
the bulk cancel and retry (API and CLI), and the status page's lists."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

import brooq
from brooq.page.routes import serve
from tests.db.test_cli import as_json, ok, refused
from tests.db.test_page import hrefs, job_ids
from tests.db.test_unique import claim, fail

Conn = psycopg.Connection[Any]
LATER = datetime.now(timezone.utc) + timedelta(hours=1)


@pytest.fixture
def conn(connect: Callable[..., Conn]) -> Conn:
    return connect()


def tags_of(db: Conn, job_id: uuid.UUID) -> list[str] | None:
    row = db.execute("SELECT tags FROM job WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return row["tags"]  # type: ignore[no-any-return]


def test_every_producer_path_writes_the_tags(queue: brooq.Queue, conn: Conn) -> None:
    one, _ = queue.enqueue(brooq.Job("t", 1, tags=["billing", "eu"]))
    with queue.transaction() as tx:
        mine, _ = brooq.enqueue(tx, brooq.Job("t", 2, tags=["null", "a:b=c/d"]))
    copied = queue.enqueue_many(
        [
            brooq.Job("t", 3, tags=["billing"]),
            brooq.Job("t", 4),
            brooq.Job("t", 5, tags=["eu"], available_at=LATER),
            brooq.Job("t", 6, available_at=LATER),
        ]
    )
    keyed = queue.enqueue_many(
        [brooq.Job("t", 7, idempotency_key="i", tags=["billing"]), brooq.Job("t", 8)]
    )
    plain = queue.enqueue_many([brooq.Job("t", 9)])  # the untagged COPY, as before
    assert [tags_of(conn, i) for i in (one, mine)] == [["billing", "eu"], ["null", "a:b=c/d"]]
    assert [tags_of(conn, i) for i, _ in copied] == [["billing"], None, ["eu"], None]
    assert [tags_of(conn, i) for i, _ in keyed + plain] == [["billing"], None, None]
    record = queue.get(one)
    assert record is not None and record.tags == ["billing", "eu"]
    untagged = queue.get(plain[0][0])
    assert untagged is not None and untagged.tags == []
    # a debounced job takes the last enqueue's tags with its payload
    job_id, _ = queue.enqueue(brooq.Job("t", 1, unique_key="k", debounce=1, tags=["a"]))
    queue.enqueue(brooq.Job("t", 2, unique_key="k", debounce=1, tags=["b", "c"]))
    assert tags_of(conn, job_id) == ["b", "c"]


def test_list_jobs_by_tag(queue: brooq.Queue, dsn: str) -> None:
    eu, _ = queue.enqueue(brooq.Job("t", 1, tags=["billing", "eu"]))
    us, _ = queue.enqueue(brooq.Job("t", 2, tags=["billing", "us"]))
    queue.enqueue(brooq.Job("other", 3, tags=["eu"]))
    queue.enqueue(brooq.Job("t", 4))
    assert [r.id for r in queue.list_jobs(tag="billing")] == [us, eu]
    assert [r.id for r in queue.list_jobs(tag="eu", topic="t")] == [eu]
    assert queue.list_jobs(tag="nobody") == []
    with pytest.raises(brooq.InvalidTags, match="tag 'a b' is not a tag"):
        queue.list_jobs(tag="a b")
    # the command
    listed = as_json(dsn, "jobs", "list", "--tag", "billing")["jobs"]
    assert [j["id"] for j in listed] == [str(us), str(eu)]
    assert listed[0]["tags"] == ["billing", "us"]
    lines = ok(dsn, "jobs", "list", "--tag", "eu").splitlines()
    assert lines[0].split()[:8] == ["ID", "TOPIC", "QUEUE", "PRIORITY", "STATE", "ATTEMPTS",
                                    "CREATED", "TAGS"]  # fmt: skip
    assert [line.split()[0] for line in lines[1:]] == [str(r.id) for r in queue.list_jobs(tag="eu")]
    assert "billing,eu" in lines[-1].split()
    assert "TAGS" not in ok(dsn, "jobs", "list", "--topic", "t", "--limit", "1").split("\n")[0]
    line = refused(dsn, "jobs", "list", "--tag", "a,b", code=2)
    assert "--tag 'a,b' is not a tag" in line


def test_bulk_cancel_and_retry_by_tag(queue: brooq.Queue, conn: Conn, dsn: str) -> None:
    tagged = [queue.enqueue(brooq.Job("t", n, tags=["eu"]))[0] for n in range(3)]
    other = [queue.enqueue(brooq.Job("t", n, tags=["us"]))[0] for n in range(2)]
    bare = queue.enqueue(brooq.Job("t", 9))[0]
    result = queue.cancel_many(topic="t", state="pending", tag="eu")
    assert (result.matched, result.changed) == (3, 3)
    states = {r["id"]: r["state"] for r in conn.execute("SELECT id, state FROM job_all")}
    assert [states[i] for i in tagged] == ["canceled"] * 3
    assert [states[i] for i in [*other, bare]] == ["pending"] * 3
    assert queue.retry_many(topic="t", state="canceled", tag="us").matched == 0
    assert queue.retry_many(topic="t", state="canceled", tag="eu").changed == 3
    with pytest.raises(brooq.InvalidTags):
        queue.cancel_many(topic="t", state="pending", tag="")
    # the command
    out = ok(dsn, "jobs", "cancel", "--topic", "t", "--state", "pending", "--tag", "us", "--yes")
    assert out.splitlines()[0] == "2 jobs match (topic t, state pending, tag us)"
    states = {r["id"]: r["state"] for r in conn.execute("SELECT id, state FROM job_all")}
    assert [states[i] for i in other] == ["canceled"] * 2 and states[bare] == "pending"
    assert as_json(dsn, "retry", "--topic", "t", "--state", "canceled", "--tag", "us", "--yes") == {
        "matched": 2,
        "changed": 2,
    }
    line = refused(dsn, "cancel", "--topic", "t", "--state", "pending", "--tag", "é", code=2)
    assert "--tag 'é' is not a tag" in line
    line = refused(dsn, "cancel", str(bare), "--tag", "eu", code=2)
    assert "not both: --tag with JOB_ID" in line


def get(db: Conn, target: str) -> str:
    response = serve(db, "GET", target, actions_enabled=False)
    assert db.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    return f"{response.status} {response.body.decode()}"


def test_the_status_pages_lists_filter_by_tag(queue: brooq.Queue, conn: Conn) -> None:
    dead = {}
    for n, tags in enumerate((["eu"], ["us"], ["eu", "billing"], None)):
        job_id, _ = queue.enqueue(brooq.Job("t", n, tags=tags))
        assert claim(conn) == [job_id]
        assert fail(conn, job_id, max_attempts=1) == "dead"
        dead[n] = job_id
    running, _ = queue.enqueue(brooq.Job("t", "r", tags=["eu"]))
    queue.enqueue(brooq.Job("t", "r2"))
    claim(conn)
    page = get(conn, "/dead?tag=eu")
    assert page.startswith("200 ")
    assert job_ids(page) == [str(dead[2]), str(dead[0])]
    assert "eu, billing" in page
    # the filter itself, a GET form; the lists' links keep the tag
    assert re.search(r'<form class="filter" method="get" action="/list">', page)
    assert 'name="tag" value="eu"' in page
    assert "/dead?tag=eu" in hrefs(page) and "/dead" in hrefs(page)  # first page, every job
    assert job_ids(get(conn, "/dead")) == [str(dead[n]) for n in (3, 2, 1, 0)]
    assert job_ids(get(conn, "/in-flight?tag=eu")) == [str(running)]
    assert len(job_ids(get(conn, "/in-flight"))) == 2
    assert job_ids(get(conn, "/failed?tag=eu")) == []
    assert get(conn, "/dead?tag=").startswith("200 ")  # an empty filter: every job
    assert get(conn, "/dead?tag=a%20b").startswith("400 ")
    assert get(conn, "/dead?tag=a&tag=b").startswith("400 ")
    job_page = get(conn, f"/jobs/{dead[2]}")
    assert "<th>tags</th><td>eu, billing</td>" in job_page


def test_the_lists_pages_with_a_tag_follow_each_other(conn: Conn) -> None:
    """The keyset pages of a filtered list: every tagged job once, none of the others, and
    each page's links keep the tag."""
    from brooq.page import reads

    total = 2 * reads.PAGE_SIZE + 7
    conn.execute(
        "INSERT INTO job (topic, state, tags, updated_at) "
        "SELECT 't', 'dead', CASE WHEN i %% 2 = 0 THEN '{eu}' ELSE '{us,x}' END::text[], "
        "       now() - (i / 3) * interval '1 second' "
        "FROM generate_series(1, %(n)s) AS i",
        {"n": 2 * total},
    )
    seen: list[str] = []
    target = "/dead?tag=eu"
    while target:
        page = get(conn, target)
        assert page.startswith("200 ")
        seen += job_ids(page)
        following = [h for h in hrefs(page) if "after=" in h]
        assert all(h.endswith("&tag=eu") for h in following), following
        target = following[0] if following else ""
    tagged = conn.execute("SELECT id FROM job WHERE tags = '{eu}'").fetchall()
    assert len(seen) == len(set(seen)) == total
    assert set(seen) == {str(r["id"]) for r in tagged}
