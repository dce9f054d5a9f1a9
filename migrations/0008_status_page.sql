-- The status page (docs/status-page.md): its lists of failed and of dead jobs,
-- newest first by keyset (updated_at, id) within one state, and its overview's count of
-- dead jobs. Without it both read the whole terminal index or the whole table: dead rows
-- are a few in a sea of done ones (measured on 1,000,000 jobs in docs/status-page.md).
-- Partial, so the hot path pays nothing: an entry is written only for a row version that
-- is failed or dead (a failed attempt, a job given up on), never for a claim or a done.
-- CONCURRENTLY, in a no-transaction file: the build holds SHARE UPDATE EXCLUSIVE, so
-- producers and claims go on meanwhile; a failed build leaves an invalid index, which the
-- migrator drops and builds again (brooq.migrate).
-- migrate:no-transaction
-- migrate:up
CREATE INDEX CONCURRENTLY IF NOT EXISTS job_failed_dead_idx
    ON job (state, updated_at DESC, id DESC)
    WHERE state IN ('failed', 'dead');

-- migrate:down
DROP INDEX CONCURRENTLY IF EXISTS job_failed_dead_idx;
