-- Flat cascades: the end of a job with downstream jobs (0013) is carried down the graph
-- by one call of brooq_jobs_ended, set by set, whatever the depth: no trigger fires
-- another for each row any more (a chain of 800 jobs ran out of stack, a tree of 30,000
-- took a minute in one statement).
--   brooq_jobs_ended(p_ended, p_failed): the jobs p_ended have just entered done, dead or
--     canceled (p_failed: those of them that failed, dead or canceled). In four
--     statements: (1) a recursive query over brooq_job_edge finds every waiting job with
--     on_upstream_failure 'cancel' that a failed job reaches through such jobs (those it
--     cancels), (2) the waiting jobs downstream of the ended and the canceled are locked
--     in id order, (3) the edges leaving the ended and the canceled are set ended (each
--     counts once), (4) every locked job's counter goes down by the edges ended into it:
--     canceled when one came from a failed job and it cancels, pending at 0, else still
--     waiting. Returns whether a job became ready now (the caller notifies).
--   brooq_job_upstream_ended (the trigger's function, the trigger as 0013 made it):
--     calls brooq_jobs_ended for its row, unless the row was ended by brooq_jobs_ended
--     itself (the setting brooq.cascading, transaction-local, is on while it writes):
--     those rows' edges are in its sets already.
--   brooq_job_after is unchanged: a job it cancels (an upstream job had failed) fires the
--     trigger, which cancels what waits on it in one call.
-- Functions only: CREATE OR REPLACE FUNCTION takes no lock on job (measured on 1,000,000
-- rows, benchmarks/migration_locks.py --migration 16: no lock on job seen, up 53 ms and
-- down 30 ms in all, producers and claims undisturbed). No-transaction, each statement
-- idempotent; the trigger keeps firing throughout (each function is replaced whole, in
-- one statement).
-- migrate:no-transaction
-- migrate:up
CREATE OR REPLACE FUNCTION brooq_jobs_ended(p_ended uuid[], p_failed uuid[]) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT SET jit = off AS $$
DECLARE
    doomed uuid[] := '{}';
    sources uuid[];
    downs uuid[];
    counts integer[];
    failed_at integer[];
    ready boolean;
    was text := current_setting('brooq.cascading', true);
BEGIN
    -- Every array below is read through an index (= ANY on a key, or one probe per
    -- element), never scanned once per row: a set of 100,000 jobs costs 100,000 probes.
    -- A child's session plans without sequential scans or sorts and with generic plans;
    -- the sort of the locks then costs 1e10 for the planner, which would compile the
    -- statement (JIT) on each call: hence jit off here.
    IF cardinality(p_failed) > 0 THEN
        -- Every waiting job that cancels at a failure and is reached from a failed job
        -- through waiting jobs that cancel (UNION: a job reached twice is walked once).
        -- A job reached is tested, and its edges read, by a probe of an index (a join
        -- would hash every waiting job, or every edge, of the table).
        WITH RECURSIVE reach(id) AS (
            SELECT e.downstream_id FROM brooq_job_edge e
            WHERE e.upstream_id = ANY(p_failed) AND NOT e.ended
            UNION
            SELECT e.downstream_id
            FROM reach r
            CROSS JOIN LATERAL (
                SELECT e.downstream_id FROM brooq_job_edge e
                WHERE e.upstream_id = r.id AND NOT e.ended
                OFFSET 0  -- probed per job reached, never hashed whole
            ) AS e
            WHERE (SELECT d.state = 'waiting' AND d.on_upstream_failure = 'cancel'
                   FROM job d WHERE d.id = r.id)
        )
        SELECT coalesce(array_agg(d.id), '{}') INTO doomed FROM job d
        WHERE d.id = ANY(ARRAY(SELECT reach.id FROM reach))
          AND d.state = 'waiting' AND d.on_upstream_failure = 'cancel';
    END IF;
    -- The waiting jobs below, locked in id order (LockRows above the sort: two ends
    -- racing wait for each other rather than deadlock), by primary key.
    PERFORM 1 FROM job d
    WHERE d.id = ANY(ARRAY(
        SELECT e.downstream_id FROM brooq_job_edge e
        WHERE e.upstream_id = ANY(p_ended || doomed) AND NOT e.ended))
      AND d.state = 'waiting'
    ORDER BY d.id
    FOR NO KEY UPDATE;
    IF cardinality(doomed) > 0 THEN
        -- A job canceled meanwhile by another transaction carried its own end down.
        doomed := ARRAY(SELECT d.id FROM job d WHERE d.id = ANY(doomed) AND d.state = 'waiting');
    END IF;
    sources := p_ended || doomed;
    -- The edges leaving them ended (each counts once: a job that ends again, retried by
    -- an operator, finds its edges ended), counted per job below; an upstream job is a
    -- failed one unless done (the doomed still read waiting: they are canceled next).
    WITH ended AS (
        UPDATE brooq_job_edge e SET ended = true
        WHERE e.upstream_id = ANY(sources) AND NOT e.ended
        RETURNING e.downstream_id, e.position,
                  (SELECT u.state <> 'done' FROM job u WHERE u.id = e.upstream_id) AS failed
    ), counted AS (
        SELECT ended.downstream_id AS id, count(*)::integer AS n,
               min(ended.position) FILTER (WHERE ended.failed) AS failed_at
        FROM ended
        GROUP BY ended.downstream_id
    )
    SELECT array_agg(c.id), array_agg(c.n), array_agg(c.failed_at)
    INTO downs, counts, failed_at
    FROM counted c;
    IF downs IS NULL THEN
        RETURN false;
    END IF;
    -- The rows this call ends fire the trigger again: it leaves them to this call.
    PERFORM set_config('brooq.cascading', 'on', true);
    WITH moved AS (
        UPDATE job d
        SET upstream_open = d.upstream_open - c.n,
            upstream_failed = coalesce(d.upstream_failed, f.id),
            state = CASE
                WHEN f.id IS NOT NULL AND d.on_upstream_failure = 'cancel' THEN 'canceled'
                WHEN d.upstream_open - c.n <= 0 THEN 'pending'
                ELSE 'waiting'
            END,
            last_error = CASE
                WHEN f.id IS NOT NULL AND d.on_upstream_failure = 'cancel'
                THEN format('upstream job %s ended %s', f.id,
                            CASE f.state WHEN 'waiting' THEN 'canceled' ELSE f.state END)
                ELSE d.last_error
            END,
            -- Only with a change of state: updated_at is indexed (retention's index), and
            -- a row whose indexed columns keep their values is updated in place (HOT).
            updated_at = CASE
                WHEN f.id IS NOT NULL AND d.on_upstream_failure = 'cancel' THEN now()
                WHEN d.upstream_open - c.n <= 0 THEN now()
                ELSE d.updated_at
            END
        FROM unnest(downs, counts, failed_at) AS c(id, n, failed_at)
        LEFT JOIN LATERAL (
            -- The first failed upstream job in the order named, and how it ended.
            SELECT e.upstream_id AS id, (SELECT u.state FROM job u WHERE u.id = e.upstream_id)
            FROM brooq_job_edge e WHERE e.downstream_id = c.id AND e.position = c.failed_at
        ) AS f(id, state) ON true
        WHERE d.id = c.id AND d.state = 'waiting'
        RETURNING d.state, d.available_at
    )
    SELECT bool_or(m.state = 'pending' AND m.available_at <= now()) INTO ready FROM moved m;
    PERFORM set_config('brooq.cascading', coalesce(was, ''), true);
    RETURN coalesce(ready, false);
END;
$$;

CREATE OR REPLACE FUNCTION brooq_job_upstream_ended() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    -- A row brooq_jobs_ended canceled: its edges are in that call's sets already.
    IF current_setting('brooq.cascading', true) = 'on' THEN
        RETURN NULL;
    END IF;
    IF brooq_jobs_ended(ARRAY[NEW.id],
                        CASE WHEN NEW.state = 'done' THEN '{}'::uuid[] ELSE ARRAY[NEW.id] END)
    THEN
        PERFORM pg_notify('brooq_job', TG_TABLE_SCHEMA);
    END IF;
    RETURN NULL;
END;
$$;

-- migrate:down
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

DROP FUNCTION IF EXISTS brooq_jobs_ended(uuid[], uuid[]);
