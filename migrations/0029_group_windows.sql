-- The windows of a topic's groups counted and taken a claim at a time, not a group at a
-- time (docs/explanation/rate-limits.md, "Rates in batches").
--   brooq_windows_places(topic, groups, limits, stamp, max): brooq_window_places for many
--     windows in one statement: the places each gives at the stamp, in turn, at most
--     max[i] for the i-th.
--   brooq_claim_batch: the same arguments and answer; the places its groups may take are
--     found by one statement for them all and taken (the slots' free_at, the windows'
--     cursors) by two, where each group's window took two function calls of its own.
--   brooq_window_sweep: deletes a swept window's cursor with its slots (a row per rated
--     group was kept for good), and the cursors left without slots.
--   brooq_window_give_back: the places of jobs a rated claim gives back unstarted (a late
--     start) set free again; the claim writes its stamp as the jobs' started_at so that
--     their places are found.
-- Functions only; no lock on job. No-transaction: each statement runs under the
-- migrator's lock_timeout and is retried; every statement is idempotent.
-- migrate:no-transaction
-- migrate:up
-- The windows no start needs any more (every slot free): deleted whole, under the topic's
-- lock (tried, never waited for), at most p_max windows per call, and each one's cursor
-- with it (a window without slots starts from its first place whatever its cursor said);
-- then at most p_max cursors left by windows deleted before (none of them has a slot).
-- Returns the slots deleted.
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
        IF n > 0 THEN
            DELETE FROM brooq_rate_cursor c
            WHERE c.topic = w.topic AND c.group_key = w.group_key;
        END IF;
    END LOOP;
    FOR w IN
        SELECT c.topic, c.group_key FROM brooq_rate_cursor c
        WHERE NOT EXISTS (SELECT 1 FROM brooq_rate_slot s
                          WHERE s.topic = c.topic AND s.group_key = c.group_key)
        LIMIT p_max
    LOOP
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(1651666799, hashtext(w.topic));
        DELETE FROM brooq_rate_cursor c
        WHERE c.topic = w.topic AND c.group_key = w.group_key
          AND NOT EXISTS (SELECT 1 FROM brooq_rate_slot s
                          WHERE s.topic = w.topic AND s.group_key = w.group_key);
    END LOOP;
    RETURN gone;
END;
$$;

-- Its search_path as 0012 pinned it (CREATE OR REPLACE cleared it).
DO $$
DECLARE
    home text;
BEGIN
    SELECT n.nspname INTO STRICT home FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE p.oid = 'brooq_window_sweep(integer)'::regprocedure;
    EXECUTE format('ALTER FUNCTION %I.brooq_window_sweep(integer) '
                   'SET search_path = pg_catalog, %I, pg_temp', home, home);
END;
$$;

-- Places given back: jobs a rated claim took that go back unstarted (a late start). Each
-- took a place in its topic's window (p_rate, p_window) and in its group's (its own rate,
-- brooq limits set, or p_group_rate, p_group_window), all at its claim's stamp, which
-- the claim wrote as the job's started_at: a place taken then is free at the stamp plus
-- its window. One such place per job, in each window, is set free at the stamp itself:
-- as if its last start had been a window before the claim, no later than the real one
-- (the place was free at the stamp), so no window of any length W ever counts more
-- starts than before, and the place is free again now. A place whose window changed
-- since (another own rate) matches nothing and stays taken. Under the topic's lock, as
-- the claims count the places. Returns the places set free.
CREATE OR REPLACE FUNCTION brooq_window_give_back(
    p_topic text, p_rate integer, p_window float8, p_group_rate integer,
    p_group_window float8, p_allowance float8, p_groups text[], p_stamps timestamptz[]
)
RETURNS integer
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
DECLARE
    w record;
    freed integer := 0;
    n integer;
BEGIN
    IF coalesce(cardinality(p_stamps), 0) = 0 THEN
        RETURN 0;
    END IF;
    PERFORM pg_advisory_xact_lock(1651666799, hashtext(p_topic));
    FOR w IN
        -- the topic's window
        SELECT '' AS g, x.s, count(*)::integer AS k, p_window AS win
        FROM unnest(p_stamps) AS x(s)
        WHERE p_rate IS NOT NULL AND x.s IS NOT NULL
        GROUP BY x.s
        UNION ALL
        -- each group's
        SELECT x.g, x.s, count(*)::integer,
               CASE WHEN o.group_rate IS NOT NULL
                    THEN greatest(o.group_window, o.group_period + p_allowance)
                    ELSE p_group_window END
        FROM unnest(p_groups, p_stamps) AS x(g, s)
        LEFT JOIN brooq_group_limit o ON o.topic = p_topic AND o.group_key = x.g
        WHERE x.g IS NOT NULL AND x.s IS NOT NULL
          AND (o.group_rate IS NOT NULL OR p_group_rate IS NOT NULL)
        GROUP BY x.g, x.s, o.group_rate, o.group_window, o.group_period
    LOOP
        UPDATE brooq_rate_slot u SET free_at = w.s
        WHERE u.ctid = ANY(ARRAY(
            SELECT t.ctid FROM brooq_rate_slot t
            WHERE t.topic = p_topic AND t.group_key = w.g
              AND t.free_at = w.s + make_interval(secs => w.win)
            LIMIT w.k));
        GET DIAGNOSTICS n = ROW_COUNT;
        freed := freed + n;
    END LOOP;
    RETURN freed;
END;
$$;

-- The places many windows of a topic give at `p_stamp`, in the order they are taken:
-- for the i-th, the window (p_topic, p_groups[i]) of p_limits[i] starts (none when NULL),
-- at most p_max[i] of them, each row its window's ordinal, the slot and its turn (1, 2,
-- ...). As brooq_window_places gives them for one window: the places after the one taken
-- last, then those never used up to the limit, then those from the first; each free at
-- the stamp, up to the first that is not (those after it were taken after it).
CREATE OR REPLACE FUNCTION brooq_windows_places(
    p_topic text, p_groups text[], p_limits integer[], p_stamp timestamptz, p_max integer[]
)
RETURNS TABLE (ord integer, slot integer, turn integer)
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    RETURN QUERY
    SELECT w.ord::integer, p.slot, p.turn::integer
    FROM unnest(p_groups, p_limits, p_max) WITH ORDINALITY AS w(g, lim, most, ord)
    CROSS JOIN LATERAL (
        SELECT coalesce(max(s.slot), 0) AS highest FROM brooq_rate_slot s
        WHERE s.topic = p_topic AND s.group_key = w.g AND s.slot <= w.lim
    ) AS h
    CROSS JOIN LATERAL (
        SELECT coalesce(least((SELECT c.last_slot FROM brooq_rate_cursor c
                               WHERE c.topic = p_topic AND c.group_key = w.g),
                              h.highest),
                        h.highest) AS last,
               -- the never-used places it gives: those from the first are needed only
               -- for what these leave
               greatest(least(w.lim, h.highest + w.most) - h.highest, 0) AS fresh
    ) AS l
    CROSS JOIN LATERAL (
        SELECT q.slot, row_number() OVER (ORDER BY q.k, q.slot) AS turn
        FROM (
            SELECT c.k, c.slot,
                   count(*) FILTER (WHERE c.free_at > p_stamp)
                       OVER (ORDER BY c.k, c.slot) AS blocked
            FROM (
                (SELECT 1 AS k, s.slot, s.free_at FROM brooq_rate_slot s
                 WHERE s.topic = p_topic AND s.group_key = w.g
                   AND s.slot > l.last AND s.slot <= w.lim
                 ORDER BY s.slot
                 LIMIT w.most)
                UNION ALL
                SELECT 2, n.slot, NULL::timestamptz
                FROM generate_series(h.highest + 1, least(w.lim, h.highest + w.most)) AS n(slot)
                UNION ALL
                (SELECT 3, s.slot, s.free_at FROM brooq_rate_slot s
                 WHERE s.topic = p_topic AND s.group_key = w.g AND s.slot <= l.last
                 ORDER BY s.slot
                 LIMIT w.most - l.fresh)
            ) AS c
        ) AS q
        WHERE q.blocked = 0
        ORDER BY q.k, q.slot
        LIMIT w.most
    ) AS p
    WHERE w.lim IS NOT NULL AND w.most > 0;
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
    -- The places the groups' windows give (brooq_windows_places), in turn: the i-th is
    -- place_turns[i]-th of the group groups[place_ords[i]], slot place_slots[i].
    place_ords integer[] := '{}';
    place_slots integer[] := '{}';
    place_turns integer[] := '{}';
    taken integer := 0;
    wrote integer;
    -- The groups' floors (brooq_group_turn.floor_*): where the claim enters a group's
    -- ready jobs, past those claimed before (docs/explanation/claim-walk.md, "Groups").
    floor_groups text[];
    floor_priorities smallint[];
    floor_ats timestamptz[];
    floor_ids uuid[];
    floors_read_at timestamptz;
    whole boolean;
    fl_priority smallint[];
    fl_at timestamptz[];
    fl_id uuid[];
    got_priorities smallint[];
    got_ats timestamptz[];
    last_i integer;
    new_groups text[] := '{}';
    new_priorities smallint[] := '{}';
    new_ats timestamptz[] := '{}';
    new_ids uuid[] := '{}';
    slack CONSTANT interval := interval '100 milliseconds';
    floor_depth CONSTANT integer := 16;
    floors_kept CONSTANT integer := 32;
    took_by integer[];
    nil CONSTANT uuid := '00000000-0000-0000-0000-000000000000';
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
            started_at = stamp,
            updated_at = stamp
        WHERE job.id = ANY(picked)
        RETURNING job.id, job.topic, job.payload, job.attempts, job.locked_by,
                  job.locked_until, job.available_at, job.queue, job.priority;
        RETURN;
    END IF;
    -- The cursor: moved by the claimer that holds its row; one that finds it held by
    -- another claimer (side by side, without a limit) reads it and leaves it.
    SELECT t.group_key, t.ungrouped_priority, t.ungrouped_at, t.ungrouped_id,
           t.ungrouped_scanned_at, t.floor_groups, t.floor_priorities, t.floor_ats,
           t.floor_ids, t.floors_read_at
    INTO cursor_group, u_priority, u_at, u_id, u_scanned_at, floor_groups,
         floor_priorities, floor_ats, floor_ids, floors_read_at
    FROM brooq_group_turn t WHERE t.topic = p_topic
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        SELECT t.group_key, t.ungrouped_priority, t.ungrouped_at, t.ungrouped_id,
               t.ungrouped_scanned_at, t.floor_groups, t.floor_priorities, t.floor_ats,
               t.floor_ids, t.floors_read_at
        INTO cursor_group, u_priority, u_at, u_id, u_scanned_at, floor_groups,
             floor_priorities, floor_ats, floor_ids, floors_read_at
        FROM brooq_group_turn t WHERE t.topic = p_topic;
        owner := NOT FOUND;
    END IF;
    cursor_group := coalesce(cursor_group, '');
    -- The floors are set aside at least every 250 ms: a claim then reads its groups whole
    -- (and sets their floors again), so a job that became ready below a floor (a claim
    -- given back, a long transaction's enqueue) waits at most that long.
    whole := floors_read_at IS NULL OR floor_groups IS NULL
             OR clock_timestamp() - floors_read_at > interval '250 milliseconds';
    -- The groups in turn, from the last one served down: those with ready jobs below the
    -- cursor, then from the highest down to the cursor, one index descent each
    -- (job_ready_group_idx, read backwards: it lands on a group's newest entries, which
    -- are its live ones; the entries of jobs claimed since the last VACUUM are at a
    -- group's oldest end), leaving out those at their group_limit; at most `room` of them.
    WITH RECURSIVE below_turn(g) AS (
        SELECT (SELECT max(j.group_key) FROM job j
                WHERE j.topic = p_topic AND j.state IN ('pending', 'failed')
                  AND j.group_key IS NOT NULL AND j.group_key < cursor_group)
        UNION ALL
        SELECT (SELECT max(j.group_key) FROM job j
                WHERE j.topic = p_topic AND j.state IN ('pending', 'failed')
                  AND j.group_key IS NOT NULL AND j.group_key < a.g)
        FROM below_turn a WHERE a.g IS NOT NULL
    ), down_to_turn(g) AS (
        SELECT (SELECT max(j.group_key) FROM job j
                WHERE j.topic = p_topic AND j.state IN ('pending', 'failed')
                  AND j.group_key IS NOT NULL)
        UNION ALL
        SELECT (SELECT max(j.group_key) FROM job j
                WHERE j.topic = p_topic AND j.state IN ('pending', 'failed')
                  AND j.group_key IS NOT NULL AND j.group_key < b.g)
        FROM down_to_turn b WHERE b.g IS NOT NULL AND b.g > cursor_group
    )
    SELECT coalesce(array_agg(x.g), '{}') INTO groups
    FROM (
        SELECT c.g FROM (
            SELECT a.g FROM below_turn a WHERE a.g IS NOT NULL
            UNION ALL
            SELECT b.g FROM down_to_turn b WHERE b.g IS NOT NULL AND b.g >= cursor_group
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
    -- group_rate_limit; the places of its window free at the stamp bound what it gives.
    -- One statement finds them for every group, kept for their taking below: at most
    -- what the group may give, and three first passes' shares (a group with a deep
    -- backlog among many gives no more in this claim; reading room's worth of places
    -- for every group would cost more than its jobs). A group with none free gives nothing now: `retry`, the first
    -- of them free again, is the held-back answer's when nothing at all is claimed.
    IF p_group_rate IS NOT NULL
       OR EXISTS (SELECT FROM unnest(own_rates) AS r WHERE r IS NOT NULL) THEN
        SELECT coalesce(array_agg(r.rate ORDER BY r.ord), '{}'),
               coalesce(array_agg(r.win ORDER BY r.ord), '{}'),
               coalesce(array_agg(r.most ORDER BY r.ord), '{}')
        INTO g_rates, g_windows, g_frees
        FROM (
            SELECT x.ord,
                   CASE WHEN own_rates[array_position(own_groups, x.g)] IS NOT NULL
                        THEN own_rates[array_position(own_groups, x.g)]
                        ELSE p_group_rate END AS rate,
                   CASE WHEN own_rates[array_position(own_groups, x.g)] IS NOT NULL
                        THEN own_windows[array_position(own_groups, x.g)]
                        ELSE p_group_window END AS win,
                   greatest(least(allow[x.ord], room,
                                  3 * ceil(room::float8 / cardinality(groups))::integer),
                            0) AS most
            FROM unnest(groups) WITH ORDINALITY AS x(g, ord)
        ) AS r;
        SELECT coalesce(array_agg(p.ord ORDER BY p.ord, p.turn), '{}'),
               coalesce(array_agg(p.slot ORDER BY p.ord, p.turn), '{}'),
               coalesce(array_agg(p.turn ORDER BY p.ord, p.turn), '{}')
        INTO place_ords, place_slots, place_turns
        FROM brooq_windows_places(p_topic, groups, g_rates, stamp, g_frees) AS p;
        -- g_frees: from what each group may give to the places its window has.
        g_frees := array_fill(0, ARRAY[cardinality(groups)]);
        FOR k IN 1 .. cardinality(place_ords) LOOP
            g_frees[place_ords[k]] := g_frees[place_ords[k]] + 1;
        END LOOP;
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
    -- Each group's floor, a position (priority, available_at, id) in its order: its
    -- stored one unless this claim reads whole; after a pass, the last job it took.
    fl_priority := array_fill(NULL::smallint, ARRAY[cardinality(groups)]);
    fl_at := array_fill(NULL::timestamptz, ARRAY[cardinality(groups)]);
    fl_id := array_fill(NULL::uuid, ARRAY[cardinality(groups)]);
    IF NOT whole THEN
        FOR i IN 1 .. cardinality(groups) LOOP
            last_i := array_position(floor_groups, groups[i]);
            IF last_i IS NOT NULL THEN
                fl_priority[i] := floor_priorities[last_i];
                fl_at[i] := floor_ats[last_i];
                fl_id[i] := floor_ids[last_i];
            END IF;
        END LOOP;
    END IF;
    WHILE cardinality(picked) < room AND true = ANY(active) AND passes < 3 LOOP
        passes := passes + 1;
        share := ceil((room - cardinality(picked))::float8
                      / cardinality(array_positions(active, true)))::integer;
        -- A group with a floor is read in three index ranges, in its order: its higher
        -- priorities whole (a job of a higher priority enqueued since), the floor's
        -- priority from the floor on, its lower priorities whole; a group without one,
        -- whole. The ranges come in order and the group's LIMIT pulls row by row, so the
        -- rows locked (SKIP LOCKED, under each range's own LIMIT) are the rows taken. The
        -- rows a pass took are below their group's floor in the next pass, but for those
        -- of a higher priority than the floor's (and the job locks are this claim's own:
        -- SKIP LOCKED would not pass over them), hence the check in the first range. The
        -- four arrays are aggregated in one pass over the same rows: aligned.
        SELECT coalesce(array_agg(x.id), '{}'), coalesce(array_agg(x.ord), '{}'),
               coalesce(array_agg(x.priority), '{}'), coalesce(array_agg(x.available_at), '{}')
        INTO got_ids, got_ords, got_priorities, got_ats
        FROM (
            SELECT c.id, g.ord, c.priority, c.available_at
            FROM unnest(groups, allow, fl_priority, fl_at, fl_id)
                 WITH ORDINALITY AS g(name, allowed, fp, fa, fi, ord)
            CROSS JOIN LATERAL (
                SELECT t.id, t.priority, t.available_at
                FROM (VALUES (1, CASE WHEN g.fp IS NULL THEN -32768 ELSE g.fp + 1 END, 32767,
                              '-infinity'::timestamptz, nil),
                             (2, g.fp::integer, g.fp::integer, g.fa, g.fi),
                             (3, -32768, g.fp - 1, '-infinity'::timestamptz, nil)
                     ) AS r(k, lo, hi, fa, fi)
                CROSS JOIN LATERAL (
                    SELECT j.id, j.priority, j.available_at FROM job j
                    WHERE j.topic = p_topic AND j.group_key = g.name
                      AND j.state IN ('pending', 'failed')
                      AND j.priority <= r.hi AND j.priority >= r.lo
                      AND (j.available_at, j.id) > (r.fa, r.fi)
                      AND j.available_at <= now() AND j.queue = ANY(p_queues)
                      AND (r.k > 1 OR j.id <> ALL(picked))
                    ORDER BY j.priority DESC, j.available_at, j.id
                    LIMIT least(share, g.allowed)
                    FOR NO KEY UPDATE OF j SKIP LOCKED
                ) AS t
                WHERE r.lo IS NOT NULL AND r.hi IS NOT NULL AND r.lo <= r.hi
                LIMIT least(share, g.allowed)
            ) AS c
            WHERE active[g.ord] AND g.allowed > 0
            LIMIT room - cardinality(picked)
        ) AS x;
        picked := picked || got_ids;
        -- What each group gave, in one pass over the rows: a group's rows come in its
        -- order, so its last one is its floor for the next pass.
        took_by := array_fill(0, ARRAY[cardinality(groups)]);
        FOR k IN 1 .. cardinality(got_ords) LOOP
            last_i := got_ords[k];
            took_by[last_i] := took_by[last_i] + 1;
            fl_priority[last_i] := got_priorities[k];
            fl_at[last_i] := got_ats[k];
            fl_id[last_i] := got_ids[k];
        END LOOP;
        FOR i IN 1 .. cardinality(groups) LOOP
            IF active[i] THEN
                took := took_by[i];
                allow[i] := allow[i] - took;
                active[i] := took >= least(share, allow[i] + took) AND allow[i] > 0;
            END IF;
        END LOOP;
    END LOOP;
    IF owner THEN
        -- The floors kept: of the groups this claim took from, those that gave at least
        -- floor_depth jobs (a deep backlog, whose claimed entries pile up fastest) or had
        -- a floor already; then the others kept before; at most floors_kept of them.
        -- A floor is the last job taken when that job is older than the claim's start
        -- less `slack`, else that start less `slack` (brooq.worker.floors says why a
        -- job not yet visible to this claim cannot sort below it).
        FOR i IN 1 .. cardinality(groups) LOOP
            IF fl_priority[i] IS NOT NULL AND first_allow[i] > allow[i]
               AND (first_allow[i] - allow[i] >= floor_depth
                    OR groups[i] = ANY(floor_groups)) THEN
                new_groups := new_groups || groups[i];
                new_priorities := new_priorities || fl_priority[i];
                IF fl_at[i] < stamp - slack THEN
                    new_ats := new_ats || fl_at[i];
                    new_ids := new_ids || fl_id[i];
                ELSE
                    new_ats := new_ats || (stamp - slack);
                    new_ids := new_ids || nil;
                END IF;
            END IF;
        END LOOP;
        -- Those of groups this claim did not read keep their floors (a group at its limit
        -- now), unless it read whole: a whole read sets the floors again from what it
        -- took, so none is older than the last whole read.
        IF NOT whole THEN
            FOR i IN 1 .. coalesce(cardinality(floor_groups), 0) LOOP
                EXIT WHEN cardinality(new_groups) >= floors_kept;
                IF NOT floor_groups[i] = ANY(groups) THEN
                    new_groups := new_groups || floor_groups[i];
                    new_priorities := new_priorities || floor_priorities[i];
                    new_ats := new_ats || floor_ats[i];
                    new_ids := new_ids || floor_ids[i];
                END IF;
            END LOOP;
        END IF;
        INSERT INTO brooq_group_turn AS t
            (topic, group_key, ungrouped_priority, ungrouped_at, ungrouped_id,
             ungrouped_scanned_at, floor_groups, floor_priorities, floor_ats, floor_ids,
             floors_read_at)
        VALUES (p_topic, coalesce(groups[cardinality(groups)], cursor_group, ''),
                last_priority, last_at, last_id, u_scanned_at,
                new_groups[1:floors_kept], new_priorities[1:floors_kept],
                new_ats[1:floors_kept], new_ids[1:floors_kept],
                CASE WHEN whole THEN clock_timestamp() ELSE floors_read_at END)
        ON CONFLICT ON CONSTRAINT brooq_group_turn_pkey
        DO UPDATE SET group_key = EXCLUDED.group_key,
                      ungrouped_priority = EXCLUDED.ungrouped_priority,
                      ungrouped_at = EXCLUDED.ungrouped_at,
                      ungrouped_id = EXCLUDED.ungrouped_id,
                      ungrouped_scanned_at = EXCLUDED.ungrouped_scanned_at,
                      floor_groups = EXCLUDED.floor_groups,
                      floor_priorities = EXCLUDED.floor_priorities,
                      floor_ats = EXCLUDED.floor_ats,
                      floor_ids = EXCLUDED.floor_ids,
                      floors_read_at = EXCLUDED.floors_read_at;
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
        -- A group that gave n jobs takes the first n of the places found for it (the same
        -- stamp, under the same lock: still free), each until the stamp plus its window,
        -- and its window's cursor moves to the last of them.
        FOR i IN 1 .. cardinality(groups) LOOP
            IF g_rates[i] IS NOT NULL THEN
                taken := taken + first_allow[i] - allow[i];
            END IF;
        END LOOP;
        INSERT INTO brooq_rate_slot AS s (topic, group_key, slot, free_at)
        SELECT p_topic, groups[x.ord], x.slot, stamp + make_interval(secs => g_windows[x.ord])
        FROM unnest(place_ords, place_slots, place_turns) AS x(ord, slot, turn)
        WHERE x.turn <= first_allow[x.ord] - allow[x.ord]
        ON CONFLICT ON CONSTRAINT brooq_rate_slot_pkey DO UPDATE SET free_at = EXCLUDED.free_at;
        GET DIAGNOSTICS wrote = ROW_COUNT;
        IF wrote <> taken THEN
            RAISE EXCEPTION 'brooq: the windows of % have room for % of % starts at %',
                p_topic, wrote, taken, stamp;
        END IF;
        INSERT INTO brooq_rate_cursor AS c (topic, group_key, last_slot)
        SELECT p_topic, groups[x.ord], x.slot
        FROM unnest(place_ords, place_slots, place_turns) AS x(ord, slot, turn)
        WHERE x.turn = first_allow[x.ord] - allow[x.ord]
        ON CONFLICT ON CONSTRAINT brooq_rate_cursor_pkey
        DO UPDATE SET last_slot = EXCLUDED.last_slot;
    END IF;
    RETURN QUERY
    UPDATE job
    SET state = 'processing',
        attempts = job.attempts + 1,
        locked_by = p_worker,
        locked_until = now() + make_interval(secs => p_lease),
        progress = NULL, progress_message = NULL,
        started_at = stamp,
        updated_at = stamp
    WHERE job.id = ANY(picked)
    RETURNING job.id, job.topic, job.payload, job.attempts, job.locked_by,
              job.locked_until, job.available_at, job.queue, job.priority;
END;
$$;

-- migrate:down
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
    -- The groups' floors (brooq_group_turn.floor_*): where the claim enters a group's
    -- ready jobs, past those claimed before (docs/explanation/claim-walk.md, "Groups").
    floor_groups text[];
    floor_priorities smallint[];
    floor_ats timestamptz[];
    floor_ids uuid[];
    floors_read_at timestamptz;
    whole boolean;
    fl_priority smallint[];
    fl_at timestamptz[];
    fl_id uuid[];
    got_priorities smallint[];
    got_ats timestamptz[];
    last_i integer;
    new_groups text[] := '{}';
    new_priorities smallint[] := '{}';
    new_ats timestamptz[] := '{}';
    new_ids uuid[] := '{}';
    slack CONSTANT interval := interval '100 milliseconds';
    floor_depth CONSTANT integer := 16;
    floors_kept CONSTANT integer := 32;
    took_by integer[];
    nil CONSTANT uuid := '00000000-0000-0000-0000-000000000000';
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
           t.ungrouped_scanned_at, t.floor_groups, t.floor_priorities, t.floor_ats,
           t.floor_ids, t.floors_read_at
    INTO cursor_group, u_priority, u_at, u_id, u_scanned_at, floor_groups,
         floor_priorities, floor_ats, floor_ids, floors_read_at
    FROM brooq_group_turn t WHERE t.topic = p_topic
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        SELECT t.group_key, t.ungrouped_priority, t.ungrouped_at, t.ungrouped_id,
               t.ungrouped_scanned_at, t.floor_groups, t.floor_priorities, t.floor_ats,
               t.floor_ids, t.floors_read_at
        INTO cursor_group, u_priority, u_at, u_id, u_scanned_at, floor_groups,
             floor_priorities, floor_ats, floor_ids, floors_read_at
        FROM brooq_group_turn t WHERE t.topic = p_topic;
        owner := NOT FOUND;
    END IF;
    cursor_group := coalesce(cursor_group, '');
    -- The floors are set aside at least every 250 ms: a claim then reads its groups whole
    -- (and sets their floors again), so a job that became ready below a floor (a claim
    -- given back, a long transaction's enqueue) waits at most that long.
    whole := floors_read_at IS NULL OR floor_groups IS NULL
             OR clock_timestamp() - floors_read_at > interval '250 milliseconds';
    -- The groups in turn, from the last one served down: those with ready jobs below the
    -- cursor, then from the highest down to the cursor, one index descent each
    -- (job_ready_group_idx, read backwards: it lands on a group's newest entries, which
    -- are its live ones; the entries of jobs claimed since the last VACUUM are at a
    -- group's oldest end), leaving out those at their group_limit; at most `room` of them.
    WITH RECURSIVE below_turn(g) AS (
        SELECT (SELECT max(j.group_key) FROM job j
                WHERE j.topic = p_topic AND j.state IN ('pending', 'failed')
                  AND j.group_key IS NOT NULL AND j.group_key < cursor_group)
        UNION ALL
        SELECT (SELECT max(j.group_key) FROM job j
                WHERE j.topic = p_topic AND j.state IN ('pending', 'failed')
                  AND j.group_key IS NOT NULL AND j.group_key < a.g)
        FROM below_turn a WHERE a.g IS NOT NULL
    ), down_to_turn(g) AS (
        SELECT (SELECT max(j.group_key) FROM job j
                WHERE j.topic = p_topic AND j.state IN ('pending', 'failed')
                  AND j.group_key IS NOT NULL)
        UNION ALL
        SELECT (SELECT max(j.group_key) FROM job j
                WHERE j.topic = p_topic AND j.state IN ('pending', 'failed')
                  AND j.group_key IS NOT NULL AND j.group_key < b.g)
        FROM down_to_turn b WHERE b.g IS NOT NULL AND b.g > cursor_group
    )
    SELECT coalesce(array_agg(x.g), '{}') INTO groups
    FROM (
        SELECT c.g FROM (
            SELECT a.g FROM below_turn a WHERE a.g IS NOT NULL
            UNION ALL
            SELECT b.g FROM down_to_turn b WHERE b.g IS NOT NULL AND b.g >= cursor_group
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
    -- Each group's floor, a position (priority, available_at, id) in its order: its
    -- stored one unless this claim reads whole; after a pass, the last job it took.
    fl_priority := array_fill(NULL::smallint, ARRAY[cardinality(groups)]);
    fl_at := array_fill(NULL::timestamptz, ARRAY[cardinality(groups)]);
    fl_id := array_fill(NULL::uuid, ARRAY[cardinality(groups)]);
    IF NOT whole THEN
        FOR i IN 1 .. cardinality(groups) LOOP
            last_i := array_position(floor_groups, groups[i]);
            IF last_i IS NOT NULL THEN
                fl_priority[i] := floor_priorities[last_i];
                fl_at[i] := floor_ats[last_i];
                fl_id[i] := floor_ids[last_i];
            END IF;
        END LOOP;
    END IF;
    WHILE cardinality(picked) < room AND true = ANY(active) AND passes < 3 LOOP
        passes := passes + 1;
        share := ceil((room - cardinality(picked))::float8
                      / cardinality(array_positions(active, true)))::integer;
        -- A group with a floor is read in three index ranges, in its order: its higher
        -- priorities whole (a job of a higher priority enqueued since), the floor's
        -- priority from the floor on, its lower priorities whole; a group without one,
        -- whole. The ranges come in order and the group's LIMIT pulls row by row, so the
        -- rows locked (SKIP LOCKED, under each range's own LIMIT) are the rows taken. The
        -- rows a pass took are below their group's floor in the next pass, but for those
        -- of a higher priority than the floor's (and the job locks are this claim's own:
        -- SKIP LOCKED would not pass over them), hence the check in the first range. The
        -- four arrays are aggregated in one pass over the same rows: aligned.
        SELECT coalesce(array_agg(x.id), '{}'), coalesce(array_agg(x.ord), '{}'),
               coalesce(array_agg(x.priority), '{}'), coalesce(array_agg(x.available_at), '{}')
        INTO got_ids, got_ords, got_priorities, got_ats
        FROM (
            SELECT c.id, g.ord, c.priority, c.available_at
            FROM unnest(groups, allow, fl_priority, fl_at, fl_id)
                 WITH ORDINALITY AS g(name, allowed, fp, fa, fi, ord)
            CROSS JOIN LATERAL (
                SELECT t.id, t.priority, t.available_at
                FROM (VALUES (1, CASE WHEN g.fp IS NULL THEN -32768 ELSE g.fp + 1 END, 32767,
                              '-infinity'::timestamptz, nil),
                             (2, g.fp::integer, g.fp::integer, g.fa, g.fi),
                             (3, -32768, g.fp - 1, '-infinity'::timestamptz, nil)
                     ) AS r(k, lo, hi, fa, fi)
                CROSS JOIN LATERAL (
                    SELECT j.id, j.priority, j.available_at FROM job j
                    WHERE j.topic = p_topic AND j.group_key = g.name
                      AND j.state IN ('pending', 'failed')
                      AND j.priority <= r.hi AND j.priority >= r.lo
                      AND (j.available_at, j.id) > (r.fa, r.fi)
                      AND j.available_at <= now() AND j.queue = ANY(p_queues)
                      AND (r.k > 1 OR j.id <> ALL(picked))
                    ORDER BY j.priority DESC, j.available_at, j.id
                    LIMIT least(share, g.allowed)
                    FOR NO KEY UPDATE OF j SKIP LOCKED
                ) AS t
                WHERE r.lo IS NOT NULL AND r.hi IS NOT NULL AND r.lo <= r.hi
                LIMIT least(share, g.allowed)
            ) AS c
            WHERE active[g.ord] AND g.allowed > 0
            LIMIT room - cardinality(picked)
        ) AS x;
        picked := picked || got_ids;
        -- What each group gave, in one pass over the rows: a group's rows come in its
        -- order, so its last one is its floor for the next pass.
        took_by := array_fill(0, ARRAY[cardinality(groups)]);
        FOR k IN 1 .. cardinality(got_ords) LOOP
            last_i := got_ords[k];
            took_by[last_i] := took_by[last_i] + 1;
            fl_priority[last_i] := got_priorities[k];
            fl_at[last_i] := got_ats[k];
            fl_id[last_i] := got_ids[k];
        END LOOP;
        FOR i IN 1 .. cardinality(groups) LOOP
            IF active[i] THEN
                took := took_by[i];
                allow[i] := allow[i] - took;
                active[i] := took >= least(share, allow[i] + took) AND allow[i] > 0;
            END IF;
        END LOOP;
    END LOOP;
    IF owner THEN
        -- The floors kept: of the groups this claim took from, those that gave at least
        -- floor_depth jobs (a deep backlog, whose claimed entries pile up fastest) or had
        -- a floor already; then the others kept before; at most floors_kept of them.
        -- A floor is the last job taken when that job is older than the claim's start
        -- less `slack`, else that start less `slack` (brooq.worker.floors says why a
        -- job not yet visible to this claim cannot sort below it).
        FOR i IN 1 .. cardinality(groups) LOOP
            IF fl_priority[i] IS NOT NULL AND first_allow[i] > allow[i]
               AND (first_allow[i] - allow[i] >= floor_depth
                    OR groups[i] = ANY(floor_groups)) THEN
                new_groups := new_groups || groups[i];
                new_priorities := new_priorities || fl_priority[i];
                IF fl_at[i] < stamp - slack THEN
                    new_ats := new_ats || fl_at[i];
                    new_ids := new_ids || fl_id[i];
                ELSE
                    new_ats := new_ats || (stamp - slack);
                    new_ids := new_ids || nil;
                END IF;
            END IF;
        END LOOP;
        -- Those of groups this claim did not read keep their floors (a group at its limit
        -- now), unless it read whole: a whole read sets the floors again from what it
        -- took, so none is older than the last whole read.
        IF NOT whole THEN
            FOR i IN 1 .. coalesce(cardinality(floor_groups), 0) LOOP
                EXIT WHEN cardinality(new_groups) >= floors_kept;
                IF NOT floor_groups[i] = ANY(groups) THEN
                    new_groups := new_groups || floor_groups[i];
                    new_priorities := new_priorities || floor_priorities[i];
                    new_ats := new_ats || floor_ats[i];
                    new_ids := new_ids || floor_ids[i];
                END IF;
            END LOOP;
        END IF;
        INSERT INTO brooq_group_turn AS t
            (topic, group_key, ungrouped_priority, ungrouped_at, ungrouped_id,
             ungrouped_scanned_at, floor_groups, floor_priorities, floor_ats, floor_ids,
             floors_read_at)
        VALUES (p_topic, coalesce(groups[cardinality(groups)], cursor_group, ''),
                last_priority, last_at, last_id, u_scanned_at,
                new_groups[1:floors_kept], new_priorities[1:floors_kept],
                new_ats[1:floors_kept], new_ids[1:floors_kept],
                CASE WHEN whole THEN clock_timestamp() ELSE floors_read_at END)
        ON CONFLICT ON CONSTRAINT brooq_group_turn_pkey
        DO UPDATE SET group_key = EXCLUDED.group_key,
                      ungrouped_priority = EXCLUDED.ungrouped_priority,
                      ungrouped_at = EXCLUDED.ungrouped_at,
                      ungrouped_id = EXCLUDED.ungrouped_id,
                      ungrouped_scanned_at = EXCLUDED.ungrouped_scanned_at,
                      floor_groups = EXCLUDED.floor_groups,
                      floor_priorities = EXCLUDED.floor_priorities,
                      floor_ats = EXCLUDED.floor_ats,
                      floor_ids = EXCLUDED.floor_ids,
                      floors_read_at = EXCLUDED.floors_read_at;
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

-- 0012's search_path for it, as that migration set it.
DO $$
DECLARE
    home text;
BEGIN
    SELECT n.nspname INTO STRICT home FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE p.oid = 'brooq_window_sweep(integer)'::regprocedure;
    EXECUTE format('ALTER FUNCTION %I.brooq_window_sweep(integer) '
                   'SET search_path = pg_catalog, %I, pg_temp', home, home);
END;
$$;

DROP FUNCTION IF EXISTS brooq_window_give_back(text, integer, float8, integer, float8, float8,
                                             text[], timestamptz[]);
DROP FUNCTION IF EXISTS brooq_windows_places(text, text[], integer[], timestamptz, integer[]);
