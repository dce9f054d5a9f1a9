-- A graph's counts planned without the estimate of its new rows, and without JIT:
-- brooq_job_after (0030) wrote every job's count of open and failed upstream jobs in one
-- UPDATE joined to job by id where job's rows were pending and not counted yet. On a
-- table whose statistics did not know the call's rows (a new or small table, before
-- autovacuum's ANALYZE) that condition was estimated at one row, the plan read job first
-- and computed the grouped counts again for each of its rows: a chain of 2,000 jobs took
-- 7.6 s in that statement on PostgreSQL 15 and 3.4 s on 18 (5,000 and more were planned
-- well). The counts are now computed once (a materialized CTE) and joined to job by id
-- alone, the condition read as a value; the count of waiting jobs likewise. Whether every
-- id named exists is a count of distinct ids (a search of the found ids per id was
-- linear in them under a child's generic plans: 1.2 s for a chain of 20,000). And in a
-- child's session (no sorts: the planner's costs reach 1e10) every call was compiled by
-- JIT, about 0.5 s even for a graph of three jobs chained by a handler: jit is off for
-- the function, as for brooq_jobs_ended (0016). What it writes is unchanged.
-- Functions only: CREATE OR REPLACE FUNCTION takes no lock on job. No-transaction, the
-- statement idempotent.
-- migrate:no-transaction
-- migrate:up
CREATE OR REPLACE FUNCTION brooq_job_after(
    p_jobs uuid[], p_policies text[], p_down uuid[], p_up uuid[]
) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT SET jit TO 'off' AS $$
DECLARE
    missing uuid;
    waiting integer;
    ups uuid[];
    states text[];
BEGIN
    -- The upstream rows still in job, in id order: an outcome being written (an UPDATE,
    -- or the claim statement's move) is waited for, never missed; the statements after
    -- this one see its end, in job or in job_history.
    PERFORM 1 FROM job j WHERE j.id = ANY(p_up) ORDER BY j.id FOR NO KEY UPDATE;
    SELECT array_agg(s.id), array_agg(s.state) INTO ups, states FROM (
        SELECT j.id, j.state FROM job j WHERE j.id = ANY(p_up)
        UNION ALL
        SELECT h.id, h.state FROM job_history h
        WHERE h.id = ANY(p_up) AND NOT EXISTS (SELECT FROM job j WHERE j.id = h.id)
    ) AS s;
    -- Every id named is a job's when as many were found as distinct ids were named (each
    -- found once above). A search of the found ids per id named, `u <> ALL(ups)`, is
    -- linear in them where the plan is generic (a child's session): 1.2 s for a chain
    -- of 20,000; it now runs only to name the missing id.
    IF coalesce(cardinality(ups), 0) < (SELECT count(DISTINCT u) FROM unnest(p_up) AS u) THEN
        SELECT u INTO missing FROM unnest(p_up) AS u
        WHERE u <> ALL(coalesce(ups, '{}')) LIMIT 1;
        RAISE EXCEPTION 'after names job %, which does not exist', missing
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    UPDATE job j SET has_downstream = true
    WHERE j.id = ANY(p_up) AND j.has_downstream IS NOT TRUE;
    -- A finished upstream job is read by claim.upstream: its row is kept past its
    -- partition's drop while a job waits on it (brooq_history_drop).
    UPDATE job_history h SET has_downstream = true
    WHERE h.id = ANY(p_up) AND h.has_downstream IS NOT TRUE;
    INSERT INTO brooq_job_edge (downstream_id, position, upstream_id, ended)
    SELECT e.down, row_number() OVER (PARTITION BY e.down ORDER BY e.n), e.up,
           u.state IN ('done', 'dead', 'canceled')
    FROM unnest(p_down, p_up) WITH ORDINALITY AS e(down, up, n)
    JOIN unnest(ups, states) AS u(id, state) ON u.id = e.up;
    -- The counts joined to the call's rows by id with no condition on job itself: the
    -- rows were just inserted, and an estimate made without them (a new or small table,
    -- before autovacuum's ANALYZE) said one row for a condition such as state =
    -- 'pending'; a plan built on that estimate read job first and computed the grouped
    -- counts again for each of its rows (a chain of 2,000 jobs: 7.6 s on PostgreSQL
    -- 15). Whether a row may be written (pending, not counted yet) is read in the same
    -- join, as a value.
    WITH counts AS MATERIALIZED (
        SELECT j.id, c.policy, c.open, c.failed, c.failed_state,
               j.state = 'pending' AND j.upstream_open IS NULL AS fresh
        FROM (
            SELECT p.id, p.policy,
                   count(*) FILTER (WHERE u.state NOT IN ('done', 'dead', 'canceled'))::integer
                       AS open,
                   (array_agg(u.id ORDER BY e.position)
                       FILTER (WHERE u.state IN ('dead', 'canceled')))[1] AS failed,
                   (array_agg(u.state ORDER BY e.position)
                       FILTER (WHERE u.state IN ('dead', 'canceled')))[1] AS failed_state
            FROM unnest(p_jobs, p_policies) AS p(id, policy)
            LEFT JOIN brooq_job_edge e ON e.downstream_id = p.id
            LEFT JOIN unnest(ups, states) AS u(id, state) ON u.id = e.upstream_id
            GROUP BY p.id, p.policy
        ) AS c
        JOIN job j ON j.id = c.id
    )
    UPDATE job d
    SET on_upstream_failure = r.policy,
        upstream_open = r.open,
        upstream_failed = r.failed,
        state = CASE
            WHEN r.failed IS NOT NULL AND r.policy = 'cancel' THEN 'canceled'
            WHEN r.open > 0 THEN 'waiting'
            ELSE d.state
        END,
        last_error = CASE
            WHEN r.failed IS NOT NULL AND r.policy = 'cancel'
            THEN format('upstream job %s ended %s', r.failed, r.failed_state)
            ELSE d.last_error
        END
    FROM counts r
    WHERE d.id = r.id AND r.fresh;
    -- A job canceled above is in job_history now: it does not wait. (Counted through a
    -- join without a condition on job, for the same reason.)
    SELECT count(*) FILTER (WHERE j.state = 'waiting') INTO waiting
    FROM unnest(p_jobs) AS p(id) JOIN job j ON j.id = p.id;
    RETURN waiting;
END;
$$;

-- migrate:down
-- The function as 0030 left it.
CREATE OR REPLACE FUNCTION brooq_job_after(
    p_jobs uuid[], p_policies text[], p_down uuid[], p_up uuid[]
) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    missing uuid;
    waiting integer;
    ups uuid[];
    states text[];
BEGIN
    -- The upstream rows still in job, in id order: an outcome being written (an UPDATE,
    -- or the claim statement's move) is waited for, never missed; the statements after
    -- this one see its end, in job or in job_history.
    PERFORM 1 FROM job j WHERE j.id = ANY(p_up) ORDER BY j.id FOR NO KEY UPDATE;
    SELECT array_agg(s.id), array_agg(s.state) INTO ups, states FROM (
        SELECT j.id, j.state FROM job j WHERE j.id = ANY(p_up)
        UNION ALL
        SELECT h.id, h.state FROM job_history h
        WHERE h.id = ANY(p_up) AND NOT EXISTS (SELECT FROM job j WHERE j.id = h.id)
    ) AS s;
    SELECT u INTO missing FROM unnest(p_up) AS u
    WHERE u <> ALL(coalesce(ups, '{}')) LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'after names job %, which does not exist', missing
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    UPDATE job j SET has_downstream = true
    WHERE j.id = ANY(p_up) AND j.has_downstream IS NOT TRUE;
    -- A finished upstream job is read by claim.upstream: its row is kept past its
    -- partition's drop while a job waits on it (brooq_history_drop).
    UPDATE job_history h SET has_downstream = true
    WHERE h.id = ANY(p_up) AND h.has_downstream IS NOT TRUE;
    INSERT INTO brooq_job_edge (downstream_id, position, upstream_id, ended)
    SELECT e.down, row_number() OVER (PARTITION BY e.down ORDER BY e.n), e.up,
           u.state IN ('done', 'dead', 'canceled')
    FROM unnest(p_down, p_up) WITH ORDINALITY AS e(down, up, n)
    JOIN unnest(ups, states) AS u(id, state) ON u.id = e.up;
    -- One pass over the call's jobs, their edges and the upstream jobs, grouped by job
    -- (a lateral subquery per job joined every upstream job of the call each time).
    UPDATE job d
    SET on_upstream_failure = c.policy,
        upstream_open = c.open,
        upstream_failed = c.failed,
        state = CASE
            WHEN c.failed IS NOT NULL AND c.policy = 'cancel' THEN 'canceled'
            WHEN c.open > 0 THEN 'waiting'
            ELSE d.state
        END,
        last_error = CASE
            WHEN c.failed IS NOT NULL AND c.policy = 'cancel'
            THEN format('upstream job %s ended %s', c.failed, c.failed_state)
            ELSE d.last_error
        END
    FROM (
        SELECT p.id, p.policy,
               count(*) FILTER (WHERE u.state NOT IN ('done', 'dead', 'canceled'))::integer
                   AS open,
               (array_agg(u.id ORDER BY e.position)
                   FILTER (WHERE u.state IN ('dead', 'canceled')))[1] AS failed,
               (array_agg(u.state ORDER BY e.position)
                   FILTER (WHERE u.state IN ('dead', 'canceled')))[1] AS failed_state
        FROM unnest(p_jobs, p_policies) AS p(id, policy)
        LEFT JOIN brooq_job_edge e ON e.downstream_id = p.id
        LEFT JOIN unnest(ups, states) AS u(id, state) ON u.id = e.upstream_id
        GROUP BY p.id, p.policy
    ) AS c
    WHERE d.id = c.id AND d.state = 'pending' AND d.upstream_open IS NULL;
    -- A job canceled above is in job_history now: it does not wait.
    SELECT count(*) INTO waiting FROM job j WHERE j.id = ANY(p_jobs) AND j.state = 'waiting';
    RETURN waiting;
END;
$$;

