-- Lighter inserts: what every job row paid for and no statement needs.
-- 1. job_ready_idx (available_at, id), the first release's claim index, was kept beside
--    job_ready_queue_idx (0003) for masters of that release during a rolling deploy. No
--    statement of brooq reads it any more; every insert and every claim paid for it.
-- 2. The queue name's CHECK ran its regular expression on every row; the rows of the
--    default queue (most of them) now pass on the equality alone.
-- Measured on a bulk enqueue of 100,000 jobs by COPY: 5.15 -> 4.2 us of server CPU per
-- job, 0.75 of it the index (docs/decisions.md). Masters of a release
-- before queues (0003) must be stopped before this runs: their claim would scan the
-- table. DROP INDEX CONCURRENTLY never blocks producers or claims (SHARE UPDATE
-- EXCLUSIVE) and cannot run in a transaction; the CHECK is swapped NOT VALID (catalog
-- only, a few milliseconds of ACCESS EXCLUSIVE), then validated under SHARE UPDATE
-- EXCLUSIVE, as 0003 did.
-- migrate:no-transaction
-- migrate:up
DROP INDEX CONCURRENTLY IF EXISTS job_ready_idx;

ALTER TABLE job DROP CONSTRAINT IF EXISTS job_queue_check,
                ADD CONSTRAINT job_queue_check
                    CHECK (queue = 'default'
                           OR (length(queue) <= 128 AND queue ~ '^[a-z0-9]+([._-][a-z0-9]+)*$'))
                    NOT VALID;
ALTER TABLE job VALIDATE CONSTRAINT job_queue_check;

-- migrate:down
-- The index first: its concurrent build waits for every older snapshot, and a build that
-- gives up (its invalid index dropped) has changed nothing, so the version stays applied.
CREATE INDEX CONCURRENTLY IF NOT EXISTS job_ready_idx
    ON job (available_at, id) WHERE state IN ('pending', 'failed');

ALTER TABLE job DROP CONSTRAINT IF EXISTS job_queue_check,
                ADD CONSTRAINT job_queue_check
                    CHECK (length(queue) <= 128 AND queue ~ '^[a-z0-9]+([._-][a-z0-9]+)*$')
                    NOT VALID;

ALTER TABLE job VALIDATE CONSTRAINT job_queue_check;
