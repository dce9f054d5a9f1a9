-- Unique while active, debounce and tags (docs/how-to/unique-and-debounce.md says what
-- they promise, docs/explanation/unique-keys.md why this shape keeps the promises).
--   unique_key:  at most one job per (topic, unique_key) in pending, failed or processing
--                (job_unique_key_idx), and at most one more, a debounced job waiting for
--                the key's job to end (job_unique_key_waiting_idx).
--   start_after: set on such a waiting job only: the start it asks for once the key's job
--                ends. Its available_at is then 9999-01-01, so no claim takes it while the
--                key's job is active; the claim is the statement it always was.
--   tags:        a few short labels to list, cancel and retry jobs by (NULL: none).
-- Each index is partial: a job without a unique_key writes no entry in either, so the
-- producers and claims of such jobs pay only the predicates' test.
-- Three functions move a waiting job into the key's place, each one way:
--   brooq_job_promote(id, wait): the move itself, refused by job_unique_key_idx while the
--     key's job is active (caught: the job stays waiting); `wait` false (the master's
--     sweep) gives up after 100 ms instead of waiting for a lock.
--   job_unique_key_freed (AFTER UPDATE OF state): the key's job became done, dead or
--     canceled: its waiting job moves up, unless someone holds that row's lock (skipped,
--     never waited for: the writer is a worker's outcome).
--   job_unique_key_waiting (a constraint trigger, deferred to the commit of the producer
--     that wrote a waiting job): the move is tried then, and waits for a transaction that
--     is ending the key's job, so the two cannot miss each other.
-- The master's reaper pass moves up a waiting job whose key has no job left (a
-- producer that rolled back while the key's job ended, a row deleted by hand).
-- No-transaction: the indexes are built CONCURRENTLY (SHARE UPDATE EXCLUSIVE: producers
-- and claims go on); the columns are catalog-only (no default), the CHECKs added NOT VALID
-- and validated without the ACCESS EXCLUSIVE lock, the triggers catalog-only; each
-- statement under the migrator's lock_timeout, retried (measured on 1,000,000 rows in
-- docs/reference/schema.md). Every statement is idempotent. The functions' bodies are
-- quoted and put each ';' at the start of a line: a no-transaction file is split at a
-- ';' ending a line. Their search_path is the migration's: brooq's schema.
-- migrate:no-transaction
-- migrate:up
ALTER TABLE job ADD COLUMN IF NOT EXISTS unique_key text,
                ADD COLUMN IF NOT EXISTS start_after timestamptz,
                ADD COLUMN IF NOT EXISTS tags text[];

ALTER TABLE job DROP CONSTRAINT IF EXISTS job_unique_key_check,
                ADD CONSTRAINT job_unique_key_check CHECK (unique_key <> '') NOT VALID;
ALTER TABLE job VALIDATE CONSTRAINT job_unique_key_check;

-- 1 to 8 tags, each 1 to 64 characters of brooq.job_options.TAG_PATTERN; a NULL element
-- becomes '*', which the pattern refuses.
ALTER TABLE job DROP CONSTRAINT IF EXISTS job_tags_check,
                ADD CONSTRAINT job_tags_check CHECK (
                    array_ndims(tags) = 1
                    AND array_to_string(tags, ',', '*')
                        ~ '^[A-Za-z0-9][A-Za-z0-9_.:=/-]{0,63}(,[A-Za-z0-9][A-Za-z0-9_.:=/-]{0,63}){0,7}$'
                ) NOT VALID;
ALTER TABLE job VALIDATE CONSTRAINT job_tags_check;

CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS job_unique_key_idx
    ON job (topic, unique_key)
    WHERE unique_key IS NOT NULL AND start_after IS NULL
      AND state IN ('pending', 'failed', 'processing');

CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS job_unique_key_waiting_idx
    ON job (topic, unique_key)
    WHERE unique_key IS NOT NULL AND start_after IS NOT NULL AND state = 'pending';

CREATE OR REPLACE FUNCTION brooq_job_promote(p_id uuid, p_wait boolean) RETURNS boolean
    LANGUAGE plpgsql SET search_path FROM CURRENT AS '
DECLARE
    ready boolean
; BEGIN
    IF NOT p_wait THEN
        PERFORM set_config(''lock_timeout'', ''100ms'', true)
    ; END IF
    ; UPDATE job SET available_at = greatest(now(), start_after), start_after = NULL,
                   updated_at = now()
    WHERE id = p_id AND start_after IS NOT NULL AND state = ''pending''
    RETURNING available_at <= now() INTO ready
    ; IF ready THEN
        PERFORM pg_notify(''brooq_job'', (SELECT n.nspname::text FROM pg_namespace n
                                         JOIN pg_class c ON c.relnamespace = n.oid
                                         WHERE c.oid = ''job''::regclass))
    ; END IF
    ; RETURN ready IS NOT NULL
; EXCEPTION WHEN unique_violation OR lock_not_available THEN
    RETURN false
; END';

CREATE OR REPLACE FUNCTION brooq_job_unique_key_freed() RETURNS trigger
    LANGUAGE plpgsql SET search_path FROM CURRENT AS '
DECLARE
    waiting uuid
; BEGIN
    SELECT id INTO waiting FROM job
    WHERE topic = OLD.topic AND unique_key = OLD.unique_key
      AND start_after IS NOT NULL AND state = ''pending''
    FOR NO KEY UPDATE SKIP LOCKED
    ; IF FOUND THEN
        PERFORM brooq_job_promote(waiting, true)
    ; END IF
    ; RETURN NULL
; END';

CREATE OR REPLACE FUNCTION brooq_job_unique_key_waiting() RETURNS trigger
    LANGUAGE plpgsql SET search_path FROM CURRENT AS '
BEGIN
    PERFORM brooq_job_promote(NEW.id, true)
    ; RETURN NULL
; END';

DROP TRIGGER IF EXISTS job_unique_key_freed ON job;

CREATE TRIGGER job_unique_key_freed AFTER UPDATE OF state ON job FOR EACH ROW
    WHEN (OLD.unique_key IS NOT NULL AND OLD.start_after IS NULL
          AND OLD.state IN ('pending', 'failed', 'processing')
          AND NEW.state IN ('done', 'dead', 'canceled'))
    EXECUTE FUNCTION brooq_job_unique_key_freed();

DROP TRIGGER IF EXISTS job_unique_key_waiting ON job;

CREATE CONSTRAINT TRIGGER job_unique_key_waiting AFTER INSERT OR UPDATE OF start_after ON job
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NEW.start_after IS NOT NULL AND NEW.state = 'pending')
    EXECUTE FUNCTION brooq_job_unique_key_waiting();

-- migrate:down
-- One transaction, all or nothing (catalog changes only): ACCESS EXCLUSIVE on job first,
-- under the migrator's lock_timeout and retried, so no lock is taken twice.
DO $$
BEGIN
    LOCK TABLE job IN ACCESS EXCLUSIVE MODE;
    DROP TRIGGER IF EXISTS job_unique_key_waiting ON job;
    DROP TRIGGER IF EXISTS job_unique_key_freed ON job;
    DROP FUNCTION IF EXISTS brooq_job_unique_key_waiting();
    DROP FUNCTION IF EXISTS brooq_job_unique_key_freed();
    DROP FUNCTION IF EXISTS brooq_job_promote(uuid, boolean);
    DROP INDEX IF EXISTS job_unique_key_waiting_idx;
    DROP INDEX IF EXISTS job_unique_key_idx;
    ALTER TABLE job DROP CONSTRAINT IF EXISTS job_tags_check,
                    DROP CONSTRAINT IF EXISTS job_unique_key_check;
    ALTER TABLE job DROP COLUMN IF EXISTS tags,
                    DROP COLUMN IF EXISTS start_after,
                    DROP COLUMN IF EXISTS unique_key;
END;
$$;
