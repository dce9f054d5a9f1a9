-- Rate limits and groups (docs/how-to/rate-limits.md; the design and its proof in
-- docs/explanation/rate-limits.md).
--   job.group_key: a job's group (Job(group=...)): nullable, no default, so adding it is
--     catalog-only; its CHECK is added NOT VALID, then validated under SHARE UPDATE
--     EXCLUSIVE, which lets producers and claims go on.
--   job_ready_group_idx: the ready jobs that have a group, by topic and group, built
--     CONCURRENTLY; a job without a group is not in it (an insert only tests the
--     predicate), so a deployment that names no groups maintains nothing more.
--   brooq_rate_slot: the windows of the rates. A (topic, group_key) pair is one window
--     ('' for the topic's own rate_limit, the group for group_rate_limit); it holds at
--     most N slots, each the place of one start, free again at `free_at` (the start's
--     stamp plus the period and the allowance).
--   brooq_group_turn: per topic, the group the last claim that had to look past the
--     first ready jobs stopped at: the next one goes on from there (round robin).
--   brooq_master.limits: each master's published limits, per topic, for `brooq queues`,
--     `brooq stats`, the status page and the held-back gauge.
--   brooq_claim_coordinated: the claim of a topic with a rate_limit, a group_limit or a
--     group_rate_limit (and its global_limit), called by the claim statement's
--     _coordinated variant; the brooq_window_* helpers read, take and sweep the slots.
-- Every function takes the topic's advisory lock that brooq_claim_limited takes (the
-- same key), so claimers of one topic are serialised whichever function they call. The
-- functions' search_path is pinned to their own schema, as 0009 does for
-- brooq_claim_limited. No-transaction: each statement runs under the migrator's
-- lock_timeout and is retried; every statement is idempotent. Measured on 1,000,000 rows
-- in RELIABILITY.md (benchmarks/migration_locks.py --migration 12): ACCESS EXCLUSIVE on
-- job for at most 12 ms up and 28 ms down.
-- migrate:no-transaction
-- migrate:up
ALTER TABLE job ADD COLUMN IF NOT EXISTS group_key text;

-- A group is 1 to 128 characters ("" is no group: the producer stores None).
ALTER TABLE job DROP CONSTRAINT IF EXISTS job_group_key_check,
                ADD CONSTRAINT job_group_key_check
                    CHECK (group_key <> '' AND length(group_key) <= 128) NOT VALID;

ALTER TABLE job VALIDATE CONSTRAINT job_group_key_check;

CREATE INDEX CONCURRENTLY IF NOT EXISTS job_ready_group_idx
    ON job (topic, group_key, priority DESC, available_at, id)
    WHERE state IN ('pending', 'failed') AND group_key IS NOT NULL;

CREATE TABLE IF NOT EXISTS brooq_rate_slot (
    topic     text        NOT NULL,
    group_key text        NOT NULL,
    slot      integer     NOT NULL,
    free_at   timestamptz NOT NULL,
    CONSTRAINT brooq_rate_slot_pkey PRIMARY KEY (topic, group_key, slot),
    CONSTRAINT brooq_rate_slot_slot_check CHECK (slot >= 1)
);

-- A window's oldest slot: the time it has room again.
CREATE INDEX IF NOT EXISTS brooq_rate_slot_free_idx ON brooq_rate_slot (topic, group_key, free_at);

CREATE TABLE IF NOT EXISTS brooq_group_turn (
    topic     text NOT NULL,
    group_key text NOT NULL,
    CONSTRAINT brooq_group_turn_pkey PRIMARY KEY (topic)
);

ALTER TABLE brooq_master ADD COLUMN IF NOT EXISTS limits jsonb;

-- When the window (p_topic, p_group) of p_limit starts has room: -infinity while it holds
-- fewer than p_limit slots (slots are numbered 1, 2, 3, ... without gaps: only whole
-- windows are ever deleted), else its oldest slot's free_at. Slots above p_limit (the
-- limit was lowered) do not count.
CREATE OR REPLACE FUNCTION brooq_window_room(p_topic text, p_group text, p_limit integer)
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN NOT EXISTS (SELECT 1 FROM brooq_rate_slot s
                         WHERE s.topic = p_topic AND s.group_key = p_group AND s.slot = p_limit)
        THEN '-infinity'::timestamptz
        ELSE (SELECT s.free_at FROM brooq_rate_slot s
              WHERE s.topic = p_topic AND s.group_key = p_group AND s.slot <= p_limit
              ORDER BY s.free_at LIMIT 1)
    END
$$;

-- A start at p_stamp takes a slot of the window until p_stamp + p_window seconds: the
-- oldest slot free at p_stamp, else a new one. The caller holds the topic's lock and saw
-- room at p_stamp, so one of the two exists. Each slot's successive values are thus at
-- least a window apart (docs/explanation/rate-limits.md).
CREATE OR REPLACE FUNCTION brooq_window_take(
    p_topic text, p_group text, p_limit integer, p_stamp timestamptz, p_window float8
)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    taken integer;
    highest integer;
BEGIN
    SELECT s.slot INTO taken FROM brooq_rate_slot s
    WHERE s.topic = p_topic AND s.group_key = p_group AND s.slot <= p_limit
      AND s.free_at <= p_stamp
    ORDER BY s.free_at LIMIT 1;
    IF taken IS NOT NULL THEN
        UPDATE brooq_rate_slot s SET free_at = p_stamp + make_interval(secs => p_window)
        WHERE s.topic = p_topic AND s.group_key = p_group AND s.slot = taken;
        RETURN;
    END IF;
    SELECT s.slot INTO highest FROM brooq_rate_slot s
    WHERE s.topic = p_topic AND s.group_key = p_group AND s.slot <= p_limit
    ORDER BY s.slot DESC LIMIT 1;
    IF coalesce(highest, 0) >= p_limit THEN
        RAISE EXCEPTION 'brooq: the window of % % has no room at %', p_topic, p_group, p_stamp;
    END IF;
    INSERT INTO brooq_rate_slot (topic, group_key, slot, free_at)
    VALUES (p_topic, p_group, coalesce(highest, 0) + 1,
            p_stamp + make_interval(secs => p_window));
END;
$$;

-- The windows no start needs any more (every slot free): deleted whole, under the topic's
-- lock (tried, never waited for), at most p_max windows per call. A window with every
-- slot free has the room of no window at all. Returns the slots deleted.
CREATE OR REPLACE FUNCTION brooq_window_sweep(p_max integer)
RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    w record;
    gone integer := 0;
    n integer;
BEGIN
    FOR w IN
        SELECT s.topic, s.group_key FROM brooq_rate_slot s
        GROUP BY s.topic, s.group_key HAVING max(s.free_at) <= now()
        LIMIT p_max
    LOOP
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(1651666799, hashtext(w.topic));
        DELETE FROM brooq_rate_slot s
        WHERE s.topic = w.topic AND s.group_key = w.group_key
          AND NOT EXISTS (SELECT 1 FROM brooq_rate_slot x
                          WHERE x.topic = w.topic AND x.group_key = w.group_key
                            AND x.free_at > clock_timestamp());
        GET DIAGNOSTICS n = ROW_COUNT;
        gone := gone + n;
    END LOOP;
    RETURN gone;
END;
$$;

-- The claim of one job of p_topic under its limits: p_cap (global_limit), p_rate starts
-- per p_window seconds (rate_limit: the period plus the allowance), p_group_cap
-- (group_limit) and p_group_rate per p_group_window (group_rate_limit); a NULL limit is
-- not applied. Returns the claimed row, or nothing, or one row with a NULL id: held back
-- by a rate, whose available_at is when a window has room (or when to try the topic's
-- lock again) and locked_until the server's clock when it said so (the child sleeps the
-- difference, no longer).
-- After the topic's lock the clock is read once (`stamp`): the start's time in every
-- window. Which job: the first ready ones in the claim's order (at most 32),
-- leaving out the groups at group_limit and those whose window is full; when all 32 were
-- held back, the groups in name order from where the last such claim stopped
-- (brooq_group_turn), one index probe each, at most 256 of them; so a group with a
-- backlog at its limit is stepped over, not read through. A job without a group is never
-- held back by its group, and is found among the first 32 only.
CREATE OR REPLACE FUNCTION brooq_claim_coordinated(
    p_topic text, p_cap integer, p_rate integer, p_window float8,
    p_group_cap integer, p_group_rate integer, p_group_window float8,
    p_queues text[], p_done uuid[], p_worker text, p_lease float8, p_max integer
)
RETURNS TABLE (id uuid, topic text, payload jsonb, attempts integer, locked_by text,
               locked_until timestamptz, available_at timestamptz, queue text,
               priority smallint)
LANGUAGE plpgsql VOLATILE AS $$
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
$$;

-- The functions name brooq's tables: their search_path is their own schema's (pg_catalog
-- first, pg_temp last), whatever the caller's.
DO $$
DECLARE
    home text;
    fn text;
BEGIN
    SELECT n.nspname INTO STRICT home FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE p.oid = 'brooq_claim_coordinated(text, integer, integer, float8, integer, integer, '
                  'float8, text[], uuid[], text, float8, integer)'::regprocedure;
    FOREACH fn IN ARRAY ARRAY[
        'brooq_claim_coordinated(text, integer, integer, float8, integer, integer, float8, '
            'text[], uuid[], text, float8, integer)',
        'brooq_window_room(text, text, integer)',
        'brooq_window_take(text, text, integer, timestamptz, float8)',
        'brooq_window_sweep(integer)'
    ] LOOP
        EXECUTE format('ALTER FUNCTION %I.%s SET search_path = pg_catalog, %I, pg_temp',
                       home, fn, home);
    END LOOP;
END;
$$;

-- migrate:down
-- One transaction, all or nothing (catalog changes only): ACCESS EXCLUSIVE on job first,
-- under the migrator's lock_timeout and retried, so no lock is taken twice.
DO $$
BEGIN
    LOCK TABLE job IN ACCESS EXCLUSIVE MODE;
    DROP FUNCTION IF EXISTS brooq_claim_coordinated(text, integer, integer, float8, integer,
        integer, float8, text[], uuid[], text, float8, integer);
    DROP FUNCTION IF EXISTS brooq_window_sweep(integer);
    DROP FUNCTION IF EXISTS brooq_window_take(text, text, integer, timestamptz, float8);
    DROP FUNCTION IF EXISTS brooq_window_room(text, text, integer);
    ALTER TABLE brooq_master DROP COLUMN IF EXISTS limits;
    DROP TABLE IF EXISTS brooq_group_turn;
    DROP TABLE IF EXISTS brooq_rate_slot;
    DROP INDEX IF EXISTS job_ready_group_idx;
    ALTER TABLE job DROP CONSTRAINT IF EXISTS job_group_key_check;
    ALTER TABLE job DROP COLUMN IF EXISTS group_key;
END;
$$;
