"""The snapshot_holders statement against real servers: a held session of this database
(and only of this one), an idle transaction that wrote, another role's session as an
unprivileged reader sees it; then, on a primary and its streaming standby, a standby's
feedback, a replication slot (active, then with its standby gone), a prepared
transaction, and a logical slot that holds back the catalogs only (not listed)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import conninfo, sql

from brooq.operator.snapshots import PREPARED, SESSION, SLOT, STANDBY, Holder, holders
from tests.harness import wait_for
from tests.pgpair import PostgresPair


def _pid(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def _of(found: list[Holder], pid: int) -> list[Holder]:
    return [h for h in found if h.pid == pid]


def test_a_repeatable_read_session_is_listed_with_who_it_is_until_it_ends(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    app = f"culprit-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, application_name=app) as holder:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM job")  # the snapshot is taken here
        pid = _pid(holder)
        time.sleep(0.2)
        mine = _of(holders(db), pid)
        assert len(mine) == 1, mine
        h = mine[0]
        assert (h.kind, h.name, h.user) == (SESSION, app, "postgres")
        assert h.state == "idle in transaction"
        assert h.client in ("127.0.0.1", "::1", "local")
        assert h.since is not None and h.since == h.xact_start
        assert h.seconds is not None and h.seconds >= 0.2
        assert h.xid_age >= 0 and h.xmin.isdigit()
        assert h.key == (SESSION, str(pid), h.since.isoformat())
        holder.commit()
        assert _of(holders(db), pid) == []


def test_an_idle_transaction_that_wrote_holds_by_its_transaction_id(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(dsn) as writer:  # READ COMMITTED: no snapshot between statements
        row = writer.execute(
            "INSERT INTO brooq_queue (name, paused) VALUES ('culprit', false) "
            "RETURNING pg_current_xact_id()::text"
        ).fetchone()
        assert row is not None
        mine = _of(holders(db), _pid(writer))
        assert [(h.kind, h.xmin) for h in mine] == [(SESSION, row[0])]
        writer.rollback()


def test_sessions_of_other_databases_and_the_reader_itself_are_not_listed(
    dsn: str, admin_dsn: str
) -> None:
    with psycopg.connect(admin_dsn) as elsewhere, psycopg.connect(dsn) as reader:
        elsewhere.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        elsewhere.execute("SELECT 1")
        reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        reader.execute("SELECT 1")  # the reader holds a snapshot too, in its transaction
        pids = {h.pid for h in holders(reader)}
        assert _pid(elsewhere) not in pids and _pid(reader) not in pids
        # The same session is listed to a reader of its own database.
        with psycopg.connect(admin_dsn, autocommit=True) as there:
            assert _pid(elsewhere) in {h.pid for h in holders(there)}


def test_an_unprivileged_reader_sees_who_holds_but_not_since_when(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    role = f"culprit_{uuid.uuid4().hex[:8]}"
    db.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        with (
            psycopg.connect(dsn, application_name="hidden-holder") as holder,
            psycopg.connect(conninfo.make_conninfo(dsn, user=role), autocommit=True) as reader,
        ):
            holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT 1")
            mine = _of(holders(reader), _pid(holder))
            assert len(mine) == 1
            h = mine[0]
            assert (h.kind, h.name, h.user) == (SESSION, "hidden-holder", "postgres")
            assert h.seconds is None and h.since is None and h.state is None
            assert h.key == (SESSION, str(h.pid), h.xmin)  # keyed by the xmin it holds
            holder.rollback()
    finally:
        db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _kind(primary: str, kind: str) -> Callable[[], list[Holder]]:
    def look() -> list[Holder]:
        with psycopg.connect(primary, autocommit=True) as conn:
            return [h for h in holders(conn) if h.kind == kind]

    return look


def test_a_standby_a_slot_and_a_prepared_transaction_hold_the_primary() -> None:
    conf = {
        "hot_standby_feedback": "on",
        "wal_receiver_status_interval": "1s",
        "max_prepared_transactions": "5",
        "wal_level": "logical",
    }
    with PostgresPair(conf) as pair:
        primary = pair.primary.dsn()
        with psycopg.connect(primary, autocommit=True) as p:
            p.execute("CREATE TABLE t (n int)")
            # A logical slot holds back the catalogs only (catalog_xmin): not listed.
            p.execute("SELECT pg_create_logical_replication_slot('decoder', 'test_decoding')")
            assert wait_for(_kind(primary, STANDBY), what="the standby's feedback")
            with psycopg.connect(pair.standby.dsn()) as query:
                query.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                query.execute("SELECT count(*) FROM t")
                for _ in range(20):
                    p.execute("INSERT INTO t VALUES (1)")
                # The standby's query is 20 transactions old and still holds.
                held = wait_for(
                    lambda: [h for h in _kind(primary, STANDBY)() if h.xid_age >= 20],
                    what="a standby holding 20 transactions back",
                )
                assert held[0].name == "standby" and held[0].since is None
                assert held[0].seconds is None and held[0].pid is not None
                # Through a physical slot, the slot holds instead of the walsender.
                p.execute("SELECT pg_create_physical_replication_slot('culprit_slot')")
                with psycopg.connect(pair.standby.dsn(), autocommit=True) as s:
                    s.execute("ALTER SYSTEM SET primary_slot_name = 'culprit_slot'")
                    s.execute("SELECT pg_reload_conf()")
                slots = wait_for(_kind(primary, SLOT), timeout=30, what="the slot's xmin")
                assert [(h.name, h.state) for h in slots] == [("culprit_slot", "active")]
                assert slots[0].xid_age >= 20 and slots[0].pid is not None
                assert "decoder" not in {h.name for h in holders(p)}
                gid = f"culprit-{uuid.uuid4().hex[:8]}"
                p.execute(f"BEGIN; INSERT INTO t VALUES (2); PREPARE TRANSACTION '{gid}'")
                prepared = _kind(primary, PREPARED)()
                assert [(h.name, h.user, h.state) for h in prepared] == [
                    (gid, "postgres", "prepared")
                ]
                assert prepared[0].since is not None and prepared[0].seconds is not None
                p.execute(f"ROLLBACK PREPARED '{gid}'")
                assert _kind(primary, PREPARED)() == []
            # The standby gone, its slot keeps holding the xmin it last reported.
            pair.standby.stop("fast")
            gone = wait_for(
                lambda: [h for h in _kind(primary, SLOT)() if h.state == "inactive"],
                what="an inactive slot",
            )
            assert gone[0].name == "culprit_slot" and gone[0].pid is None
            assert gone[0].key == (SLOT, "culprit_slot", gone[0].xmin)
            p.execute("SELECT pg_drop_replication_slot('culprit_slot')")
            p.execute("SELECT pg_drop_replication_slot('decoder')")
            assert _kind(primary, SLOT)() == []
