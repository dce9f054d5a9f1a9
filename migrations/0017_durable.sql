-- Durable handlers: steps recorded once, sleeps and waits that hold no worker, child jobs
-- a handler waits for (docs/how-to/durable-handlers.md says what they promise).
--   brooq_job_step:      one row per (job, step name): the step's result as JSON, written
--                        in its own committed transaction while the job is still
--                        processing and held by the writer; a later attempt reads it
--                        back instead of running the step. Deleted with its job.
--   brooq_event:         one row per key: the first emit's payload (later emits change
--                        nothing); a wait that comes after reads it at once.
--                        Retention deletes an event older than its TTL that no job waits
--                        on (brooq_event_emitted_idx).
--   brooq_event_wait:    the job parked until key is emitted (one key per job), since when.
--   job.parked:          why a pending or waiting job is parked: 'sleep' (pending until
--                        its wake time), 'event' (waiting, or pending until its wait's
--                        deadline), 'jobs' (waiting for its children); NULL otherwise.
--                        Read with the state: a job claimed again keeps the word.
--   brooq_emit_event:    an emit, under the key's transaction-scoped advisory lock: the
--                        event stored if first, the jobs waiting on it made pending now,
--                        their wait rows gone, a NOTIFY on brooq_job. Returns whether
--                        this emit was the first.
--   brooq_park_event:    a handler's wait, under the same lock: false when the event
--                        exists (read it), NULL when the job is no longer processing and
--                        held by p_me (the lease was lost), else the job parked (waiting,
--                        or pending until p_until) with its attempt refunded, true.
--   brooq_park_jobs:     a handler's wait for child jobs: the children locked in id
--                        order (an outcome being written is waited for, never missed),
--                        false when all ended, NULL on a lost lease, else the parent
--                        waiting with edges from its open children (brooq_job_edge at
--                        negative positions, so claim.upstream and the page's graph, which
--                        read positions from 1, never list them) and upstream_open their
--                        count; brooq_jobs_ended (0016) then makes it pending once, in the
--                        last child's outcome transaction.
-- No-transaction, every statement idempotent and retried under the migrator's
-- lock_timeout: the column is catalog-only (no default), the rest are new objects.
-- Measured on 1,000,000 rows (benchmarks/migration_locks.py --migration 17): ACCESS
-- EXCLUSIVE on job for 0.6 ms up (the ADD COLUMN; 57 ms in all) and 4.9 ms down (the
-- check of parked jobs reads the small tables, not job; 17 ms in all), producers and
-- claims undisturbed; behind a 3 s reader the ADD COLUMN gave up twice after 500 ms
-- (lock_timeout) and was retried.
-- migrate:no-transaction
-- migrate:up
ALTER TABLE job ADD COLUMN IF NOT EXISTS parked text;

CREATE TABLE IF NOT EXISTS brooq_job_step (
    job_id     uuid        NOT NULL REFERENCES job (id) ON DELETE CASCADE,
    name       text        NOT NULL,
    result     jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT brooq_job_step_pkey PRIMARY KEY (job_id, name)
);

CREATE TABLE IF NOT EXISTS brooq_event (
    key        text        NOT NULL,
    payload    jsonb,
    emitted_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT brooq_event_pkey PRIMARY KEY (key)
);

CREATE TABLE IF NOT EXISTS brooq_event_wait (
    job_id uuid        NOT NULL REFERENCES job (id) ON DELETE CASCADE,
    key    text        NOT NULL,
    since  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT brooq_event_wait_pkey PRIMARY KEY (job_id)
);

CREATE INDEX IF NOT EXISTS brooq_event_wait_key_idx ON brooq_event_wait (key);

-- Retention finds the events older than its TTL by this index (events_expire).
CREATE INDEX IF NOT EXISTS brooq_event_emitted_idx ON brooq_event (emitted_at);

CREATE OR REPLACE FUNCTION brooq_emit_event(p_key text, p_payload jsonb) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    ready boolean;
BEGIN
    -- One emit or park of a key at a time: a wait parks before this emit (and is
    -- released by it) or reads the event it stored, never neither.
    PERFORM pg_advisory_xact_lock(hashtextextended(p_key, 0));
    INSERT INTO brooq_event (key, payload) VALUES (p_key, p_payload)
    ON CONFLICT (key) DO NOTHING;
    IF NOT FOUND THEN
        RETURN false;  -- the first emit won
    END IF;
    WITH waits AS (
        DELETE FROM brooq_event_wait w WHERE w.key = p_key RETURNING w.job_id
    ), moved AS (
        UPDATE job j
        SET state = 'pending', available_at = now(), updated_at = now()
        WHERE j.id = ANY(ARRAY(SELECT waits.job_id FROM waits))
          AND j.state IN ('waiting', 'pending') AND j.parked = 'event'
        RETURNING j.id
    )
    SELECT count(*) > 0 INTO ready FROM moved;
    IF ready THEN
        PERFORM pg_notify('brooq_job', (SELECT n.nspname::text FROM pg_namespace n
                                        JOIN pg_class c ON c.relnamespace = n.oid
                                        WHERE c.oid = 'job'::regclass));
    END IF;
    RETURN true;
END;
$$;

CREATE OR REPLACE FUNCTION brooq_park_event(
    p_job uuid, p_me text, p_key text, p_until timestamptz
) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_key, 0));
    IF EXISTS (SELECT 1 FROM brooq_event e WHERE e.key = p_key) THEN
        RETURN false;
    END IF;
    UPDATE job
    SET state = CASE WHEN p_until IS NULL THEN 'waiting' ELSE 'pending' END,
        available_at = coalesce(p_until, available_at),
        attempts = greatest(attempts - 1, 0),
        locked_by = NULL, locked_until = NULL, parked = 'event', updated_at = now()
    WHERE id = p_job AND state = 'processing' AND locked_by = p_me;
    IF NOT FOUND THEN
        RETURN NULL;  -- the lease was lost
    END IF;
    INSERT INTO brooq_event_wait (job_id, key) VALUES (p_job, p_key)
    ON CONFLICT (job_id) DO UPDATE SET key = EXCLUDED.key, since = now();
    RETURN true;
END;
$$;

CREATE OR REPLACE FUNCTION brooq_park_jobs(p_job uuid, p_me text, p_ids uuid[]) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    missing uuid;
    open integer;
    base integer;
BEGIN
    -- The children in id order (as brooq_job_after locks upstream jobs): an outcome
    -- being written is waited for (its trigger then finds the edges below, or its end is
    -- read here), never missed.
    PERFORM 1 FROM job j WHERE j.id = ANY(p_ids) ORDER BY j.id FOR NO KEY UPDATE;
    SELECT u INTO missing FROM unnest(p_ids) AS u
    WHERE NOT EXISTS (SELECT 1 FROM job j WHERE j.id = u) LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'wait_jobs names job %, which does not exist', missing
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    SELECT count(DISTINCT j.id) INTO open FROM job j
    WHERE j.id = ANY(p_ids) AND j.state NOT IN ('done', 'dead', 'canceled');
    IF open = 0 THEN
        RETURN false;
    END IF;
    -- 'run': a failed child never cancels its parent, which reads how each ended.
    UPDATE job
    SET state = 'waiting', upstream_open = open, on_upstream_failure = 'run',
        attempts = greatest(attempts - 1, 0),
        locked_by = NULL, locked_until = NULL, parked = 'jobs', updated_at = now()
    WHERE id = p_job AND state = 'processing' AND locked_by = p_me;
    IF NOT FOUND THEN
        RETURN NULL;  -- the lease was lost (the caller rolls back)
    END IF;
    UPDATE job j SET has_downstream = true
    WHERE j.id = ANY(p_ids) AND j.has_downstream IS NOT TRUE;
    SELECT least(coalesce(min(e.position), 0), 0) INTO base
    FROM brooq_job_edge e WHERE e.downstream_id = p_job;
    -- A child an earlier wait named keeps its edge (it counts once, when it ends).
    INSERT INTO brooq_job_edge (downstream_id, position, upstream_id, ended)
    SELECT p_job, base - row_number() OVER (ORDER BY c.n)::integer, c.id, false
    FROM (
        SELECT u.id, min(u.n) AS n
        FROM unnest(p_ids) WITH ORDINALITY AS u(id, n)
        JOIN job j ON j.id = u.id AND j.state NOT IN ('done', 'dead', 'canceled')
        GROUP BY u.id
    ) AS c
    ON CONFLICT (upstream_id, downstream_id) DO NOTHING;
    RETURN true;
END;
$$;

-- migrate:down
-- One transaction, all or nothing: ACCESS EXCLUSIVE on job first (under the migrator's
-- lock_timeout, retried), which waits for every transaction that wrote to job, so the
-- check sees every parked job; a parked job would never be woken without these objects.
DO $$
BEGIN
    LOCK TABLE job IN ACCESS EXCLUSIVE MODE;
    -- Found from the small tables (a parked job has a sleep's step, a wait row or an
    -- edge to a child), not by a scan of job under the lock.
    IF EXISTS (SELECT 1 FROM brooq_event_wait w JOIN job j ON j.id = w.job_id
               WHERE j.state IN ('pending', 'waiting') AND j.parked = 'event')
       OR EXISTS (SELECT 1 FROM brooq_job_step s JOIN job j ON j.id = s.job_id
                  WHERE s.name LIKE '\_\_sleep:%' AND j.state = 'pending' AND j.parked = 'sleep')
       OR EXISTS (SELECT 1 FROM brooq_job_edge e JOIN job j ON j.id = e.downstream_id
                  WHERE e.position < 0 AND j.state = 'waiting' AND j.parked = 'jobs') THEN
        RAISE EXCEPTION 'jobs are parked (sleeping or waiting for an event or child jobs): '
                        'cancel them first (brooq jobs cancel ID)';
    END IF;
    DROP FUNCTION IF EXISTS brooq_park_jobs(uuid, text, uuid[]);
    DROP FUNCTION IF EXISTS brooq_park_event(uuid, text, text, timestamptz);
    DROP FUNCTION IF EXISTS brooq_emit_event(text, jsonb);
    DROP TABLE IF EXISTS brooq_event_wait;
    DROP TABLE IF EXISTS brooq_event;
    DROP TABLE IF EXISTS brooq_job_step;
    DELETE FROM brooq_job_edge WHERE position < 0;
    ALTER TABLE job DROP COLUMN IF EXISTS parked;
END;
$$;
