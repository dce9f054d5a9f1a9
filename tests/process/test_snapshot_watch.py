"""A real master names a snapshot held past QUEUE_SNAPSHOT_WARN: a REPEATABLE READ
transaction left open by a recognisable application is named in the log once (pid,
application, client, state; never its query), its age is the gauge, the status page
shows it, and its end is said and the gauge falls."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import psycopg

from tests.harness import StartMaster, wait_for
from tests.process.test_operations import get, ops_addr, sample

GAUGE = "brooq_oldest_snapshot_age_seconds"


def test_a_held_snapshot_is_named_once_gauged_shown_and_its_end_said(
    dsn: str, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    m = start_master(workers=1, env={"QUEUE_SNAPSHOT_WARN": "1s"})
    addr = ops_addr(m)
    app = f"culprit-{uuid.uuid4().hex[:8]}"
    secret = f"secret-{uuid.uuid4().hex}"
    with psycopg.connect(dsn, application_name=app) as holder:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM job WHERE topic <> %s", (secret,))
        began = time.monotonic()
        row = holder.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        pid = row[0]
        line = re.compile(
            rf"event=snapshot_held kind=session backend={pid} application='{app}' "
            r"user='postgres' client=\S+ state='idle in transaction' age=(\d+)s "
            r"age_from=xact_start xid_age=\d+ since=\S+ query_start=\S+: "
        )
        found = wait_for(lambda: line.search(m.log()), timeout=60, what="the holder named")
        named_after = time.monotonic() - began
        print(f"named {named_after:.1f} s after the snapshot was taken (threshold 1 s)")
        assert int(found.group(1)) >= 1
        assert secret not in m.log()  # the query text is never logged

        def gauge() -> float:
            return sample(get(addr, "/metrics")[1], GAUGE)

        # Several looks later (one a second), the gauge has grown and the line is
        # still said once.
        seen = wait_for(lambda: (g := gauge()) >= named_after + 3 and g, what="gauge grows")
        assert len(line.findall(m.log())) == 1
        status, page = get(addr, "/")
        assert status == 200
        assert f"session {pid} ({app}, postgres, " in page, page
        holder.commit()
    released = re.compile(rf"event=snapshot_released kind=session backend={pid} .*held=(\d+)s")
    ended = wait_for(lambda: released.search(m.log()), what="the release said")
    assert int(ended.group(1)) >= 3
    fallen = wait_for(lambda: (g := gauge()) < seen / 2 and [g], what="gauge falls")
    print(f"gauge {seen:.1f} s while held, {fallen[0]:.2f} s after")
    assert len(line.findall(m.log())) == 1 and len(released.findall(m.log())) == 1
