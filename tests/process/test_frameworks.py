"""brooq inside the frameworks' transactions, with the real frameworks (the test extra):
the Django, SQLAlchemy and FastAPI examples in examples/, and what brooq.enqueue refuses.

Django keeps process-wide state (settings, the app registry, thread-local connections),
so each Django test runs the example project in a subprocess of its own, on the test's
database; SQLAlchemy and FastAPI run in-process (their state is the objects made here).
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest

import brooq
from brooq import migrate
from brooq.schema import files as migration_files
from tests.db.test_migrate import brooq_objects

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DJANGO_PROJECT = EXAMPLES / "django"


def load_example(relative: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # SQLAlchemy resolves the models' annotations through it
    spec.loader.exec_module(module)
    return module


def jobs(dsn: str, topic: str | None = None) -> list[tuple[str, Any]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT topic, payload FROM job_all WHERE %(t)s::text IS NULL OR topic = %(t)s "
            "ORDER BY id",
            {"t": topic},
        ).fetchall()
    return [(t, p) for t, p in rows]


# ---------------------------------------------------------------------------- Django


def django(
    dsn: str, *args: str, code: str | None = None, setup: bool = True
) -> subprocess.CompletedProcess[str]:
    """``manage.py ARGS`` or ``python -c CODE`` (after django.setup() unless not ``setup``)
    in the example project, on ``dsn``; fails the test if it fails."""
    env = {
        **os.environ,
        "DATABASE_URL": dsn,
        "DJANGO_SETTINGS_MODULE": "mysite.settings",
        "PYTHONPATH": os.pathsep.join([str(DJANGO_PROJECT), str(ROOT)]),
    }
    if code is not None:
        prelude = "import django\ndjango.setup()\n" if setup else ""
        argv = [sys.executable, "-c", prelude + code]
    else:
        argv = [sys.executable, "manage.py", *args]
    out = subprocess.run(
        argv, cwd=DJANGO_PROJECT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def post_order(dsn: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """POST /orders through Django's test client (no server: the view, its atomic block
    and the database are real)."""
    code = f"""
import json
from django.test import Client
response = Client().post("/orders", {json.dumps(body)!r}, content_type="application/json")
print(json.dumps([response.status_code, json.loads(response.content)]))
"""
    status, answer = json.loads(django(dsn, code=code).stdout.splitlines()[-1])
    return status, answer


def orders(dsn: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn) as conn:
        return [(i, s) for i, s in conn.execute("SELECT id, sku FROM shop_order ORDER BY id")]


def without_django(objects: list[str]) -> list[str]:
    return [o for o in objects if "django_migrations" not in o and "shop_order" not in o]


def test_django_migration_applies_brooqs_schema_and_reverses(empty_dsn: str, dsn: str) -> None:
    out = django(empty_dsn, "migrate", "--no-color")
    assert "Applying shop.0001_brooq... OK" in out.stdout
    declared = [o for o in brooq_objects(dsn) if "brooq_migration" not in o]
    assert without_django(brooq_objects(empty_dsn)) == declared  # what `brooq migrate up` makes
    with psycopg.connect(empty_dsn) as conn:
        migrate.verify(conn)  # the master's start-up check accepts it
        invalid = conn.execute("SELECT count(*) FROM pg_index WHERE NOT indisvalid").fetchone()
        assert invalid == (0,)  # the CONCURRENTLY builds completed
    queue = brooq.Queue(empty_dsn)
    try:
        queue.enqueue(brooq.Job("smoke.test", {}))
    finally:
        queue.close()
    assert jobs(empty_dsn) == [("smoke.test", {})]

    django(empty_dsn, "migrate", "shop", "zero", "--no-color")
    assert without_django(brooq_objects(empty_dsn)) == []
    django(empty_dsn, "migrate", "--no-color")  # and forward again
    assert without_django(brooq_objects(empty_dsn)) == declared


def test_django_migration_pins_brooqs_versions() -> None:
    """The example's Django migrations of brooq's schema pin their versions, one after
    the other from 1 to the last brooq ships, none atomic (CONCURRENTLY inside)."""
    ranges = []
    for path in sorted((DJANGO_PROJECT / "shop/migrations").glob("*_brooq*.py")):
        text = path.read_text()
        assert "atomic = False" in text, path.name
        found = re.search(r"^FIRST, LAST = (\d+), (\d+)$", text, re.M)
        assert found is not None, path.name
        ranges.append((int(found.group(1)), int(found.group(2))))
    assert ranges[0][0] == 1
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(ranges)), ranges
    assert ranges[-1][1] == migration_files.load()[-1].version, (
        "brooq ships a new migration: add a Django migration with first=<it> to the example"
    )


def test_django_view_commits_the_order_and_its_job(empty_dsn: str) -> None:
    django(empty_dsn, "migrate", "--no-color")
    status, answer = post_order(empty_dsn, {"sku": "a-1", "quantity": 2})
    assert status == 201, answer
    assert orders(empty_dsn) == [(answer["order"], "a-1")]
    assert jobs(empty_dsn) == [("shop.order_placed", {"order": answer["order"]})]


def test_django_view_that_raises_in_atomic_leaves_neither(empty_dsn: str) -> None:
    django(empty_dsn, "migrate", "--no-color")
    status, answer = post_order(empty_dsn, {"sku": "sold-out", "quantity": 1})
    assert status == 409, answer
    assert orders(empty_dsn) == []
    assert jobs(empty_dsn) == []


def test_django_handler_reads_the_order(empty_dsn: str) -> None:
    """The brooq app module of the example: the handler runs with the ORM set up."""
    django(empty_dsn, "migrate", "--no-color")
    status, answer = post_order(empty_dsn, {"sku": "b-2", "quantity": 3})
    assert status == 201
    code = f"""
import brooq
from shop import jobs
claim = brooq.Claim(id=None, topic="shop.order_placed", payload={{"order": {answer["order"]}}},
                    attempt=1, locked_by="test", locked_until=None)
print(jobs.order_placed(claim))
"""
    out = django(empty_dsn, code=code)
    assert out.stdout.strip().splitlines()[-1] == str({"order": answer["order"], "quantity": 3})


def test_django_autocommit_outside_atomic_commits_at_once(dsn: str) -> None:
    code = f"""
import psycopg, brooq
from django.db import connection
brooq.enqueue(connection, brooq.Job("outside.atomic", {{}}))
with psycopg.connect({dsn!r}) as other:   # another session sees it before this one ends
    print(other.execute("SELECT count(*) FROM job_all").fetchone()[0])
brooq.enqueue_many(connection, [brooq.Job("many.outside", {{"n": n}}) for n in range(3)])
"""
    assert django(dsn, code=code).stdout.strip().splitlines()[-1] == "1"
    assert len(jobs(dsn)) == 4


def test_django_nested_atomic_rolls_back_its_savepoint_only(dsn: str) -> None:
    code = """
import brooq
from django.db import connection, transaction
with transaction.atomic():
    brooq.enqueue(connection, brooq.Job("outer.kept", {}))
    try:
        with transaction.atomic():
            brooq.enqueue(connection, brooq.Job("inner.dropped", {}))
            raise ValueError
    except ValueError:
        pass
"""
    django(dsn, code=code)
    assert jobs(dsn) == [("outer.kept", {})]


def test_django_on_another_driver_is_refused_by_name(dsn: str) -> None:
    code = """
import django
from django.conf import settings
settings.configure(DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3",
                                          "NAME": ":memory:"}})
django.setup()
import brooq
from django.db import connection
try:
    brooq.enqueue(connection, brooq.Job("never.written", {}))
except TypeError as exc:
    print(exc)
"""
    out = django(dsn, code=code, setup=False).stdout.strip().splitlines()[-1]
    assert "a Django connection only on psycopg 3" in out
    assert "Django's psycopg 3 backend" in out and "sqlite3" in out


# ------------------------------------------------------------------------ SQLAlchemy


@pytest.fixture
def sa_app(dsn: str) -> Any:
    app = load_example("sqlalchemy/app.py", "example_sqlalchemy_app")
    engine = app.engine_for(dsn)
    app.create_schema(engine)
    yield app, engine
    engine.dispose()


def signups(dsn: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn) as conn:
        return [(i, e) for i, e in conn.execute("SELECT id, email FROM example_signup")]


def test_sqlalchemy_session_commits_the_row_and_its_job(sa_app: Any, dsn: str) -> None:
    from sqlalchemy.orm import Session

    app, engine = sa_app
    with Session(engine) as session:
        signup_id = app.sign_up(session, "ann@example.org")
    assert signups(dsn) == [(signup_id, "ann@example.org")]
    assert jobs(dsn) == [("email.welcome", {"signup": signup_id})]


def test_sqlalchemy_session_rollback_leaves_neither(sa_app: Any, dsn: str) -> None:
    from sqlalchemy.orm import Session

    app, engine = sa_app
    with Session(engine) as session, pytest.raises(RuntimeError):
        app.sign_up(session, "bob@example.org", fail=True)
    with Session(engine) as session:  # a session that ends without commit: rolled back
        brooq.enqueue_many(session, [brooq.Job("never.committed", {"n": n}) for n in range(3)])
    assert signups(dsn) == []
    assert jobs(dsn) == []


def test_sqlalchemy_connection_joins_its_transaction(sa_app: Any, dsn: str) -> None:
    _, engine = sa_app
    with engine.connect() as conn:  # no transaction begun yet: enqueue begins it
        brooq.enqueue(conn, brooq.Job("conn.committed", {}))
        conn.commit()
    with engine.connect() as conn:
        brooq.enqueue(conn, brooq.Job("conn.rolled_back", {}))
        conn.rollback()
    with engine.begin() as conn:
        brooq.enqueue_many(conn, [brooq.Job("conn.begun", {"n": n}) for n in range(2)])
    with engine.connect() as conn:
        brooq.enqueue(conn, brooq.Job("conn.closed", {}))  # closed without commit
    assert [t for t, _ in jobs(dsn)] == ["conn.committed", "conn.begun", "conn.begun"]


def test_sqlalchemy_scoped_session(sa_app: Any, dsn: str) -> None:
    from sqlalchemy.orm import scoped_session, sessionmaker

    _, engine = sa_app
    session = scoped_session(sessionmaker(engine))
    brooq.enqueue(session, brooq.Job("scoped.session", {}))
    session.commit()
    session.remove()
    assert jobs(dsn) == [("scoped.session", {})]


def test_sqlalchemy_on_another_driver_is_refused_by_name(tmp_path: Path) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    engine = create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    with Session(engine) as session, pytest.raises(TypeError) as caught:
        brooq.enqueue(session, brooq.Job("never.written", {}))
    assert "a SQLAlchemy connection only on psycopg 3" in str(caught.value)
    assert "postgresql+psycopg://" in str(caught.value)
    assert "sqlite3" in str(caught.value)
    engine.dispose()


# --------------------------------------------------------------------------- FastAPI


async def _requests(app: Any) -> list[Any]:
    import httpx

    async with (
        app.router.lifespan_context(app),  # its end closes the Queue's async pool
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client,
    ):
        return [
            await client.post("/reports", json={"report_id": 7}),
            await client.post("/reports", json={"report_id": 0}),  # refused by the endpoint
            await client.post("/reports", json={"report": "seven"}),  # refused by FastAPI
        ]


def test_fastapi_endpoint_enqueues_and_a_failed_request_does_not(dsn: str) -> None:
    import asyncio

    example = load_example("fastapi/app.py", "example_fastapi_app")
    queue = brooq.Queue(dsn)
    accepted, refused, malformed = asyncio.run(_requests(example.create_app(queue)))
    assert accepted.status_code == 202, accepted.text
    assert refused.status_code == 422 and malformed.status_code == 422
    assert jobs(dsn) == [("report.render", {"report_id": 7})]
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT id::text FROM job_all").fetchone()
    assert row == (accepted.json()["job"],)
    queue.close()


async def _report_round_trip(app: Any, wait_done: Any) -> tuple[Any, Any, Any]:
    import httpx

    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client,
    ):
        accepted = await client.post("/reports", json={"report_id": 7})
        job = accepted.json()["job"]
        await asyncio.to_thread(wait_done, job)
        return (
            await client.get(f"/reports/{job}"),
            await client.get("/reports/01a2374d-158d-7041-8d47-d2b4a1f858b4"),
            await client.get("/reports/seven"),
        )


def test_the_fastapi_example_has_its_worker_half(dsn: str, start_master: Any) -> None:
    """The endpoint's job is run by brooq-master on the example's jobs.py, and the app
    reads its result back."""
    from tests.harness import wait_for

    example = load_example("fastapi/app.py", "example_fastapi_app")
    start_master(workers=1, app="jobs:queue", cwd=EXAMPLES / "fastapi")
    queue = brooq.Queue(dsn)

    def wait_done(job: str) -> None:
        wait_for(lambda: (r := queue.get(job)) is not None and r.state == "done", what="done")

    done, unknown, malformed = asyncio.run(_report_round_trip(example.create_app(queue), wait_done))
    assert done.status_code == 200, done.text
    assert done.json()["state"] == "done"
    assert done.json()["result"]["report"] == "report-7"
    assert unknown.status_code == 404 and malformed.status_code == 422
    queue.close()


# ------------------------------------------------------------------------ bad targets


@pytest.mark.parametrize("target", [None, "postgresql://x", object(), 42])
def test_anything_else_is_a_type_error_naming_what_is_accepted(target: object) -> None:
    with pytest.raises(TypeError) as caught:
        brooq.enqueue(target, brooq.Job("never.written", {}))
    accepted = (
        "takes a psycopg Connection or Cursor, a Django connection or a SQLAlchemy "
        "Session/Connection (psycopg 3), not "
    )
    assert str(caught.value).startswith("brooq.enqueue " + accepted)
    with pytest.raises(TypeError, match=r"^brooq\.enqueue_many takes a psycopg"):
        brooq.enqueue_many(target, [brooq.Job("never.written", {})])


def test_the_type_error_names_the_type(dsn: str) -> None:
    with pytest.raises(TypeError, match=r"not str$"):
        brooq.enqueue("postgresql://x", brooq.Job("never.written", {}))
    with pytest.raises(TypeError, match=r"not pathlib\.PosixPath$"):
        brooq.enqueue(Path("/"), brooq.Job("never.written", {}))


async def _async_target(dsn: str) -> str:
    async with await psycopg.AsyncConnection.connect(dsn) as aconn:
        try:
            brooq.enqueue(aconn, brooq.Job("never.written", {}))
        except TypeError as exc:
            return str(exc)
    return "no error"


def test_an_async_connection_is_pointed_to_enqueue_async(dsn: str) -> None:
    import asyncio

    message = asyncio.run(_async_target(dsn))
    assert "use brooq.enqueue_async" in message


def test_brooq_imports_no_framework(dsn: str) -> None:
    """brooq recognises the frameworks' objects without importing them."""
    code = f"""
import sys, psycopg, brooq
with psycopg.connect({dsn!r}) as conn:
    brooq.enqueue(conn, brooq.Job("plain.psycopg", {{}}))
try:
    brooq.enqueue(object(), brooq.Job("never.written", {{}}))
except TypeError:
    pass
loaded = [m for m in ("django", "sqlalchemy", "fastapi") if m in sys.modules]
assert not loaded, loaded
"""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert jobs(dsn) == [("plain.psycopg", {})]


def test_script_ranges_and_parts() -> None:
    newest = migration_files.load()[-1].version
    assert migrate.script("up") == migrate.script("up", first=1, last=newest)
    only_two = migrate.script("up", first=2, last=2)
    assert "0002_lease_expiries (up)" in only_two and "0001_job" not in only_two
    for first, last in ((0, None), (2, 1), (1, newest + 1)):
        with pytest.raises(brooq.BrooqError, match="this brooq ships 1 to"):
            migrate.script("up", first=first, last=last)
    with pytest.raises(brooq.BrooqError, match="direction"):
        migrate.script_parts("sideways")
    parts = migrate.script_parts("up")
    concurrent = [p for p in parts if "CONCURRENTLY" in p]
    assert concurrent and all(len(migration_files.statements(p)) == 1 for p in concurrent)
    every = migration_files.load()
    expected = sum(1 if m.transactional else len(migration_files.statements(m.up)) for m in every)
    assert len(parts) == expected  # a transactional file whole, the others per statement
