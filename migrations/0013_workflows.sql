-- Workflows: jobs that wait for other jobs (docs/how-to/workflows.md says what they
-- promise, docs/explanation/workflows.md why a counter keeps the promise).
--   state 'waiting':          a job named with after=[...] whose upstream jobs have not all
--                             ended; no claim reads it (the ready index holds pending and
--                             failed rows only).
--   job.upstream_open:        how many of its upstream jobs have not ended (NULL: a job
--                             without upstream jobs); the last to end releases it.
--   job.upstream_failed:      the first upstream job that ended dead or canceled.
--   job.on_upstream_failure:  'cancel' (canceled at the first failed upstream job) or
--                             'run' (runs once every upstream job ended, whatever the end).
--   job.has_downstream:       true once a job names it in after (NULL: never); the trigger's
--                             WHEN reads it, so an outcome of a job nobody waits for pays
--                             that test and nothing else.
--   brooq_job_edge:           one row per (downstream, upstream) pair, `position` the
--                             order named, `ended` set once by the upstream's end: a job
--                             that ends twice (retried by an operator) counts once.
--   brooq_job_after:          the producer's half: the edges of a batch of created jobs,
--                             the counters set, the upstream rows flagged (locked in id
--                             order), a job whose upstream jobs all ended moved at once.
--   job_upstream_ended:       AFTER UPDATE OF state, WHEN the row has downstream jobs and
--                             enters done, dead or canceled: in that transaction each
--                             waiting downstream row's counter goes down by one (rows
--                             locked in id order), at 0 it becomes pending, at a failure
--                             it is canceled ('cancel'), which fires this trigger for its
--                             own downstream jobs in turn.
-- No-transaction: the columns are catalog-only (no default), the state CHECK replaced NOT
-- VALID then validated without the ACCESS EXCLUSIVE lock, job_waiting_idx built
-- CONCURRENTLY, the trigger catalog-only; each
-- statement runs under the migrator's lock_timeout and is retried; every statement is
-- idempotent. Measured on 1,000,000 rows in RELIABILITY.md (benchmarks/migration_locks.py
-- --migration 13): ACCESS EXCLUSIVE on job for at most 4 ms up and 1 ms down.
-- migrate:no-transaction
-- migrate:up
ALTER TABLE job ADD COLUMN IF NOT EXISTS upstream_open integer,
                ADD COLUMN IF NOT EXISTS upstream_failed uuid,
                ADD COLUMN IF NOT EXISTS on_upstream_failure text,
                ADD COLUMN IF NOT EXISTS has_downstream boolean;

ALTER TABLE job DROP CONSTRAINT IF EXISTS job_state_check,
                ADD CONSTRAINT job_state_check CHECK (state IN ('pending', 'processing',
                    'failed', 'done', 'dead', 'canceled', 'waiting')) NOT VALID;

ALTER TABLE job VALIDATE CONSTRAINT job_state_check;

ALTER TABLE job DROP CONSTRAINT IF EXISTS job_on_upstream_failure_check,
                ADD CONSTRAINT job_on_upstream_failure_check
                    CHECK (on_upstream_failure IN ('cancel', 'run')) NOT VALID;

ALTER TABLE job VALIDATE CONSTRAINT job_on_upstream_failure_check;

CREATE TABLE IF NOT EXISTS brooq_job_edge (
    downstream_id uuid    NOT NULL,
    position      integer NOT NULL,
    upstream_id   uuid    NOT NULL,
    ended         boolean NOT NULL DEFAULT false,
    CONSTRAINT brooq_job_edge_pkey PRIMARY KEY (downstream_id, position)
);

-- The waiting jobs, for the counts of `brooq stats`, the page and the gauges (an arm of
-- their OR of partial-index predicates); a row in any other state writes no entry.
CREATE INDEX CONCURRENTLY IF NOT EXISTS job_waiting_idx ON job (queue, topic)
    WHERE state = 'waiting';

-- The end of a job finds its downstream jobs by this index.
CREATE UNIQUE INDEX IF NOT EXISTS brooq_job_edge_upstream_idx
    ON brooq_job_edge (upstream_id, downstream_id);

CREATE OR REPLACE FUNCTION brooq_job_upstream_ended() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    failed boolean := NEW.state <> 'done';
    ready boolean;
BEGIN
    -- One statement (a trigger's statements are its cost per upstream job): the edges
    -- ended (each counts once: a job that ends again, retried by an operator, finds its
    -- edges ended), the waiting downstream rows locked in id order (LockRows above the
    -- sort: two upstream jobs ending at once wait for each other rather than deadlock),
    -- then their counters.
    WITH ended AS (
        UPDATE brooq_job_edge e SET ended = true
        WHERE e.upstream_id = NEW.id AND NOT e.ended
        RETURNING e.downstream_id
    ), locked AS (
        -- By primary key whatever the planner guesses (a child's session plans without
        -- sequential scans or sorts, generic plans: a join here read the whole table).
        SELECT d.id FROM job d
        WHERE d.id = ANY(ARRAY(SELECT ended.downstream_id FROM ended)) AND d.state = 'waiting'
        ORDER BY d.id
        FOR NO KEY UPDATE
    ), moved AS (
        UPDATE job d
        SET upstream_open = d.upstream_open - 1,
            upstream_failed = CASE WHEN failed THEN coalesce(d.upstream_failed, NEW.id)
                                   ELSE d.upstream_failed END,
            state = CASE
                WHEN failed AND d.on_upstream_failure = 'cancel' THEN 'canceled'
                WHEN d.upstream_open <= 1 THEN 'pending'
                ELSE 'waiting'
            END,
            last_error = CASE
                WHEN failed AND d.on_upstream_failure = 'cancel'
                THEN format('upstream job %s ended %s', NEW.id, NEW.state)
                ELSE d.last_error
            END,
            -- Only with a change of state: updated_at is indexed (retention's index), and
            -- a row whose indexed columns keep their values is updated in place (HOT):
            -- a fan-in's counter writes no index entry per upstream job.
            updated_at = CASE
                WHEN failed AND d.on_upstream_failure = 'cancel' THEN now()
                WHEN d.upstream_open <= 1 THEN now()
                ELSE d.updated_at
            END
        WHERE d.id = ANY(ARRAY(SELECT locked.id FROM locked)) AND d.state = 'waiting'
        RETURNING d.state, d.available_at
    )
    SELECT bool_or(m.state = 'pending' AND m.available_at <= now()) INTO ready FROM moved m;
    IF ready THEN
        PERFORM pg_notify('brooq_job', TG_TABLE_SCHEMA);
    END IF;
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS job_upstream_ended ON job;

CREATE TRIGGER job_upstream_ended AFTER UPDATE OF state ON job FOR EACH ROW
    WHEN (OLD.has_downstream AND OLD.state NOT IN ('done', 'dead', 'canceled')
          AND NEW.state IN ('done', 'dead', 'canceled'))
    EXECUTE FUNCTION brooq_job_upstream_ended();

-- The edges p_down[i] waits for p_up[i] (in the order given per downstream job), and
-- p_jobs[i]'s on_upstream_failure p_policies[i]; each p_jobs row is one this transaction
-- inserted as pending. Raises (foreign_key_violation) naming an upstream id that is no
-- job. Returns how many of p_jobs wait.
CREATE OR REPLACE FUNCTION brooq_job_after(
    p_jobs uuid[], p_policies text[], p_down uuid[], p_up uuid[]
) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    missing uuid;
    waiting integer;
BEGIN
    -- The upstream rows in id order: an outcome being written is waited for (its trigger
    -- then finds these edges, or its end is read below), never missed.
    PERFORM 1 FROM job j WHERE j.id = ANY(p_up) ORDER BY j.id FOR NO KEY UPDATE;
    SELECT u INTO missing FROM unnest(p_up) AS u
    WHERE NOT EXISTS (SELECT 1 FROM job j WHERE j.id = u) LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'after names job %, which does not exist', missing
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    UPDATE job j SET has_downstream = true
    WHERE j.id = ANY(p_up) AND j.has_downstream IS NOT TRUE;
    INSERT INTO brooq_job_edge (downstream_id, position, upstream_id, ended)
    SELECT e.down, row_number() OVER (PARTITION BY e.down ORDER BY e.n), e.up,
           u.state IN ('done', 'dead', 'canceled')
    FROM unnest(p_down, p_up) WITH ORDINALITY AS e(down, up, n)
    JOIN job u ON u.id = e.up;
    UPDATE job d
    SET on_upstream_failure = p.policy,
        upstream_open = c.open,
        upstream_failed = c.failed,
        state = CASE
            WHEN c.failed IS NOT NULL AND p.policy = 'cancel' THEN 'canceled'
            WHEN c.open > 0 THEN 'waiting'
            ELSE d.state
        END,
        last_error = CASE
            WHEN c.failed IS NOT NULL AND p.policy = 'cancel'
            THEN format('upstream job %s ended %s', c.failed, c.failed_state)
            ELSE d.last_error
        END
    FROM unnest(p_jobs, p_policies) AS p(id, policy)
    CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE u.state NOT IN ('done', 'dead', 'canceled'))::integer
                   AS open,
               (array_agg(u.id ORDER BY e.position)
                   FILTER (WHERE u.state IN ('dead', 'canceled')))[1] AS failed,
               (array_agg(u.state ORDER BY e.position)
                   FILTER (WHERE u.state IN ('dead', 'canceled')))[1] AS failed_state
        FROM brooq_job_edge e JOIN job u ON u.id = e.upstream_id
        WHERE e.downstream_id = p.id
    ) AS c
    WHERE d.id = p.id AND d.state = 'pending' AND d.upstream_open IS NULL;
    SELECT count(*) INTO waiting FROM job j WHERE j.id = ANY(p_jobs) AND j.state = 'waiting';
    RETURN waiting;
END;
$$;

-- migrate:down
-- One transaction, all or nothing: ACCESS EXCLUSIVE on job first (under the migrator's
-- lock_timeout, retried), which waits for every transaction that wrote to job, a
-- producer's enqueue not yet committed included, so the check sees its waiting job;
-- then everything the check guards, catalog changes only (the state CHECK swapped NOT
-- VALID: no job can wait any more). Then the validation, under SHARE UPDATE EXCLUSIVE
-- (a stop before it is recorded as partly reverted; the down part runs again whole).
DO $$
BEGIN
    LOCK TABLE job IN ACCESS EXCLUSIVE MODE;
    IF EXISTS (SELECT 1 FROM job WHERE state = 'waiting') THEN
        RAISE EXCEPTION 'jobs are waiting for other jobs: cancel them first '
                        '(brooq jobs cancel --state waiting --topic ...)';
    END IF;
    DROP TRIGGER IF EXISTS job_upstream_ended ON job;
    DROP FUNCTION IF EXISTS brooq_job_after(uuid[], text[], uuid[], uuid[]);
    DROP FUNCTION IF EXISTS brooq_job_upstream_ended();
    DROP TABLE IF EXISTS brooq_job_edge;
    DROP INDEX IF EXISTS job_waiting_idx;
    ALTER TABLE job DROP CONSTRAINT IF EXISTS job_state_check,
                    ADD CONSTRAINT job_state_check CHECK (state IN ('pending', 'processing',
                        'failed', 'done', 'dead', 'canceled')) NOT VALID;
    ALTER TABLE job DROP CONSTRAINT IF EXISTS job_on_upstream_failure_check;
    ALTER TABLE job DROP COLUMN IF EXISTS has_downstream,
                    DROP COLUMN IF EXISTS on_upstream_failure,
                    DROP COLUMN IF EXISTS upstream_failed,
                    DROP COLUMN IF EXISTS upstream_open;
END;
$$;

ALTER TABLE job VALIDATE CONSTRAINT job_state_check;
