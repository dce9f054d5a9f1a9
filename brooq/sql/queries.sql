-- Every statement brooq runs, named table_verb. Parameters are psycopg named
-- placeholders. Outcome writes are guarded by "still processing and still mine":
-- zero rows is a normal answer, never an error. Arrays are bound in binary (the "b"
-- placeholders): psycopg's text form escapes element by element, six times slower.

-- name: job_insert
-- One job. ON CONFLICT covers only keyed rows (the unique index is partial).
INSERT INTO {job} (id, topic, payload, idempotency_key, available_at, queue, priority)
VALUES (%(id)s, %(topic)s, %(payload)s::jsonb, %(key)s, coalesce(%(available_at)s, now()),
        %(queue)s, %(priority)s)
ON CONFLICT (topic, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id

-- name: job_insert_one
-- Queue.enqueue's one job: job_insert with libpq's $n placeholders, prepared once by
-- name on the connection brooq.enqueue_line keeps for it and sent straight through
-- libpq (id, available_at and priority in binary). Its parameter types are in
-- enqueue_line._TYPES.
INSERT INTO {job} (id, topic, payload, idempotency_key, available_at, queue, priority)
VALUES ($1, $2, $3::jsonb, $4, coalesce($5, now()), $6, $7)
ON CONFLICT (topic, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id

-- name: job_insert_many
-- Many jobs in one statement (one round trip, one NOTIFY). Ids are made by the client,
-- so the caller knows every id before the answer; rows skipped by a key conflict are
-- missing from RETURNING.
INSERT INTO {job} (id, topic, payload, idempotency_key, available_at, queue, priority)
SELECT i.id, i.topic, i.payload::jsonb, i.key, coalesce(i.available_at, now()), i.queue,
       i.priority
FROM unnest(%(ids)b::uuid[], %(topics)b::text[], %(payloads)b::text[], %(keys)b::text[],
            %(available_ats)b::timestamptz[], %(queues)b::text[], %(priorities)b::int2[])
     WITH ORDINALITY AS i(id, topic, payload, key, available_at, queue, priority, ord)
ORDER BY i.ord
ON CONFLICT (topic, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id

-- name: job_copy_ready
-- Many jobs without idempotency keys, ready now (available_at takes its default, the
-- server's now()): COPY, a quarter cheaper for the server than INSERT ... SELECT. No key
-- means no conflict to look for; COPY fires the statement's NOTIFY trigger like INSERT.
COPY {job} (id, topic, payload, queue, priority) FROM STDIN

-- name: job_copy_scheduled
-- The same for jobs given an available_at.
COPY {job} (id, topic, payload, available_at, queue, priority) FROM STDIN

-- name: job_get_id_by_key
SELECT id FROM {job} WHERE topic = %(topic)s AND idempotency_key = %(key)s

-- name: job_get_ids_by_keys
SELECT k.topic, k.key, job.id
FROM unnest(%(topics)b::text[], %(keys)b::text[]) AS k(topic, key)
JOIN {job} ON job.topic = k.topic AND job.idempotency_key = k.key

-- name: job_get
-- errors: [] when none (NULL until the first failed attempt, and on rows an older master
-- wrote).
SELECT id, topic, payload, state, attempts, available_at, locked_by, locked_until,
       last_error, idempotency_key, created_at, updated_at, queue, priority,
       result, coalesce(errors, '[]'::jsonb) AS errors
FROM {job} WHERE id = %(id)s

-- name: job_wait_register
-- queue.wait(): flag the job as waited for, so that the trigger job_waited_notify
-- (migration 0006) notifies brooq_outcome when it reaches done, dead or canceled. Run
-- after LISTEN, so the end of the job cannot fall between the two (an outcome committed
-- first is seen by the job_get that follows). A terminal, unknown or already flagged
-- row is not written; updated_at stays (the flag is no change of the job's fate).
UPDATE {job} SET waited = true
WHERE id = %(id)s AND state IN ('pending', 'processing', 'failed') AND waited IS NOT TRUE

-- name: listen_outcomes
LISTEN brooq_outcome

-- name: job_cancel
-- Operator or producer cancel. A processing row is canceled too: its holder learns it
-- at the next lease renewal, and its own outcome write then matches no row. from_states
-- is brooq.job.CANCELABLE_STATES (bound by brooq.queue.transition_params), the one
-- spelling of which states may be canceled.
UPDATE {job} SET state = 'canceled', updated_at = now()
WHERE id = %(id)s AND state = ANY(%(from_states)s::text[])
RETURNING id

-- name: job_retry
-- Operator retry of a finished job: back to pending now, attempts reset, last_error and
-- the error history kept, the waited flag cleared (its waiter has returned: the next end
-- would otherwise notify nobody's wait).
-- from_states is brooq.job.RETRYABLE_STATES (bound by brooq.queue.transition_params).
WITH retried AS (
    UPDATE {job} SET state = 'pending', attempts = 0, available_at = now(),
                   locked_by = NULL, locked_until = NULL, waited = NULL, updated_at = now()
    WHERE id = %(id)s AND state = ANY(%(from_states)s::text[])
    RETURNING id
)
-- The payload is the job table's schema: a master wakes its children only for its own
-- (brooq.ipc.channel).
SELECT retried.id, pg_notify('brooq_job', (SELECT n.nspname::text FROM pg_namespace n
                                  JOIN pg_class c ON c.relnamespace = n.oid
                                  WHERE c.oid = {job:name}::regclass)) FROM retried

-- name: job_count_matching
-- The bulk forms (brooq jobs cancel/retry --topic T --state S, Queue.cancel_many and
-- retry_many): how many jobs of a topic (and queue) are in a state, and the instant of
-- that count. The batches below touch only rows not written since (updated_at <= as_of):
-- a job that changed meanwhile is left alone, and rows arriving while a bulk change runs
-- cannot keep it going forever.
SELECT count(*) AS matched, now() AS as_of
FROM {job}
WHERE topic = %(topic)s AND state = %(state)s
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)

-- name: job_cancel_batch
-- One batch of a bulk cancel, its own transaction: at most `batch` rows are locked, and
-- only until its commit, so canceling a million jobs never holds a million row locks (nor
-- blocks claims and outcome writes for the whole run). Rows locked by someone else are
-- skipped: they are changing meanwhile (a claim, an outcome). Keyset on id (`after`: the
-- last id of the previous batch, the nil UUID first, which brooq.ids never makes) walks
-- the table once instead of rescanning the rows already passed (there is no index on
-- topic: each batch walks the primary key from `after` until it has `batch` rows). The
-- UPDATE takes the ids as an array, one primary-key lookup each: joined to picked, it was
-- planned as a hash join over every row in the state (0.83 s a batch instead of 0.35 s,
-- 200,000 dead jobs in a 1,000,000-job table). Guarded as job_cancel is: from_states is
-- brooq.job.BULK_FROM_STATES['cancel'], re-checked under the row lock.
WITH picked AS MATERIALIZED (
    SELECT id FROM {job}
    WHERE id > %(after)s::uuid AND topic = %(topic)s AND state = %(state)s
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND updated_at <= %(as_of)s
    ORDER BY id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), canceled AS (
    UPDATE {job} SET state = 'canceled', updated_at = now()
    WHERE id = ANY(ARRAY(SELECT id FROM picked)) AND state = %(state)s
      AND state = ANY(%(from_states)s::text[])
    RETURNING id
)
SELECT (SELECT count(*) FROM picked) AS picked,
       (SELECT id FROM picked ORDER BY id DESC LIMIT 1) AS last_id,
       (SELECT count(*) FROM canceled) AS changed

-- name: job_retry_batch
-- One batch of a bulk retry: batched, locked, keyed and guarded as job_cancel_batch, and
-- each row written as job_retry writes one (pending now, attempts reset, last_error and
-- the error history kept, the waited flag cleared); from_states is
-- brooq.job.BULK_FROM_STATES['retry']. One pg_notify per batch that retried anything wakes
-- the masters, as job_retry's does for one job (NOTIFY must never run per row).
WITH picked AS MATERIALIZED (
    SELECT id FROM {job}
    WHERE id > %(after)s::uuid AND topic = %(topic)s AND state = %(state)s
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND updated_at <= %(as_of)s
    ORDER BY id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), retried AS (
    UPDATE {job} SET state = 'pending', attempts = 0, available_at = now(),
                   locked_by = NULL, locked_until = NULL, waited = NULL, updated_at = now()
    WHERE id = ANY(ARRAY(SELECT id FROM picked)) AND state = %(state)s
      AND state = ANY(%(from_states)s::text[])
    RETURNING id
)
SELECT (SELECT count(*) FROM picked) AS picked,
       (SELECT id FROM picked ORDER BY id DESC LIMIT 1) AS last_id,
       (SELECT count(*) FROM retried) AS changed,
       (SELECT pg_notify('brooq_job', (SELECT n.nspname::text FROM pg_namespace n
                                        JOIN pg_class c ON c.relnamespace = n.oid
                                        WHERE c.oid = {job:name}::regclass))
        FROM retried LIMIT 1) AS woke

-- name: job_finish_and_claim
-- The hot path, one round trip: write `done` for the jobs this worker finished and claim
-- up to `limit` ready jobs of the given topics in one queue, higher priority first, then
-- FIFO by (available_at, id), and no more than a fair share among `children` workers.
-- Used when the master works one queue (every deployment that names no queues);
-- job_finish_and_claim_queues is the same for several queues in a chosen order.
-- The limit may be 0 (only write) and the done list empty (only claim). Finished rows
-- come back with claimed = false, claimed rows with claimed = true (the caller sorts
-- them). The `done` part is job_set_done's guarded UPDATE. The claim locks exactly
-- the rows it returns through a materialized CTE with LIMIT, run once (an "id IN
-- (subquery)" form may lock more: PostgreSQL bug #15715), and charges the attempt
-- (the attempt is charged at claim: attempts counts the times a job was claimed).
-- Paused queues are left out by the child (queue_paused_names, read at most
-- poll_interval apart), not checked here: a probe of brooq_queue in every claim cost
-- 2 percent of the statement, for a table that changes a few times a year.
WITH finished AS (
    UPDATE {job} SET state = 'done', updated_at = now()
    WHERE id = ANY(%(done)b::uuid[]) AND state = 'processing' AND locked_by = %(worker)s
    RETURNING id
),
next AS MATERIALIZED (
    SELECT id
    FROM {job}
    WHERE queue = %(queue)s
      AND state IN ('pending', 'failed')
      AND available_at <= now()
      AND topic = ANY(%(topics)b::text[])
    ORDER BY priority DESC, available_at, id
    -- At most a fair share of what is ready, so that at the end of a burst one child
    -- does not take the last jobs as a batch while its siblings find none. The count
    -- stops at what could matter (limit x children rows) and locks nothing.
    LIMIT least(%(limit)s, (
        SELECT (count(*) + %(children)s - 1) / %(children)s
        FROM (
            SELECT 1 FROM {job}
            WHERE queue = %(queue)s
              AND state IN ('pending', 'failed')
              AND available_at <= now()
              AND topic = ANY(%(topics)b::text[])
            ORDER BY priority DESC, available_at, id  -- the ready index, only as far as needed
            LIMIT %(limit)s * %(children)s
        ) AS ready
    ))
    FOR NO KEY UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE {job}
    SET state = 'processing',
        attempts = job.attempts + 1,
        locked_by = %(worker)s,
        locked_until = now() + make_interval(secs => %(lease)s),
        updated_at = now()
    -- By primary key whatever the planner guesses of the LIMIT above (a join here
    -- may become a hash join over the whole table in a generic plan).
    WHERE job.id = ANY(ARRAY(SELECT id FROM next))
    RETURNING job.id, job.topic, job.payload, job.attempts, job.locked_by, job.locked_until,
              job.available_at, job.queue, job.priority
)
SELECT true AS claimed, id, topic, payload, attempts, locked_by, locked_until, available_at,
       queue, priority
FROM claimed
UNION ALL
SELECT false, id, NULL::text, NULL::jsonb, NULL::integer, NULL::text, NULL::timestamptz,
       NULL::timestamptz, NULL::text, NULL::smallint
FROM finished

-- name: job_finish_and_claim_queues
-- job_finish_and_claim over several queues, tried in the order of the `queues` array
-- (the child's weighted round robin puts a different queue first from round to round):
-- a queue with fewer ready rows than the limit spills into the next. A subquery with FOR
-- UPDATE is never flattened and its lateral reference makes a nested loop over the
-- array, whose rows come in array order; inside, LockRows sits under the inner LIMIT
-- (skipped rows do not count) and the outer LIMIT pulls row by row, so the rows locked
-- are the rows returned. The inner LIMIT is required: without it the generic plan
-- sorted every ready row (docs/decisions.md).
WITH finished AS (
    UPDATE {job} SET state = 'done', updated_at = now()
    WHERE id = ANY(%(done)b::uuid[]) AND state = 'processing' AND locked_by = %(worker)s
    RETURNING id
),
next AS MATERIALIZED (
    SELECT j.id
    FROM unnest(%(queues)b::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT job.id
        FROM {job}
        WHERE job.queue = q.name
          AND job.state IN ('pending', 'failed')
          AND job.available_at <= now()
          AND job.topic = ANY(%(topics)b::text[])
        ORDER BY job.priority DESC, job.available_at, job.id
        LIMIT %(limit)s
        FOR NO KEY UPDATE OF job SKIP LOCKED
    ) AS j
    LIMIT least(%(limit)s, (
        SELECT (count(*) + %(children)s - 1) / %(children)s
        FROM (
            SELECT FROM unnest(%(queues)b::text[]) AS q(name)
            CROSS JOIN LATERAL (
                SELECT FROM {job}
                WHERE job.queue = q.name
                  AND job.state IN ('pending', 'failed')
                  AND job.available_at <= now()
                  AND job.topic = ANY(%(topics)b::text[])
                ORDER BY job.priority DESC, job.available_at, job.id
                LIMIT %(limit)s * %(children)s
            ) AS r
            LIMIT %(limit)s * %(children)s
        ) AS ready
    ))
),
claimed AS (
    UPDATE {job}
    SET state = 'processing',
        attempts = job.attempts + 1,
        locked_by = %(worker)s,
        locked_until = now() + make_interval(secs => %(lease)s),
        updated_at = now()
    WHERE job.id = ANY(ARRAY(SELECT id FROM next))
    RETURNING job.id, job.topic, job.payload, job.attempts, job.locked_by, job.locked_until,
              job.available_at, job.queue, job.priority
)
SELECT true AS claimed, id, topic, payload, attempts, locked_by, locked_until, available_at,
       queue, priority
FROM claimed
UNION ALL
SELECT false, id, NULL::text, NULL::jsonb, NULL::integer, NULL::text, NULL::timestamptz,
       NULL::timestamptz, NULL::text, NULL::smallint
FROM finished

-- name: job_finish_and_claim_limited
-- job_finish_and_claim_queues for a master with a topic under global_limit: first at most
-- one job of that topic (`limited`, its cap `cap`), through brooq_claim_limited
-- (migration 0004), which holds the fleet to the cap; then the other topics (`topics`
-- never holds a limited one) for what is left of `limit`. One limited topic per
-- statement, so one advisory lock per transaction: no lock order to get wrong. Only a
-- master with a limited topic runs this; the others pay nothing for the feature.
WITH finished AS (
    UPDATE {job} SET state = 'done', updated_at = now()
    WHERE id = ANY(%(done)b::uuid[]) AND state = 'processing' AND locked_by = %(worker)s
    RETURNING id
),
limited AS MATERIALIZED (
    SELECT c.id, c.topic, c.payload, c.attempts, c.locked_by, c.locked_until,
           c.available_at, c.queue, c.priority
    FROM {brooq_claim_limited}(%(limited)s, %(cap)s, %(queues)b::text[], %(done)b::uuid[],
                             %(worker)s, %(lease)s, least(%(limit)s, 1)) AS c
),
next AS MATERIALIZED (
    SELECT j.id
    FROM unnest(%(queues)b::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT job.id
        FROM {job}
        WHERE job.queue = q.name
          AND job.state IN ('pending', 'failed')
          AND job.available_at <= now()
          AND job.topic = ANY(%(topics)b::text[])
        ORDER BY job.priority DESC, job.available_at, job.id
        LIMIT %(limit)s
        FOR NO KEY UPDATE OF job SKIP LOCKED
    ) AS j
    LIMIT least(%(limit)s - (SELECT count(*) FROM limited), (
        SELECT (count(*) + %(children)s - 1) / %(children)s
        FROM (
            SELECT FROM unnest(%(queues)b::text[]) AS q(name)
            CROSS JOIN LATERAL (
                SELECT FROM {job}
                WHERE job.queue = q.name
                  AND job.state IN ('pending', 'failed')
                  AND job.available_at <= now()
                  AND job.topic = ANY(%(topics)b::text[])
                ORDER BY job.priority DESC, job.available_at, job.id
                LIMIT %(limit)s * %(children)s
            ) AS r
            LIMIT %(limit)s * %(children)s
        ) AS ready
    ))
),
claimed AS (
    UPDATE {job}
    SET state = 'processing',
        attempts = job.attempts + 1,
        locked_by = %(worker)s,
        locked_until = now() + make_interval(secs => %(lease)s),
        updated_at = now()
    WHERE job.id = ANY(ARRAY(SELECT id FROM next))
    RETURNING job.id, job.topic, job.payload, job.attempts, job.locked_by, job.locked_until,
              job.available_at, job.queue, job.priority
)
SELECT true AS claimed, id, topic, payload, attempts, locked_by, locked_until, available_at,
       queue, priority
FROM limited
UNION ALL
SELECT true, id, topic, payload, attempts, locked_by, locked_until, available_at, queue,
       priority
FROM claimed
UNION ALL
SELECT false, id, NULL::text, NULL::jsonb, NULL::integer, NULL::text, NULL::timestamptz,
       NULL::timestamptz, NULL::text, NULL::smallint
FROM finished

-- name: job_finish_and_claim_results
-- job_finish_and_claim for a round trip that stores what handlers returned: `results` holds, for
-- each id of `done`, its result as JSON text or NULL. Only the `finished` CTE differs
-- (a unit test holds them together): the statements of round trips without a result
-- stay as they are (the array lookup cost 1 us per job, docs/decisions.md).
WITH finished AS (
    UPDATE {job} SET state = 'done', updated_at = now(),
        result = (%(results)b::text[])[array_position(%(done)b::uuid[], id)]::jsonb
    WHERE id = ANY(%(done)b::uuid[]) AND state = 'processing' AND locked_by = %(worker)s
    RETURNING id
),
next AS MATERIALIZED (
    SELECT id
    FROM {job}
    WHERE queue = %(queue)s
      AND state IN ('pending', 'failed')
      AND available_at <= now()
      AND topic = ANY(%(topics)b::text[])
    ORDER BY priority DESC, available_at, id
    -- At most a fair share of what is ready, so that at the end of a burst one child
    -- does not take the last jobs as a batch while its siblings find none. The count
    -- stops at what could matter (limit x children rows) and locks nothing.
    LIMIT least(%(limit)s, (
        SELECT (count(*) + %(children)s - 1) / %(children)s
        FROM (
            SELECT 1 FROM {job}
            WHERE queue = %(queue)s
              AND state IN ('pending', 'failed')
              AND available_at <= now()
              AND topic = ANY(%(topics)b::text[])
            ORDER BY priority DESC, available_at, id  -- the ready index, only as far as needed
            LIMIT %(limit)s * %(children)s
        ) AS ready
    ))
    FOR NO KEY UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE {job}
    SET state = 'processing',
        attempts = job.attempts + 1,
        locked_by = %(worker)s,
        locked_until = now() + make_interval(secs => %(lease)s),
        updated_at = now()
    -- By primary key whatever the planner guesses of the LIMIT above (a join here
    -- may become a hash join over the whole table in a generic plan).
    WHERE job.id = ANY(ARRAY(SELECT id FROM next))
    RETURNING job.id, job.topic, job.payload, job.attempts, job.locked_by, job.locked_until,
              job.available_at, job.queue, job.priority
)
SELECT true AS claimed, id, topic, payload, attempts, locked_by, locked_until, available_at,
       queue, priority
FROM claimed
UNION ALL
SELECT false, id, NULL::text, NULL::jsonb, NULL::integer, NULL::text, NULL::timestamptz,
       NULL::timestamptz, NULL::text, NULL::smallint
FROM finished

-- name: job_finish_and_claim_queues_results
-- job_finish_and_claim_queues for a round trip that stores what handlers returned: `results` holds, for
-- each id of `done`, its result as JSON text or NULL. Only the `finished` CTE differs
-- (a unit test holds them together): the statements of round trips without a result
-- stay as they are (the array lookup cost 1 us per job, docs/decisions.md).
WITH finished AS (
    UPDATE {job} SET state = 'done', updated_at = now(),
        result = (%(results)b::text[])[array_position(%(done)b::uuid[], id)]::jsonb
    WHERE id = ANY(%(done)b::uuid[]) AND state = 'processing' AND locked_by = %(worker)s
    RETURNING id
),
next AS MATERIALIZED (
    SELECT j.id
    FROM unnest(%(queues)b::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT job.id
        FROM {job}
        WHERE job.queue = q.name
          AND job.state IN ('pending', 'failed')
          AND job.available_at <= now()
          AND job.topic = ANY(%(topics)b::text[])
        ORDER BY job.priority DESC, job.available_at, job.id
        LIMIT %(limit)s
        FOR NO KEY UPDATE OF job SKIP LOCKED
    ) AS j
    LIMIT least(%(limit)s, (
        SELECT (count(*) + %(children)s - 1) / %(children)s
        FROM (
            SELECT FROM unnest(%(queues)b::text[]) AS q(name)
            CROSS JOIN LATERAL (
                SELECT FROM {job}
                WHERE job.queue = q.name
                  AND job.state IN ('pending', 'failed')
                  AND job.available_at <= now()
                  AND job.topic = ANY(%(topics)b::text[])
                ORDER BY job.priority DESC, job.available_at, job.id
                LIMIT %(limit)s * %(children)s
            ) AS r
            LIMIT %(limit)s * %(children)s
        ) AS ready
    ))
),
claimed AS (
    UPDATE {job}
    SET state = 'processing',
        attempts = job.attempts + 1,
        locked_by = %(worker)s,
        locked_until = now() + make_interval(secs => %(lease)s),
        updated_at = now()
    WHERE job.id = ANY(ARRAY(SELECT id FROM next))
    RETURNING job.id, job.topic, job.payload, job.attempts, job.locked_by, job.locked_until,
              job.available_at, job.queue, job.priority
)
SELECT true AS claimed, id, topic, payload, attempts, locked_by, locked_until, available_at,
       queue, priority
FROM claimed
UNION ALL
SELECT false, id, NULL::text, NULL::jsonb, NULL::integer, NULL::text, NULL::timestamptz,
       NULL::timestamptz, NULL::text, NULL::smallint
FROM finished

-- name: job_finish_and_claim_limited_results
-- job_finish_and_claim_limited for a round trip that stores what handlers returned: `results` holds, for
-- each id of `done`, its result as JSON text or NULL. Only the `finished` CTE differs
-- (a unit test holds them together): the statements of round trips without a result
-- stay as they are (the array lookup cost 1 us per job, docs/decisions.md).
WITH finished AS (
    UPDATE {job} SET state = 'done', updated_at = now(),
        result = (%(results)b::text[])[array_position(%(done)b::uuid[], id)]::jsonb
    WHERE id = ANY(%(done)b::uuid[]) AND state = 'processing' AND locked_by = %(worker)s
    RETURNING id
),
limited AS MATERIALIZED (
    SELECT c.id, c.topic, c.payload, c.attempts, c.locked_by, c.locked_until,
           c.available_at, c.queue, c.priority
    FROM {brooq_claim_limited}(%(limited)s, %(cap)s, %(queues)b::text[], %(done)b::uuid[],
                             %(worker)s, %(lease)s, least(%(limit)s, 1)) AS c
),
next AS MATERIALIZED (
    SELECT j.id
    FROM unnest(%(queues)b::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT job.id
        FROM {job}
        WHERE job.queue = q.name
          AND job.state IN ('pending', 'failed')
          AND job.available_at <= now()
          AND job.topic = ANY(%(topics)b::text[])
        ORDER BY job.priority DESC, job.available_at, job.id
        LIMIT %(limit)s
        FOR NO KEY UPDATE OF job SKIP LOCKED
    ) AS j
    LIMIT least(%(limit)s - (SELECT count(*) FROM limited), (
        SELECT (count(*) + %(children)s - 1) / %(children)s
        FROM (
            SELECT FROM unnest(%(queues)b::text[]) AS q(name)
            CROSS JOIN LATERAL (
                SELECT FROM {job}
                WHERE job.queue = q.name
                  AND job.state IN ('pending', 'failed')
                  AND job.available_at <= now()
                  AND job.topic = ANY(%(topics)b::text[])
                ORDER BY job.priority DESC, job.available_at, job.id
                LIMIT %(limit)s * %(children)s
            ) AS r
            LIMIT %(limit)s * %(children)s
        ) AS ready
    ))
),
claimed AS (
    UPDATE {job}
    SET state = 'processing',
        attempts = job.attempts + 1,
        locked_by = %(worker)s,
        locked_until = now() + make_interval(secs => %(lease)s),
        updated_at = now()
    WHERE job.id = ANY(ARRAY(SELECT id FROM next))
    RETURNING job.id, job.topic, job.payload, job.attempts, job.locked_by, job.locked_until,
              job.available_at, job.queue, job.priority
)
SELECT true AS claimed, id, topic, payload, attempts, locked_by, locked_until, available_at,
       queue, priority
FROM limited
UNION ALL
SELECT true, id, topic, payload, attempts, locked_by, locked_until, available_at, queue,
       priority
FROM claimed
UNION ALL
SELECT false, id, NULL::text, NULL::jsonb, NULL::integer, NULL::text, NULL::timestamptz,
       NULL::timestamptz, NULL::text, NULL::smallint
FROM finished

-- name: queue_paused_names
-- Which of the given queues are paused: a child reads it at most poll_interval apart
-- and leaves those out of its claims, so a pause holds fleet-wide within poll_interval.
SELECT name FROM {brooq_queue} WHERE paused AND name = ANY(%(queues)s::text[])

-- name: job_release_ids
-- A worker gives back jobs it claimed but will not run (drain, a long job in a batch;
-- the master does it for a child whose job runs long): pending, the attempt refunded.
-- available_at stays (it is in the past), so the jobs are claimable at once and keep
-- their place in the FIFO order.
UPDATE {job}
SET state = 'pending', attempts = greatest(attempts - 1, 0),
    locked_by = NULL, locked_until = NULL, updated_at = now()
WHERE id = ANY(%(ids)b::uuid[]) AND state = 'processing' AND locked_by = %(worker)s
RETURNING id

-- name: job_release_suspects
-- An async child died with several jobs in flight and nobody to blame (a crash, a loop
-- blocked by C code): each goes back with the attempt refunded and counts a lease expiry,
-- the reaper's bound for a job that takes its worker down (the one that reaches
-- %(max_expiries)s makes it dead, with the reason, as job_reap_expired words it).
UPDATE {job}
SET state = CASE WHEN lease_expiries + 1 >= %(max_expiries)s THEN 'dead' ELSE 'pending' END,
    attempts = CASE
        WHEN lease_expiries + 1 >= %(max_expiries)s THEN attempts
        ELSE greatest(attempts - 1, 0)
    END,
    lease_expiries = lease_expiries + 1,
    last_error = CASE
        WHEN lease_expiries + 1 >= %(max_expiries)s
        THEN 'its worker died with it in flight ' || (lease_expiries + 1)::text
             || ' times: ' || %(cause)s
        ELSE last_error
    END,
    errors = jsonb_path_query_array(
        coalesce(errors, '[]'::jsonb)
            || jsonb_build_object(
                'attempt', attempts, 'at', now(),
                'error', 'in flight when its worker died (' || (lease_expiries + 1)::text
                    || ' of ' || %(max_expiries)s::text || '): ' || %(cause)s,
                'worker', locked_by),
        '$[last - 19 to last]'),
    locked_by = NULL, locked_until = NULL, updated_at = now()
WHERE id = ANY(%(ids)s::uuid[]) AND state = 'processing' AND locked_by = %(worker)s
RETURNING id, topic, state

-- name: job_get_held
-- The job a dead worker was running, if it still holds it.
SELECT id, topic, attempts FROM {job}
WHERE id = %(id)s AND state = 'processing' AND locked_by = %(worker)s

-- name: job_set_done
-- `done` with chained jobs or on_success hooks, in their transaction; `result` is what
-- the handler returned as JSON text, or NULL.
UPDATE {job} SET state = 'done', result = %(result)s::jsonb, updated_at = now()
WHERE id = %(id)s AND state = 'processing' AND locked_by = %(worker)s

-- name: session_planner_defaults
-- The children's connections run without bitmap scans and with generic plans
-- (brooq/worker/connection.py says why); the application's on_success writes, in the
-- same transaction, get the planner's defaults back.
SELECT set_config('enable_bitmapscan', 'on', true), set_config('plan_cache_mode', 'auto', true)

-- name: job_set_failed
-- A failed attempt: dead when the attempts are used up, else failed until the backoff
-- has passed. The refund flag gives the attempt back (PreserveAttempt), which never leads to dead.
-- The error history gets one entry in the same UPDATE: appended, then the last 20 kept
-- (a lax jsonpath range is clamped, so a shorter history stays whole), oldest first. In
-- SET, job.attempts is the value before this UPDATE: this attempt's number, charged at
-- claim (a refunded attempt's number comes again). history_error is the error bounded
-- to 1,000 characters (last_error keeps 2,000).
UPDATE {job}
SET state = CASE
        WHEN NOT %(refund)s AND attempts >= %(max_attempts)s THEN 'dead'
        ELSE 'failed'
    END,
    attempts = CASE WHEN %(refund)s THEN greatest(attempts - 1, 0) ELSE attempts END,
    available_at = now() + make_interval(secs => %(delay)s),
    last_error = %(error)s,
    errors = jsonb_path_query_array(
        coalesce(job.errors, '[]'::jsonb)
            || jsonb_build_object('attempt', job.attempts, 'at', now(),
                                  'error', %(history_error)s::text,
                                  'worker', %(worker)s::text),
        '$[last - 19 to last]'),
    updated_at = now()
WHERE id = %(id)s AND state = 'processing' AND locked_by = %(worker)s
RETURNING state

-- name: job_set_canceled
UPDATE {job} SET state = 'canceled', last_error = %(error)s, updated_at = now()
WHERE id = %(id)s AND state = 'processing' AND locked_by = %(worker)s

-- name: job_release
-- Give jobs back without spending the attempt (drain budget exceeded, immediate stop, a
-- stalled child killed): pending and claimable at once, in their old place in the FIFO
-- order. A row locked by someone else is skipped, never waited for: the master's loop
-- runs this, and the lock may belong to the killed child's own backend, itself hung in
-- the middle of a statement. Such a row keeps its lease, which nobody renews any more:
-- the reaper returns it when the lease expires.
WITH held AS (
    SELECT id FROM {job}
    WHERE state = 'processing' AND locked_by = ANY(%(workers)b::text[])
    FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE {job}
SET state = 'pending', attempts = greatest(job.attempts - 1, 0),
    locked_by = NULL, locked_until = NULL, updated_at = now()
FROM held
WHERE job.id = held.id AND job.state = 'processing'
  AND job.locked_by = ANY(%(workers)b::text[])
RETURNING job.id, job.topic

-- name: job_renew_leases
-- One statement renews every in-flight job of this master, each guarded by its own
-- holder. A job missing from the result has been canceled, reaped or taken over.
-- A row locked by another transaction is never waited for: most often it is the
-- child's own outcome transaction (an on_success hook may run for long), and waiting
-- would freeze the master's loop and every row this statement had locked already.
-- Such a row still counts as held when this statement's snapshot says so; it is
-- renewed, or found lost, on the next pass.
WITH held AS (
    SELECT job.id
    FROM {job}
    JOIN unnest(%(ids)b::uuid[], %(workers)b::text[]) AS h(id, worker)
      ON job.id = h.id AND job.locked_by = h.worker
    WHERE job.state = 'processing'
), lockable AS (
    SELECT job.id
    FROM {job}
    JOIN unnest(%(ids)b::uuid[], %(workers)b::text[]) AS h(id, worker)
      ON job.id = h.id AND job.locked_by = h.worker
    WHERE job.state = 'processing'
    FOR NO KEY UPDATE OF job SKIP LOCKED
), renewed AS (
    UPDATE {job}
    SET locked_until = now() + make_interval(secs => %(lease)s)
    FROM lockable
    WHERE job.id = lockable.id
    RETURNING job.id
)
SELECT id FROM renewed
UNION
SELECT id FROM held WHERE id NOT IN (SELECT id FROM lockable)

-- name: job_reap_expired
-- Expired leases go back to pending with the attempt charged at claim refunded: an expired
-- lease is a crash, not a recorded failure, and never brings a job closer to dead through
-- max_attempts. What bounds a job that takes its whole host down each time is its count
-- of expiries: the one that reaches %(max_expiries)s makes it dead, with the reason.
-- The state check is made again on the locked row, so an outcome committed meanwhile
-- survives, and several masters may run this at once. A locked row is skipped, not
-- waited for: someone (its holder's outcome transaction, often) is writing it; if it is
-- still expired afterwards, the next pass takes it.
WITH expired AS (
    SELECT id
    FROM {job}
    WHERE state = 'processing' AND locked_until < now()
    FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE {job}
SET state = CASE WHEN job.lease_expiries + 1 >= %(max_expiries)s THEN 'dead' ELSE 'pending' END,
    attempts = CASE
        WHEN job.lease_expiries + 1 >= %(max_expiries)s THEN job.attempts
        ELSE greatest(job.attempts - 1, 0)
    END,
    lease_expiries = job.lease_expiries + 1,
    last_error = CASE
        WHEN job.lease_expiries + 1 >= %(max_expiries)s
        THEN 'lease expired ' || (job.lease_expiries + 1)::text
             || ' times: the workers running it vanished (host lost or frozen?)'
        ELSE job.last_error
    END,
    -- Each expiry appends to the error history (job_set_failed's expression; here, after
    -- the UPDATE keyword, so that pg_stat_activity's first 1 kB still shows it): attempt
    -- is the attempt charged at claim, worker the holder whose lease ran out (in SET,
    -- job.locked_by is still the old value). The attempt is refunded, so the next claim
    -- charges the same number again: the history then shows that attempt number twice.
    errors = jsonb_path_query_array(
        coalesce(job.errors, '[]'::jsonb)
            || jsonb_build_object(
                'attempt', job.attempts, 'at', now(),
                'error', 'lease expired (' || (job.lease_expiries + 1)::text || ' of '
                    || %(max_expiries)s::text || '): '
                    || CASE WHEN job.lease_expiries + 1 >= %(max_expiries)s
                            THEN 'dead, the workers running it vanished (host lost or frozen?)'
                            ELSE 'back to pending, the attempt refunded'
                       END,
                'worker', job.locked_by),
        '$[last - 19 to last]'),
    locked_by = NULL, locked_until = NULL,
    available_at = now(), updated_at = now()
FROM expired
WHERE job.id = expired.id AND job.state = 'processing' AND job.locked_until < now()
RETURNING job.id, job.topic, job.state, job.lease_expiries

-- name: job_delete_expired
-- Retention: one batch of terminal rows older than the TTL, oldest first. SKIP LOCKED
-- lets several masters delete different rows instead of waiting for each other.
DELETE FROM {job}
WHERE id IN (
    SELECT id FROM {job}
    WHERE state IN ('done', 'dead', 'canceled')
      AND updated_at < now() - make_interval(secs => %(ttl)s)
    ORDER BY updated_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
RETURNING topic

-- name: job_stats_by_topic
-- Per queue and topic, in one snapshot: the active states and dead (done grows without
-- bound and is never counted). ready = claimable now (a paused queue's ready jobs are
-- still counted: they wait). busy = processing under a lease that has not expired, i.e.
-- a child working on it; an expired lease waits for the reaper.
-- The WHERE is an OR of three arms, each the predicate of a partial index (as in
-- web_overview_exact): the planner reads the active and dead rows only, through a
-- BitmapOr, never the done and canceled history; as one IN list it matched no index and
-- scanned the whole table every stats period (1,000,000 jobs, 94 % done: 137 ms a run
-- before, 44 ms after; docs/status-page.md). Its cost still follows the backlog.
SELECT queue, topic,
       count(*) FILTER (WHERE state = 'pending') AS pending,
       count(*) FILTER (WHERE state IN ('pending', 'failed') AND available_at <= now()) AS ready,
       count(*) FILTER (WHERE state = 'processing') AS processing,
       count(*) FILTER (WHERE state = 'processing' AND locked_until > now()) AS busy,
       count(*) FILTER (WHERE state = 'failed') AS failed,
       count(*) FILTER (WHERE state = 'dead') AS dead,
       coalesce(extract(epoch FROM now() - min(available_at) FILTER (
           WHERE state IN ('pending', 'failed') AND available_at <= now())), 0)::float8
           AS oldest_ready_age
FROM {job}
WHERE state IN ('pending', 'failed') OR state = 'processing' OR state = 'dead'
GROUP BY queue, topic
ORDER BY queue, topic

-- name: job_table_health
-- The job table's upkeep, for the master's gauges: dead tuples (the statistics
-- collector's estimate: what vacuum has yet to reclaim; a queue's claims and outcomes
-- leave two per job) and the age of its oldest unfrozen transaction ID (autovacuum must
-- freeze before autovacuum_freeze_max_age, 200 million by default; wraparound stops
-- writes at about 2 billion). Catalog reads only, whatever the table's size.
SELECT coalesce(s.n_dead_tup, 0)::float8 AS dead_tuples,
       age(c.relfrozenxid)::float8 AS xid_age
FROM pg_class AS c
LEFT JOIN pg_stat_all_tables AS s ON s.relid = c.oid
WHERE c.oid = {job:name}::regclass

-- name: job_vacuum
-- The master's own VACUUM (brooq/supervisor/vacuum.py), past QUEUE_VACUUM_DEAD_TUPLES:
-- it removes the entries claimed jobs left at the front of the ready index, which every
-- claim walks until a vacuum. SKIP_LOCKED: autovacuum or another master at it already ->
-- returns at once. INDEX_CLEANUP ON: AUTO would skip the indexes when few pages hold dead
-- tuples. Sent without waiting; outside a transaction (VACUUM must be).
VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) {job}

-- name: job_queue_stats
-- Per queue, in one snapshot: every queue holding active or dead jobs, and every queue
-- with a brooq_queue row (paused or resumed by an operator, perhaps before any job came),
-- by name. A queue without a row is running (paused = false). ready = claimable now,
-- scheduled = pending or failed and due later; failed (waiting for a retry) is counted in
-- ready or scheduled as well. Like job_stats_by_topic (and with its OR of partial-index
-- predicates), only the active states and dead are read, never done or canceled rows.
WITH counts AS (
    SELECT queue,
           count(*) FILTER (WHERE state IN ('pending', 'failed') AND available_at <= now())
               AS ready,
           count(*) FILTER (WHERE state IN ('pending', 'failed') AND available_at > now())
               AS scheduled,
           count(*) FILTER (WHERE state = 'processing') AS processing,
           count(*) FILTER (WHERE state = 'failed') AS failed,
           count(*) FILTER (WHERE state = 'dead') AS dead,
           coalesce(extract(epoch FROM now() - min(available_at) FILTER (
               WHERE state IN ('pending', 'failed') AND available_at <= now())), 0)::float8
               AS oldest_ready_seconds
    FROM {job}
    WHERE state IN ('pending', 'failed') OR state = 'processing' OR state = 'dead'
    GROUP BY queue
)
SELECT coalesce(c.queue, q.name) AS name,
       coalesce(q.paused, false) AS paused,
       coalesce(c.ready, 0) AS ready,
       coalesce(c.scheduled, 0) AS scheduled,
       coalesce(c.processing, 0) AS processing,
       coalesce(c.failed, 0) AS failed,
       coalesce(c.dead, 0) AS dead,
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
SELECT id, topic, payload, state, attempts, available_at, locked_by, locked_until,
       last_error, idempotency_key, created_at, updated_at, queue, priority,
       result, coalesce(errors, '[]'::jsonb) AS errors
FROM {job}
WHERE (%(topic)s::text IS NULL OR topic = %(topic)s::text)
  AND (%(state)s::text IS NULL OR state = %(state)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: job_list_processing
-- Jobs in flight, longest running first. running_for counts from the claim (lease renewal
-- leaves updated_at alone); a negative lease_left is an expired lease the reaper will
-- give back.
SELECT id, topic, attempts, locked_by, locked_until,
       extract(epoch FROM now() - updated_at)::float8 AS running_for,
       extract(epoch FROM locked_until - now())::float8 AS lease_left
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
SELECT queue, topic, count(*) AS jobs
FROM {job}
WHERE state IN ('done', 'dead', 'canceled', 'failed')
  AND updated_at >= now() - make_interval(secs => %(seconds)s)
GROUP BY queue, topic

-- name: schema_check
-- Before the master forks: is the job table that the search_path finds brooq's, and is
-- the migrations' bookkeeping there? One row, whatever exists; the table names resolve
-- exactly as brooq's statements will resolve them (search_path, DSN options included).
SELECT n.nspname AS job_schema,
       coalesce(ARRAY(SELECT a.attname::text FROM pg_attribute a
                      WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
                '{}') AS job_columns,
       to_regclass({brooq_migration:name}) IS NOT NULL AS has_versions,
       current_setting('search_path') AS search_path
FROM (SELECT to_regclass({job:name}) AS oid) AS j
LEFT JOIN pg_class c ON c.oid = j.oid
LEFT JOIN pg_namespace n ON n.oid = c.relnamespace

-- name: migration_versions
-- The versions applied by `brooq migrate up` (run only once schema_check or
-- migration_table_exists found the table).
SELECT version, applied_at FROM {brooq_migration} ORDER BY version

-- The migrator's own bookkeeping (brooq/migrate.py). The version table's name is fixed
-- (brooq.migrate.VERSION_TABLE); the migration files' own text is the one SQL run from
-- elsewhere (brooq.migrate._run, marked sql-outside).

-- name: migration_lock
-- A session advisory lock held while migrating (key brooq.migrate.LOCK_KEY), so that two
-- deploy steps cannot race. Tried, never waited for inside a statement: a session
-- waiting in pg_advisory_lock holds a snapshot, and CREATE INDEX CONCURRENTLY in the
-- session that has the lock waits for every older snapshot to go (a deadlock nobody
-- detects). The migrator polls instead.
SELECT pg_try_advisory_lock(%(key)s) AS locked

-- name: migration_unlock
SELECT pg_advisory_unlock(%(key)s)

-- name: migration_create_schema
-- QUEUE_SCHEMA: `brooq migrate up` creates the schema. Composed with psycopg.sql: the
-- placeholder is the schema's Identifier.
CREATE SCHEMA IF NOT EXISTS {}

-- name: migration_use_schema
-- QUEUE_SCHEMA: the migration files name brooq's relations bare, so they run with the
-- schema alone on the search_path (session-wide; the former path is kept for
-- migration_restore_search_path). Composed with psycopg.sql: the placeholder is the
-- Literal of the schema's quoted name.
SELECT set_config('brooq.saved_search_path', current_setting('search_path'), false),
       set_config('search_path', {}, false)

-- name: migration_restore_search_path
SELECT set_config('search_path', current_setting('brooq.saved_search_path'), false)

-- name: migration_table_exists
SELECT to_regclass({brooq_migration:name}) IS NOT NULL AS present

-- name: migration_create_table
CREATE TABLE IF NOT EXISTS {brooq_migration} (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: migration_insert
INSERT INTO {brooq_migration} (version, name) VALUES (%(version)s, %(name)s)

-- name: migration_delete
DELETE FROM {brooq_migration} WHERE version = %(version)s

-- name: migration_count
SELECT count(*) AS applied FROM {brooq_migration}

-- name: migration_drop_table
-- Undoing the first migration leaves nothing of brooq's, its bookkeeping included.
DROP TABLE {brooq_migration}

-- name: listen_jobs
LISTEN brooq_job

-- name: migration_set_lock_timeout
-- For the no-transaction migrations (brooq/migrate.py says why they exist). Session-wide on the migrator's own connection, reset after the file.
SELECT set_config('lock_timeout', %(timeout)s, false)

-- name: migration_reset_lock_timeout
RESET lock_timeout

-- name: migration_invalid_indexes
-- The invalid indexes of the job table among the given names: what a failed
-- CREATE INDEX CONCURRENTLY leaves behind.
SELECT n.nspname::text AS schema, c.relname::text AS name
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE i.indrelid = to_regclass({job:name}) AND NOT i.indisvalid
  AND c.relname = ANY(%(names)s::text[])
ORDER BY 1, 2

-- name: migration_drop_index
-- Composed with psycopg.sql: the placeholder is the index's qualified Identifier.
DROP INDEX CONCURRENTLY IF EXISTS {}

-- name: migration_lock_holders
-- Who may be holding what a timed-out statement waited for: other sessions whose
-- transaction has been open at least as long as the wait (shorter ones cannot have
-- held it all along) and holds a lock on job or a snapshot (CREATE INDEX CONCURRENTLY
-- waits for every older transaction). No query text: it may hold literals.
SELECT a.pid,
       coalesce(nullif(a.application_name, ''), a.usename::text) || ', ' || a.state
           || ', transaction open for ' || date_trunc('second', now() - a.xact_start)::text AS what
FROM pg_stat_activity a
WHERE a.pid <> pg_backend_pid()
  AND a.xact_start <= now() - %(waited)s::interval
  AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL
       OR EXISTS (SELECT FROM pg_locks l WHERE l.pid = a.pid AND l.relation = to_regclass({job:name})))
ORDER BY a.xact_start
LIMIT 5

-- name: periodic_claim
-- A master claims a schedule's tick: the row moves forward only, so of N masters one gets
-- the claim (it won the tick and enqueues its job in the same transaction); the others,
-- and a master whose clock is behind (an older tick), do not. The database's clock is the
-- judge of the future: a tick later than now() + `tolerance` seconds (a master whose clock
-- runs ahead) is refused, and a stored last_tick that far ahead (left by such a master
-- before this rule, or by a database clock set back) blocks nothing: a present tick
-- replaces it. One row always: `name` is NULL unless the tick was claimed; `first`: the
-- row is new (xmax is 0 only for a row this statement inserted), i.e. the schedule was
-- never claimed before; `db_now`: the database's clock, for the master's skew.
WITH clock AS (
    SELECT now() AS db_now, now() + make_interval(secs => %(tolerance)s) AS latest
), claimed AS (
    INSERT INTO {brooq_periodic} (name, last_tick)
    SELECT %(name)s::text, %(tick)s::timestamptz FROM clock
    WHERE %(tick)s::timestamptz <= clock.latest
    ON CONFLICT (name) DO UPDATE SET last_tick = EXCLUDED.last_tick, updated_at = now()
    WHERE brooq_periodic.last_tick < EXCLUDED.last_tick
       OR brooq_periodic.last_tick > now() + make_interval(secs => %(tolerance)s)
    RETURNING name, (xmax = 0) AS first
)
SELECT claimed.name, claimed.first, clock.db_now FROM clock LEFT JOIN claimed ON true

-- name: periodic_set_job
-- The job the winner of a tick enqueued, in the claim's transaction.
UPDATE {brooq_periodic} SET last_job = %(job)s WHERE name = %(name)s

-- name: periodic_list
-- `brooq periodic`: the last claimed tick of each named schedule and its job's state
-- (NULL state with a last_job: retention deleted the job).
SELECT p.name, p.last_tick, p.last_job, j.state
FROM {brooq_periodic} p
LEFT JOIN {job} j ON j.id = p.last_job
WHERE p.name = ANY(%(names)s::text[])

-- name: testing_ready_queues
-- brooq.testing.drain: the queues that hold jobs of these topics ready now, so that one
-- claim statement (job_finish_and_claim_queues) can be given all of them.
SELECT DISTINCT queue FROM {job}
WHERE state IN ('pending', 'failed') AND available_at <= now() AND topic = ANY(%(topics)s::text[])
ORDER BY queue

-- name: testing_jobs
-- brooq.testing.jobs: every job (of a topic, in a state), oldest first, for assertions.
SELECT id, topic, payload, state, attempts, available_at, locked_by, locked_until,
       last_error, idempotency_key, created_at, updated_at, queue, priority,
       result, coalesce(errors, '[]'::jsonb) AS errors
FROM {job}
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
SELECT state FROM {job} WHERE id = %(id)s

-- name: listen_stack_requests
LISTEN brooq_stack

-- name: listen_stack_answers
LISTEN brooq_stack_answer

-- name: stack_answer
-- The master answers every open request for the job (one per command waiting) and wakes
-- the commands; a request already answered is left alone. The payload is the job id (a
-- uuid, unique across the schemas of a database; a request id is not).
WITH answered AS (
    UPDATE {brooq_stack_request}
    SET answered_at = now(), worker = %(worker)s, stack = %(stack)s
    WHERE job_id = %(job_id)s AND answered_at IS NULL
    RETURNING id
)
SELECT count(*) FROM (SELECT pg_notify('brooq_stack_answer', %(job_id)s::text) FROM answered) AS n

-- name: stack_take
-- The command reads its request's answer and deletes the row (answered or not: at its
-- timeout it gives up). No row: already taken.
DELETE FROM {brooq_stack_request} WHERE id = %(id)s RETURNING answered_at, worker, stack

-- name: stack_requests_expire
-- Requests older than an hour (their command died before taking them).
DELETE FROM {brooq_stack_request} WHERE requested_at < now() - interval '1 hour'

-- The status page (brooq/web). Every page reads in one read-only REPEATABLE
-- READ transaction (one snapshot: the figures of a page agree with each other) under a
-- transaction-local statement_timeout, and every list is bounded by a LIMIT. Big lists
-- page by keyset (updated_at, id), never by OFFSET: page 1,000 costs what page 1 costs.

-- name: web_begin_read_only
-- The first statement of a page's transaction (it must precede any query).
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY

-- name: web_statement_timeout
-- set_config(..., true) is SET LOCAL with a bound value: it ends with the transaction, so
-- a connection shared with other work keeps its own settings. Custom plans only: psycopg
-- prepares a statement run five times on a connection, and PostgreSQL's generic plan for
-- the overview's statements (a LIMIT and state flags as parameters) reads far more than
-- the plan made for the values (1,000,000 jobs: 700 ms against 60 ms from the sixth
-- render on); planning them costs well under a millisecond.
SELECT set_config('statement_timeout', %(timeout)s, true),
       set_config('plan_cache_mode', 'force_custom_plan', true)

-- name: web_table_pages
-- The job table's size in pages (of its main fork: the file's size, not a statistic),
-- for the overview's sample: it reads about the same number of pages however large the
-- table grows.
SELECT coalesce(pg_relation_size(to_regclass({job:name})), 0)
           / current_setting('block_size')::int AS pages

-- name: web_overview_page
-- One page of the overview's sample (docs/status-page.md, "Exact up to a size, estimated
-- above"): the active and dead jobs of block `lo` (a TID range, read as one page by a
-- Tid Range Scan), per state, queue and topic. reads.overview sends one per sampled
-- page, pipelined: a LATERAL join over the blocks is planned as a scan of the whole
-- table per block (PostgreSQL parameterises no TID range by an outer column).
SELECT state, queue, topic, count(*) AS jobs,
       count(*) FILTER (WHERE available_at <= now()) AS ready,
       min(available_at) FILTER (
           WHERE state IN ('pending', 'failed') AND available_at <= now()) AS oldest_ready_at
FROM {job}
WHERE ctid >= %(lo)s::tid AND ctid < %(hi)s::tid
  AND state IN ('pending', 'failed', 'processing', 'dead')
GROUP BY state, queue, topic

-- name: web_ready_queue_names
-- The queues holding pending or failed jobs, by a loose scan of job_ready_queue_idx (one
-- index probe per queue, however many jobs each holds), so that the overview can count
-- the small queues beside an estimated backlog exactly instead of missing them.
WITH RECURSIVE q AS (
    (SELECT queue FROM {job} WHERE state IN ('pending', 'failed') ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {job} j
            WHERE j.state IN ('pending', 'failed') AND j.queue > q.queue
            ORDER BY j.queue LIMIT 1)
    FROM q WHERE q.queue IS NOT NULL
)
SELECT queue FROM q WHERE queue IS NOT NULL LIMIT %(limit)s

-- name: web_overview_queues_exact
-- The pending and failed jobs of the queues given, exactly, per state, queue and topic,
-- through job_ready_queue_idx; at most `cap` + 1 rows (state_jobs above `cap`: cut
-- short, not to be shown).
SELECT state, queue, topic, count(*) AS jobs,
       count(*) FILTER (WHERE available_at <= now()) AS ready,
       min(available_at) FILTER (WHERE available_at <= now()) AS oldest_ready_at,
       sum(count(*)) OVER () AS state_jobs
FROM (
    SELECT state, queue, topic, available_at FROM {job}
    WHERE state IN ('pending', 'failed') AND queue = ANY(%(queues)s::text[])
    LIMIT %(cap)s + 1
) AS r
GROUP BY state, queue, topic

-- name: web_overview_exact
-- The overview's exact figures, per state, queue and topic, of the states asked for (a
-- false flag: that state is not read at all, a one-time filter). Each state's rows come
-- through its partial index (job_ready_queue_idx or job_ready_idx for pending and failed,
-- job_processing_lease_idx, job_failed_dead_idx of migration 0008), never the done and
-- canceled history, and at most `cap` + 1 of them: `state_jobs` above `cap` means that
-- state was cut short and its figures are not to be shown (the sample's stand instead),
-- so this statement reads at most four times `cap` rows however large the backlog.
-- jobs = the group's rows in that state; ready = those due now (pending and failed); the
-- first `groups` groups of each state (by queue, topic), state_jobs counting them all.
WITH pending AS (
    SELECT queue, topic, available_at FROM {job}
    WHERE state = 'pending' AND %(pending)s LIMIT %(cap)s + 1
), failed AS (
    SELECT queue, topic, available_at FROM {job}
    WHERE state = 'failed' AND %(failed)s LIMIT %(cap)s + 1
), processing AS (
    SELECT queue, topic FROM {job}
    WHERE state = 'processing' AND %(processing)s LIMIT %(cap)s + 1
), dead AS (
    SELECT queue, topic FROM {job}
    WHERE state = 'dead' AND %(dead)s LIMIT %(cap)s + 1
)
(SELECT 'pending' AS state, queue, topic, count(*) AS jobs,
        count(*) FILTER (WHERE available_at <= now()) AS ready,
        min(available_at) FILTER (WHERE available_at <= now()) AS oldest_ready_at,
        sum(count(*)) OVER () AS state_jobs
 FROM pending GROUP BY queue, topic ORDER BY queue, topic LIMIT %(groups)s)
UNION ALL
(SELECT 'failed', queue, topic, count(*), count(*) FILTER (WHERE available_at <= now()),
        min(available_at) FILTER (WHERE available_at <= now()), sum(count(*)) OVER ()
 FROM failed GROUP BY queue, topic ORDER BY queue, topic LIMIT %(groups)s)
UNION ALL
(SELECT 'processing', queue, topic, count(*), 0, NULL, sum(count(*)) OVER ()
 FROM processing GROUP BY queue, topic ORDER BY queue, topic LIMIT %(groups)s)
UNION ALL
(SELECT 'dead', queue, topic, count(*), 0, NULL, sum(count(*)) OVER ()
 FROM dead GROUP BY queue, topic ORDER BY queue, topic LIMIT %(groups)s)

-- name: web_now
-- The snapshot's clock, for the chart's minutes and the ages shown.
SELECT now() AS now, date_trunc('minute', now()) AS minute

-- name: web_paused_queues
SELECT name, updated_at FROM {brooq_queue} WHERE paused ORDER BY name LIMIT %(limit)s

-- name: web_done_per_minute
-- Jobs written done in each minute of the last hour (minutes without any are missing;
-- the page fills them with 0). Through job_terminal_updated_idx (state = 'done' implies
-- its predicate), at most `cap` + 1 rows: more (a sum above `cap`) and the page shows
-- web_done_per_minute_sample's estimate instead.
SELECT date_trunc('minute', updated_at) AS minute, count(*) AS jobs
FROM (
    SELECT updated_at FROM {job}
    WHERE state = 'done'
      AND updated_at >= date_trunc('minute', now()) - interval '59 minutes'
    LIMIT %(cap)s + 1
) AS done
GROUP BY 1
ORDER BY 1

-- name: web_done_per_minute_sample
-- The same, in `percent` per cent of the table's pages picked by TABLESAMPLE SYSTEM (the
-- number of pages it reads varies by a few per cent; a chart needs no more): a
-- throughput of more than `cap` jobs an hour is charted from a sample.
SELECT date_trunc('minute', updated_at) AS minute, count(*) AS jobs
FROM {job} TABLESAMPLE SYSTEM (%(percent)s) REPEATABLE (%(seed)s)
WHERE state = 'done'
  AND updated_at >= date_trunc('minute', now()) - interval '59 minutes'
GROUP BY 1
ORDER BY 1

-- name: web_in_flight
-- Jobs in state processing, longest running first (updated_at is the claim: lease
-- renewal leaves it alone), one page after the cursor (after_at, after_id), or the first
-- page from a cursor before every row ('-infinity', the nil UUID): one condition, never
-- an OR, so the row comparison stays an index condition. limit is the page size plus one
-- (is there a next page?).
SELECT id, topic, queue, attempts, locked_by, updated_at,
       extract(epoch FROM now() - updated_at)::float8 AS running_for,
       extract(epoch FROM locked_until - now())::float8 AS lease_left
FROM {job}
WHERE state = 'processing'
  AND (updated_at, id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
ORDER BY updated_at, id
LIMIT %(limit)s

-- name: web_finished_badly
-- Failed (waiting for a retry) or dead jobs, newest first, one page before the cursor
-- (after_at, after_id); the first page from a cursor after every row ('infinity', the
-- max UUID). Through job_failed_dead_idx (migration 0008), (state, updated_at DESC, id
-- DESC): a page reads its 51 entries wherever the cursor is. The last error is cut to `error_chars` characters here, so a page never
-- carries megabytes of tracebacks.
SELECT id, topic, queue, state, attempts, updated_at, available_at,
       left(last_error, %(error_chars)s) AS last_error,
       length(last_error) AS last_error_length,
       coalesce(jsonb_array_length(errors), 0) AS errors_count
FROM {job}
WHERE state = %(state)s::text
  AND (updated_at, id) < (%(after_at)s::timestamptz, %(after_id)s::uuid)
ORDER BY updated_at DESC, id DESC
LIMIT %(limit)s

-- name: web_job_get
-- One job, every column whatever migrations added (the page lists them in table order).
SELECT * FROM {job} WHERE id = %(id)s

-- name: session_settings_local
-- Behind a transaction pooler (brooq/pooler.py) a connection has no session of its own:
-- brooq's session settings are set for one transaction, in the same pipeline (the same
-- round trip) as the statement they are for.
SELECT set_config(s.name, s.value, true)
FROM unnest(%(names)s::text[], %(values)s::text[]) AS s(name, value)

-- name: session_setting_get
-- Whether the `options` startup parameter was applied: a pooler that ignores it (PgBouncer's
-- ignore_startup_parameters) would leave brooq without its session settings, silently.
SELECT current_setting(%(name)s)

-- name: master_beat
-- A master's beat (brooq/supervisor/duties/beat.py): its row written (inserted at the
-- first beat, and again if another master swept it while this one could not beat),
-- the rows that missed `missed` of their own beats deleted when `sweep` (every few
-- beats, not every one), and the (queue, topic) pairs the other live masters handle
-- (every queue of a row with every topic of it: a master runs the jobs of its topics
-- in the queues it works) read back. One statement, sent off the loop with libpq's $n
-- placeholders in text: $1 id, $2 host, $3 pid, $4 version, $5 app, $6 queues and $7
-- topics (JSON arrays of text), $8 children (a JSON array), $9 beat_seconds, $10
-- started_at, $11 missed, $12 sweep. The SELECT reads the snapshot from before the
-- statement's own writes, so the master adds its own pairs itself.
WITH me AS (
    INSERT INTO {brooq_master} (id, host, pid, version, app, queues, topics, children,
                                beat_seconds, started_at, seen_at)
    VALUES ($1::uuid, $2, $3::int4, $4, $5,
            ARRAY(SELECT jsonb_array_elements_text($6::jsonb)),
            ARRAY(SELECT jsonb_array_elements_text($7::jsonb)),
            $8::jsonb, $9::float8, $10::timestamptz, now())
    ON CONFLICT (id) DO UPDATE
    SET children = EXCLUDED.children, beat_seconds = EXCLUDED.beat_seconds, seen_at = now()
    RETURNING id
), gone AS (
    DELETE FROM {brooq_master}
    WHERE $12::bool AND id <> $1::uuid
      AND seen_at < now() - make_interval(secs => beat_seconds * $11::int4)
    RETURNING id
)
SELECT DISTINCT q.queue, t.topic
FROM {brooq_master} AS m, unnest(m.queues) AS q(queue), unnest(m.topics) AS t(topic)
WHERE m.id <> $1::uuid
  AND m.seen_at >= now() - make_interval(secs => m.beat_seconds * $11::int4)

-- name: master_leave
-- A master stopping (drained, SIGQUIT, fatal) deletes its row: it drops out at once.
DELETE FROM {brooq_master} WHERE id = %(id)s

-- name: fleet_live
-- The live masters (`brooq fleet`, the status page's /fleet, the "no handler" marks):
-- the rows written within `missed` of their own beats. A tiny table: one row per master.
SELECT id, host, pid, version, app, queues, topics, children, beat_seconds, started_at,
       seen_at, extract(epoch FROM now() - seen_at)::float8 AS seen_seconds_ago
FROM {brooq_master}
WHERE seen_at >= now() - make_interval(secs => beat_seconds * %(missed)s::int4)
ORDER BY host, pid, id
LIMIT %(limit)s
