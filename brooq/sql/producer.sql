-- What producers run: Queue.enqueue and its kin (brooq.produce, brooq.enqueue_line)
-- write jobs, and Queue.wait listens for a job's outcome.

-- name: job_insert
-- One job. ON CONFLICT covers only keyed rows (the unique index is partial).
INSERT INTO {job} (id, topic, payload, idempotency_key, available_at, queue, priority,
                   group_key)
VALUES (%(id)s, %(topic)s, %(payload)s::jsonb, %(key)s, coalesce(%(available_at)s, now()),
        %(queue)s, %(priority)s, %(group)s)
ON CONFLICT (topic, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id

-- name: job_insert_one
-- Queue.enqueue's one job: job_insert with libpq's $n placeholders, prepared once by
-- name on the connection brooq.enqueue_line keeps for it and sent straight through
-- libpq (id, available_at and priority in binary). Its parameter types are in
-- enqueue_line._TYPES.
INSERT INTO {job} (id, topic, payload, idempotency_key, available_at, queue, priority,
                   group_key)
VALUES ($1, $2, $3::jsonb, $4, coalesce($5, now()), $6, $7, $8)
ON CONFLICT (topic, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id

-- name: job_insert_many
-- Many jobs in one statement (one round trip, one NOTIFY). Ids are made by the client,
-- so the caller knows every id before the answer; rows skipped by a key conflict are
-- missing from RETURNING.
INSERT INTO {job} (id, topic, payload, idempotency_key, available_at, queue, priority,
                   group_key)
SELECT i.id, i.topic, i.payload::jsonb, i.key, coalesce(i.available_at, now()), i.queue,
       i.priority, i.group_key
FROM unnest(%(ids)b::uuid[], %(topics)b::text[], %(payloads)b::text[], %(keys)b::text[],
            %(available_ats)b::timestamptz[], %(queues)b::text[], %(priorities)b::int2[],
            %(groups)b::text[])
     WITH ORDINALITY AS i(id, topic, payload, key, available_at, queue, priority, group_key,
                          ord)
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

-- name: job_copy_ready_grouped
-- job_copy_ready for a batch in which a job has a group (Job(group=...)): a batch
-- without one keeps the narrower COPY.
COPY {job} (id, topic, payload, queue, priority, group_key) FROM STDIN

-- name: job_copy_scheduled_grouped
COPY {job} (id, topic, payload, available_at, queue, priority, group_key) FROM STDIN

-- name: job_get_id_by_key
SELECT id FROM {job} WHERE topic = %(topic)s AND idempotency_key = %(key)s

-- name: job_get_ids_by_keys
SELECT k.topic, k.key, job.id
FROM unnest(%(topics)b::text[], %(keys)b::text[]) AS k(topic, key)
JOIN {job} ON job.topic = k.topic AND job.idempotency_key = k.key

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
