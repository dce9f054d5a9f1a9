"""/readyz when the database answers but refuses every claim (a full disk or
tablespace: SQLSTATE 53100, raised here by a trigger on the claim's UPDATE only, so the
master's own connection and statements keep working): not ready, with the reason, and
ready again once claims work."""

from __future__ import annotations

from typing import Any

import psycopg

import brooq
from tests.harness import StartMaster, executions, wait_for
from tests.process.test_operations import get, ops_addr

REFUSE_CLAIMS = """
CREATE FUNCTION refuse_claims() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'could not extend file: No space left on device'
        USING ERRCODE = 'disk_full';
END $$;
CREATE TRIGGER refuse_claims BEFORE UPDATE ON job FOR EACH ROW
    WHEN (OLD.state <> 'processing' AND NEW.state = 'processing')
    EXECUTE FUNCTION refuse_claims();
"""


def test_readyz_is_503_while_every_claim_fails(
    start_master: StartMaster, queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    m = start_master(workers=2)
    addr = ops_addr(m)
    wait_for(lambda: get(addr, "/readyz") == (200, "ready\n"), what="ready")
    db.execute(REFUSE_CLAIMS)
    job_id, _ = queue.enqueue(brooq.Job("t.ok"))
    wait_for(lambda: get(addr, "/readyz")[0] == 503, timeout=15, what="503")
    status, reason = get(addr, "/readyz")
    assert status == 503 and "claims fail" in reason and "No space left on device" in reason, reason
    assert get(addr, "/healthz") == (200, "ok\n")  # the master loop itself is fine
    assert executions(db, job_id) == 0
    db.execute("DROP TRIGGER refuse_claims ON job")
    wait_for(lambda: executions(db, job_id) == 1, what="the job ran")
    wait_for(lambda: get(addr, "/readyz") == (200, "ready\n"), what="ready again")
