-- Coordinated topics claimed a batch at a time, whatever their limits: rates and the
-- groups' own rates (docs/how-to/rate-limits.md; the design in
-- docs/explanation/rate-limits.md, "Rates in batches").
--   brooq_group_limit.group_rate, group_period, group_window: a group's own rate set at
--     runtime (brooq limits set --rate), beside its own group_limit (now nullable: a
--     row may hold either or both).
--   brooq_rate_cursor, brooq_window_places, brooq_window_next, brooq_window_take_places:
--     a window's places taken in turn from the one taken last (the cursor): the places
--     a batch may take, found through the primary key up to the batch's size, when the
--     next is free, and the taking of many at once; the free_at index's old end (a dead
--     entry each time a place is taken again, until a VACUUM) is never read.
--   brooq_claim_batch(topic, cap, rate, window, group_cap, group_rate, group_window,
--     in_turn, allowance, queues, done, worker, lease, max): brooq_claim_groups with
--     rates. Up to `max` jobs of the topic: as many as the topic's window has free slots
--     (none: a held-back answer saying when), its groups in turn (with `in_turn`, a
--     group_limit, a group_rate_limit or a group's own limit) each giving what its cap
--     and its window's free slots allow, else its first ready jobs; each start takes
--     its place in the windows. Under a rate the topic's lock is tried (a held-back answer
--     when taken), under a cap waited for.
-- brooq_claim_groups and brooq_claim_coordinated stay for the masters of the previous
-- release. Functions, and tables of brooq's own (a row per group with its own limits, a
-- row per rate window); no lock on job. No-transaction: each statement runs under the migrator's lock_timeout
-- and is retried; every statement is idempotent.
-- migrate:no-transaction
-- migrate:up
ALTER TABLE brooq_group_limit ALTER COLUMN group_limit DROP NOT NULL,
                              ADD COLUMN IF NOT EXISTS group_rate integer,
                              ADD COLUMN IF NOT EXISTS group_period float8,
                              ADD COLUMN IF NOT EXISTS group_window float8;

ALTER TABLE brooq_group_limit DROP CONSTRAINT IF EXISTS brooq_group_limit_rate_check,
    ADD CONSTRAINT brooq_group_limit_rate_check CHECK (
        (group_rate IS NULL) = (group_period IS NULL)
        AND (group_rate IS NULL) = (group_window IS NULL)
        AND (group_rate IS NULL OR (group_rate >= 1 AND group_period > 0
                                    AND group_window >= group_period))
        AND (group_limit IS NOT NULL OR group_rate IS NOT NULL));

-- A window's places taken in turn (round robin): brooq_rate_cursor holds the place taken
-- last, so the next ones are the places after it (then the never-used ones up to the
-- limit, then those from the first): the one taken longest ago first, found by the
-- primary key alone. A window's free_at index is never read from its old end, where
-- each retaking of a place leaves a dead entry until the next VACUUM.
CREATE TABLE IF NOT EXISTS brooq_rate_cursor (
    topic      text    NOT NULL,
    group_key  text    NOT NULL,
    last_slot  integer NOT NULL,
    CONSTRAINT brooq_rate_cursor_pkey PRIMARY KEY (topic, group_key)
);

-- The places a window gives at `p_stamp`, at most `p_max`, in the order they are taken:
-- each free at the stamp, up to the first that is not (those after it were taken after
-- it: in use longer).
CREATE OR REPLACE FUNCTION brooq_window_places(
    p_topic text, p_group text, p_limit integer, p_stamp timestamptz, p_max integer
)
RETURNS integer[]
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    last_slot integer;
    highest integer;
    places integer[] := '{}';
    place record;
    blocked boolean := false;
BEGIN
    IF p_max < 1 THEN
        RETURN places;
    END IF;
    SELECT coalesce(max(s.slot), 0) INTO highest FROM brooq_rate_slot s
    WHERE s.topic = p_topic AND s.group_key = p_group AND s.slot <= p_limit;
    SELECT least(c.last_slot, highest) INTO last_slot FROM brooq_rate_cursor c
    WHERE c.topic = p_topic AND c.group_key = p_group;
    last_slot := coalesce(last_slot, highest);
    FOR place IN
        SELECT s.slot, s.free_at FROM brooq_rate_slot s
        WHERE s.topic = p_topic AND s.group_key = p_group
          AND s.slot > last_slot AND s.slot <= p_limit
        ORDER BY s.slot
        LIMIT p_max
    LOOP
        IF place.free_at > p_stamp THEN
            blocked := true;
            EXIT;
        END IF;
        places := places || place.slot;
    END LOOP;
    IF blocked OR cardinality(places) >= p_max THEN
        RETURN places;
    END IF;
    places := places || ARRAY(SELECT generate_series(
        highest + 1, least(p_limit, highest + p_max - cardinality(places))));
    IF cardinality(places) >= p_max THEN
        RETURN places;
    END IF;
    FOR place IN
        SELECT s.slot, s.free_at FROM brooq_rate_slot s
        WHERE s.topic = p_topic AND s.group_key = p_group AND s.slot <= last_slot
        ORDER BY s.slot
        LIMIT p_max - cardinality(places)
    LOOP
        EXIT WHEN place.free_at > p_stamp;
        places := places || place.slot;
    END LOOP;
    RETURN places;
END;
$$;

-- When a full window has room again: the free_at of its next place in turn.
CREATE OR REPLACE FUNCTION brooq_window_next(p_topic text, p_group text, p_limit integer)
RETURNS timestamptz
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    last_slot integer;
    next_free timestamptz;
BEGIN
    SELECT c.last_slot INTO last_slot FROM brooq_rate_cursor c
    WHERE c.topic = p_topic AND c.group_key = p_group;
    SELECT s.free_at INTO next_free FROM brooq_rate_slot s
    WHERE s.topic = p_topic AND s.group_key = p_group AND s.slot <= p_limit
      AND s.slot > coalesce(last_slot, 0)
    ORDER BY s.slot LIMIT 1;
    IF next_free IS NULL THEN
        SELECT s.free_at INTO next_free FROM brooq_rate_slot s
        WHERE s.topic = p_topic AND s.group_key = p_group AND s.slot <= p_limit
        ORDER BY s.slot LIMIT 1;
    END IF;
    RETURN next_free;
END;
$$;

-- n starts at `p_stamp` take the window's next n places (brooq_window_places, under the
-- topic's lock that counted them), each until `p_stamp + p_window`; the cursor moves to
-- the last.
CREATE OR REPLACE FUNCTION brooq_window_take_places(
    p_topic text, p_group text, p_limit integer, p_stamp timestamptz, p_window float8,
    p_n integer
)
RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
DECLARE
    places integer[];
BEGIN
    places := brooq_window_places(p_topic, p_group, p_limit, p_stamp, p_n);
    IF cardinality(places) < p_n THEN
        RAISE EXCEPTION 'brooq: the window of % % has no room for % at %',
            p_topic, p_group, p_n, p_stamp;
    END IF;
    INSERT INTO brooq_rate_slot AS s (topic, group_key, slot, free_at)
    SELECT p_topic, p_group, p, p_stamp + make_interval(secs => p_window)
    FROM unnest(places) AS p
    ON CONFLICT ON CONSTRAINT brooq_rate_slot_pkey DO UPDATE SET free_at = EXCLUDED.free_at;
    INSERT INTO brooq_rate_cursor AS c (topic, group_key, last_slot)
    VALUES (p_topic, p_group, places[cardinality(places)])
    ON CONFLICT ON CONSTRAINT brooq_rate_cursor_pkey
    DO UPDATE SET last_slot = EXCLUDED.last_slot;
END;
$$;

CREATE OR REPLACE FUNCTION brooq_claim_batch(
    p_topic text, p_cap integer, p_rate integer, p_window float8,
    p_group_cap integer, p_group_rate integer, p_group_window float8,
    p_in_turn boolean, p_allowance float8,
    p_queues text[], p_done uuid[], p_worker text, p_lease float8, p_max integer
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
    own_rates integer[];
    own_periods float8[];
    own_windows float8[];
    stamp timestamptz;
    retry timestamptz;
    free integer;
    rated boolean;
    locked boolean := false;
    in_turn boolean;
    g_rates integer[];
    g_windows float8[];
    g_frees integer[];
    first_allow integer[];
BEGIN
    IF p_max < 1 OR p_topic IS NULL THEN
        RETURN;
    END IF;
    -- The groups' own limits and rates set at runtime (brooq limits set): each replaces
    -- the topic's group_limit or group_rate_limit for its group, read at every claim. A
    -- group's own rate counts only on a topic under a rate (p_allowance: the children's
    -- start deadline exists), its window the longer of its own (its period and
    -- allowance) and its period plus the children's allowance.
    SELECT coalesce(array_agg(o.group_key ORDER BY o.group_key), '{}'),
           coalesce(array_agg(o.group_limit ORDER BY o.group_key), '{}'),
           coalesce(array_agg(CASE WHEN p_allowance IS NOT NULL THEN o.group_rate END
                              ORDER BY o.group_key), '{}'),
           coalesce(array_agg(o.group_period ORDER BY o.group_key), '{}'),
           coalesce(array_agg(greatest(o.group_window, o.group_period + p_allowance)
                              ORDER BY o.group_key), '{}')
    INTO own_groups, own_limits, own_rates, own_periods, own_windows
    FROM brooq_group_limit o WHERE o.topic = p_topic;
    rated := p_rate IS NOT NULL OR p_group_rate IS NOT NULL
             OR EXISTS (SELECT FROM unnest(own_rates) AS r WHERE r IS NOT NULL);
    in_turn := p_in_turn OR p_group_cap IS NOT NULL OR p_group_rate IS NOT NULL
               OR cardinality(own_groups) > 0;
    -- Under a rate the lock is tried, not waited for (as brooq_claim_coordinated): a wait
    -- would eat into the allowance between the claim and the handlers' calls; a claimer
    -- that finds it taken is told to come again in a millisecond or two (a held-back
    -- answer: a row without an id, its available_at when to come). Under a limit the
    -- count and the claim must not interleave with another claimer's: the lock, waited
    -- for. Without either (fair_groups alone) claimers go side by side, each skipping the
    -- rows the other locked.
    IF rated THEN
        IF NOT pg_try_advisory_xact_lock(1651666799, hashtext(p_topic)) THEN
            RETURN QUERY SELECT NULL::uuid, p_topic, NULL::jsonb, NULL::integer, NULL::text,
                                clock_timestamp(),
                                clock_timestamp()
                                + make_interval(secs => 0.001 + random() * 0.002),
                                NULL::text, NULL::smallint;
            RETURN;
        END IF;
        locked := true;
    ELSIF p_cap IS NOT NULL OR p_group_cap IS NOT NULL OR cardinality(own_groups) > 0 THEN
        PERFORM pg_advisory_xact_lock(1651666799, hashtext(p_topic));
        locked := true;
    END IF;
    stamp := clock_timestamp();
    IF locked AND (p_cap IS NOT NULL OR p_group_cap IS NOT NULL
                   OR cardinality(own_groups) > 0) THEN
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
    -- The topic's rate: the slots of its window free at the stamp bound the batch; none
    -- free, the held-back answer says when the first one is.
    IF p_rate IS NOT NULL THEN
        free := cardinality(brooq_window_places(p_topic, '', p_rate, stamp, room));
        IF free < 1 THEN
            retry := brooq_window_next(p_topic, '', p_rate);
            RETURN QUERY SELECT NULL::uuid, p_topic, NULL::jsonb, NULL::integer, NULL::text,
                                stamp, retry, NULL::text, NULL::smallint;
            RETURN;
        END IF;
        room := least(room, free);
        retry := NULL;
    END IF;
    -- A topic without groups to take in turn (a rate or a cap alone): its first ready jobs,
    -- priority then FIFO, as the plain claim takes them.
    IF NOT in_turn THEN
        picked := ARRAY(
            SELECT c.id FROM unnest(p_queues) AS q(name)
            CROSS JOIN LATERAL (
                SELECT j.id FROM job j
                WHERE j.queue = q.name AND j.state IN ('pending', 'failed')
                  AND j.available_at <= now() AND j.topic = p_topic
                ORDER BY j.priority DESC, j.available_at, j.id
                LIMIT room
                FOR NO KEY UPDATE OF j SKIP LOCKED
            ) AS c
            LIMIT room);
        IF cardinality(picked) = 0 THEN
            RETURN;
        END IF;
        IF p_rate IS NOT NULL THEN
            PERFORM brooq_window_take_places(p_topic, '', p_rate, stamp, p_window,
                                           cardinality(picked));
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
        RETURN;
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
        FROM unnest(groups) WITH ORDINALITY AS x(g, ord) ORDER BY x.ord);
    -- The groups' rates: each group's own (brooq limits set) or the topic's
    -- group_rate_limit; the slots of its window free at the stamp bound what it gives. A
    -- group with none free gives nothing now: `retry`, the first of them free again, is
    -- the held-back answer's when nothing at all is claimed.
    IF p_group_rate IS NOT NULL
       OR EXISTS (SELECT FROM unnest(own_rates) AS r WHERE r IS NOT NULL) THEN
        SELECT coalesce(array_agg(r.rate ORDER BY r.ord), '{}'),
               coalesce(array_agg(r.win ORDER BY r.ord), '{}'),
               coalesce(array_agg(r.free ORDER BY r.ord), '{}')
        INTO g_rates, g_windows, g_frees
        FROM (
            SELECT r.*,
                   CASE WHEN r.rate IS NOT NULL
                        THEN cardinality(brooq_window_places(p_topic, r.g, r.rate, stamp, room))
                   END AS free
            FROM (
                SELECT x.g, x.ord,
                       CASE WHEN own_rates[array_position(own_groups, x.g)] IS NOT NULL
                            THEN own_rates[array_position(own_groups, x.g)]
                            ELSE p_group_rate END AS rate,
                       CASE WHEN own_rates[array_position(own_groups, x.g)] IS NOT NULL
                            THEN own_windows[array_position(own_groups, x.g)]
                            ELSE p_group_window END AS win
                FROM unnest(groups) WITH ORDINALITY AS x(g, ord)
            ) AS r
        ) AS r;
        FOR i IN 1 .. cardinality(groups) LOOP
            IF g_rates[i] IS NOT NULL THEN
                allow[i] := least(allow[i], g_frees[i]);
                IF g_frees[i] < 1 THEN  -- its window full: when its next place is free
                    retry := least(retry, brooq_window_next(p_topic, groups[i], g_rates[i]));
                END IF;
            END IF;
        END LOOP;
    END IF;
    first_allow := allow;
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
        IF retry IS NOT NULL THEN
            RETURN QUERY SELECT NULL::uuid, p_topic, NULL::jsonb, NULL::integer, NULL::text,
                                stamp, retry, NULL::text, NULL::smallint;
        END IF;
        RETURN;
    END IF;
    -- Each start takes its place in the windows: the topic's, and its group's.
    IF p_rate IS NOT NULL THEN
        PERFORM brooq_window_take_places(p_topic, '', p_rate, stamp, p_window,
                                       cardinality(picked));
    END IF;
    IF g_rates IS NOT NULL THEN
        FOR i IN 1 .. cardinality(groups) LOOP
            IF g_rates[i] IS NOT NULL AND first_allow[i] > allow[i] THEN
                PERFORM brooq_window_take_places(p_topic, groups[i], g_rates[i], stamp,
                                               g_windows[i], first_allow[i] - allow[i]);
            END IF;
        END LOOP;
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
-- The groups' own rates go (a row holding only a rate with them); the previous
-- release's claims read group_limit alone.
DROP FUNCTION IF EXISTS brooq_claim_batch(text, integer, integer, float8, integer, integer,
                                          float8, boolean, float8, text[], uuid[], text,
                                          float8, integer);

DROP FUNCTION IF EXISTS brooq_window_take_places(text, text, integer, timestamptz, float8,
                                                 integer);

DROP FUNCTION IF EXISTS brooq_window_next(text, text, integer);

DROP FUNCTION IF EXISTS brooq_window_places(text, text, integer, timestamptz, integer);

DROP TABLE IF EXISTS brooq_rate_cursor;

DELETE FROM brooq_group_limit WHERE group_limit IS NULL;

ALTER TABLE brooq_group_limit DROP CONSTRAINT IF EXISTS brooq_group_limit_rate_check,
                              DROP COLUMN IF EXISTS group_window,
                              DROP COLUMN IF EXISTS group_period,
                              DROP COLUMN IF EXISTS group_rate,
                              ALTER COLUMN group_limit SET NOT NULL;
