-- Jobs on hold: state 'on_hold', a job no claim takes until an operator releases it
-- (queue.hold and queue.release, Job(held=True); docs/how-to/hold.md).
--   state 'on_hold':  out of the ready index (its predicate holds pending and failed
--                     only), so claims never read it and a held job costs them nothing.
--   job_on_hold_idx:  the held jobs by queue and topic, for the counts (an arm of their
--                     OR of partial-index predicates) and the bulk release by topic; a
--                     row in any other state writes no entry.
-- No-transaction: the state CHECK replaced NOT VALID then validated without the ACCESS
-- EXCLUSIVE lock, the index built CONCURRENTLY; each statement runs under the migrator's
-- lock_timeout and is retried; every statement is idempotent.
-- migrate:no-transaction
-- migrate:up
ALTER TABLE job DROP CONSTRAINT IF EXISTS job_state_check,
                ADD CONSTRAINT job_state_check CHECK (state IN ('pending', 'processing',
                    'failed', 'done', 'dead', 'canceled', 'waiting', 'on_hold')) NOT VALID;

ALTER TABLE job VALIDATE CONSTRAINT job_state_check;

CREATE INDEX CONCURRENTLY IF NOT EXISTS job_on_hold_idx ON job (queue, topic)
    WHERE state = 'on_hold';

-- migrate:down
-- The held jobs go back where a release puts them (pending, their place in line kept:
-- they run once the previous release's masters claim them); then the CHECK without
-- 'on_hold', NOT VALID (no job can go on hold any more: the previous release's code has
-- no hold), validated under SHARE UPDATE EXCLUSIVE.
UPDATE job SET state = 'pending', updated_at = now() WHERE state = 'on_hold';

DROP INDEX CONCURRENTLY IF EXISTS job_on_hold_idx;

ALTER TABLE job DROP CONSTRAINT IF EXISTS job_state_check,
                ADD CONSTRAINT job_state_check CHECK (state IN ('pending', 'processing',
                    'failed', 'done', 'dead', 'canceled', 'waiting')) NOT VALID;

ALTER TABLE job VALIDATE CONSTRAINT job_state_check;
