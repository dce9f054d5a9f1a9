-- What a worker child runs: the claim round trip (one template, ten variants), the
-- outcomes it writes and the jobs it gives back.

-- template: job_finish_and_claim
-- variant: job_finish_and_claim
-- variant: job_finish_and_claim_queues: queues
-- variant: job_finish_and_claim_limited: queues, limited
-- variant: job_finish_and_claim_results: results
-- variant: job_finish_and_claim_queues_results: queues, results
-- variant: job_finish_and_claim_limited_results: queues, limited, results
-- variant: job_finish_and_claim_coordinated: queues, limited, coordinated
-- variant: job_finish_and_claim_coordinated_results: queues, limited, coordinated, results
-- variant: job_finish_and_claim_floored: queues, floored
-- variant: job_finish_and_claim_floored_results: queues, floored, results
-- The hot path, one round trip: write `done` for the jobs this worker finished and claim
-- up to `limit` ready jobs of the given topics, higher priority first, then FIFO by
-- (available_at, id), and no more than a fair share among `children` workers.
-- The limit may be 0 (only write) and the done list empty (only claim). Claimed rows
-- come back with claimed = true (the caller sorts them); a job of `done` whose `done`
-- was not written (no longer this worker's: canceled, reaped, taken over) comes back with
-- claimed = false and only its id. The ones written do not come back: a row per job
-- cost the child more than the anti-join costs the server. The `done` part is
-- job_set_done's guarded UPDATE. The claim locks exactly the rows it returns through a
-- materialized CTE with LIMIT, run once (an "id IN (subquery)" form may lock more:
-- PostgreSQL bug #15715), and charges the attempt (the attempt is charged at claim:
-- attempts counts the times a job was claimed).
-- Paused queues are left out by the child (queue_paused_names, read at most
-- poll_interval apart), not checked here: a probe of brooq_queue in every claim cost
-- 2 percent of the statement, for a table that changes a few times a year.
-- job_finish_and_claim works one queue (every deployment that names no queues); the
-- variants: _queues several queues in a chosen order, _limited a topic under
-- global_limit besides, _floored the queues' ranges of priorities each from a floor
-- (brooq.worker.floors: past the jobs claimed before), _results stores what the handlers
-- returned and the last progress of those that reported one.
WITH finished AS (
    -- A finished job leaves job for job_history in this statement (migration 0020): its
    -- row deleted here, inserted below with its outcome; no UPDATE first, no trigger on
    -- job. `(state = 'processing') IS TRUE`, not `state = 'processing'`: the plain form
    -- lets the planner read job_processing_lease_idx whole instead of the primary key (a
    -- generic plan estimates a short partial index cheaper than ten key look-ups), and
    -- under a held snapshot that index keeps an entry for every job that ever ran: each
    -- `done` walked them all (docs/explanation/held-snapshots.md). The same guard, by key.
    DELETE FROM {job}
    WHERE id = ANY(%(done)b::uuid[]) AND (state = 'processing') IS TRUE
      AND locked_by = %(worker)s
    RETURNING job.*
),
moved AS (
    -- Every column of job in its order (tests/db/test_history.py holds the two tables'
    -- columns equal). job_history_ended tells a waiter, carries a graph on and moves up a
    -- debounced job, for the rows that need it.
    INSERT INTO {job_history}
    SELECT f.id, f.topic, f.payload, 'done', f.attempts, f.available_at, f.locked_by,
           f.locked_until, f.last_error, f.idempotency_key, f.created_at, now(),
           f.lease_expiries, f.queue, f.priority,
--#if results
           -- `results` holds, for each id of `done`, its result as JSON text or NULL. Only
           -- round trips with a result pay for it (the array lookup cost 1 us per job,
           -- docs/decisions.md). `reported` names the jobs whose handler called
           -- claim.progress(): their last report (`fractions`, `messages`, in its order) is
           -- written with the done, frozen from then on (job_set_done_progress says why);
           -- a round trip with a report and no result takes this variant too, its results
           -- all NULL.
           (%(results)b::text[])[array_position(%(done)b::uuid[], f.id)]::jsonb,
--#else
           f.result,
--#end
           f.errors, f.waited, f.unique_key, f.start_after, f.tags, f.group_key,
           f.upstream_open, f.upstream_failed, f.on_upstream_failure, f.has_downstream,
--#if results
           CASE WHEN f.id = ANY(%(reported)b::uuid[])
               THEN (%(fractions)b::float8[])[array_position(%(reported)b::uuid[], f.id)]
               ELSE f.progress END,
           CASE WHEN f.id = ANY(%(reported)b::uuid[])
               THEN (%(messages)b::text[])[array_position(%(reported)b::uuid[], f.id)]
               ELSE f.progress_message END,
--#else
           f.progress, f.progress_message,
--#end
           f.logs, f.traceparent, f.parked, f.started_at, f.ordering_key
    FROM finished AS f
),
--#if limited
-- First at most one job of the topic under global_limit (`limited`, its cap `cap`),
-- through brooq_claim_limited (migration 0004), which holds the fleet to the cap; then
-- the other topics (`topics` never holds a limited one) for what is left of `limit`. One
-- limited topic per statement, so one advisory lock per transaction: no lock order to
-- get wrong. Only a master with a limited topic runs this; the others pay nothing for
-- the feature.
--#if coordinated
-- _coordinated (and _grouped, the same statement): a topic claimed apart in batches under
-- the same lock, through brooq_claim_batch instead.
--#end
limited AS MATERIALIZED (
    SELECT c.id, c.topic, c.payload, c.attempts, c.locked_by, c.locked_until,
           c.available_at, c.queue, c.priority
--#if coordinated
    -- _coordinated and _grouped: a topic under a rate_limit, a group_limit, a
    -- group_rate_limit or fair_groups, through brooq_claim_batch (migration 0027), a
    -- batch at a time of up to `batch` (the child's pacing: under a rate, as many as its
    -- handlers have been starting within their allowance); under a rate it may answer a
    -- row without an id instead (held back: when the window has room). The statements of
    -- topics without limits (one queue, _queues) are not changed.
    FROM {brooq_claim_batch}(%(limited)s, %(cap)s::integer, %(rate)s::integer,
                           %(window)s::float8, %(group_cap)s::integer,
                           %(group_rate)s::integer, %(group_window)s::float8,
                           %(in_turn)s::boolean, %(allowance)s::float8,
                           %(queues)b::text[], %(done)b::uuid[], %(worker)s, %(lease)s,
                           least(%(limit)s::integer, %(batch)s::integer)) AS c
--#else
    FROM {brooq_claim_limited}(%(limited)s, %(cap)s, %(queues)b::text[], %(done)b::uuid[],
                             %(worker)s, %(lease)s, least(%(limit)s, 1)) AS c
--#end
),
--#end
next AS MATERIALIZED (
--#if queues
    -- The queues are tried in the order of the `queues` array (the child's weighted round
    -- robin puts a different queue first from round to round): a queue with fewer ready
    -- rows than the limit spills into the next. A subquery with FOR UPDATE is never
    -- flattened and its lateral reference makes a nested loop over the array, whose rows
    -- come in array order; inside, LockRows sits under the inner LIMIT (skipped rows do
    -- not count) and the outer LIMIT pulls row by row, so the rows locked are the rows
    -- returned. The inner LIMIT is required: without it the generic plan sorted every
    -- ready row (docs/decisions.md).
    SELECT j.id
--#if floored
    -- _floored: each row of the arrays is a queue's range of priorities [lo, hi], read from
    -- the position (`floor`, `floor_id`) on (brooq.worker.floors), the ranges in claim
    -- order (a queue's from the highest priority down). For a range of one priority the
    -- index is entered at (queue, priority, floor, floor_id), past the entries of the jobs
    -- claimed before, which stay until a VACUUM (longer under a held snapshot); the other
    -- ranges are read whole.
    FROM unnest(%(queues)b::text[], %(lows)b::int2[], %(highs)b::int2[],
                %(floors)b::timestamptz[], %(floor_ids)b::uuid[]) AS q(name, lo, hi, floor,
                                                                     floor_id)
--#else
    FROM unnest(%(queues)b::text[]) AS q(name)
--#end
    CROSS JOIN LATERAL (
        SELECT job.id
        FROM {job}
        WHERE job.queue = q.name
--#if floored
          AND job.priority <= q.hi AND job.priority >= q.lo
          AND (job.available_at, job.id) >= (q.floor, q.floor_id)
--#end
          AND job.state IN ('pending', 'failed')
          AND job.available_at <= now()
          AND job.topic = ANY(%(topics)b::text[])
--#if limited
          -- A master whose topics are all limited claims no other: a one-time filter
          -- then skips the scan, which in a generic plan would walk every ready row of
          -- the queue (13.6 ms with 20,000 of the limited topic's, under its lock).
          AND cardinality(%(topics)b::text[]) > 0
--#end
        ORDER BY job.priority DESC, job.available_at, job.id
        LIMIT %(limit)s
--#else
    SELECT id
    FROM {job}
    WHERE queue = %(queue)s
      AND state IN ('pending', 'failed')
      AND available_at <= now()
      AND topic = ANY(%(topics)b::text[])
    ORDER BY priority DESC, available_at, id
    -- At most a fair share of what is ready, so that at the end of a burst one child
    -- does not take the last jobs as a batch while its siblings find none. The count
    -- stops at what could matter (limit x children rows) and locks nothing. A claim of
    -- one job skips it (its share is that job or none, which the scan finds anyway): the
    -- count walks the front of the ready index a second time, and under a held snapshot
    -- that front holds every job claimed since.
    LIMIT CASE WHEN %(limit)s <= 1 THEN %(limit)s ELSE least(%(limit)s, (
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
    )) END
--#end
    -- The lock: the last clause of `next` for one queue, of the lateral subquery for several.
    FOR NO KEY UPDATE{if queues: OF job} SKIP LOCKED
--#if queues
    ) AS j
    -- At most a fair share of what is ready, as for one queue, the count over the queues
    -- (skipped for a claim of one job, as for one queue).
--#if coordinated
    -- count(id): the held-back answer (a row without an id) is no claim.
    LIMIT least(%(limit)s - (SELECT count(id) FROM limited), (
--#else
--#if limited
    LIMIT least(%(limit)s - (SELECT count(*) FROM limited), (
--#else
    LIMIT CASE WHEN %(limit)s <= 1 THEN %(limit)s ELSE least(%(limit)s, (
--#end
--#end
        SELECT (count(*) + %(children)s - 1) / %(children)s
        FROM (
--#if floored
            SELECT FROM unnest(%(queues)b::text[], %(lows)b::int2[], %(highs)b::int2[],
                               %(floors)b::timestamptz[], %(floor_ids)b::uuid[])
                        AS q(name, lo, hi, floor, floor_id)
--#else
            SELECT FROM unnest(%(queues)b::text[]) AS q(name)
--#end
            CROSS JOIN LATERAL (
                SELECT FROM {job}
                WHERE job.queue = q.name
--#if floored
                  AND job.priority <= q.hi AND job.priority >= q.lo
                  AND (job.available_at, job.id) >= (q.floor, q.floor_id)
--#end
                  AND job.state IN ('pending', 'failed')
                  AND job.available_at <= now()
                  AND job.topic = ANY(%(topics)b::text[])
--#if limited
                  AND cardinality(%(topics)b::text[]) > 0
--#end
                ORDER BY job.priority DESC, job.available_at, job.id
                LIMIT %(limit)s * %(children)s
            ) AS r
            LIMIT %(limit)s * %(children)s
        ) AS ready
    )){if not limited: END}
--#end
),
claimed AS (
    UPDATE {job}
    SET state = 'processing',
        attempts = job.attempts + 1,
        locked_by = %(worker)s,
        locked_until = now() + make_interval(secs => %(lease)s),
        -- Each attempt starts with no progress: an earlier attempt's is not this one's.
        progress = NULL, progress_message = NULL,
        -- The attempt's start, kept once it ended (updated_at is then its end).
        started_at = now(),
        updated_at = now()
    -- By primary key whatever the planner guesses of the LIMIT above (a join here
    -- may become a hash join over the whole table in a generic plan).
    WHERE job.id = ANY(ARRAY(SELECT id FROM next))
    RETURNING job.id, job.topic, job.payload, job.attempts, job.locked_by, job.locked_until,
              job.available_at, job.queue, job.priority
)
SELECT true AS claimed, id, topic, payload, attempts, locked_by, locked_until, available_at,
       queue, priority
--#if limited
FROM limited
UNION ALL
SELECT true, id, topic, payload, attempts, locked_by, locked_until, available_at, queue,
       priority
--#end
FROM claimed
UNION ALL
SELECT false, d.id, NULL::text, NULL::jsonb, NULL::integer, NULL::text, NULL::timestamptz,
       NULL::timestamptz, NULL::text, NULL::smallint
FROM unnest(%(done)b::uuid[]) AS d(id)
WHERE d.id NOT IN (SELECT id FROM finished)

-- name: queue_paused_names
-- Which of the given queues are paused: a child reads it at most poll_interval apart
-- and leaves those out of its claims, so a pause holds fleet-wide within poll_interval.
SELECT name FROM {brooq_queue} WHERE paused AND name = ANY(%(queues)s::text[])

-- template: job_release_ids
-- variant: job_release_ids
-- variant: job_release_ids_rated: rated
-- A worker gives back jobs it claimed but will not run (drain, a long job in a batch;
-- the master does it for a child whose job runs long): pending, the attempt refunded.
-- available_at stays (it is in the past), so the jobs are claimable at once and keep
-- their place in the FIFO order. _rated: claims of a topic under a rate that go back
-- unstarted (a late start): the places they took in the topic's window and in their
-- groups' are set free again (brooq_window_give_back, migration 0029), in the same
-- transaction; the turn's own parameters (brooq.worker.pacing.turns) name the windows.
--#if rated
WITH released AS (
--#end
UPDATE {job}
SET state = 'pending', attempts = greatest(attempts - 1, 0),
    locked_by = NULL, locked_until = NULL, updated_at = now()
WHERE id = ANY(%(ids)b::uuid[]) AND (state = 'processing') IS TRUE AND locked_by = %(worker)s
--#if rated
RETURNING id, group_key, started_at
)
SELECT {brooq_window_give_back}(
    %(topic)s::text, %(rate)s::integer, %(window)s::float8, %(group_rate)s::integer,
    %(group_window)s::float8, %(allowance)s::float8,
    ARRAY(SELECT r.group_key FROM released r), ARRAY(SELECT r.started_at FROM released r)
) AS freed
--#else
RETURNING id
--#end

-- template: job_set_done
-- variant: job_set_done
-- variant: job_set_done_logs: logs
-- variant: job_set_done_progress: progress
-- variant: job_set_done_logs_progress: logs, progress
-- `done` with chained jobs or on_success hooks, in their transaction; `result` is what
-- the handler returned as JSON text, or NULL. _logs (a keep_logs handler's attempt that
-- logged): the attempt's log text appended to job.logs, the last 20 attempts kept.
-- _progress (an attempt whose handler called claim.progress()): its last report, which
-- the master may not have written yet, written with the outcome; from then on the row is
-- not 'processing' and the master's job_write_progress leaves it alone: the progress is
-- frozen with the outcome.
UPDATE {job} SET state = 'done', result = %(result)s::jsonb,
    --#if progress
    progress = %(progress)s::float8, progress_message = %(progress_message)s::text,
    --#end
    --#if logs
    logs = jsonb_path_query_array(
        coalesce(job.logs, '[]'::jsonb)
            || jsonb_build_object('attempt', job.attempts, 'at', now(), 'text', %(logs)s::text),
        '$[last - 19 to last]'),
    --#end
    updated_at = now()
WHERE id = %(id)s AND (state = 'processing') IS TRUE AND locked_by = %(worker)s

-- name: session_planner_defaults
-- The children's connections run without bitmap or sequential scans or sorts and with
-- generic plans (brooq/worker/connection.py says why); the application's on_success
-- writes, in the same transaction, get the planner's defaults back.
SELECT set_config('enable_bitmapscan', 'on', true), set_config('enable_seqscan', 'on', true),
       set_config('enable_sort', 'on', true), set_config('plan_cache_mode', 'auto', true)

-- template: job_set_failed
-- variant: job_set_failed
-- variant: job_set_failed_logs: logs
-- variant: job_set_failed_progress: progress
-- variant: job_set_failed_logs_progress: logs, progress
-- A failed attempt: dead when the attempts are used up, else failed until the backoff
-- has passed. The refund flag gives the attempt back (PreserveAttempt), which never leads to dead.
-- The error history gets one entry in the same UPDATE (brooq_errors_append, migration
-- 0018: the last 20 kept, oldest first, tracebacks on the newest 5). In SET, job.attempts
-- is the value before this UPDATE: this attempt's number, charged at claim (a refunded
-- attempt's number comes again), and job.updated_at the claim's time. history_error is
-- the error bounded to 1,000 characters (last_error keeps 2,000); kind says how the
-- attempt failed (raised, timeout, refused; killed or worker_died when the master writes
-- it); traceback is brooq.ipc.tracebacks' bounded text, or NULL.
-- _logs: as job_set_done_logs.
-- _progress: as job_set_done_progress (a retry's next claim sets it back to NULL).
UPDATE {job}
SET state = CASE
        WHEN NOT %(refund)s AND attempts >= %(max_attempts)s THEN 'dead'
        ELSE 'failed'
    END,
    attempts = CASE WHEN %(refund)s THEN greatest(attempts - 1, 0) ELSE attempts END,
    available_at = now() + make_interval(secs => %(delay)s),
    --#if progress
    progress = %(progress)s::float8, progress_message = %(progress_message)s::text,
    --#end
    last_error = %(error)s,
    errors = {brooq_errors_append}(job.errors, jsonb_build_object(
        'attempt', job.attempts, 'at', now(), 'started_at', job.updated_at,
        'worker', %(worker)s::text, 'error', %(history_error)s::text,
        'kind', %(kind)s::text, 'traceback', %(traceback)s::text)),
    --#if logs
    logs = jsonb_path_query_array(
        coalesce(job.logs, '[]'::jsonb)
            || jsonb_build_object('attempt', job.attempts, 'at', now(), 'text', %(logs)s::text),
        '$[last - 19 to last]'),
    --#end
    updated_at = now()
WHERE id = %(id)s AND (state = 'processing') IS TRUE AND locked_by = %(worker)s
RETURNING state

-- template: job_set_canceled
-- variant: job_set_canceled
-- variant: job_set_canceled_logs: logs
-- variant: job_set_canceled_progress: progress
-- variant: job_set_canceled_logs_progress: logs, progress
-- _logs: as job_set_done_logs. _progress: as job_set_done_progress.
-- The handler's CancelJob is its attempt's end: an entry in the error history (kind
-- canceled, with where it was raised), as job_set_failed appends one.
UPDATE {job} SET state = 'canceled', last_error = %(error)s,
    errors = {brooq_errors_append}(job.errors, jsonb_build_object(
        'attempt', job.attempts, 'at', now(), 'started_at', job.updated_at,
        'worker', %(worker)s::text, 'error', %(history_error)s::text,
        'kind', 'canceled', 'traceback', %(traceback)s::text)),
    --#if progress
    progress = %(progress)s::float8, progress_message = %(progress_message)s::text,
    --#end
    --#if logs
    logs = jsonb_path_query_array(
        coalesce(job.logs, '[]'::jsonb)
            || jsonb_build_object('attempt', job.attempts, 'at', now(), 'text', %(logs)s::text),
        '$[last - 19 to last]'),
    --#end
    updated_at = now()
WHERE id = %(id)s AND (state = 'processing') IS TRUE AND locked_by = %(worker)s

-- name: job_traceparents
-- The trace context of claimed jobs enqueued under a producer span (brooq.worker.spans):
-- run once per claim round trip, and only by a child whose application configured a
-- tracer provider; a job enqueued without tracing is not in the answer.
SELECT id, traceparent FROM {job}
WHERE id = ANY(%(ids)b::uuid[]) AND traceparent IS NOT NULL
