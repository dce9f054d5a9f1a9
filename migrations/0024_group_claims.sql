-- Claims of a topic that takes its groups in turn: fair shares between groups
-- (fair_groups) and group_limit at thousands of starts a second (docs/how-to/rate-limits.md;
-- the design in docs/explanation/rate-limits.md, "Groups in turn").
--   brooq_claim_groups(topic, cap, group_cap, queues, done, worker, lease, max): up to
--     `max` jobs of the topic in one call; under a cap or a group_limit, under the
--     topic's advisory lock (the key brooq_claim_limited and brooq_claim_coordinated take,
--     so every claimer of a topic is serialised whichever it calls), else side by side. The groups with ready jobs are visited in turn
--     from the one after the topic's cursor (brooq_group_turn.group_key), wrapping, each
--     giving its first jobs (priority, then FIFO) up to an equal share of the batch and
--     what its group_limit leaves; the jobs without a group are one more share, found by
--     a bounded scan of the topic's ready jobs that goes on from where the last one
--     stopped (the ungrouped_* cursor), so none waits for ever behind a large backlog.
--     The cursor moves to the last group visited: the next claim begins after it.
--   brooq_group_limit: a group's own group_limit, set at runtime (brooq limits set), read
--     by every claim of the topic: every master obeys a change at its next claim.
--   brooq_group_turn.ungrouped_priority, ungrouped_at, ungrouped_id: that scan's position
--     (NULL: from the front); ungrouped_scanned_at: when it last ran (it runs at most
--     every 50 ms unless the last one filled its share).
-- The table is brooq's own and small (a row per topic); the function locks no table. No
-- lock on job. No-transaction: each statement runs under the migrator's lock_timeout and
-- is retried; every statement is idempotent.
-- migrate:no-transaction
-- migrate:up
ALTER TABLE brooq_group_turn ADD COLUMN IF NOT EXISTS ungrouped_priority smallint,
                             ADD COLUMN IF NOT EXISTS ungrouped_at timestamptz,
                             ADD COLUMN IF NOT EXISTS ungrouped_id uuid,
                             ADD COLUMN IF NOT EXISTS ungrouped_scanned_at timestamptz;

-- A group's own limit, set at runtime (a tenant's plan): it replaces the topic's
-- group_limit for that group (0: its jobs wait), in the claims of topics whose groups
-- are taken in turn.
CREATE TABLE IF NOT EXISTS brooq_group_limit (
    topic       text        NOT NULL,
    group_key   text        NOT NULL,
    group_limit integer     NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT brooq_group_limit_pkey PRIMARY KEY (topic, group_key),
    CONSTRAINT brooq_group_limit_check CHECK (group_limit >= 0)
);

CREATE OR REPLACE FUNCTION brooq_claim_groups(
    p_topic text, p_cap integer, p_group_cap integer, p_queues text[], p_done uuid[],
    p_worker text, p_lease float8, p_max integer
)
RETURNS TABLE (id uuid, topic text, payload jsonb, attempts integer, locked_by text,
               locked_until timestamptz, available_at timestamptz, queue text,
               priority smallint)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
-- The groups come in the order the recursive scans find them: no parallel plan. The two
-- small sorts (of at most 256 rows) are costed as disabled in a child's session
-- (enable_sort = off), which would make every call pay a JIT compilation.
SET max_parallel_workers_per_gather = 0
SET jit = off
AS $$
DECLARE
    room integer := p_max;
    busy_groups text[] := '{}';
    busy_counts integer[] := '{}';
    total integer := 0;
    cursor_group text;
    u_priority smallint;
    u_at timestamptz;
    u_id uuid;
    groups text[];
    share integer;
    picked uuid[];
    ungrouped uuid[];
    scanned integer;
    last_priority smallint;
    last_at timestamptz;
    last_id uuid;
    ungrouped_budget CONSTANT integer := 256;
    allow integer[];
    active boolean[];
    passes integer := 0;
    got_ids uuid[];
    got_ords bigint[];
    took integer;
    owner boolean := true;
    scan boolean;
    u_scanned_at timestamptz;
    own_groups text[];
    own_limits integer[];
BEGIN
    IF p_max < 1 OR p_topic IS NULL THEN
        RETURN;
    END IF;
    -- Under a limit the count and the claim must not interleave with another claimer's:
    -- the topic's lock. Without one (fair_groups alone) claimers go side by side, each
    -- skipping the rows the other locked.
    -- The groups' own limits set at runtime (brooq limits set): each replaces the
    -- topic's group_limit for its group, read at every claim.
    SELECT coalesce(array_agg(o.group_key), '{}'), coalesce(array_agg(o.group_limit), '{}')
    INTO own_groups, own_limits
    FROM brooq_group_limit o WHERE o.topic = p_topic;
    IF p_cap IS NOT NULL OR p_group_cap IS NOT NULL OR cardinality(own_groups) > 0 THEN
        PERFORM pg_advisory_xact_lock(1651666799, hashtext(p_topic));
        -- What the topic runs now, by group (a job this statement writes done is not
        -- running).
        SELECT coalesce(array_agg(r.group_key), '{}'), coalesce(array_agg(r.n), '{}'),
               coalesce(sum(r.n), 0)
        INTO busy_groups, busy_counts, total
        FROM (SELECT j.group_key, count(*)::integer AS n FROM job j
              WHERE j.state = 'processing' AND j.topic = p_topic
                AND NOT (j.locked_by = p_worker AND j.id = ANY(p_done))
              GROUP BY j.group_key) AS r;
    END IF;
    IF p_cap IS NOT NULL THEN
        room := least(room, p_cap - total);
        IF room < 1 THEN
            RETURN;
        END IF;
    END IF;
    -- The cursor: moved by the claimer that holds its row; one that finds it held by
    -- another claimer (side by side, without a limit) reads it and leaves it.
    SELECT t.group_key, t.ungrouped_priority, t.ungrouped_at, t.ungrouped_id,
           t.ungrouped_scanned_at
    INTO cursor_group, u_priority, u_at, u_id, u_scanned_at
    FROM brooq_group_turn t WHERE t.topic = p_topic
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        SELECT t.group_key, t.ungrouped_priority, t.ungrouped_at, t.ungrouped_id,
               t.ungrouped_scanned_at
        INTO cursor_group, u_priority, u_at, u_id, u_scanned_at
        FROM brooq_group_turn t WHERE t.topic = p_topic;
        owner := NOT FOUND;
    END IF;
    -- The groups in turn: those with ready jobs after the cursor, then from the first up
    -- to the cursor, one index descent each (job_ready_group_idx), leaving out those at
    -- their group_limit; at most `room` of them.
    WITH RECURSIVE after_turn(g) AS (
        SELECT (SELECT min(j.group_key) FROM job j
                WHERE j.topic = p_topic AND j.state IN ('pending', 'failed')
                  AND j.group_key IS NOT NULL AND j.group_key > coalesce(cursor_group, ''))
        UNION ALL
        SELECT (SELECT min(j.group_key) FROM job j
                WHERE j.topic = p_topic AND j.state IN ('pending', 'failed')
                  AND j.group_key IS NOT NULL AND j.group_key > a.g)
        FROM after_turn a WHERE a.g IS NOT NULL
    ), up_to_turn(g) AS (
        SELECT (SELECT min(j.group_key) FROM job j
                WHERE j.topic = p_topic AND j.state IN ('pending', 'failed')
                  AND j.group_key IS NOT NULL)
        WHERE cursor_group IS NOT NULL
        UNION ALL
        SELECT (SELECT min(j.group_key) FROM job j
                WHERE j.topic = p_topic AND j.state IN ('pending', 'failed')
                  AND j.group_key IS NOT NULL AND j.group_key > b.g)
        FROM up_to_turn b WHERE b.g IS NOT NULL AND b.g < cursor_group
    )
    SELECT coalesce(array_agg(x.g), '{}') INTO groups
    FROM (
        SELECT c.g FROM (
            SELECT a.g FROM after_turn a WHERE a.g IS NOT NULL
            UNION ALL
            SELECT b.g FROM up_to_turn b WHERE b.g IS NOT NULL AND b.g <= cursor_group
        ) AS c
        WHERE coalesce(own_limits[array_position(own_groups, c.g)], p_group_cap) IS NULL
           OR coalesce(busy_counts[array_position(busy_groups, c.g)], 0)
              < coalesce(own_limits[array_position(own_groups, c.g)], p_group_cap)
        LIMIT room
    ) AS x;
    -- The jobs without a group take at most one share among the groups', no more, and
    -- are looked for at most every 50 ms (a scan that filled its share comes back at the
    -- next claim): a topic whose jobs all have a group pays for the scan rarely.
    share := ceil(room::float8 / (cardinality(groups) + 1))::integer;
    scan := owner AND (u_scanned_at IS NULL OR clock_timestamp() - u_scanned_at
                                                > interval '50 milliseconds');
    IF scan THEN
        -- The jobs without a group: the ready jobs of the topic in its queues from the
        -- cursor on (priority, then FIFO), at most ungrouped_budget rows read, the
        -- ungrouped among them taken up to the share. Two ranges keep each an index range
        -- of job_ready_queue_idx: the rest of the cursor's priority, then the lower ones.
        WITH window_rows AS MATERIALIZED (
            SELECT w.id, w.group_key, w.priority, w.available_at
            FROM unnest(p_queues) AS q(name)
            CROSS JOIN LATERAL (
                (SELECT j.id, j.group_key, j.priority, j.available_at FROM job j
                 WHERE j.queue = q.name AND j.state IN ('pending', 'failed')
                   AND j.topic = p_topic AND u_priority IS NOT NULL
                   AND j.priority = u_priority AND (j.available_at, j.id) > (u_at, u_id)
                 ORDER BY j.available_at, j.id
                 LIMIT ungrouped_budget)
                UNION ALL
                (SELECT j.id, j.group_key, j.priority, j.available_at FROM job j
                 WHERE j.queue = q.name AND j.state IN ('pending', 'failed')
                   AND j.topic = p_topic
                   AND (u_priority IS NULL OR j.priority < u_priority)
                 ORDER BY j.priority DESC, j.available_at, j.id
                 LIMIT ungrouped_budget)
                LIMIT ungrouped_budget
            ) AS w
            LIMIT ungrouped_budget
        ), taken AS (
            SELECT w.id, w.priority, w.available_at FROM window_rows w
            WHERE w.group_key IS NULL AND w.available_at <= now()
            ORDER BY w.priority DESC, w.available_at, w.id
            LIMIT share
        )
        SELECT (SELECT count(*) FROM window_rows)::integer,
               (SELECT coalesce(array_agg(t.id), '{}') FROM taken t),
               l.priority, l.available_at, l.id
        INTO scanned, ungrouped, last_priority, last_at, last_id
        FROM (SELECT 1) AS one
        LEFT JOIN LATERAL (
            -- Where the next scan goes on: after the last job taken when the share is full,
            -- else after the last row read; from the front once a scan reached the end.
            SELECT v.priority, v.available_at, v.id FROM (
                SELECT t.priority, t.available_at, t.id FROM taken t
                WHERE (SELECT count(*) FROM taken) >= share
                UNION ALL
                SELECT w.priority, w.available_at, w.id FROM window_rows w
                WHERE (SELECT count(*) FROM taken) < share
            ) AS v
            ORDER BY v.priority, v.available_at DESC, v.id DESC
            LIMIT 1
        ) AS l ON true;
        IF scanned < ungrouped_budget AND cardinality(ungrouped) < share THEN
            last_priority := NULL;
            last_at := NULL;
            last_id := NULL;
        END IF;
        -- A scan that filled its share comes again at the next claim.
        u_scanned_at := CASE WHEN cardinality(ungrouped) >= share THEN NULL
                             ELSE clock_timestamp() END;
    ELSE
        ungrouped := '{}';
        last_priority := u_priority;
        last_at := u_at;
        last_id := u_id;
    END IF;
    -- The batch: the ungrouped jobs taken, locked here (SKIP LOCKED), then the groups in
    -- turn, each its first jobs up to an equal share of what is left and what its
    -- group_limit allows; a group that filled its share may give more in a next pass
    -- (at most three), so that a few groups with deep backlogs still fill the batch.
    SELECT coalesce(array_agg(j.id), '{}') INTO picked FROM (
        SELECT j.id FROM job j
        WHERE j.id = ANY(ungrouped) AND j.state IN ('pending', 'failed')
        FOR NO KEY UPDATE OF j SKIP LOCKED
    ) AS j;
    allow := ARRAY(
        SELECT coalesce(coalesce(own_limits[array_position(own_groups, g)], p_group_cap)
                        - coalesce(busy_counts[array_position(busy_groups, g)], 0),
                        room)
        FROM unnest(groups) AS g);
    active := array_fill(true, ARRAY[cardinality(groups)]);
    WHILE cardinality(picked) < room AND true = ANY(active) AND passes < 3 LOOP
        passes := passes + 1;
        share := ceil((room - cardinality(picked))::float8
                      / cardinality(array_positions(active, true)))::integer;
        SELECT coalesce(array_agg(x.id), '{}'), coalesce(array_agg(x.ord), '{}')
        INTO got_ids, got_ords
        FROM (
            SELECT c.id, g.ord FROM unnest(groups, allow) WITH ORDINALITY AS g(name, allowed, ord)
            CROSS JOIN LATERAL (
                SELECT j.id FROM job j
                WHERE j.topic = p_topic AND j.group_key = g.name
                  AND j.state IN ('pending', 'failed') AND j.available_at <= now()
                  AND j.queue = ANY(p_queues) AND j.id <> ALL(picked)
                ORDER BY j.priority DESC, j.available_at, j.id
                LIMIT least(share, g.allowed)
                FOR NO KEY UPDATE OF j SKIP LOCKED
            ) AS c
            WHERE active[g.ord] AND g.allowed > 0
            LIMIT room - cardinality(picked)
        ) AS x;
        picked := picked || got_ids;
        FOR i IN 1 .. cardinality(groups) LOOP
            IF active[i] THEN
                took := cardinality(array_positions(got_ords, i::bigint));
                allow[i] := allow[i] - took;
                active[i] := took >= least(share, allow[i] + took) AND allow[i] > 0;
            END IF;
        END LOOP;
    END LOOP;
    IF owner THEN
        INSERT INTO brooq_group_turn AS t
            (topic, group_key, ungrouped_priority, ungrouped_at, ungrouped_id,
             ungrouped_scanned_at)
        VALUES (p_topic, coalesce(groups[cardinality(groups)], cursor_group, ''),
                last_priority, last_at, last_id, u_scanned_at)
        ON CONFLICT ON CONSTRAINT brooq_group_turn_pkey
        DO UPDATE SET group_key = EXCLUDED.group_key,
                      ungrouped_priority = EXCLUDED.ungrouped_priority,
                      ungrouped_at = EXCLUDED.ungrouped_at,
                      ungrouped_id = EXCLUDED.ungrouped_id,
                      ungrouped_scanned_at = EXCLUDED.ungrouped_scanned_at;
    END IF;
    IF cardinality(picked) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    UPDATE job
    SET state = 'processing',
        attempts = job.attempts + 1,
        locked_by = p_worker,
        locked_until = now() + make_interval(secs => p_lease),
        progress = NULL, progress_message = NULL,
        started_at = now(),
        updated_at = now()
    WHERE job.id = ANY(picked)
    RETURNING job.id, job.topic, job.payload, job.attempts, job.locked_by,
              job.locked_until, job.available_at, job.queue, job.priority;
END;
$$;

-- migrate:down
DROP FUNCTION IF EXISTS brooq_claim_groups(text, integer, integer, text[], uuid[], text,
                                           float8, integer);

DROP TABLE IF EXISTS brooq_group_limit;

ALTER TABLE brooq_group_turn DROP COLUMN IF EXISTS ungrouped_scanned_at,
                             DROP COLUMN IF EXISTS ungrouped_id,
                             DROP COLUMN IF EXISTS ungrouped_at,
                             DROP COLUMN IF EXISTS ungrouped_priority;
