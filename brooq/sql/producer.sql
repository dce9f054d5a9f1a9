-- What producers run: Queue.enqueue and its kin (brooq.producer.insert, brooq.producer.line)
-- write jobs, and Queue.wait listens for a job's outcome.

-- name: job_insert
-- One job. A key is the job's for its whole life (migration 0020): a key in
-- brooq_job_key, its job active or finished (in job_history), inserts nothing; ON
-- CONFLICT covers a key inserted by a transaction not yet committed when this statement
-- began (job's unique index is partial: keyed rows only). A job without a key reads no
-- key (the OR's first arm).
INSERT INTO {job} (id, topic, payload, idempotency_key, available_at, queue, priority,
                   group_key)
SELECT %(id)s, %(topic)s, %(payload)s::jsonb, %(key)s, coalesce(%(available_at)s, now()),
       %(queue)s, %(priority)s, %(group)s
WHERE %(key)s::text IS NULL OR NOT EXISTS (
    SELECT FROM {brooq_job_key} AS k
    WHERE k.topic = %(topic)s AND k.idempotency_key = %(key)s)
ON CONFLICT (topic, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id

-- name: job_insert_one
-- Queue.enqueue's one job: job_insert with libpq's $n placeholders, prepared once by
-- name on the connection brooq.producer.line keeps for it and sent straight through
-- libpq (id, available_at and priority in binary). Its parameter types are in
-- enqueue_line._TYPES.
INSERT INTO {job} (id, topic, payload, idempotency_key, available_at, queue, priority,
                   group_key)
SELECT $1, $2, $3::jsonb, $4, coalesce($5, now()), $6, $7, $8
WHERE $4::text IS NULL OR NOT EXISTS (
    SELECT FROM {brooq_job_key} AS k WHERE k.topic = $2 AND k.idempotency_key = $4::text)
ON CONFLICT (topic, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id

-- name: job_insert_many
-- Many jobs in one statement (one round trip, one NOTIFY). Ids are made by the client,
-- so the caller knows every id before the answer; rows skipped for their key (in
-- brooq_job_key, or a conflict: as job_insert) are missing from RETURNING. The key's
-- look-up is one probe of brooq_job_key's primary key per row (none for a row without a
-- key: a NULL key matches no entry): OFFSET 0 keeps the LATERAL subquery a parameterised
-- scan. As a NOT EXISTS, the planner read the whole table (every finished job's key)
-- into a hash once a batch held some hundreds of keys.
INSERT INTO {job} (id, topic, payload, idempotency_key, available_at, queue, priority,
                   group_key)
SELECT i.id, i.topic, i.payload::jsonb, i.key, coalesce(i.available_at, now()), i.queue,
       i.priority, i.group_key
FROM unnest(%(ids)b::uuid[], %(topics)b::text[], %(payloads)b::text[], %(keys)b::text[],
            %(available_ats)b::timestamptz[], %(queues)b::text[], %(priorities)b::int2[],
            %(groups)b::text[])
     WITH ORDINALITY AS i(id, topic, payload, key, available_at, queue, priority, group_key,
                          ord)
LEFT JOIN LATERAL (
    SELECT true AS taken FROM {brooq_job_key} AS k
    WHERE k.topic = i.topic AND k.idempotency_key = i.key OFFSET 0
) AS k ON true
WHERE k.taken IS NULL
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
-- The job holding an idempotency key, active or finished: brooq_job_key has every key
-- for its job's life (written by job_key_taken with the job's row).
SELECT job_id AS id FROM {brooq_job_key} WHERE topic = %(topic)s AND idempotency_key = %(key)s

-- name: job_get_ids_by_keys
SELECT k.topic, k.key, t.job_id AS id
FROM unnest(%(topics)b::text[], %(keys)b::text[]) AS k(topic, key)
JOIN {brooq_job_key} AS t ON t.topic = k.topic AND t.idempotency_key = k.key

-- template: job_insert_options
-- variant: job_insert_options
-- variant: job_insert_options_traced: traced
-- One job with a unique_key or tags (brooq.producer.insert); job_insert stays the plain
-- job's. No conflict target: the row may collide on the idempotency key's index or on
-- job_unique_key_idx (one active job per topic and unique_key, migration 0011), and
-- either means "already there"; an idempotency key in brooq_job_key (its job finished,
-- maybe) too, as in job_insert. `state`: pending, or on_hold for Job(held=True), which
-- takes this statement for it; so does a job with an ordering_key (the job_ordered
-- trigger of migration 0026 makes it wait for its key's turn). _traced: a job enqueued
-- under a producer span (brooq.tracing), with its W3C traceparent; a job without one
-- never takes it.
INSERT INTO {job} (id, topic, payload, idempotency_key, available_at, queue, priority,
                   unique_key, tags, group_key, state, ordering_key{if traced:, traceparent})
SELECT %(id)s, %(topic)s, %(payload)s::jsonb, %(key)s, coalesce(%(available_at)s, now()),
       %(queue)s, %(priority)s, %(unique_key)s, %(tags)s::text[],
       %(group)s, %(state)s, %(ordering_key)s{if traced:, %(traceparent)s}
WHERE %(key)s::text IS NULL OR NOT EXISTS (
    SELECT FROM {brooq_job_key} AS k
    WHERE k.topic = %(topic)s AND k.idempotency_key = %(key)s)
ON CONFLICT DO NOTHING
RETURNING id

-- name: job_get_id_by_unique_key
-- The active job holding a unique_key: its waiting debounced job first (the one that
-- runs last), else the key's job. Each arm reads its partial unique index.
(SELECT id FROM {job}
 WHERE topic = %(topic)s AND unique_key = %(key)s
   AND start_after IS NOT NULL AND state = 'pending')
UNION ALL
(SELECT id FROM {job}
 WHERE topic = %(topic)s AND unique_key = %(key)s
   AND start_after IS NULL AND state IN ('pending', 'failed', 'processing'))
LIMIT 1

-- name: job_debounce
-- One debounced job (unique_key, debounce seconds): the first of these that applies.
--   1. The key has a waiting job (created while the key's job ran): it takes this
--      enqueue (payload, queue, priority, tags, group) and asks to start `debounce` from now
--      once the key's job ends (start_after).
--   2. The key's job has not started (pending): it takes this enqueue and starts
--      `debounce` from now.
--   3. The key's job has started (processing, or failed and waiting for its retry): a
--      waiting job is inserted (available_at 9999-01-01: no claim takes it; start_after:
--      when it asks to start), which the key's job makes its successor when it ends
--      (migration 0011's triggers).
--   4. The key is free: the job is inserted, to start `debounce` from now.
-- The answer is the id of the job that took the enqueue: `id` (the caller's new id) when
-- it inserted one. No row: a producer racing this one inserted for the key first (ON
-- CONFLICT), and the caller runs the statement again. Every part reads one snapshot: a
-- key's job claimed meanwhile is not updated (its row changed: the UPDATE's re-check
-- fails on `pending`) and was seen active, so the waiting job is inserted; a key's job
-- ended meanwhile leaves that waiting job with no job before it, and the insert's own
-- trigger moves it up at commit. The rows updated stay locked until the caller commits:
-- a claim skips such a job meanwhile.
WITH waiting AS (
    UPDATE {job}
    SET payload = %(payload)s::jsonb, queue = %(queue)s, priority = %(priority)s,
        tags = %(tags)s::text[], group_key = %(group)s,
        start_after = now() + make_interval(secs => %(debounce)s),
        updated_at = now()
    WHERE topic = %(topic)s AND unique_key = %(unique_key)s
      AND start_after IS NOT NULL AND state = 'pending'
    RETURNING id
), unstarted AS (
    UPDATE {job}
    SET payload = %(payload)s::jsonb, queue = %(queue)s, priority = %(priority)s,
        tags = %(tags)s::text[], group_key = %(group)s,
        available_at = now() + make_interval(secs => %(debounce)s),
        updated_at = now()
    WHERE topic = %(topic)s AND unique_key = %(unique_key)s
      AND start_after IS NULL AND state = 'pending'
      AND NOT EXISTS (SELECT FROM waiting)
    RETURNING id
), started AS (
    SELECT EXISTS (
        SELECT FROM {job}
        WHERE topic = %(topic)s AND unique_key = %(unique_key)s
          AND start_after IS NULL AND state IN ('pending', 'failed', 'processing')
    ) AS running
), inserted AS (
    INSERT INTO {job} (id, topic, payload, available_at, queue, priority, unique_key, tags,
                       group_key, start_after)
    SELECT %(id)s, %(topic)s, %(payload)s::jsonb,
           CASE WHEN started.running THEN '9999-01-01 00:00:00+00'::timestamptz
                ELSE now() + make_interval(secs => %(debounce)s) END,
           %(queue)s, %(priority)s, %(unique_key)s, %(tags)s::text[], %(group)s,
           CASE WHEN started.running THEN now() + make_interval(secs => %(debounce)s) END
    FROM started
    WHERE NOT EXISTS (SELECT FROM waiting) AND NOT EXISTS (SELECT FROM unstarted)
    ON CONFLICT DO NOTHING
    RETURNING id
)
SELECT id FROM waiting
UNION ALL
SELECT id FROM unstarted
UNION ALL
SELECT id FROM inserted

-- template: job_insert_many_options
-- variant: job_insert_many_options
-- variant: job_insert_many_options_traced: traced
-- job_insert_many for a batch holding unique keys, tags, held jobs or ordering keys
-- (brooq.producer.insert): the same arrays (the groups among them), and four more; `tags`
-- holds each job's tags as a text[] literal (NULL: none), `states` pending or on_hold
-- (Job(held=True)), `ordering_keys` each job's key or NULL.
-- No conflict target, as job_insert_options. _traced: a batch enqueued under a producer
-- span, each job with its traceparent (any batch then takes this statement, never COPY).
INSERT INTO {job} (id, topic, payload, idempotency_key, available_at, queue, priority,
                   unique_key, tags, group_key, state, ordering_key{if traced:, traceparent})
SELECT i.id, i.topic, i.payload::jsonb, i.key, coalesce(i.available_at, now()), i.queue,
       i.priority, i.unique_key, i.tags::text[], i.group_key,
       i.state, i.ordering_key{if traced:, i.traceparent}
FROM unnest(%(ids)b::uuid[], %(topics)b::text[], %(payloads)b::text[], %(keys)b::text[],
            %(available_ats)b::timestamptz[], %(queues)b::text[], %(priorities)b::int2[],
            %(unique_keys)b::text[], %(tags)b::text[], %(groups)b::text[],
            %(states)b::text[], %(ordering_keys)b::text[]
            --#if traced
            , %(traceparents)b::text[]
            --#end
            )
     WITH ORDINALITY AS i(id, topic, payload, key, available_at, queue, priority, unique_key,
                          tags, group_key, state, ordering_key, {if traced:traceparent, }ord)
LEFT JOIN LATERAL (  -- a key in brooq_job_key: as job_insert_many
    SELECT true AS taken FROM {brooq_job_key} AS k
    WHERE k.topic = i.topic AND k.idempotency_key = i.key OFFSET 0
) AS k ON true
WHERE k.taken IS NULL
ORDER BY i.ord
ON CONFLICT DO NOTHING
RETURNING id

-- name: job_copy_ready_options
-- job_copy_ready for a batch in which some jobs have tags (a text[] literal, or NULL), a
-- group (Job(group=...)), are held (state on_hold, else pending) or have an ordering key:
-- a batch with none of them keeps the narrower COPY.
COPY {job} (id, topic, payload, queue, priority, tags, group_key, state, ordering_key)
FROM STDIN

-- name: job_copy_scheduled_options
COPY {job} (id, topic, payload, available_at, queue, priority, tags, group_key, state,
            ordering_key)
FROM STDIN

-- name: job_get_ids_by_unique_keys
-- The active jobs holding these unique keys, each key's waiting job first (as
-- job_get_id_by_unique_key): one arm per partial unique index.
SELECT topic, key, id FROM (
    SELECT k.topic, k.key, job.id, 0 AS rank
    FROM unnest(%(topics)b::text[], %(keys)b::text[]) AS k(topic, key)
    JOIN {job} ON job.topic = k.topic AND job.unique_key = k.key
         AND job.start_after IS NOT NULL AND job.state = 'pending'
    UNION ALL
    SELECT k.topic, k.key, job.id, 1
    FROM unnest(%(topics)b::text[], %(keys)b::text[]) AS k(topic, key)
    JOIN {job} ON job.topic = k.topic AND job.unique_key = k.key
         AND job.start_after IS NULL AND job.state IN ('pending', 'failed', 'processing')
) AS holders
ORDER BY rank

-- name: job_wait_register
-- queue.wait(): flag the job as waited for, so that the trigger job_waited_notify
-- (migration 0006) notifies brooq_outcome when it reaches done, dead or canceled. Run
-- after LISTEN, so the end of the job cannot fall between the two (an outcome committed
-- first is seen by the job_get that follows). A terminal, unknown or already flagged
-- row is not written; updated_at stays (the flag is no change of the job's fate).
UPDATE {job} SET waited = true
WHERE id = %(id)s AND state IN ('waiting', 'pending', 'processing', 'failed')
  AND waited IS NOT TRUE

-- name: listen_outcomes
LISTEN brooq_outcome

-- name: job_ids_present
-- Which of the ids `after` names are jobs, active or finished (job_all: a finished one
-- may be in job_history): read before a graph's insert, so that a name that is no job is
-- refused with nothing written.
SELECT id FROM {job_all}
WHERE id = ANY(%(ids)b::uuid[])
  AND updated_at >= (SELECT min({brooq_history_floor}(i)) FROM unnest(%(ids)b::uuid[]) AS i)

-- name: job_after
-- A graph's edges, after its jobs were inserted pending in this transaction: each job of
-- `jobs` waits for the ids of `ups` paired with it in `downs` (migration 0013's
-- brooq_job_after), and becomes waiting, or stays pending when every job it names has
-- ended done, or is canceled when one ended dead or canceled.
SELECT {brooq_job_after}(%(jobs)b::uuid[], %(policies)b::text[], %(downs)b::uuid[],
                         %(ups)b::uuid[]) AS waiting

-- name: job_after_release
-- A graph's jobs, once job_after wrote their edges: inserted held (available_at
-- 9999-01-01, brooq.producer.insert.HELD, so that the insert's trigger sent no NOTIFY for
-- a job that is to wait), each gets its own available_at (NULL: now). When one of them
-- stayed pending and is ready now (every job it names had ended), the children are woken
-- as the insert's trigger would have woken them: one NOTIFY naming the table's schema
-- (the same payload as brooq_job_notify's TG_TABLE_SCHEMA), sent at commit. A job that
-- job_after canceled (a job it names ended dead or canceled) is in job_history already:
-- it gets its available_at there (looked for there only when job has it not: an
-- anti-join, where `a.id <> ALL(ARRAY(...))` compared each id with every released one,
-- 21 s for a graph of 100,000 jobs).
WITH released AS (
    UPDATE {job} j SET available_at = coalesce(a.at, now())
    FROM unnest(%(ids)b::uuid[], %(available_ats)b::timestamptz[]) AS a(id, at)
    WHERE j.id = a.id
    RETURNING j.id, j.tableoid, j.state = 'pending' AND j.available_at <= now() AS ready
), ended AS (
    UPDATE {job_history} h SET available_at = coalesce(a.at, now())
    FROM unnest(%(ids)b::uuid[], %(available_ats)b::timestamptz[]) AS a(id, at)
    WHERE h.id = a.id AND NOT EXISTS (SELECT FROM released r WHERE r.id = a.id)
)
SELECT pg_notify('brooq_job', n.nspname)
FROM (SELECT r.tableoid FROM released r WHERE r.ready LIMIT 1) AS woken
JOIN pg_class c ON c.oid = woken.tableoid
JOIN pg_namespace n ON n.oid = c.relnamespace
