-- When each attempt started (docs/reference/schema.md; the charts of docs/status-page.md).
--   job.started_at: the claim of the job's current (or last) attempt, set to now() by
--     every claim, in the UPDATE that claims (the claim statement's and the two functions'
--     below); nullable, no default, so adding it is catalog-only. A retry's claim writes
--     its own start; rows claimed before this version keep NULL until their next claim.
--     With available_at (the attempt's due time) and updated_at (the end, once the job
--     ended) it gives each attempt's pickup latency and a finished job's run time.
--   brooq_claim_limited (0004) and brooq_claim_coordinated (0012), the claims of topics
--     under global_limit, rate_limit and group limits: the same bodies, their UPDATE
--     setting started_at and starting the attempt with no progress (progress,
--     progress_message NULL), as the claim statement does. Each is replaced with its
--     search_path pinned in the same statement (CREATE OR REPLACE FUNCTION resets a
--     function's settings: with ALTER FUNCTION after it, a claim in between would run
--     with the caller's search_path), in its own schema as 0009 and 0012 pin it.
-- No-transaction: each statement runs under the migrator's lock_timeout and is retried,
-- so the ALTER behind a long transaction never queues producers and claims for longer
-- than that; every statement is idempotent. The down step is one DO block: ACCESS
-- EXCLUSIVE on job first, the functions as 0004 and 0012 left them, then the column
-- dropped, all or nothing. Measured on 1,000,000 rows with benchmarks/migration_locks.py
-- --migration 19 (docs/reference/schema.md).
-- migrate:no-transaction
-- migrate:up
ALTER TABLE job ADD COLUMN IF NOT EXISTS started_at timestamptz;

DO $do$
DECLARE
    home text;
BEGIN
    SELECT n.nspname INTO STRICT home FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE p.oid = 'brooq_claim_limited(text, integer, text[], uuid[], text, float8, integer)'
        ::regprocedure;
    EXECUTE format($fn$CREATE OR REPLACE FUNCTION %I.brooq_claim_limited(
    p_topic text, p_cap integer, p_queues text[], p_done uuid[], p_worker text,
    p_lease float8, p_max integer
)
RETURNS TABLE (id uuid, topic text, payload jsonb, attempts integer, locked_by text,
               locked_until timestamptz, available_at timestamptz, queue text,
               priority smallint)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, %I, pg_temp
AS $body$
DECLARE
    room integer;
BEGIN
    IF p_max < 1 OR p_topic IS NULL THEN
        RETURN;
    END IF;
    SELECT p_cap - count(*) INTO room FROM job j
    WHERE j.state = 'processing' AND j.topic = p_topic
      AND NOT (j.locked_by = p_worker AND j.id = ANY(p_done));
    IF room <= 0 THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(1651666799, hashtext(p_topic));
    SELECT p_cap - count(*) INTO room FROM job j
    WHERE j.state = 'processing' AND j.topic = p_topic
      AND NOT (j.locked_by = p_worker AND j.id = ANY(p_done));
    IF room <= 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH next AS MATERIALIZED (
        SELECT c.id
        FROM unnest(p_queues) AS q(name)
        CROSS JOIN LATERAL (
            SELECT j.id FROM job j
            WHERE j.queue = q.name
              AND j.state IN ('pending', 'failed')
              AND j.available_at <= now()
              AND j.topic = p_topic
            ORDER BY j.priority DESC, j.available_at, j.id
            LIMIT least(room, p_max)
            FOR NO KEY UPDATE OF j SKIP LOCKED
        ) AS c
        LIMIT least(room, p_max)
    )
    UPDATE job
    SET state = 'processing',
        attempts = job.attempts + 1,
        locked_by = p_worker,
        locked_until = now() + make_interval(secs => p_lease),
        progress = NULL, progress_message = NULL,
        started_at = now(),
        updated_at = now()
    WHERE job.id = ANY(ARRAY(SELECT next.id FROM next))
    RETURNING job.id, job.topic, job.payload, job.attempts, job.locked_by,
              job.locked_until, job.available_at, job.queue, job.priority;
END;
$body$$fn$, home, home);
    EXECUTE format($fn$CREATE OR REPLACE FUNCTION %I.brooq_claim_coordinated(
    p_topic text, p_cap integer, p_rate integer, p_window float8,
    p_group_cap integer, p_group_rate integer, p_group_window float8,
    p_queues text[], p_done uuid[], p_worker text, p_lease float8, p_max integer
)
RETURNS TABLE (id uuid, topic text, payload jsonb, attempts integer, locked_by text,
               locked_until timestamptz, available_at timestamptz, queue text,
               priority smallint)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, %I, pg_temp
AS $body$
DECLARE
    stamp timestamptz;
    room timestamptz;
    retry timestamptz;
    blocked text[] := '{}';
    picked uuid;
    picked_group text;
    cand record;
    seen integer := 0;
    first_group text;
    last_group text;
    grp text;
    wrapped boolean;
    steps integer := 0;
BEGIN
    IF p_max < 1 OR p_topic IS NULL THEN
        RETURN;
    END IF;
    -- Looks without the lock first: a topic at its cap or with a full window costs its
    -- pollers no wait on the lock.
    IF p_cap IS NOT NULL AND (
        SELECT count(*) FROM job j
        WHERE j.state = 'processing' AND j.topic = p_topic
          AND NOT (j.locked_by = p_worker AND j.id = ANY(p_done))) >= p_cap THEN
        RETURN;
    END IF;
    IF p_rate IS NOT NULL THEN
        room := brooq_window_room(p_topic, '', p_rate);
        IF room > clock_timestamp() THEN
            RETURN QUERY SELECT NULL::uuid, p_topic, NULL::jsonb, NULL::integer, NULL::text,
                                clock_timestamp(), room, NULL::text, NULL::smallint;
            RETURN;
        END IF;
    END IF;
    -- Under a rate the lock is tried, not waited for: a wait would eat into the allowance
    -- between the claim and the handler's call (16 claimers in line for it gave back
    -- most of their starts as late). A claimer that finds it taken is told to try again
    -- in a millisecond or two (a held-back answer), its jitter keeping claimers apart.
    IF p_rate IS NOT NULL OR p_group_rate IS NOT NULL THEN
        IF NOT pg_try_advisory_xact_lock(1651666799, hashtext(p_topic)) THEN
            RETURN QUERY SELECT NULL::uuid, p_topic, NULL::jsonb, NULL::integer, NULL::text,
                                clock_timestamp(),
                                clock_timestamp() + make_interval(secs => 0.001 + random() * 0.002),
                                NULL::text, NULL::smallint;
            RETURN;
        END IF;
    ELSE
        PERFORM pg_advisory_xact_lock(1651666799, hashtext(p_topic));
    END IF;
    stamp := clock_timestamp();
    IF p_cap IS NOT NULL AND (
        SELECT count(*) FROM job j
        WHERE j.state = 'processing' AND j.topic = p_topic
          AND NOT (j.locked_by = p_worker AND j.id = ANY(p_done))) >= p_cap THEN
        RETURN;
    END IF;
    IF p_rate IS NOT NULL THEN
        room := brooq_window_room(p_topic, '', p_rate);
        IF room > stamp THEN
            RETURN QUERY SELECT NULL::uuid, p_topic, NULL::jsonb, NULL::integer, NULL::text,
                                stamp, room, NULL::text, NULL::smallint;
            RETURN;
        END IF;
    END IF;
    IF p_group_cap IS NULL AND p_group_rate IS NULL THEN
        SELECT c.id INTO picked
        FROM unnest(p_queues) AS q(name)
        CROSS JOIN LATERAL (
            SELECT j.id FROM job j
            WHERE j.queue = q.name AND j.state IN ('pending', 'failed')
              AND j.available_at <= now() AND j.topic = p_topic
            ORDER BY j.priority DESC, j.available_at, j.id
            LIMIT 1
            FOR NO KEY UPDATE OF j SKIP LOCKED
        ) AS c
        LIMIT 1;
    ELSE
        IF p_group_cap IS NOT NULL THEN
            SELECT coalesce(array_agg(b.group_key), '{}') INTO blocked FROM (
                SELECT j.group_key FROM job j
                WHERE j.state = 'processing' AND j.topic = p_topic AND j.group_key IS NOT NULL
                  AND NOT (j.locked_by = p_worker AND j.id = ANY(p_done))
                GROUP BY j.group_key HAVING count(*) >= p_group_cap
            ) AS b;
        END IF;
        FOR cand IN
            SELECT c.id, c.group_key
            FROM unnest(p_queues) AS q(name)
            CROSS JOIN LATERAL (
                SELECT j.id, j.group_key FROM job j
                WHERE j.queue = q.name AND j.state IN ('pending', 'failed')
                  AND j.available_at <= now() AND j.topic = p_topic
                ORDER BY j.priority DESC, j.available_at, j.id
                LIMIT 32
            ) AS c
            LIMIT 32
        LOOP
            seen := seen + 1;
            CONTINUE WHEN cand.group_key = ANY(blocked);
            IF cand.group_key IS NOT NULL AND p_group_rate IS NOT NULL THEN
                room := brooq_window_room(p_topic, cand.group_key, p_group_rate);
                IF room > stamp THEN
                    blocked := blocked || cand.group_key;
                    retry := least(retry, room);
                    CONTINUE;
                END IF;
            END IF;
            SELECT j.id INTO picked FROM job j
            WHERE j.id = cand.id AND j.state IN ('pending', 'failed')
            FOR NO KEY UPDATE SKIP LOCKED;
            IF picked IS NOT NULL THEN
                picked_group := cand.group_key;
                EXIT;
            END IF;
        END LOOP;
        IF picked IS NULL AND seen >= 32 THEN
            SELECT t.group_key INTO first_group FROM brooq_group_turn t WHERE t.topic = p_topic;
            last_group := first_group;
            wrapped := first_group IS NULL;
            LOOP
                steps := steps + 1;
                EXIT WHEN steps > 256;
                SELECT j.group_key INTO grp FROM job j
                WHERE j.topic = p_topic AND j.state IN ('pending', 'failed')
                  AND j.group_key IS NOT NULL AND j.group_key > coalesce(last_group, '')
                ORDER BY j.group_key
                LIMIT 1;
                IF grp IS NULL THEN
                    EXIT WHEN wrapped;
                    wrapped := true;
                    last_group := NULL;
                    CONTINUE;
                END IF;
                EXIT WHEN wrapped AND first_group IS NOT NULL AND grp > first_group;
                last_group := grp;
                CONTINUE WHEN grp = ANY(blocked);
                IF p_group_rate IS NOT NULL THEN
                    room := brooq_window_room(p_topic, grp, p_group_rate);
                    IF room > stamp THEN
                        blocked := blocked || grp;
                        retry := least(retry, room);
                        CONTINUE;
                    END IF;
                END IF;
                SELECT j.id INTO picked FROM job j
                WHERE j.topic = p_topic AND j.group_key = grp
                  AND j.state IN ('pending', 'failed') AND j.available_at <= now()
                  AND j.queue = ANY(p_queues)
                ORDER BY j.priority DESC, j.available_at, j.id
                LIMIT 1
                FOR NO KEY UPDATE OF j SKIP LOCKED;
                IF picked IS NOT NULL THEN
                    picked_group := grp;
                    EXIT;
                END IF;
            END LOOP;
            IF last_group IS NOT NULL THEN
                INSERT INTO brooq_group_turn AS t (topic, group_key)
                VALUES (p_topic, last_group)
                ON CONFLICT ON CONSTRAINT brooq_group_turn_pkey
                DO UPDATE SET group_key = EXCLUDED.group_key;
            END IF;
        END IF;
    END IF;
    IF picked IS NULL THEN
        IF retry IS NOT NULL THEN
            RETURN QUERY SELECT NULL::uuid, p_topic, NULL::jsonb, NULL::integer, NULL::text,
                                stamp, retry, NULL::text, NULL::smallint;
        END IF;
        RETURN;
    END IF;
    IF p_rate IS NOT NULL THEN
        PERFORM brooq_window_take(p_topic, '', p_rate, stamp, p_window);
    END IF;
    IF p_group_rate IS NOT NULL AND picked_group IS NOT NULL THEN
        PERFORM brooq_window_take(p_topic, picked_group, p_group_rate, stamp, p_group_window);
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
    WHERE job.id = picked
    RETURNING job.id, job.topic, job.payload, job.attempts, job.locked_by,
              job.locked_until, job.available_at, job.queue, job.priority;
END;
$body$$fn$, home, home);
END;
$do$;

-- migrate:down
DO $do$
DECLARE
    home text;
BEGIN
    LOCK TABLE job IN ACCESS EXCLUSIVE MODE;
    SELECT n.nspname INTO STRICT home FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE p.oid = 'brooq_claim_limited(text, integer, text[], uuid[], text, float8, integer)'
        ::regprocedure;
    EXECUTE format($fn$CREATE OR REPLACE FUNCTION %I.brooq_claim_limited(
    p_topic text, p_cap integer, p_queues text[], p_done uuid[], p_worker text,
    p_lease float8, p_max integer
)
RETURNS TABLE (id uuid, topic text, payload jsonb, attempts integer, locked_by text,
               locked_until timestamptz, available_at timestamptz, queue text,
               priority smallint)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, %I, pg_temp
AS $body$
DECLARE
    room integer;
BEGIN
    IF p_max < 1 OR p_topic IS NULL THEN
        RETURN;
    END IF;
    SELECT p_cap - count(*) INTO room FROM job j
    WHERE j.state = 'processing' AND j.topic = p_topic
      AND NOT (j.locked_by = p_worker AND j.id = ANY(p_done));
    IF room <= 0 THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(1651666799, hashtext(p_topic));
    SELECT p_cap - count(*) INTO room FROM job j
    WHERE j.state = 'processing' AND j.topic = p_topic
      AND NOT (j.locked_by = p_worker AND j.id = ANY(p_done));
    IF room <= 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH next AS MATERIALIZED (
        SELECT c.id
        FROM unnest(p_queues) AS q(name)
        CROSS JOIN LATERAL (
            SELECT j.id FROM job j
            WHERE j.queue = q.name
              AND j.state IN ('pending', 'failed')
              AND j.available_at <= now()
              AND j.topic = p_topic
            ORDER BY j.priority DESC, j.available_at, j.id
            LIMIT least(room, p_max)
            FOR NO KEY UPDATE OF j SKIP LOCKED
        ) AS c
        LIMIT least(room, p_max)
    )
    UPDATE job
    SET state = 'processing',
        attempts = job.attempts + 1,
        locked_by = p_worker,
        locked_until = now() + make_interval(secs => p_lease),
        updated_at = now()
    WHERE job.id = ANY(ARRAY(SELECT next.id FROM next))
    RETURNING job.id, job.topic, job.payload, job.attempts, job.locked_by,
              job.locked_until, job.available_at, job.queue, job.priority;
END;
$body$$fn$, home, home);
    EXECUTE format($fn$CREATE OR REPLACE FUNCTION %I.brooq_claim_coordinated(
    p_topic text, p_cap integer, p_rate integer, p_window float8,
    p_group_cap integer, p_group_rate integer, p_group_window float8,
    p_queues text[], p_done uuid[], p_worker text, p_lease float8, p_max integer
)
RETURNS TABLE (id uuid, topic text, payload jsonb, attempts integer, locked_by text,
               locked_until timestamptz, available_at timestamptz, queue text,
               priority smallint)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, %I, pg_temp
AS $body$
DECLARE
    stamp timestamptz;
    room timestamptz;
    retry timestamptz;
    blocked text[] := '{}';
    picked uuid;
    picked_group text;
    cand record;
    seen integer := 0;
    first_group text;
    last_group text;
    grp text;
    wrapped boolean;
    steps integer := 0;
BEGIN
    IF p_max < 1 OR p_topic IS NULL THEN
        RETURN;
    END IF;
    -- Looks without the lock first: a topic at its cap or with a full window costs its
    -- pollers no wait on the lock.
    IF p_cap IS NOT NULL AND (
        SELECT count(*) FROM job j
        WHERE j.state = 'processing' AND j.topic = p_topic
          AND NOT (j.locked_by = p_worker AND j.id = ANY(p_done))) >= p_cap THEN
        RETURN;
    END IF;
    IF p_rate IS NOT NULL THEN
        room := brooq_window_room(p_topic, '', p_rate);
        IF room > clock_timestamp() THEN
            RETURN QUERY SELECT NULL::uuid, p_topic, NULL::jsonb, NULL::integer, NULL::text,
                                clock_timestamp(), room, NULL::text, NULL::smallint;
            RETURN;
        END IF;
    END IF;
    -- Under a rate the lock is tried, not waited for: a wait would eat into the allowance
    -- between the claim and the handler's call (16 claimers in line for it gave back
    -- most of their starts as late). A claimer that finds it taken is told to try again
    -- in a millisecond or two (a held-back answer), its jitter keeping claimers apart.
    IF p_rate IS NOT NULL OR p_group_rate IS NOT NULL THEN
        IF NOT pg_try_advisory_xact_lock(1651666799, hashtext(p_topic)) THEN
            RETURN QUERY SELECT NULL::uuid, p_topic, NULL::jsonb, NULL::integer, NULL::text,
                                clock_timestamp(),
                                clock_timestamp() + make_interval(secs => 0.001 + random() * 0.002),
                                NULL::text, NULL::smallint;
            RETURN;
        END IF;
    ELSE
        PERFORM pg_advisory_xact_lock(1651666799, hashtext(p_topic));
    END IF;
    stamp := clock_timestamp();
    IF p_cap IS NOT NULL AND (
        SELECT count(*) FROM job j
        WHERE j.state = 'processing' AND j.topic = p_topic
          AND NOT (j.locked_by = p_worker AND j.id = ANY(p_done))) >= p_cap THEN
        RETURN;
    END IF;
    IF p_rate IS NOT NULL THEN
        room := brooq_window_room(p_topic, '', p_rate);
        IF room > stamp THEN
            RETURN QUERY SELECT NULL::uuid, p_topic, NULL::jsonb, NULL::integer, NULL::text,
                                stamp, room, NULL::text, NULL::smallint;
            RETURN;
        END IF;
    END IF;
    IF p_group_cap IS NULL AND p_group_rate IS NULL THEN
        SELECT c.id INTO picked
        FROM unnest(p_queues) AS q(name)
        CROSS JOIN LATERAL (
            SELECT j.id FROM job j
            WHERE j.queue = q.name AND j.state IN ('pending', 'failed')
              AND j.available_at <= now() AND j.topic = p_topic
            ORDER BY j.priority DESC, j.available_at, j.id
            LIMIT 1
            FOR NO KEY UPDATE OF j SKIP LOCKED
        ) AS c
        LIMIT 1;
    ELSE
        IF p_group_cap IS NOT NULL THEN
            SELECT coalesce(array_agg(b.group_key), '{}') INTO blocked FROM (
                SELECT j.group_key FROM job j
                WHERE j.state = 'processing' AND j.topic = p_topic AND j.group_key IS NOT NULL
                  AND NOT (j.locked_by = p_worker AND j.id = ANY(p_done))
                GROUP BY j.group_key HAVING count(*) >= p_group_cap
            ) AS b;
        END IF;
        FOR cand IN
            SELECT c.id, c.group_key
            FROM unnest(p_queues) AS q(name)
            CROSS JOIN LATERAL (
                SELECT j.id, j.group_key FROM job j
                WHERE j.queue = q.name AND j.state IN ('pending', 'failed')
                  AND j.available_at <= now() AND j.topic = p_topic
                ORDER BY j.priority DESC, j.available_at, j.id
                LIMIT 32
            ) AS c
            LIMIT 32
        LOOP
            seen := seen + 1;
            CONTINUE WHEN cand.group_key = ANY(blocked);
            IF cand.group_key IS NOT NULL AND p_group_rate IS NOT NULL THEN
                room := brooq_window_room(p_topic, cand.group_key, p_group_rate);
                IF room > stamp THEN
                    blocked := blocked || cand.group_key;
                    retry := least(retry, room);
                    CONTINUE;
                END IF;
            END IF;
            SELECT j.id INTO picked FROM job j
            WHERE j.id = cand.id AND j.state IN ('pending', 'failed')
            FOR NO KEY UPDATE SKIP LOCKED;
            IF picked IS NOT NULL THEN
                picked_group := cand.group_key;
                EXIT;
            END IF;
        END LOOP;
        IF picked IS NULL AND seen >= 32 THEN
            SELECT t.group_key INTO first_group FROM brooq_group_turn t WHERE t.topic = p_topic;
            last_group := first_group;
            wrapped := first_group IS NULL;
            LOOP
                steps := steps + 1;
                EXIT WHEN steps > 256;
                SELECT j.group_key INTO grp FROM job j
                WHERE j.topic = p_topic AND j.state IN ('pending', 'failed')
                  AND j.group_key IS NOT NULL AND j.group_key > coalesce(last_group, '')
                ORDER BY j.group_key
                LIMIT 1;
                IF grp IS NULL THEN
                    EXIT WHEN wrapped;
                    wrapped := true;
                    last_group := NULL;
                    CONTINUE;
                END IF;
                EXIT WHEN wrapped AND first_group IS NOT NULL AND grp > first_group;
                last_group := grp;
                CONTINUE WHEN grp = ANY(blocked);
                IF p_group_rate IS NOT NULL THEN
                    room := brooq_window_room(p_topic, grp, p_group_rate);
                    IF room > stamp THEN
                        blocked := blocked || grp;
                        retry := least(retry, room);
                        CONTINUE;
                    END IF;
                END IF;
                SELECT j.id INTO picked FROM job j
                WHERE j.topic = p_topic AND j.group_key = grp
                  AND j.state IN ('pending', 'failed') AND j.available_at <= now()
                  AND j.queue = ANY(p_queues)
                ORDER BY j.priority DESC, j.available_at, j.id
                LIMIT 1
                FOR NO KEY UPDATE OF j SKIP LOCKED;
                IF picked IS NOT NULL THEN
                    picked_group := grp;
                    EXIT;
                END IF;
            END LOOP;
            IF last_group IS NOT NULL THEN
                INSERT INTO brooq_group_turn AS t (topic, group_key)
                VALUES (p_topic, last_group)
                ON CONFLICT ON CONSTRAINT brooq_group_turn_pkey
                DO UPDATE SET group_key = EXCLUDED.group_key;
            END IF;
        END IF;
    END IF;
    IF picked IS NULL THEN
        IF retry IS NOT NULL THEN
            RETURN QUERY SELECT NULL::uuid, p_topic, NULL::jsonb, NULL::integer, NULL::text,
                                stamp, retry, NULL::text, NULL::smallint;
        END IF;
        RETURN;
    END IF;
    IF p_rate IS NOT NULL THEN
        PERFORM brooq_window_take(p_topic, '', p_rate, stamp, p_window);
    END IF;
    IF p_group_rate IS NOT NULL AND picked_group IS NOT NULL THEN
        PERFORM brooq_window_take(p_topic, picked_group, p_group_rate, stamp, p_group_window);
    END IF;
    RETURN QUERY
    UPDATE job
    SET state = 'processing',
        attempts = job.attempts + 1,
        locked_by = p_worker,
        locked_until = now() + make_interval(secs => p_lease),
        updated_at = now()
    WHERE job.id = picked
    RETURNING job.id, job.topic, job.payload, job.attempts, job.locked_by,
              job.locked_until, job.available_at, job.queue, job.priority;
END;
$body$$fn$, home, home);
    ALTER TABLE job DROP COLUMN IF EXISTS started_at;
END;
$do$;
