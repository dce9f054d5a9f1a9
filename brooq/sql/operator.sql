-- The operator's reads and writes: Queue's inspection, cancel, retry and pause, the
-- CLI, a stack asked of a master, and brooq.testing's helpers.

-- name: job_get
-- errors: [] when none (NULL until the first failed attempt, and on rows an older master
-- wrote); tags: [] when none. A job is in job while active, in job_history once finished
-- (or, finished before migration 0020, still in job): job_all reads both, by id in each,
-- job_history's partitions from the job's enqueue time on (brooq_history_floor).
SELECT id, topic, payload, state, attempts, available_at, locked_by, locked_until,
       last_error, idempotency_key, created_at, updated_at, queue, priority,
       result, coalesce(errors, '[]'::jsonb) AS errors, unique_key,
       coalesce(tags, '{}') AS tags, start_after, group_key AS "group",
       progress, progress_message, traceparent, started_at, ordering_key
FROM {job_all} WHERE id = %(id)s AND updated_at >= {brooq_history_floor}(%(id)s)

-- name: job_logs
-- A keep_logs job's log per attempt ({"attempt", "at", "text"}, the last 20 attempts,
-- oldest first): [] when none were kept.
SELECT coalesce(logs, '[]'::jsonb) AS logs FROM {job_all}
WHERE id = %(id)s AND updated_at >= {brooq_history_floor}(%(id)s)

-- name: job_cancel
-- Operator or producer cancel. A processing row is canceled too, and then a NOTIFY
-- brooq_cancel (the job id) goes out at commit: the holder's master renews at once,
-- finds the lease lost and interrupts the handler. The row is locked first to read the
-- state it leaves. from_states is brooq.job.CANCELABLE_STATES (transition_params). Only
-- job is read: a job finishing while the cancel waits for its row leaves job (for
-- job_history) in that outcome's statement, so the cancel finds no row and writes
-- nothing; the caller reads how the job ended in a statement of its own (job_get).
WITH prior AS MATERIALIZED (
    SELECT id, state = 'processing' AS held FROM {job}
    WHERE id = %(id)s AND state = ANY(%(from_states)s::text[])
    FOR UPDATE
), canceled AS (
    UPDATE {job} SET state = 'canceled', updated_at = now()
    WHERE id = (SELECT id FROM prior) AND state = ANY(%(from_states)s::text[])
    RETURNING id
)
SELECT canceled.id,
       CASE WHEN prior.held THEN pg_notify('brooq_cancel', canceled.id::text) END
FROM canceled JOIN prior ON prior.id = canceled.id

-- name: job_retry
-- Operator retry of a finished job: back to pending now, attempts reset, last_error and
-- the error history kept, the waited flag cleared (its waiter has returned: the next end
-- would otherwise notify nobody's wait).
-- from_states is brooq.job.RETRYABLE_STATES (bound by brooq.queue.transition_params).
-- A finished job is in job_history: its row is moved back into job (deleted there,
-- inserted here as the retry writes it, every column of job in its order: a test holds
-- the list equal to the table's). One that finished before migration 0020 is still in
-- job and is updated in place. A job is in one of them, never both: one of the two
-- writes finds it. Its idempotency key stays its own (brooq_job_key, job_key_taken).
-- A job with a unique_key comes back as its key's job (start_after cleared: a canceled
-- waiting job too), so not while another active job holds the key: the INSERT (or the
-- UPDATE) then fails on job_unique_key_idx, which brooq.operator.changes reads as a
-- refusal (in a savepoint) and explains, naming that job.
WITH moved AS (
    DELETE FROM {job_history}
    WHERE id = %(id)s AND state = ANY(%(from_states)s::text[])
    RETURNING *
), back AS (
    INSERT INTO {job}
    SELECT m.id, m.topic, m.payload, 'pending' AS state, 0 AS attempts,
           now() AS available_at, NULL AS locked_by, NULL AS locked_until, m.last_error,
           m.idempotency_key, m.created_at, now() AS updated_at, m.lease_expiries, m.queue,
           m.priority, m.result, m.errors, NULL AS waited, m.unique_key, NULL AS start_after,
           m.tags, m.group_key, m.upstream_open, m.upstream_failed, m.on_upstream_failure,
           m.has_downstream, m.progress, m.progress_message, m.logs, m.traceparent,
           m.parked, m.started_at, m.ordering_key
    FROM moved AS m
    RETURNING id
), kept AS (
    UPDATE {job} SET state = 'pending', attempts = 0, available_at = now(),
                   locked_by = NULL, locked_until = NULL, waited = NULL, start_after = NULL,
                   updated_at = now()
    WHERE id = %(id)s AND state = ANY(%(from_states)s::text[])
    RETURNING id
), retried AS (
    SELECT id FROM back UNION ALL SELECT id FROM kept
)
-- The payload is the job table's schema: a master wakes its children only for its own
-- (brooq.ipc.channel).
SELECT retried.id, pg_notify('brooq_job', (SELECT n.nspname::text FROM pg_namespace n
                                  JOIN pg_class c ON c.relnamespace = n.oid
                                  WHERE c.oid = {job:name}::regclass)) FROM retried

-- name: job_hold
-- Operator or producer hold: a job no worker has taken (from_states is
-- brooq.job.HOLDABLE_STATES: pending, ready or scheduled, or failed, waiting out a
-- retry's backoff) goes on hold, out of the ready index, until released; its place in
-- line (available_at) and its attempts are kept. Not a durable handler's parked job (it
-- has started), nor one with a unique_key (on hold it would give its key up: the next
-- enqueue of the key would run while it waits). A claim holding the row makes this wait
-- for the claim's commit, after which the row is processing and is left alone.
UPDATE {job} SET state = 'on_hold', updated_at = now()
WHERE id = %(id)s AND state = ANY(%(from_states)s::text[]) AND parked IS NULL
  AND unique_key IS NULL
RETURNING id

-- name: job_hold_release
-- A held job back to pending (from_states is brooq.job.RELEASABLE_STATES), its place in
-- line kept: ready at once when its available_at has passed (the masters are woken, as
-- job_retry wakes them), else when it comes.
WITH released AS (
    UPDATE {job} SET state = 'pending', updated_at = now()
    WHERE id = %(id)s AND state = ANY(%(from_states)s::text[])
    RETURNING id, available_at <= now() AS ready
)
SELECT released.id,
       CASE WHEN released.ready THEN pg_notify('brooq_job', (
           SELECT n.nspname::text FROM pg_namespace n JOIN pg_class c
               ON c.relnamespace = n.oid WHERE c.oid = {job:name}::regclass)) END
FROM released

-- name: job_is_parked
-- One row when the job is a durable handler's parked job (why a hold was refused).
SELECT 1 FROM {job} WHERE id = %(id)s AND parked IS NOT NULL

-- name: job_unique_key_holder
-- The active job holding a job's unique_key (its key's job, not a waiting one), other
-- than the job itself: why a retry of it was refused. No row: the key is free. The job
-- itself is finished (job_all); the holder is active (job).
SELECT holder.id, holder.state
FROM {job_all} AS mine
JOIN {job} AS holder
  ON holder.topic = mine.topic AND holder.unique_key = mine.unique_key
 AND holder.start_after IS NULL AND holder.state IN ('pending', 'failed', 'processing')
WHERE mine.id = %(id)s AND mine.updated_at >= {brooq_history_floor}(%(id)s)
  AND holder.id <> mine.id
LIMIT 1

-- name: job_count_matching
-- The bulk forms (brooq jobs cancel/retry --topic T --state S, Queue.cancel_many and
-- retry_many): how many jobs of a topic (and queue, and tag) are in a state, and the
-- instant of that count. The batches below touch only rows not written since (updated_at <= as_of):
-- a job that changed meanwhile is left alone, and rows arriving while a bulk change runs
-- cannot keep it going forever. A finished state is counted in job_history besides job
-- (its rows from before migration 0020); an unfinished one in job only: the history's
-- arm is not run at all then (a test of the parameter alone, made once).
SELECT (SELECT count(*)
        FROM {job}
        WHERE topic = %(topic)s AND state = %(state)s
          AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
          AND (%(tag)s::text IS NULL OR tags @> ARRAY[%(tag)s::text]))
       + (SELECT count(*)
          FROM {job_history}
          WHERE %(state)s::text IN ('done', 'dead', 'canceled')
            AND topic = %(topic)s AND state = %(state)s
            AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
            AND (%(tag)s::text IS NULL OR tags @> ARRAY[%(tag)s::text])) AS matched,
       now() AS as_of

-- template: job_cancel_batch
-- variant: job_cancel_batch
-- variant: job_hold_batch: hold
-- variant: job_hold_release_batch: release
-- One batch of a bulk cancel, its own transaction: at most `batch` rows are locked, and
-- only until its commit, so canceling a million jobs never holds a million row locks (nor
-- blocks claims and outcome writes for the whole run). Rows locked by someone else are
-- skipped: they are changing meanwhile (a claim, an outcome). Keyset on id (`after`: the
-- last id of the previous batch, the nil UUID first, which brooq.producer.ids never makes) walks
-- the table once instead of rescanning the rows already passed (there is no index on
-- topic: each batch walks the primary key from `after` until it has `batch` rows). The
-- UPDATE takes the ids as an array, one primary-key lookup each: joined to picked, it was
-- planned as a hash join over every row in the state (0.83 s a batch instead of 0.35 s,
-- 200,000 dead jobs in a 1,000,000-job table). Guarded as job_cancel is: from_states is
-- brooq.job.BULK_FROM_STATES['cancel'], re-checked under the row lock.
-- _hold: the rows go on hold as job_hold puts one (not parked, not keyed: those are
-- left alone); _release: back to pending as job_release, one pg_notify per batch that
-- released anything (NOTIFY must never run per row).
WITH picked AS MATERIALIZED (
    SELECT id FROM {job}
    WHERE id > %(after)s::uuid AND topic = %(topic)s AND state = %(state)s
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(tag)s::text IS NULL OR tags @> ARRAY[%(tag)s::text])
      AND updated_at <= %(as_of)s
    ORDER BY id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), changed AS (
--#if hold
    UPDATE {job} SET state = 'on_hold', updated_at = now()
--#else
--#if release
    UPDATE {job} SET state = 'pending', updated_at = now()
--#else
    UPDATE {job} SET state = 'canceled', updated_at = now()
--#end
--#end
    WHERE id = ANY(ARRAY(SELECT id FROM picked)) AND state = %(state)s
      AND state = ANY(%(from_states)s::text[])
--#if hold
      AND parked IS NULL AND unique_key IS NULL
--#end
    RETURNING id
)
SELECT (SELECT count(*) FROM picked) AS picked,
       (SELECT id FROM picked ORDER BY id DESC LIMIT 1) AS last_id,
--#if release
       (SELECT count(*) FROM changed) AS changed,
       CASE WHEN EXISTS (SELECT FROM changed) THEN pg_notify('brooq_job', (
           SELECT n.nspname::text FROM pg_namespace n JOIN pg_class c
               ON c.relnamespace = n.oid WHERE c.oid = {job:name}::regclass)) END AS woken
--#else
       (SELECT count(*) FROM changed) AS changed
--#end

-- name: job_purge_count
-- brooq purge --queue Q / --topic T, Queue.purge(dry_run=True): how many jobs a purge
-- would cancel now. The jobs a purge takes: every job of the queue (and/or topic) not yet
-- taken by a worker, i.e. pending (ready or scheduled), failed (retrying) and waiting (on
-- the jobs named in its `after`); never processing, finished, or parked (a durable
-- handler's job that has started: it sleeps or waits, and is canceled by id).
-- from_states is brooq.job.BULK_FROM_STATES['cancel'].
SELECT count(*) AS matched
FROM {job}
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(topic)s::text IS NULL OR topic = %(topic)s::text)
  AND state = ANY(%(from_states)s::text[]) AND parked IS NULL

-- name: job_purge_batch
-- One batch of a purge (job_purge_count says which jobs), its own transaction, batched,
-- locked and keyed as job_cancel_batch: at most `batch` rows locked until its commit, rows
-- locked by someone else skipped (a claim is taking them). Only jobs created up to
-- `as_of` are taken: the first batch passes NULL and answers its own now(), which the
-- next batches pass, so jobs enqueued while a purge runs are left alone and cannot keep
-- it going. Canceling a job some other job waits for cancels that one too (the graph's
-- trigger), as any cancel does.
WITH picked AS MATERIALIZED (
    SELECT id FROM {job}
    WHERE id > %(after)s::uuid
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(topic)s::text IS NULL OR topic = %(topic)s::text)
      AND state = ANY(%(from_states)s::text[]) AND parked IS NULL
      AND created_at <= coalesce(%(as_of)s::timestamptz, now())
    ORDER BY id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), canceled AS (
    UPDATE {job} SET state = 'canceled', updated_at = now()
    WHERE id = ANY(ARRAY(SELECT id FROM picked))
      AND state = ANY(%(from_states)s::text[]) AND parked IS NULL
    RETURNING id
)
SELECT (SELECT count(*) FROM picked) AS picked,
       (SELECT id FROM picked ORDER BY id DESC LIMIT 1) AS last_id,
       (SELECT count(*) FROM canceled) AS changed,
       coalesce(%(as_of)s::timestamptz, now()) AS as_of

-- name: job_retry_batch
-- One batch of a bulk retry: batched, locked, keyed and guarded as job_cancel_batch, and
-- each row written as job_retry writes one (pending now, attempts reset, last_error and
-- the error history kept, the waited flag cleared, start_after cleared; moved back from
-- job_history into job, or updated in place for a row from before migration 0020);
-- from_states is brooq.job.BULK_FROM_STATES['retry']. The keyset walks both tables by
-- id: each gives its first `batch` rows past `after`, and the batch is the first `batch`
-- of the two together (rows of one locked past the other's are left for the next
-- batch, which starts after this one's last id). One pg_notify per batch that retried
-- anything wakes the masters, as job_retry's does for one job (NOTIFY must never run per
-- row).
-- A job with a unique_key comes back as its key's job, so it is left alone (`taken`,
-- with the job holding its key) when an active job holds the key, or when a job of this
-- batch with a smaller id and the same key comes back first. One taking the key meanwhile
-- makes the INSERT (or UPDATE) fail on job_unique_key_idx: brooq.operator.changes runs
-- the batch again.
WITH picked_history AS MATERIALIZED (
    SELECT id, topic, unique_key FROM {job_history}
    WHERE id > %(after)s::uuid AND topic = %(topic)s AND state = %(state)s
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(tag)s::text IS NULL OR tags @> ARRAY[%(tag)s::text])
      AND updated_at <= %(as_of)s
    ORDER BY id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), picked_job AS MATERIALIZED (
    SELECT id, topic, unique_key FROM {job}
    WHERE id > %(after)s::uuid AND topic = %(topic)s AND state = %(state)s
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(tag)s::text IS NULL OR tags @> ARRAY[%(tag)s::text])
      AND updated_at <= %(as_of)s
    ORDER BY id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), picked AS MATERIALIZED (
    SELECT id, topic, unique_key
    FROM (SELECT * FROM picked_history UNION ALL SELECT * FROM picked_job) AS both_tables
    ORDER BY id
    LIMIT %(batch)s
), taken AS MATERIALIZED (
    SELECT p.id, coalesce(
        (SELECT holder.id FROM {job} AS holder
         WHERE holder.topic = p.topic AND holder.unique_key = p.unique_key
           AND holder.start_after IS NULL
           AND holder.state IN ('pending', 'failed', 'processing')
         LIMIT 1),
        (SELECT first.id FROM picked AS first
         WHERE first.topic = p.topic AND first.unique_key = p.unique_key AND first.id < p.id
         ORDER BY first.id LIMIT 1)) AS holder
    FROM picked AS p
    WHERE p.unique_key IS NOT NULL
), moved AS (
    DELETE FROM {job_history}
    WHERE id = ANY(ARRAY(SELECT id FROM picked
                         EXCEPT SELECT id FROM taken WHERE holder IS NOT NULL))
      AND state = %(state)s AND state = ANY(%(from_states)s::text[])
    RETURNING *
), back AS (
    -- Every column of job in its order, as job_retry writes them.
    INSERT INTO {job}
    SELECT m.id, m.topic, m.payload, 'pending' AS state, 0 AS attempts,
           now() AS available_at, NULL AS locked_by, NULL AS locked_until, m.last_error,
           m.idempotency_key, m.created_at, now() AS updated_at, m.lease_expiries, m.queue,
           m.priority, m.result, m.errors, NULL AS waited, m.unique_key, NULL AS start_after,
           m.tags, m.group_key, m.upstream_open, m.upstream_failed, m.on_upstream_failure,
           m.has_downstream, m.progress, m.progress_message, m.logs, m.traceparent,
           m.parked, m.started_at, m.ordering_key
    FROM moved AS m
    RETURNING id
), kept AS (
    UPDATE {job} SET state = 'pending', attempts = 0, available_at = now(),
                   locked_by = NULL, locked_until = NULL, waited = NULL, start_after = NULL,
                   updated_at = now()
    WHERE id = ANY(ARRAY(SELECT id FROM picked
                         EXCEPT SELECT id FROM taken WHERE holder IS NOT NULL))
      AND state = %(state)s AND state = ANY(%(from_states)s::text[])
    RETURNING id
), retried AS (
    SELECT id FROM back UNION ALL SELECT id FROM kept
)
SELECT (SELECT count(*) FROM picked) AS picked,
       (SELECT id FROM picked ORDER BY id DESC LIMIT 1) AS last_id,
       (SELECT count(*) FROM retried) AS changed,
       ARRAY(SELECT id FROM taken WHERE holder IS NOT NULL ORDER BY id) AS taken,
       ARRAY(SELECT holder FROM taken WHERE holder IS NOT NULL ORDER BY id) AS holders,
       (SELECT pg_notify('brooq_job', (SELECT n.nspname::text FROM pg_namespace n
                                        JOIN pg_class c ON c.relnamespace = n.oid
                                        WHERE c.oid = {job:name}::regclass))
        FROM retried LIMIT 1) AS woke

-- name: job_stats_by_topic
-- Per queue and topic, in one snapshot, the counts of docs/explanation/guarantees.md
-- ("Counts"), each unfinished job in exactly one: waiting (for the jobs named in its
-- after), scheduled (pending, due later), ready (pending or failed, due now: claimable;
-- a paused queue's ready jobs are still counted: they wait), retrying (failed, due later:
-- its backoff), parked (a durable handler's job sleeping or waiting for an event or its
-- child jobs: job.parked read with the state, pending until a wake time or a wait's
-- deadline, or waiting), on_hold (held by an operator until released), processing, and
-- dead (done grows without bound and is never counted). held, part of ready, is
-- job_held_by_topic's. Then the state counts the
-- library's records keep: pending, failed, and busy (processing under a lease that has
-- not expired, i.e. a child working on it; an expired lease waits for the reaper).
-- The unfinished jobs are in job; the dead are in job_history (job_history_dead_idx),
-- and in job those that died before migration 0020. A job is in one of the two: the
-- one snapshot counts it once. On job, the WHERE is an OR of arms, each the
-- predicate of a partial index (as in web_overview_exact): the planner reads the active
-- and legacy dead rows only, through a BitmapOr; as one IN list it matched no index and
-- scanned the whole table every stats period (docs/status-page.md). Its cost follows
-- the backlog and the dead jobs kept, never the done ones.
WITH active AS (
    SELECT queue, topic,
           count(*) FILTER (WHERE state = 'waiting' AND parked IS NULL) AS waiting,
           count(*) FILTER (WHERE state = 'pending' AND available_at > now()
                              AND parked IS NULL) AS scheduled,
           count(*) FILTER (WHERE state IN ('pending', 'failed') AND available_at <= now())
               AS ready,
           count(*) FILTER (WHERE state = 'failed' AND available_at > now()) AS retrying,
           count(*) FILTER (WHERE parked IS NOT NULL AND (
               state = 'waiting' OR (state = 'pending' AND available_at > now())))
               AS parked,
           count(*) FILTER (WHERE state = 'on_hold') AS on_hold,
           count(*) FILTER (WHERE state = 'processing') AS processing,
           count(*) FILTER (WHERE state = 'dead') AS dead,
           min(available_at) FILTER (
               WHERE state IN ('pending', 'failed') AND available_at <= now()) AS oldest_ready,
           count(*) FILTER (WHERE state = 'pending') AS pending,
           count(*) FILTER (WHERE state = 'failed') AS failed,
           count(*) FILTER (WHERE state = 'processing' AND locked_until > now()) AS busy
    FROM {job}
    WHERE state IN ('pending', 'failed') OR state = 'processing' OR state = 'dead'
       OR state = 'waiting' OR state = 'on_hold'
    GROUP BY queue, topic
), gone AS (
    SELECT queue, topic, count(*) AS dead
    FROM {job_history}
    WHERE state = 'dead'
    GROUP BY queue, topic
)
SELECT coalesce(a.queue, g.queue) AS queue, coalesce(a.topic, g.topic) AS topic,
       coalesce(a.waiting, 0) AS waiting,
       coalesce(a.scheduled, 0) AS scheduled,
       coalesce(a.ready, 0) AS ready,
       coalesce(a.retrying, 0) AS retrying,
       coalesce(a.parked, 0) AS parked,
       coalesce(a.on_hold, 0) AS on_hold,
       coalesce(a.processing, 0) AS processing,
       coalesce(a.dead, 0) + coalesce(g.dead, 0) AS dead,
       coalesce(extract(epoch FROM now() - a.oldest_ready), 0)::float8 AS oldest_ready_age,
       coalesce(a.pending, 0) AS pending,
       coalesce(a.failed, 0) AS failed,
       coalesce(a.busy, 0) AS busy
FROM active AS a
FULL JOIN gone AS g ON g.queue = a.queue AND g.topic = a.topic
ORDER BY 1, 2

-- template: limits_held
-- variant: topic_limits_held
-- variant: job_held_by_topic: exact
-- What the topics' limits hold back now (docs/how-to/rate-limits.md). The limits are
-- those the live masters publish (brooq_master.limits; for a topic, the row seen last; a
-- row counts while within 3 of its own beats: brooq.operator.masters.MISSED_BEATS, which a unit
-- test holds equal). Every ready job of a topic is held back while the topic is at its
-- global_limit or its rate_limit's window is full (N slots in use: brooq_rate_slot,
-- migration 0012); the ready jobs of a group while the group is at its group_limit or
-- its group_rate_limit's window is full, the group's own (brooq_group_limit, set at
-- runtime: `brooq limits set`) where it has one, as the claim reads them (an own rate
-- only on a topic under a rate; an own limit of 0 holds every ready job of the group).
-- topic_limits_held: per topic with limits, the
-- limits, what holds all its ready jobs back (NULL: nothing) and how many groups are
-- held back; it reads the processing rows and the windows only (the status page,
-- `brooq queues`). job_held_by_topic: per queue and topic, the ready jobs held back and
-- the age of the oldest ready job that is not; it reads the limited topics' ready rows
-- as job_stats_by_topic reads every topic's (`brooq stats`, the master's gauges).
WITH lim AS (
    SELECT DISTINCT ON (l.key) l.key AS topic, l.value AS limits,
           -- A row is written by any master, any version: a limit that is not a whole
           -- number, or limits that are not an object, count as none (never an error).
           CASE WHEN l.value->>'global_limit' ~ '^[0-9]{1,9}$'
                THEN (l.value->>'global_limit')::int END AS cap,
           CASE WHEN l.value->'rate_limit'->>'limit' ~ '^[0-9]{1,9}$'
                THEN (l.value->'rate_limit'->>'limit')::int END AS rate,
           CASE WHEN l.value->>'group_limit' ~ '^[0-9]{1,9}$'
                THEN (l.value->>'group_limit')::int END AS group_cap,
           CASE WHEN l.value->'group_rate_limit'->>'limit' ~ '^[0-9]{1,9}$'
                THEN (l.value->'group_rate_limit'->>'limit')::int END AS group_rate
    FROM {brooq_master} AS m,
         jsonb_each(CASE WHEN jsonb_typeof(m.limits) = 'object' THEN m.limits
                         ELSE '{}'::jsonb END) AS l
    WHERE m.limits IS NOT NULL AND jsonb_typeof(l.value) = 'object'
      AND m.seen_at >= now() - make_interval(secs => m.beat_seconds * 3)
    ORDER BY l.key, m.seen_at DESC
), own AS MATERIALIZED (
    -- The groups' own limits of the topics claimed in turn (a rate, a limit per group or
    -- fair_groups: a global_limit alone takes one job a claim and reads none); an own
    -- rate counts only under a rate (the claim's own rules: brooq_claim_batch).
    SELECT o.topic, o.group_key, o.group_limit,
           CASE WHEN lim.rate IS NOT NULL OR lim.group_rate IS NOT NULL
                THEN o.group_rate END AS group_rate
    FROM lim JOIN {brooq_group_limit} AS o ON o.topic = lim.topic
    WHERE lim.rate IS NOT NULL OR lim.group_cap IS NOT NULL OR lim.group_rate IS NOT NULL
       OR lim.limits->'fair_groups' = 'true'::jsonb
), topic_held AS MATERIALIZED (
    -- holds: whether any limit of the topic can hold a job back (fair_groups alone
    -- cannot, a group's own limit can: only then are its ready rows read for the
    -- count). Materialized: inlined into the count below, its CASE (a count of the
    -- topic's window) would run once per ready job.
    SELECT lim.topic,
           lim.cap IS NOT NULL OR lim.rate IS NOT NULL OR lim.group_cap IS NOT NULL
           OR lim.group_rate IS NOT NULL
           OR EXISTS (SELECT FROM own WHERE own.topic = lim.topic
                        AND (own.group_limit IS NOT NULL OR own.group_rate IS NOT NULL))
               AS holds,
           CASE
               WHEN lim.cap IS NOT NULL AND (
                   SELECT count(*) FROM {job} AS j
                   WHERE j.state = 'processing' AND j.topic = lim.topic) >= lim.cap
               THEN 'global_limit'
               WHEN lim.rate IS NOT NULL AND (
                   SELECT count(*) FROM {brooq_rate_slot} AS s
                   WHERE s.topic = lim.topic AND s.group_key = '' AND s.slot <= lim.rate
                     AND s.free_at > now()) >= lim.rate
               THEN 'rate_limit'
           END AS held_by
    FROM lim
), group_held AS (
    SELECT lim.topic, j.group_key
    FROM lim
    JOIN {job} AS j
      ON j.topic = lim.topic AND j.state = 'processing' AND j.group_key IS NOT NULL
    LEFT JOIN own ON own.topic = lim.topic AND own.group_key = j.group_key
    WHERE coalesce(own.group_limit, lim.group_cap) IS NOT NULL
    GROUP BY lim.topic, j.group_key
    HAVING count(*) >= min(coalesce(own.group_limit, lim.group_cap))
    UNION
    SELECT own.topic, own.group_key FROM own WHERE own.group_limit = 0
    UNION
    SELECT lim.topic, s.group_key
    FROM lim
    JOIN {brooq_rate_slot} AS s
      ON s.topic = lim.topic AND s.group_key <> '' AND s.free_at > now()
    LEFT JOIN own ON own.topic = lim.topic AND own.group_key = s.group_key
    WHERE s.slot <= coalesce(own.group_rate, lim.group_rate)
    GROUP BY lim.topic, s.group_key
    HAVING count(*) >= min(coalesce(own.group_rate, lim.group_rate))
)
--#if exact
SELECT r.queue, r.topic,
       count(*) FILTER (WHERE r.held) AS held,
       coalesce(extract(epoch FROM now() - min(r.available_at) FILTER (WHERE NOT r.held)),
                0)::float8 AS oldest_unheld_age
FROM (
    SELECT j.queue, j.topic, j.available_at,
           th.held_by IS NOT NULL OR gh.group_key IS NOT NULL AS held
    FROM {job} AS j
    JOIN topic_held AS th ON th.topic = j.topic AND th.holds
    LEFT JOIN group_held AS gh ON gh.topic = j.topic AND gh.group_key = j.group_key
    WHERE j.state IN ('pending', 'failed') AND j.available_at <= now()
) AS r
GROUP BY r.queue, r.topic
ORDER BY r.queue, r.topic
--#else
SELECT lim.topic, lim.limits, th.held_by,
       (SELECT count(*) FROM group_held AS gh WHERE gh.topic = lim.topic) AS groups_held
FROM lim
JOIN topic_held AS th ON th.topic = lim.topic
ORDER BY lim.topic
--#end

-- name: job_queue_stats
-- Per queue, in one snapshot: every queue holding unfinished or dead jobs, and every
-- queue with a brooq_queue row (paused or resumed by an operator, perhaps before any job
-- came), by name. A queue without a row is running (paused = false). The counts are
-- job_stats_by_topic's, summed over the queue's topics (held is added by the caller,
-- from job_held_by_topic); failed is the state's count (its jobs are counted in ready or
-- retrying). limited: the topics whose oldest ready job not held back the caller takes
-- from job_held_by_topic, left out of oldest_ready_seconds here. Like
-- job_stats_by_topic (and with its OR of partial-index predicates), only the unfinished
-- states and dead are read in job, and the dead in job_history, never done or canceled
-- rows.
WITH active AS (
    SELECT queue,
           count(*) FILTER (WHERE state = 'waiting' AND parked IS NULL) AS waiting,
           count(*) FILTER (WHERE state = 'pending' AND available_at > now()
                              AND parked IS NULL) AS scheduled,
           count(*) FILTER (WHERE state IN ('pending', 'failed') AND available_at <= now())
               AS ready,
           count(*) FILTER (WHERE state = 'failed' AND available_at > now()) AS retrying,
           count(*) FILTER (WHERE parked IS NOT NULL AND (
               state = 'waiting' OR (state = 'pending' AND available_at > now())))
               AS parked,
           count(*) FILTER (WHERE state = 'on_hold') AS on_hold,
           count(*) FILTER (WHERE state = 'processing') AS processing,
           count(*) FILTER (WHERE state = 'dead') AS dead,
           count(*) FILTER (WHERE state = 'failed') AS failed,
           coalesce(extract(epoch FROM now() - min(available_at) FILTER (
               WHERE state IN ('pending', 'failed') AND available_at <= now()
                 AND topic <> ALL(%(limited)s::text[]))), 0)::float8
               AS oldest_ready_seconds
    FROM {job}
    WHERE state IN ('pending', 'failed') OR state = 'processing' OR state = 'dead'
       OR state = 'waiting' OR state = 'on_hold'
    GROUP BY queue
), gone AS (
    SELECT queue, count(*) AS dead
    FROM {job_history}
    WHERE state = 'dead'
    GROUP BY queue
), counts AS (
    SELECT coalesce(a.queue, g.queue) AS queue, a.waiting, a.scheduled, a.ready,
           a.retrying, a.parked, a.on_hold, a.processing,
           coalesce(a.dead, 0) + coalesce(g.dead, 0) AS dead, a.failed,
           a.oldest_ready_seconds
    FROM active AS a
    FULL JOIN gone AS g ON g.queue = a.queue
)
SELECT coalesce(c.queue, q.name) AS name,
       coalesce(q.paused, false) AS paused,
       coalesce(c.waiting, 0) AS waiting,
       coalesce(c.scheduled, 0) AS scheduled,
       coalesce(c.ready, 0) AS ready,
       coalesce(c.retrying, 0) AS retrying,
       coalesce(c.parked, 0) AS parked,
       coalesce(c.on_hold, 0) AS on_hold,
       coalesce(c.processing, 0) AS processing,
       coalesce(c.dead, 0) AS dead,
       coalesce(c.failed, 0) AS failed,
       coalesce(c.oldest_ready_seconds, 0)::float8 AS oldest_ready_seconds
FROM counts AS c
FULL JOIN {brooq_queue} AS q ON q.name = c.queue
ORDER BY 1

-- name: queue_set_paused
-- Operator pause or resume of a queue. A queue nobody used yet may be paused: the row
-- waits for its jobs. Running jobs are not touched; claims read the row.
INSERT INTO {brooq_queue} (name, paused)
VALUES (%(name)s, %(paused)s)
ON CONFLICT (name) DO UPDATE SET paused = EXCLUDED.paused, updated_at = now()

-- name: job_list
-- Newest first. A tag is a filter on the rows read in that order (no index on tags: a
-- listing stops at `limit` matches; docs/how-to/unique-and-debounce.md has its cost).
-- Active and finished jobs alike (job_all); a finished state is read in job_history
-- (and job's rows from before migration 0020), an unfinished one in job.
SELECT id, topic, payload, state, attempts, available_at, locked_by, locked_until,
       last_error, idempotency_key, created_at, updated_at, queue, priority,
       result, coalesce(errors, '[]'::jsonb) AS errors, unique_key,
       coalesce(tags, '{}') AS tags, start_after, group_key AS "group",
       progress, progress_message, traceparent, started_at, ordering_key
FROM {job_all}
WHERE (%(topic)s::text IS NULL OR topic = %(topic)s::text)
  AND (%(state)s::text IS NULL OR state = %(state)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(tag)s::text IS NULL OR tags @> ARRAY[%(tag)s::text])
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: job_list_processing
-- Jobs in flight, longest running first. running_for counts from the claim (lease renewal
-- leaves updated_at alone); a negative lease_left is an expired lease the reaper will
-- give back. progress: the handler's last claim.progress() a renewal wrote, or NULL.
SELECT id, topic, attempts, locked_by, locked_until,
       extract(epoch FROM now() - updated_at)::float8 AS running_for,
       extract(epoch FROM locked_until - now())::float8 AS lease_left,
       progress, progress_message
FROM {job}
WHERE state = 'processing'
ORDER BY updated_at, id
LIMIT %(limit)s

-- name: job_processing_by_holder
-- Per holder (a child's locked_by), its jobs in state processing, busiest first (an async
-- child holds many at once): how many, and how long the oldest has run, counted from the
-- claim as job_list_processing counts it. Expired leases are counted (the reaper has not
-- given them back yet). At most the given number of holders.
SELECT locked_by,
       count(*) AS processing,
       extract(epoch FROM now() - min(updated_at))::float8 AS oldest_running
FROM {job}
WHERE state = 'processing'
GROUP BY locked_by
ORDER BY processing DESC, locked_by
LIMIT %(limit)s

-- name: job_count_finished_since
-- Per queue and topic, the jobs that reached done, failed, dead or canceled in the last
-- given number of seconds (each of those writes sets updated_at): the recent throughput.
-- failed in job, the finished in job_history (only its partitions that may hold rows
-- that recent are read: it is partitioned on updated_at) and, from before migration
-- 0020, in job.
SELECT queue, topic, count(*) AS jobs
FROM {job_all}
WHERE state IN ('done', 'dead', 'canceled', 'failed')
  AND updated_at >= now() - make_interval(secs => %(seconds)s)
GROUP BY queue, topic

-- name: periodic_list
-- `brooq periodic`: the last claimed tick of each named schedule and its job's state,
-- active or finished (NULL state with a last_job: retention deleted the job).
SELECT p.name, p.last_tick, p.last_job, j.state
FROM {brooq_periodic} p
LEFT JOIN {job_all} j ON j.id = p.last_job
WHERE p.name = ANY(%(names)s::text[])

-- name: testing_ready_queues
-- brooq.testing.drain: the queues that hold jobs of these topics ready now, so that one
-- claim statement (job_finish_and_claim_queues) can be given all of them.
SELECT DISTINCT queue FROM {job}
WHERE state IN ('pending', 'failed') AND available_at <= now() AND topic = ANY(%(topics)s::text[])
ORDER BY queue

-- name: testing_jobs
-- brooq.testing.jobs: every job (of a topic, in a state), oldest first, for assertions:
-- active and finished alike (job_all).
SELECT id, topic, payload, state, attempts, available_at, locked_by, locked_until,
       last_error, idempotency_key, created_at, updated_at, queue, priority,
       result, coalesce(errors, '[]'::jsonb) AS errors, unique_key,
       coalesce(tags, '{}') AS tags, start_after, group_key AS "group",
       progress, progress_message, traceparent, started_at, ordering_key
FROM {job_all}
WHERE (%(topic)s::text IS NULL OR topic = %(topic)s::text)
  AND (%(state)s::text IS NULL OR state = %(state)s::text)
ORDER BY created_at, id

-- name: stack_request
-- `brooq jobs stack`: ask for the stack of a running job. The notification carries the
-- job id: each master looks at its children's boards, and only the one running it answers.
WITH request AS (
    INSERT INTO {brooq_stack_request} (job_id) VALUES (%(job_id)s) RETURNING id
)
SELECT id, pg_notify('brooq_stack', %(job_id)s::text) FROM request

-- name: stack_job_state
-- Whether the job runs (no stack is asked of a job that does not): a finished job is
-- named with how it ended, not as unknown.
SELECT state FROM {job_all} WHERE id = %(id)s AND updated_at >= {brooq_history_floor}(%(id)s)

-- name: listen_stack_answers
LISTEN brooq_stack_answer

-- name: stack_take
-- The command reads its request's answer and deletes the row (answered or not: at its
-- timeout it gives up). No row: already taken.
DELETE FROM {brooq_stack_request} WHERE id = %(id)s RETURNING answered_at, worker, stack

-- name: fleet_live
-- The live masters (`brooq fleet`, the status page's /fleet, the "no handler" marks):
-- the rows written within `missed` of their own beats. A tiny table: one row per master.
-- Counted from the moment the database's rows are as of: now() on a primary and on a
-- standby streaming with all it received replayed; on a standby behind (replay lagging,
-- or not streaming), when the last transaction it replayed committed on the primary,
-- as replica_lag counts its lag. Counted from now(), a standby 30 s behind showed no
-- master alive.
WITH as_of AS (
    SELECT CASE
             WHEN pg_is_in_recovery()
                  AND (NOT EXISTS (SELECT FROM pg_stat_wal_receiver)
                       OR pg_last_wal_receive_lsn() IS DISTINCT FROM pg_last_wal_replay_lsn())
               THEN least(now(), coalesce(pg_last_xact_replay_timestamp(), now()))
             ELSE now()
           END AS at
)
SELECT id, host, pid, version, app, queues, topics, children, beat_seconds, started_at,
       seen_at, extract(epoch FROM as_of.at - seen_at)::float8 AS seen_seconds_ago,
       coalesce(limits, '{}'::jsonb) AS limits
FROM {brooq_master}, as_of
WHERE seen_at >= as_of.at - make_interval(secs => beat_seconds * %(missed)s::int4)
ORDER BY host, pid, id
LIMIT %(limit)s

-- name: snapshot_holders
-- What holds back the cleanup of dead rows in this database (the job table's among
-- them): VACUUM removes a row version only once no snapshot may still see it, so the
-- oldest of these is how far back every table's cleanup stops. Four kinds hold it:
--   session   a backend of this database with a snapshot (backend_xmin) or a
--             transaction ID (backend_xid: an idle transaction that wrote something);
--   standby   a walsender whose standby reports its oldest query (hot_standby_feedback):
--             it holds every database's cleanup, whichever it streams;
--   slot      a replication slot's xmin (a standby with feedback, kept while it is
--             away); a logical slot's catalog_xmin holds back the system catalogs only,
--             not the job table, and is left out;
--   prepared  a prepared transaction of this database (PREPARE TRANSACTION) until it is
--             committed or rolled back.
-- Oldest first, by transaction ID age (the horizon itself). `since`: when the holding
-- began by a clock PostgreSQL keeps (a session's transaction start, a preparation's
-- time); NULL for a standby and a slot, and for another role's session unless the
-- reader has pg_read_all_stats (its state and times are hidden then). No query text: it
-- may hold data. Left out: this statement's own session, autovacuum workers (a VACUUM's
-- snapshot holds back nothing) and parallel workers (their leader is listed).
SELECT kind, pid, name, usename, client, state, backend_start, xact_start, query_start,
       since, extract(epoch FROM now() - since)::float8 AS seconds, xid_age, xmin
FROM (
    SELECT CASE WHEN a.datid IS NULL OR a.backend_type = 'walsender' THEN 'standby'
                ELSE 'session' END AS kind,
           a.pid, a.application_name AS name, a.usename::text AS usename,
           coalesce(host(a.client_addr), CASE WHEN a.client_port = -1 THEN 'local' END)
               AS client,
           a.state, a.backend_start, a.xact_start, a.query_start,
           CASE WHEN a.datid IS NOT NULL AND a.backend_type IS DISTINCT FROM 'walsender'
                THEN a.xact_start END AS since,
           greatest(age(a.backend_xmin), age(a.backend_xid)) AS xid_age,
           coalesce(a.backend_xmin, a.backend_xid)::text AS xmin
    FROM pg_stat_activity AS a
    WHERE a.pid <> pg_backend_pid()
      AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
      AND (a.datid IS NULL
           OR a.datid = (SELECT oid FROM pg_database WHERE datname = current_database()))
      AND a.backend_type IS DISTINCT FROM 'autovacuum worker'
      AND a.backend_type IS DISTINCT FROM 'parallel worker'
    UNION ALL
    SELECT 'slot', s.active_pid, s.slot_name::text, w.usename::text, host(w.client_addr),
           CASE WHEN s.active THEN 'active' ELSE 'inactive' END,
           NULL, NULL, NULL, NULL, age(s.xmin), s.xmin::text
    FROM pg_replication_slots AS s
    LEFT JOIN pg_stat_activity AS w ON w.pid = s.active_pid
    WHERE s.xmin IS NOT NULL
    UNION ALL
    SELECT 'prepared', NULL, p.gid, p.owner::text, NULL, 'prepared', NULL, NULL, NULL,
           p.prepared, age(p.transaction), p.transaction::text
    FROM pg_prepared_xacts AS p
    WHERE p.database = current_database()
) AS holder
ORDER BY xid_age DESC, since NULLS LAST
LIMIT %(limit)s

-- name: replica_lag
-- How far the database read is behind its primary, as the database itself knows it
-- (brooq.operator.replica; docs/how-to/read-replica.md). pg_last_xact_replay_timestamp()
-- is when the last replayed transaction committed on the primary: while a standby has
-- replayed all it received, its age only says how long the primary has been quiet, so
-- such a standby, streaming, is 0 behind. pg_stat_wal_receiver has its row (the pid,
-- shown to any role) while a WAL receiver runs. clock_timestamp(), not now(): the
-- transaction may have begun earlier.
SELECT pg_is_in_recovery() AS standby,
       EXISTS (SELECT FROM pg_stat_wal_receiver) AS streaming,
       pg_last_wal_receive_lsn() IS NOT DISTINCT FROM pg_last_wal_replay_lsn() AS caught_up,
       pg_last_xact_replay_timestamp() AS replayed_at,
       extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())::float8
           AS since_replay

-- name: job_upstream
-- The jobs a job waits for or waited for (after=[...]), in the order it named them:
-- claim.upstream, `brooq jobs show`, the job page. A job retention deleted is left out
-- (retention keeps those of a job not yet ended). Positions from 1: the child jobs a
-- durable handler waited for (claim.wait_jobs) have edges at negative positions.
SELECT u.id, u.topic, u.state, u.result
FROM {brooq_job_edge} AS e JOIN {job_all} AS u ON u.id = e.upstream_id
WHERE e.downstream_id = %(id)s AND e.position > 0
ORDER BY e.position

-- name: job_downstream
-- The jobs that wait or waited for a job, by id (enqueue order), at most `limit`, active
-- or finished.
SELECT d.id, d.topic, d.state, d.result
FROM {brooq_job_edge} AS e JOIN {job_all} AS d ON d.id = e.downstream_id
WHERE e.upstream_id = %(id)s
ORDER BY d.id
LIMIT %(limit)s

-- name: group_limit_set
-- A group's own group_limit (brooq limits set, Queue.set_group_limit): it replaces the
-- topic's for that group in the claims of topics whose groups are taken in turn
-- (brooq_claim_groups reads it at every claim: every master obeys at its next claim).
INSERT INTO {brooq_group_limit} (topic, group_key, group_limit)
VALUES (%(topic)s, %(group)s, %(limit)s)
ON CONFLICT (topic, group_key)
DO UPDATE SET group_limit = EXCLUDED.group_limit, updated_at = now()

-- name: group_limit_clear
-- The group back to the topic's group_limit; a row when there was an own limit. A row
-- that holds an own rate too keeps it.
WITH gone AS (
    DELETE FROM {brooq_group_limit}
    WHERE topic = %(topic)s AND group_key = %(group)s AND group_rate IS NULL
    RETURNING group_limit
), kept AS (
    UPDATE {brooq_group_limit} SET group_limit = NULL, updated_at = now()
    WHERE topic = %(topic)s AND group_key = %(group)s AND group_rate IS NOT NULL
      AND group_limit IS NOT NULL
    RETURNING group_limit
)
SELECT group_limit FROM gone UNION ALL SELECT group_limit FROM kept

-- name: group_rate_set
-- A group's own rate (brooq limits set --rate, Queue.set_group_rate): at most `rate`
-- starts in any `period` seconds, each start holding its place for `window` seconds (the
-- period and its allowance, brooq.declare.rates); it replaces the topic's
-- group_rate_limit for that group in every claim of a rated topic (brooq_claim_batch).
INSERT INTO {brooq_group_limit} (topic, group_key, group_rate, group_period, group_window)
VALUES (%(topic)s, %(group)s, %(rate)s, %(period)s, %(window)s)
ON CONFLICT (topic, group_key)
DO UPDATE SET group_rate = EXCLUDED.group_rate, group_period = EXCLUDED.group_period,
              group_window = EXCLUDED.group_window, updated_at = now()

-- name: group_rate_clear
-- The group back to the topic's group_rate_limit; a row when there was an own rate. A
-- row that holds an own limit too keeps it.
WITH gone AS (
    DELETE FROM {brooq_group_limit}
    WHERE topic = %(topic)s AND group_key = %(group)s AND group_limit IS NULL
    RETURNING group_rate
), kept AS (
    UPDATE {brooq_group_limit}
    SET group_rate = NULL, group_period = NULL, group_window = NULL, updated_at = now()
    WHERE topic = %(topic)s AND group_key = %(group)s AND group_limit IS NOT NULL
      AND group_rate IS NOT NULL
    RETURNING group_rate
)
SELECT group_rate FROM gone UNION ALL SELECT group_rate FROM kept

-- name: group_limit_list
-- The groups' own limits and rates, by topic and group; all topics when `topic` is NULL.
SELECT topic, group_key AS "group", group_limit AS "limit", group_rate AS rate,
       group_period AS period, updated_at
FROM {brooq_group_limit}
WHERE %(topic)s::text IS NULL OR topic = %(topic)s::text
ORDER BY topic, group_key

-- name: schedule_add
-- A periodic schedule stored in the database (Queue.add_schedule, `brooq periodic add`);
-- no row when one of that name exists (the caller says so).
INSERT INTO {brooq_schedule} (name, cron, every_seconds, tz, topic, payload, queue,
                              priority, backfill, paused)
VALUES (%(name)s, %(cron)s, %(every)s, %(tz)s, %(topic)s, %(payload)s::jsonb, %(queue)s,
        %(priority)s, %(backfill)s, %(paused)s)
ON CONFLICT (name) DO NOTHING
RETURNING name

-- name: schedule_update
-- A stored schedule changed whole (the caller merged the fields given with the row);
-- no row when there is none of that name.
UPDATE {brooq_schedule}
SET cron = %(cron)s, every_seconds = %(every)s, tz = %(tz)s, topic = %(topic)s,
    payload = %(payload)s::jsonb, queue = %(queue)s, priority = %(priority)s,
    backfill = %(backfill)s, paused = %(paused)s, updated_at = now()
WHERE name = %(name)s
RETURNING name

-- name: schedule_remove
DELETE FROM {brooq_schedule} WHERE name = %(name)s RETURNING name

-- name: schedule_list
-- The stored schedules, by name, with the last tick claimed and its job (brooq_periodic):
-- what the masters' periodic duty reads at each pass, and what `brooq periodic` lists.
SELECT s.name, s.cron, s.every_seconds, s.tz, s.topic, s.payload, s.queue, s.priority,
       s.backfill, s.paused, s.created_at, s.updated_at, p.last_tick, p.last_job
FROM {brooq_schedule} s
LEFT JOIN {brooq_periodic} p ON p.name = s.name
WHERE %(name)s::text IS NULL OR s.name = %(name)s::text
ORDER BY s.name

-- name: key_blocked_list
-- The ordered keys whose next job cannot start (brooq keys, Queue.blocked_keys, the
-- page): a dead job blocks them (its row in brooq_key_block, the job dead in
-- job_history), or their job waits for a retry (failed). `waiting`: the key's jobs waiting
-- their turn. Oldest first; `topic` NULL: every topic.
SELECT * FROM (
    SELECT b.topic, b.ordering_key, 'dead' AS reason, b.job_id, h.queue,
           b.blocked_at AS since, NULL::timestamptz AS retry_at,
           (SELECT count(*) FROM {job} w
            WHERE w.topic = b.topic AND w.ordering_key = b.ordering_key
              AND w.ordering_key IS NOT NULL AND w.state = 'waiting'
              AND w.parked IS NULL) AS waiting
    FROM {brooq_key_block} b
    JOIN {job_history} h ON h.id = b.job_id AND h.state = 'dead'
    WHERE %(topic)s::text IS NULL OR b.topic = %(topic)s::text
    UNION ALL
    SELECT j.topic, j.ordering_key, 'retrying', j.id, j.queue, j.updated_at, j.available_at,
           (SELECT count(*) FROM {job} w
            WHERE w.topic = j.topic AND w.ordering_key = j.ordering_key
              AND w.ordering_key IS NOT NULL AND w.state = 'waiting'
              AND w.parked IS NULL)
    FROM {job} j
    WHERE j.ordering_key IS NOT NULL AND j.state = 'failed'
      AND (%(topic)s::text IS NULL OR j.topic = %(topic)s::text)
) AS blocked
ORDER BY since, topic, ordering_key
LIMIT %(limit)s

-- name: key_blocked_counts
-- The blocked ordered keys by queue (brooq queues): keys a dead job blocks, keys whose
-- job waits for a retry.
SELECT queue, count(*) FILTER (WHERE reason = 'dead') AS dead,
       count(*) FILTER (WHERE reason = 'retrying') AS retrying
FROM (
    SELECT h.queue, 'dead' AS reason
    FROM {brooq_key_block} b
    JOIN {job_history} h ON h.id = b.job_id AND h.state = 'dead'
    UNION ALL
    SELECT j.queue, 'retrying' FROM {job} j
    WHERE j.ordering_key IS NOT NULL AND j.state = 'failed'
) AS blocked
GROUP BY queue

-- name: key_unblock
-- The key's dead jobs no longer block it (Queue.unblock_key, brooq keys unblock); the
-- dead jobs stay dead. key_next then starts its next job.
DELETE FROM {brooq_key_block}
WHERE topic = %(topic)s AND ordering_key = %(key)s
RETURNING job_id

-- name: key_next
-- The first waiting job of each key made pending when nothing of its key is in the way
-- (brooq_order_next, migration 0026); `wait`: wait for a producer holding the key's lock
-- (an operator's call) or not (a master's duty: that key again next pass). The ids made
-- pending, NULL for a key left as it was.
SELECT k.topic, k.ordering_key, {brooq_order_next}(k.topic, k.ordering_key, %(wait)s) AS id
FROM unnest(%(topics)s::text[], %(keys)s::text[]) AS k(topic, ordering_key)

-- name: key_skip_dead
-- The blocks of the topics whose handler says ordering_skip_dead=True (a master's keys
-- duty): deleted, their keys handed on by key_next.
DELETE FROM {brooq_key_block} WHERE topic = ANY(%(topics)s::text[])
RETURNING topic, ordering_key

-- name: key_sweep
-- A master's keys duty: the next `batch` keys with jobs waiting their turn, in (topic,
-- key) order past the cursor, each given brooq_order_next without waiting. It hands on
-- a key whose hand-over a worker could not make (a producer held the key's lock as its
-- job ended), whose job was deleted outside a transition, whose dead job's partition was
-- dropped, or whose producer ran in REPEATABLE READ; the ids made pending come back.
WITH keys AS (
    -- job_ordering_idx: the jobs waiting their turn, by key.
    SELECT DISTINCT j.topic, j.ordering_key FROM {job} j
    WHERE j.ordering_key IS NOT NULL AND j.state = 'waiting' AND j.parked IS NULL
      AND (j.topic, j.ordering_key) > (%(after_topic)s::text, %(after_key)s::text)
    ORDER BY j.topic, j.ordering_key
    LIMIT %(batch)s
)
SELECT k.topic, k.ordering_key, {brooq_order_next}(k.topic, k.ordering_key, false) AS id
FROM keys k
ORDER BY k.topic, k.ordering_key
