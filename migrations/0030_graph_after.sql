-- A graph's edges in one pass: brooq_job_after (0013, 0020) counted each new job's open
-- and failed upstream jobs in a lateral subquery that joined unnest(ups, states), every
-- upstream job of the call, once per job: quadratic in the graph's size when the plan ran
-- it as a nested loop (a chain of 20,000 jobs took 43 s in that statement, one of 100,000
-- did not end within five minutes). The count is now one grouped join over the call's
-- jobs, their edges and the upstream jobs (20,000: 1.4 s for the whole call; 100,000:
-- 3.8 s). What it writes is unchanged: a job with no edge gets upstream_open 0 as before.
-- Functions only: CREATE OR REPLACE FUNCTION takes no lock on job (measured,
-- docs/reference/schema.md). No-transaction, the statement idempotent.
-- migrate:no-transaction
-- migrate:up
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

-- migrate:down
-- The function as 0020 left it.
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
        FROM brooq_job_edge e JOIN unnest(ups, states) AS u(id, state) ON u.id = e.upstream_id
        WHERE e.downstream_id = p.id
    ) AS c
    WHERE d.id = p.id AND d.state = 'pending' AND d.upstream_open IS NULL;
    -- A job canceled above is in job_history now: it does not wait.
    SELECT count(*) INTO waiting FROM job j WHERE j.id = ANY(p_jobs) AND j.state = 'waiting';
    RETURN waiting;
END;
$$;
