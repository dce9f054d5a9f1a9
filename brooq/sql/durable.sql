-- Durable handlers (brooq.worker.durable, brooq.producer.events, the CLI): a handler's
-- recorded steps, its sleeps, its waits for events and child jobs, and the emits that end
-- them. Every write a handler makes is guarded by "still processing and held by this
-- child", as the outcome writes are.

-- name: job_steps_read
-- The steps a job recorded, read once per attempt at its first step.
SELECT name, result FROM {brooq_job_step} WHERE job_id = %(id)s

-- name: job_step_record
-- One step's result, recorded while the job is still processing and held by this child
-- (the row locked FOR SHARE: a renewal or a reaper's write waits for this transaction,
-- and a lease lost before it records nothing). No row: the lease is gone.
INSERT INTO {brooq_job_step} (job_id, name, result)
SELECT %(id)s, %(name)s, %(result)s::jsonb
WHERE EXISTS (
    SELECT 1 FROM {job}
    WHERE id = %(id)s AND state = 'processing' AND locked_by = %(worker)s
    FOR SHARE
)
RETURNING created_at

-- name: job_steps_forget
-- Queue.retry(fresh=True): a retried job's recorded steps forgotten, in the retry's
-- transaction.
DELETE FROM {brooq_job_step} WHERE job_id = %(id)s

-- name: job_park_sleep
-- A durable sleep: the job pending until its wake time, the attempt given back, the
-- child let go. No row: the lease is gone.
UPDATE {job}
SET state = 'pending', available_at = %(until)s, attempts = greatest(attempts - 1, 0),
    locked_by = NULL, locked_until = NULL, parked = 'sleep', updated_at = now()
WHERE id = %(id)s AND state = 'processing' AND locked_by = %(worker)s
RETURNING id

-- name: event_read
-- The payload of the event emitted under a key (no row: not emitted yet).
SELECT payload FROM {brooq_event} WHERE key = %(key)s

-- name: event_emit
-- One emit, in the caller's transaction: whether it was the first under its key.
SELECT {brooq_emit_event}(%(key)s, %(payload)s::jsonb)

-- name: event_park
-- A handler's wait for an event: false (the event is there: read it), NULL (the lease is
-- gone) or true (parked until the emit, or until the deadline when one is given).
SELECT {brooq_park_event}(%(id)s, %(worker)s, %(key)s, %(until)s)

-- name: event_wait_forget
-- The wait row of a job whose wait ended by its deadline.
DELETE FROM {brooq_event_wait} WHERE job_id = %(id)s

-- name: event_waits
-- The pending waits, oldest first, at most `limit`: `brooq events waits`.
SELECT w.job_id, j.topic, w.key, w.since, j.state,
       CASE WHEN j.state = 'pending' THEN j.available_at END AS until
FROM {brooq_event_wait} AS w JOIN {job} AS j ON j.id = w.job_id
WHERE j.state IN ('waiting', 'pending')  -- a canceled job's wait is no wait
ORDER BY w.since, w.job_id
LIMIT %(limit)s

-- name: jobs_park
-- A handler's wait for child jobs: false (all ended), NULL (the lease is gone) or true
-- (parked until the last of them ends).
SELECT {brooq_park_jobs}(%(id)s, %(worker)s, %(ids)b::uuid[])

-- name: jobs_records
-- The records of the jobs a handler waited for (any order: the caller orders them): ended
-- jobs, so job_all (in job_history, or in job for one that ended before migration 0020).
-- Only job_history's partitions from the earliest enqueue time of the ids on.
SELECT id, topic, state, result, last_error FROM {job_all}
WHERE id = ANY(%(ids)b::uuid[])
  AND updated_at >= (SELECT min({brooq_history_floor}(i)) FROM unnest(%(ids)b::uuid[]) AS i)

-- name: job_durable
-- What `brooq jobs show` says of a job's durable side: its steps (names, when recorded,
-- the size of each result's JSON text, oldest first), why it is parked (read with its
-- state), its available_at, and the key it waits for. A finished job's steps stay (until
-- its partition of job_history is dropped): job_all.
SELECT j.state, j.parked, j.available_at,
       (SELECT w.key FROM {brooq_event_wait} AS w WHERE w.job_id = j.id) AS event_key,
       coalesce(s.names, '{}') AS names, coalesce(s.ats, '{}') AS ats,
       coalesce(s.sizes, '{}') AS sizes
FROM {job_all} AS j
LEFT JOIN LATERAL (
    SELECT array_agg(st.name ORDER BY st.created_at, st.name) AS names,
           array_agg(st.created_at ORDER BY st.created_at, st.name) AS ats,
           array_agg(octet_length(st.result::text) ORDER BY st.created_at, st.name) AS sizes
    FROM {brooq_job_step} AS st WHERE st.job_id = j.id
) AS s ON true
WHERE j.id = %(id)s AND j.updated_at >= {brooq_history_floor}(%(id)s)

-- name: job_children
-- The jobs a job spawned (claim.spawn), in the order spawned, at most `limit`, ended or
-- not (job_all).
SELECT c.id, c.topic, c.state
FROM {brooq_job_step} AS s JOIN {job_all} AS c ON c.id = (s.result #>> '{}')::uuid
WHERE s.job_id = %(id)s AND s.name LIKE '\_\_spawn:%%'
ORDER BY s.created_at, c.id
LIMIT %(limit)s

-- name: events_expire
-- Retention of events (the master's retention duty, with the jobs' TTL): at most `batch`
-- events emitted longer than `ttl` seconds ago that no job waits on, oldest first.
DELETE FROM {brooq_event} AS e
WHERE e.key IN (
    SELECT x.key FROM {brooq_event} AS x
    WHERE x.emitted_at < now() - make_interval(secs => %(ttl)s)
      AND NOT EXISTS (SELECT 1 FROM {brooq_event_wait} AS w WHERE w.key = x.key)
    ORDER BY x.emitted_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
