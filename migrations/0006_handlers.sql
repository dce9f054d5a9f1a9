-- Results, error history and waiting. Three nullable columns without a
-- default: catalog-only, the ACCESS EXCLUSIVE lock lasts milliseconds (measured on
-- 1,000,000 rows in RELIABILITY.md). No-transaction, so each statement runs under the
-- migrator's lock_timeout and is retried: a long reader delays the migration, never the
-- producers and claims queued behind it. Every statement is idempotent.
--   result: what the handler returned (JSON), written with `done`.
--   errors: one entry per failed attempt, the last 20, oldest first.
--   waited: set by queue.wait() alone; the trigger below notifies the end of such a job,
--           so a job nobody waits for costs the workers nothing (the false WHEN is
--           evaluated without calling the function).
-- CREATE OR REPLACE TRIGGER needs PostgreSQL 14: hence DROP, then CREATE. The function's
-- body is quoted (a no-transaction file is split at a semicolon ending a line).
-- migrate:no-transaction
-- migrate:up
ALTER TABLE job ADD COLUMN IF NOT EXISTS result jsonb,
                ADD COLUMN IF NOT EXISTS errors jsonb,
                ADD COLUMN IF NOT EXISTS waited boolean;

CREATE OR REPLACE FUNCTION brooq_job_waited_notify() RETURNS trigger LANGUAGE plpgsql
    AS 'BEGIN PERFORM pg_notify(''brooq_outcome'', NEW.id::text); RETURN NULL; END';

DROP TRIGGER IF EXISTS job_waited_notify ON job;

CREATE TRIGGER job_waited_notify AFTER UPDATE OF state ON job FOR EACH ROW
    WHEN (NEW.waited AND NEW.state IN ('done', 'dead', 'canceled')
          AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION brooq_job_waited_notify();

-- migrate:down
-- One transaction, all or nothing (catalog changes only): ACCESS EXCLUSIVE on job first,
-- under the migrator's lock_timeout and retried, so no lock is taken twice.
DO $$
BEGIN
    LOCK TABLE job IN ACCESS EXCLUSIVE MODE;
    DROP TRIGGER IF EXISTS job_waited_notify ON job;
    DROP FUNCTION IF EXISTS brooq_job_waited_notify();
    ALTER TABLE job DROP COLUMN IF EXISTS waited,
                    DROP COLUMN IF EXISTS errors,
                    DROP COLUMN IF EXISTS result;
END;
$$;
