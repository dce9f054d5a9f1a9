"""What a port from Celery leans on, through every door a job comes in by (Queue.enqueue,
enqueue_many, their async forms, brooq.enqueue* on the caller's connection with app=):
handlers spread over several modules (include=), strict_topics, payloads holding
datetime, Decimal and UUID read back as their types by a real handler; and the async
reads (get_async, list_jobs_async, cancel_async) beside the sync ones."""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib
import sys
import textwrap
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import psycopg
import pytest
from psycopg import conninfo

import brooq
import brooq.db
import brooq.migrate
import brooq.testing
from brooq.errors import AppLoadError, InvalidTopic

Door = Callable[[brooq.Queue, Sequence[brooq.Job], str], list[uuid.UUID]]


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _async_queue(queue: brooq.Queue, jobs: Sequence[brooq.Job]) -> list[uuid.UUID]:
    try:
        return [(await queue.enqueue_async(job))[0] for job in jobs]
    finally:
        await queue.close_async()


async def _async_many(queue: brooq.Queue, jobs: Sequence[brooq.Job]) -> list[uuid.UUID]:
    try:
        return [i for i, _ in await queue.enqueue_many_async(jobs)]
    finally:
        await queue.close_async()


async def _async_conn(queue: brooq.Queue, jobs: Sequence[brooq.Job], dsn: str) -> list[uuid.UUID]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        found = [(await brooq.enqueue_async(conn, job, app=queue))[0] for job in jobs]
        await conn.commit()
        return found


async def _async_conn_many(
    queue: brooq.Queue, jobs: Sequence[brooq.Job], dsn: str
) -> list[uuid.UUID]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        found = [i for i, _ in await brooq.enqueue_many_async(conn, jobs, app=queue)]
        await conn.commit()
        return found


def _conn(queue: brooq.Queue, jobs: Sequence[brooq.Job], dsn: str) -> list[uuid.UUID]:
    with psycopg.connect(dsn) as conn:  # the caller's transaction, committed on exit
        return [brooq.enqueue(conn, job, app=queue)[0] for job in jobs]


def _conn_many(queue: brooq.Queue, jobs: Sequence[brooq.Job], dsn: str) -> list[uuid.UUID]:
    with psycopg.connect(dsn) as conn:
        return [i for i, _ in brooq.enqueue_many(conn, jobs, app=queue)]


DOORS: dict[str, Door] = {
    "enqueue": lambda q, jobs, dsn: [q.enqueue(job)[0] for job in jobs],
    "enqueue_many": lambda q, jobs, dsn: [i for i, _ in q.enqueue_many(jobs)],
    "enqueue_async": lambda q, jobs, dsn: _run(_async_queue(q, jobs)),
    "enqueue_many_async": lambda q, jobs, dsn: _run(_async_many(q, jobs)),
    "brooq.enqueue(conn, app=)": _conn,
    "brooq.enqueue_many(conn, app=)": _conn_many,
    "brooq.enqueue_async(conn, app=)": lambda q, jobs, dsn: _run(_async_conn(q, jobs, dsn)),
    "brooq.enqueue_many_async(conn, app=)": lambda q, jobs, dsn: _run(
        _async_conn_many(q, jobs, dsn)
    ),
}


def write_shop(root: Path, name: str, dsn: str, *, strict: bool, include: list[str]) -> None:
    """A package ``name`` whose Queue (name.app:queue) registers no handler itself: its
    modules do, one by one (name.tasks) and a package walked whole (name.billing)."""
    pkg = root / name
    (pkg / "billing" / "refunds").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "app.py").write_text(
        textwrap.dedent(
            f"""
            import brooq
            queue = brooq.Queue({dsn!r}, include={include!r}, strict_topics={strict!r})
            """
        )
    )
    (pkg / "tasks.py").write_text(
        textwrap.dedent(
            f"""
            import uuid
            from dataclasses import dataclass
            from datetime import datetime
            from decimal import Decimal

            from {name}.app import queue

            @dataclass
            class OrderPaid:
                order: uuid.UUID
                amount: Decimal
                paid_at: datetime

            @queue.handler("shop.order.paid", payload=OrderPaid)
            def order_paid(claim):
                p = claim.payload
                return {{
                    "types": [type(v).__name__ for v in (p.order, p.amount, p.paid_at)],
                    "amount_plus_cent": p.amount + Decimal("0.01"),
                    "offset": str(p.paid_at.utcoffset()),
                    "order": p.order,
                }}

            @queue.handler("shop.email.send")
            def email_send(claim):
                return "sent"
            """
        )
    )
    (pkg / "billing" / "__init__.py").write_text("")
    (pkg / "billing" / "invoices.py").write_text(
        f"from {name}.app import queue\n\n"
        '@queue.handler("shop.invoice.send", queue="billing")\n'
        "def invoice(claim):\n    return 'invoiced'\n"
    )
    (pkg / "billing" / "refunds" / "__init__.py").write_text("")
    (pkg / "billing" / "refunds" / "issue.py").write_text(
        f"from {name}.app import queue\n\n"
        '@queue.handler("shop.refund.issue", queue="billing")\n'
        "def refund(claim):\n    return 'refunded'\n"
    )


@pytest.fixture
def shop(dsn: str, tmp_path: Path) -> Iterator[Callable[..., brooq.Queue]]:
    names: list[str] = []
    sys.path.insert(0, str(tmp_path))

    def make(*, strict: bool = False, include: list[str] | None = None) -> brooq.Queue:
        name = f"shop_{uuid.uuid4().hex[:10]}"
        names.append(name)
        given = [f"{name}.tasks", f"{name}.billing"] if include is None else include
        write_shop(tmp_path, name, dsn, strict=strict, include=given)
        importlib.invalidate_caches()
        queue: brooq.Queue = importlib.import_module(f"{name}.app").queue
        opened.append(queue)
        return queue

    opened: list[brooq.Queue] = []
    yield make
    for queue in opened:
        queue.close()
    sys.path.remove(str(tmp_path))
    for module in [m for m in sys.modules if any(m.split(".")[0] == n for n in names)]:
        del sys.modules[module]


def rows(db: psycopg.Connection[Any], ids: Sequence[uuid.UUID]) -> list[tuple[Any, ...]]:
    return [
        db.execute("SELECT topic, queue, state FROM job_all WHERE id = %s", (i,)).fetchone()
        for i in ids
    ]


def count(db: psycopg.Connection[Any]) -> int:
    return int(db.execute("SELECT count(*) FROM job_all").fetchone()[0])


@pytest.mark.parametrize("door", list(DOORS))
def test_include_is_imported_at_the_first_enqueue_and_places_each_job_in_its_handlers_queue(
    door: str, shop: Callable[..., brooq.Queue], dsn: str, db: psycopg.Connection[Any]
) -> None:
    queue = shop()
    assert queue.handlers == {}  # nothing imported by building the Queue
    jobs = [
        brooq.Job("shop.invoice.send"),  # billing/invoices.py
        brooq.Job("shop.refund.issue"),  # billing/refunds/issue.py: a package inside
        brooq.Job("shop.email.send"),  # tasks.py
        brooq.Job("shop.invoice.send", queue="urgent"),  # the job's own queue wins
    ]
    ids = DOORS[door](queue, jobs, dsn)
    assert sorted(queue.handlers) == [
        "shop.email.send",
        "shop.invoice.send",
        "shop.order.paid",
        "shop.refund.issue",
    ]
    assert rows(db, ids) == [
        ("shop.invoice.send", "billing", "pending"),
        ("shop.refund.issue", "billing", "pending"),
        ("shop.email.send", "default", "pending"),
        ("shop.invoice.send", "urgent", "pending"),
    ]
    assert brooq.testing.drain(queue) == {"done": 4}


def test_drain_runs_the_included_modules_handlers_without_an_enqueue_first(
    shop: Callable[..., brooq.Queue], db: psycopg.Connection[Any]
) -> None:
    queue = shop()
    # Jobs written by someone else (another process, a SQL INSERT): this Queue enqueued none.
    with psycopg.connect(queue.dsn, autocommit=True) as other:
        brooq.enqueue(other, brooq.Job("shop.refund.issue", queue="billing"))
    assert queue.handlers == {}
    assert brooq.testing.drain(queue) == {"done": 1}
    assert "shop.refund.issue" in queue.handlers


@pytest.mark.parametrize("door", list(DOORS))
def test_strict_topics_refuses_a_topic_no_handler_declares_at_every_door(
    door: str, shop: Callable[..., brooq.Queue], dsn: str, db: psycopg.Connection[Any]
) -> None:
    queue = shop(strict=True)
    many = "many" in door
    with pytest.raises(InvalidTopic) as info:
        DOORS[door](queue, [brooq.Job("shop.email.send"), brooq.Job("shop.emial.send")], dsn)
    message = str(info.value)
    assert message == (
        ("job 1: " if many else "")
        + "topic 'shop.emial.send' has no handler on this Queue (strict_topics=True); "
        "did you mean 'shop.email.send' or 'shop.invoice.send'?"
    )
    # A batch wrote nothing, nor the caller's transaction (rolled back by the error);
    # one by one through the Queue, the job before the refused one went in.
    assert count(db) == (0 if many or "conn" in door else 1)
    ids = DOORS[door](queue, [brooq.Job("shop.refund.issue")], dsn)
    assert rows(db, ids) == [("shop.refund.issue", "billing", "pending")]


def test_strict_topics_without_any_handler_says_so(
    shop: Callable[..., brooq.Queue], db: psycopg.Connection[Any]
) -> None:
    queue = shop(strict=True, include=[])
    with pytest.raises(InvalidTopic, match=r"declares none; register them with @queue\.handler"):
        queue.enqueue(brooq.Job("shop.email.send"))
    assert count(db) == 0


def test_no_close_match_lists_the_topics(shop: Callable[..., brooq.Queue]) -> None:
    queue = shop(strict=True)
    with pytest.raises(InvalidTopic, match=r"strict_topics=True\); its topics are shop.email"):
        queue.enqueue(brooq.Job("zzz"))


def test_without_strict_topics_an_unknown_topic_is_accepted(
    shop: Callable[..., brooq.Queue], db: psycopg.Connection[Any]
) -> None:
    queue = shop()
    job_id, _ = queue.enqueue(brooq.Job("shop.emial.send"))
    assert rows(db, [job_id]) == [("shop.emial.send", "default", "pending")]


@pytest.mark.parametrize("door", ["enqueue", "enqueue_async", "brooq.enqueue(conn, app=)"])
def test_an_include_that_cannot_be_imported_names_the_module_and_writes_nothing(
    door: str, shop: Callable[..., brooq.Queue], dsn: str, db: psycopg.Connection[Any]
) -> None:
    queue = shop(include=["shop_nothing_here.tasks"])
    for _ in range(2):  # the next call tries again, and says the same
        with pytest.raises(AppLoadError) as info:
            DOORS[door](queue, [brooq.Job("shop.email.send")], dsn)
        assert str(info.value) == (
            "cannot import 'shop_nothing_here.tasks' (named in the Queue's include=): "
            "ModuleNotFoundError: No module named 'shop_nothing_here'"
        )
    assert count(db) == 0


@pytest.mark.parametrize("door", list(DOORS))
def test_datetime_decimal_and_uuid_reach_a_typed_handler_as_their_types(
    door: str, shop: Callable[..., brooq.Queue], dsn: str, queue: brooq.Queue
) -> None:
    app = shop(strict=True)
    paid_at = dt.datetime(2026, 12, 4, 23, 0, 1, 250000, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    order = uuid.uuid4()
    ids = DOORS[door](
        app,
        [
            brooq.Job(
                "shop.order.paid", {"order": order, "amount": Decimal("19.90"), "paid_at": paid_at}
            )
        ],
        dsn,
    )
    record = queue.get(ids[0])
    assert record is not None
    assert record.payload == {
        "order": str(order),
        "amount": "19.90",
        "paid_at": "2026-12-04T23:00:01.250000+01:00",
    }
    assert brooq.testing.drain(app) == {"done": 1}
    done = queue.get(ids[0])
    assert done is not None and done.state == "done"
    assert done.result == {
        "types": ["UUID", "Decimal", "datetime"],
        "amount_plus_cent": "19.91",
        "offset": "1:00:00",
        "order": str(order),
    }


@pytest.mark.parametrize("door", list(DOORS))
def test_a_typed_topic_refuses_text_that_is_not_its_type_at_every_door(
    door: str, shop: Callable[..., brooq.Queue], dsn: str, db: psycopg.Connection[Any]
) -> None:
    app = shop()
    bad = brooq.Job(
        "shop.order.paid", {"order": "nope", "amount": "1", "paid_at": "2026-01-01T00:00Z"}
    )
    with pytest.raises(brooq.PayloadMismatch, match=r"payload.order: expected UUID \(its text\)"):
        DOORS[door](app, [bad], dsn)
    assert count(db) == 0


def test_the_async_reads_answer_as_the_sync_ones(queue: brooq.Queue) -> None:
    first, _ = queue.enqueue(brooq.Job("a.one", {"n": 1}, tags=["x"]))
    second, _ = queue.enqueue(brooq.Job("b.two", queue="other"))
    unknown = uuid.uuid4()

    async def main() -> None:
        try:
            assert await queue.get_async(first) == queue.get(first)
            assert await queue.get_async(str(second)) == queue.get(second)
            assert await queue.get_async(unknown) is None
            for filters in (
                {},
                {"topic": "a.one"},
                {"queue": "other"},
                {"tag": "x"},
                {"state": "pending", "limit": 1},
                {"state": "done"},
            ):
                assert await queue.list_jobs_async(**filters) == queue.list_jobs(**filters)
            assert await queue.cancel_async(first) is True
            assert (await queue.get_async(first)).state == "canceled"  # type: ignore[union-attr]
            assert await queue.cancel_async(first) is False  # already finished
            assert await queue.cancel_async(unknown) is False
            # Bad arguments are refused before any I/O, as the sync calls refuse them.
            with pytest.raises(brooq.BrooqError, match="limit must be between 1 and 1000"):
                await queue.list_jobs_async(limit=0)
            with pytest.raises(brooq.BrooqError, match="state must be one of"):
                await queue.list_jobs_async(state="running")
            with pytest.raises(brooq.InvalidJobId):
                await queue.get_async("not-an-id")
            with pytest.raises(brooq.InvalidJobId):
                await queue.cancel_async("not-an-id")
        finally:
            await queue.close_async()

    asyncio.run(main())
    assert queue.get(first).state == "canceled"  # type: ignore[union-attr]
    assert queue.get(second).state == "pending"  # type: ignore[union-attr]


def test_a_running_job_canceled_from_async_code_is_canceled(
    queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    job_id, _ = queue.enqueue(brooq.Job("a.one"))
    db.execute(
        "UPDATE job SET state = 'processing', locked_by = 'w', attempts = 1, "
        "locked_until = now() + interval '1 min' WHERE id = %s",
        (job_id,),
    )

    async def main() -> bool:
        try:
            return await queue.cancel_async(job_id)
        finally:
            await queue.close_async()

    assert asyncio.run(main()) is True
    assert queue.get(job_id).state == "canceled"  # type: ignore[union-attr]


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_a_queue_on_a_sqlalchemy_url_works(dsn: str, driver: str) -> None:
    params = conninfo.conninfo_to_dict(dsn)
    name = params.pop("dbname")
    url = f"postgresql+{driver}:///{name}?{urlencode(params)}"
    queue = brooq.Queue(url)
    try:
        job_id, _ = queue.enqueue(brooq.Job("a.one"))
        assert queue.get(job_id) is not None
        assert queue.dsn == f"postgresql:///{name}?{urlencode(params)}"

        async def on_the_async_pool() -> uuid.UUID:
            try:
                found, _ = await queue.enqueue_async(brooq.Job("a.one"))
                assert await queue.get_async(found) is not None
                return found
            finally:
                await queue.close_async()

        assert queue.get(asyncio.run(on_the_async_pool())) is not None
    finally:
        queue.close()


def test_migrate_and_db_connect_take_sqlalchemys_url_form(empty_dsn: str) -> None:
    """brooq.migrate and brooq.db.connect called from Python (an Alembic env.py, a
    fixture) take the URL an application already has for SQLAlchemy."""
    params = conninfo.conninfo_to_dict(empty_dsn)
    # The host as a parameter: a TCP address or a Unix socket's directory alike.
    query = urllib.parse.urlencode({"host": params["host"], "port": params.get("port", 5432)})
    url = f"postgresql+psycopg://{params.get('user', 'postgres')}@/{params['dbname']}?{query}"
    assert [m.version for m in brooq.migrate.up(url)][:1] == [1]
    assert {s.state for s in brooq.migrate.status(url)} == {"applied"}
    with brooq.db.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM job_all").fetchone() == (0,)
    assert brooq.migrate.down(url.replace("+psycopg:", "+psycopg2:"))
