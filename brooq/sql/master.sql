-- What brooq-master runs besides its children: lease renewal, the reaper, retention,
-- vacuum, periodic jobs, the answers to stack requests and the wake-up channel.

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
    errors = {brooq_errors_append}(errors, jsonb_build_object(
        'attempt', attempts, 'at', now(), 'started_at', updated_at,
        'error', 'in flight when its worker died (' || (lease_expiries + 1)::text
            || ' of ' || %(max_expiries)s::text || '): ' || %(cause)s,
        'worker', locked_by, 'kind', 'worker_died', 'traceback', NULL::text)),
    locked_by = NULL, locked_until = NULL, updated_at = now()
WHERE id = ANY(%(ids)s::uuid[]) AND state = 'processing' AND locked_by = %(worker)s
RETURNING id, topic, state

-- name: job_get_held
-- The job a dead worker was running, if it still holds it.
SELECT id, topic, attempts FROM {job}
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

-- name: job_write_progress
-- The running handlers' last claim.progress() reports, read off the children's boards
-- (brooq/supervisor/duties/progress.py, a short tick, run only when a child reported
-- since the last write). Each is written only while its job is still processing under
-- the attempt that reported it, held by the child that runs it: once an outcome is
-- written (it carries the attempt's last report) no later write changes it, and an
-- earlier attempt's report never reaches a later attempt. A locked row is skipped, never
-- waited for (most often the child's own outcome transaction): its id comes back with
-- written = false when the row still looked processing, and the next tick tries again.
WITH reported AS (
    SELECT * FROM unnest(%(ids)b::uuid[], %(workers)b::text[], %(attempts)b::int4[],
                         %(progress)b::float8[], %(messages)b::text[])
        AS r(id, worker, attempt, progress, message)
), lockable AS (
    SELECT job.id, r.progress, r.message
    FROM {job}
    JOIN reported AS r ON job.id = r.id AND job.locked_by = r.worker
                      AND job.attempts = r.attempt
    WHERE (job.state = 'processing') IS TRUE
    FOR NO KEY UPDATE OF job SKIP LOCKED
), written AS (
    UPDATE {job} SET progress = lockable.progress, progress_message = lockable.message
    FROM lockable
    WHERE job.id = lockable.id
    RETURNING job.id
)
SELECT id, true AS written FROM written
UNION ALL
SELECT job.id, false
FROM {job}
JOIN reported AS r ON job.id = r.id AND job.locked_by = r.worker AND job.attempts = r.attempt
WHERE (job.state = 'processing') IS TRUE AND job.id NOT IN (SELECT id FROM lockable)

-- template: job_reap_expired
-- variant: job_reap_expired
-- variant: job_reap_expired_except: except
-- variant: job_reap_expired_one: one
-- Expired leases go back to pending with the attempt charged at claim refunded: an expired
-- lease is a crash, not a recorded failure, and never brings a job closer to dead through
-- max_attempts. What bounds a job that takes its whole host down each time is its count
-- of expiries: the one that reaches %(max_expiries)s makes it dead, with the reason.
-- The state check is made again on the locked row, so an outcome committed meanwhile
-- survives, and several masters may run this at once. A locked row is skipped, not
-- waited for: someone (its holder's outcome transaction, often) is writing it; if it is
-- still expired afterwards, the next pass takes it.
-- _except: every expired lease but the jobs `skip`, which the reaper holds back (their
-- write failed: brooq/supervisor/duties/reaper.py); _one: the job `id` alone, if its
-- lease expired (the reaper's job-by-job pass, after the statement for all had failed).
WITH expired AS (
    SELECT id
    FROM {job}
    WHERE state = 'processing' AND locked_until < now()
    --#if except
      AND id <> ALL(%(skip)b::uuid[])
    --#end
    --#if one
      AND id = %(id)s
    --#end
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
    -- Appended by brooq_errors_append (migration 0018); no traceback: nobody saw the stack.
    errors = {brooq_errors_append}(job.errors, jsonb_build_object(
        'attempt', job.attempts, 'at', now(), 'started_at', job.updated_at,
        'error', 'lease expired (' || (job.lease_expiries + 1)::text || ' of '
            || %(max_expiries)s::text || '): '
            || CASE WHEN job.lease_expiries + 1 >= %(max_expiries)s
                    THEN 'dead, the workers running it vanished (host lost or frozen?)'
                    ELSE 'back to pending, the attempt refunded'
               END,
        'worker', job.locked_by, 'kind', 'lease_expired', 'traceback', NULL::text)),
    locked_by = NULL, locked_until = NULL,
    available_at = now(), updated_at = now()
FROM expired
WHERE job.id = expired.id AND job.state = 'processing' AND job.locked_until < now()
RETURNING job.id, job.topic, job.state, job.lease_expiries

-- name: job_expired_ids
-- The expired leases, at most %(limit)s, but the jobs %(skip)b: the reaper's job-by-job
-- pass, when job_reap_expired failed (one row's write fails: a trigger of the
-- application's raising, a statement timeout), takes them one at a time.
SELECT id FROM {job}
WHERE state = 'processing' AND locked_until < now() AND id <> ALL(%(skip)b::uuid[])
LIMIT %(limit)s

-- name: job_promote_orphans
-- The reaper's pass also moves up a debounced job left waiting with no job before it:
-- one whose unique_key has no pending, failed or processing job (migration 0011's
-- triggers move it up when that job ends; this catches a producer that updated it and
-- rolled back while the key's job ended, or a key's job deleted by hand). A few at a
-- time, locked rows skipped; brooq_job_promote(id, false) waits at most 100 ms for a
-- lock and leaves the job waiting when a job took the key meanwhile.
SELECT count(*) FILTER (WHERE {brooq_job_promote}(orphan.id, false)) AS promoted
FROM (
    SELECT waiting.id FROM {job} AS waiting
    WHERE waiting.unique_key IS NOT NULL AND waiting.start_after IS NOT NULL
      AND waiting.state = 'pending'
      AND NOT EXISTS (
          SELECT FROM {job} AS head
          WHERE head.topic = waiting.topic AND head.unique_key = waiting.unique_key
            AND head.start_after IS NULL
            AND head.state IN ('pending', 'failed', 'processing'))
    LIMIT 100
    FOR NO KEY UPDATE SKIP LOCKED
) AS orphan

-- name: job_delete_expired
-- Retention of the terminal rows left in job (those that ended before migration 0020, or
-- written there by hand): one batch of those older than the TTL, oldest first, with their
-- idempotency keys, steps and event waits. SKIP LOCKED
-- lets several masters delete different rows instead of waiting for each other. A job
-- that a job not yet ended waits for or reads (has_downstream, and an edge to a row in
-- waiting, pending, failed or processing: claim.upstream reads it) stays; the edges of
-- the deleted rows go with them, in the same statement. Jobs outside graphs pay the
-- test of has_downstream.
WITH gone AS (
    DELETE FROM {job}
    WHERE id IN (
        SELECT t.id FROM {job} AS t
        WHERE t.state IN ('done', 'dead', 'canceled')
          AND t.updated_at < now() - make_interval(secs => %(ttl)s)
          AND (t.has_downstream IS NOT TRUE OR NOT EXISTS (
              SELECT FROM {brooq_job_edge} AS e JOIN {job} AS d ON d.id = e.downstream_id
              WHERE e.upstream_id = t.id
                AND d.state IN ('waiting', 'pending', 'failed', 'processing')))
        ORDER BY t.updated_at
        LIMIT %(batch)s
        FOR UPDATE OF t SKIP LOCKED
    )
    RETURNING id, topic, has_downstream, upstream_open, idempotency_key
), keys AS (
    -- The idempotency keys of the rows deleted (brooq_job_key, migration 0020) go with them.
    DELETE FROM {brooq_job_key} AS k USING gone
    WHERE gone.idempotency_key IS NOT NULL AND k.topic = gone.topic
      AND k.idempotency_key = gone.idempotency_key AND k.job_id = gone.id
), steps AS (
    DELETE FROM {brooq_job_step} AS s WHERE s.job_id = ANY(ARRAY(SELECT id FROM gone))
), waits AS (
    DELETE FROM {brooq_event_wait} AS w WHERE w.job_id = ANY(ARRAY(SELECT id FROM gone))
), edges_in AS (
    -- By index, whatever the planner guesses: the edges' key for a deleted downstream
    -- job, brooq_job_edge_upstream_idx for a deleted upstream one.
    DELETE FROM {brooq_job_edge} AS e
    WHERE e.downstream_id = ANY(ARRAY(SELECT id FROM gone WHERE upstream_open IS NOT NULL))
), edges_out AS (
    DELETE FROM {brooq_job_edge} AS e
    WHERE e.upstream_id = ANY(ARRAY(SELECT id FROM gone WHERE has_downstream))
)
SELECT topic FROM gone

-- name: history_prepare
-- The partitions of job_history from the end of the newest one until `until`, each
-- `step` seconds long, at most `max` per call (migration 0020: made alone, rows of the
-- default partition in its range moved in, then attached under SHARE UPDATE EXCLUSIVE,
-- which outcomes do not wait for). Returns how many were made.
SELECT {brooq_history_prepare}(make_interval(secs => %(step)s), now(),
                               now() + make_interval(secs => %(ahead)s), %(max)s) AS made

-- name: history_expired
-- The partitions of job_history whose every job ended more than `ttl` seconds ago (their
-- upper bound), oldest first, with an estimate of their rows (the catalog's: no count).
SELECT e.name, e.upper_bound, greatest(c.reltuples, 0)::bigint AS rows
FROM {brooq_history_expired}(now() - make_interval(secs => %(ttl)s)) AS e
JOIN pg_class AS c ON c.relname = e.name
    AND c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = {job_history:name}::regclass)

-- name: history_release_keys
-- A partition's idempotency keys, a batch in id order after `after`, in its own
-- transaction: the last id read, the jobs read (fewer than `batch`: the last batch) and
-- the keys released.
SELECT r.last_id, r.seen, r.released
FROM {brooq_history_release_keys}(%(name)s, %(after)s::uuid, %(batch)s) AS r

-- name: history_release_links
-- Once its keys are released, a partition's edges, steps and event waits.
SELECT {brooq_history_release_links}(%(name)s)

-- name: history_lock_timeout
-- The drop's own lock_timeout, for its transaction only: outcomes queue behind a waiting
-- ACCESS EXCLUSIVE request, so it gives up soon and is tried again next pass.
SELECT set_config('lock_timeout', %(timeout)s, true)

-- name: history_drop
-- A partition detached and dropped (ACCESS EXCLUSIVE on job_history for the catalog
-- change: the caller's lock_timeout bounds what outcomes wait), upstream jobs a job not
-- yet ended reads kept in the default partition. Returns the rows kept.
SELECT {brooq_history_drop}(%(name)s) AS kept

-- name: history_expire_default
-- The default partition's jobs that ended more than `ttl` seconds ago, a batch.
SELECT t AS topic
FROM {brooq_history_expire_default}(now() - make_interval(secs => %(ttl)s), %(batch)s) AS t

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

-- name: listen_jobs
LISTEN brooq_job

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

-- name: listen_stack_requests
LISTEN brooq_stack

-- name: listen_cancels
-- A processing job canceled (job_cancel's NOTIFY, the job id as payload): the master
-- whose child holds it renews at once, so the handler hears of it now.
LISTEN brooq_cancel

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

-- name: rate_windows_sweep
-- The rates' windows whose every slot is free again (brooq_window_sweep, migration 0012):
-- deleted whole, under their topic's lock if it is free, at most `windows` of them; a
-- window with every slot free holds what an absent one does. Run by the retention duty.
SELECT {brooq_window_sweep}(%(windows)s) AS deleted

-- name: stack_requests_expire
-- Requests older than an hour (their command died before taking them).
DELETE FROM {brooq_stack_request} WHERE requested_at < now() - interval '1 hour'

-- The status page (brooq/web). Every page reads in one read-only REPEATABLE
-- READ transaction (one snapshot: the figures of a page agree with each other) under a
-- transaction-local statement_timeout, and every list is bounded by a LIMIT. Big lists
-- page by keyset (updated_at, id), never by OFFSET: page 1,000 costs what page 1 costs.

-- name: master_beat
-- A master's beat (brooq/supervisor/duties/beat.py): its row written (inserted at the
-- first beat, and again if another master swept it while this one could not beat),
-- the rows that missed `missed` of their own beats deleted when `sweep` (every few
-- beats, not every one), and the (queue, topic) pairs the other live masters handle
-- (every queue of a row with every topic of it: a master runs the jobs of its topics
-- in the queues it works) read back. One statement, sent off the loop with libpq's $n
-- placeholders in text: $1 id, $2 host, $3 pid, $4 version, $5 app, $6 queues and $7
-- topics (JSON arrays of text), $8 children (a JSON array), $9 beat_seconds, $10
-- started_at, $11 missed, $12 sweep, $13 limits (a JSON object: per topic, its
-- global_limit, rate_limit, group_limit and group_rate_limit as given). The SELECT
-- reads the snapshot from before the statement's own writes, so the master adds its own
-- pairs itself.
WITH me AS (
    INSERT INTO {brooq_master} (id, host, pid, version, app, queues, topics, children,
                                beat_seconds, started_at, seen_at, limits)
    VALUES ($1::uuid, $2, $3::int4, $4, $5,
            ARRAY(SELECT jsonb_array_elements_text($6::jsonb)),
            ARRAY(SELECT jsonb_array_elements_text($7::jsonb)),
            $8::jsonb, $9::float8, $10::timestamptz, now(), $13::jsonb)
    ON CONFLICT (id) DO UPDATE
    SET children = EXCLUDED.children, beat_seconds = EXCLUDED.beat_seconds, seen_at = now(),
        queues = EXCLUDED.queues, topics = EXCLUDED.topics, limits = EXCLUDED.limits
    RETURNING id
), gone AS (
    DELETE FROM {brooq_master}
    WHERE $12::bool AND id <> $1::uuid
      AND seen_at < now() - make_interval(secs => beat_seconds * $11::int4)
    RETURNING id
)
SELECT q.queue, t.topic
FROM (SELECT queues, topics FROM {brooq_master}
      WHERE id <> $1::uuid
        AND seen_at >= now() - make_interval(secs => beat_seconds * $11::int4)
      ORDER BY cardinality(queues) * cardinality(topics)) AS m,
     unnest(m.queues) AS q(queue), unnest(m.topics) AS t(topic)
-- Bounded, and not DISTINCT (which would build every pair first): one row of thousands
-- of queues times thousands of topics is millions of pairs, and must not make every
-- other master's beat time out. The smallest rows first; past the bound a pair is not
-- known as handled (at worst an unhandled_topic line).
LIMIT 100000

-- name: master_leave
-- A master stopping (drained, SIGQUIT, fatal) deletes its row: it drops out at once.
DELETE FROM {brooq_master} WHERE id = %(id)s

-- name: child_session_end
-- A dead child's database sessions (brooq/supervisor/leftovers.py), found by the
-- application_name the child connects with, on this database: each one still there is
-- ended (a claim it runs is rolled back, or has committed). No rows: none is left.
SELECT pid, pg_terminate_backend(pid) AS ended
FROM pg_stat_activity
WHERE application_name = %(name)s AND datname = current_database()
  AND pid <> pg_backend_pid()

-- name: child_session_find
-- The same sessions, only looked for (a role that may not end them).
SELECT pid FROM pg_stat_activity
WHERE application_name = %(name)s AND datname = current_database()
  AND pid <> pg_backend_pid()

-- name: job_release_dead_worker
-- The jobs a dead child still holds once none of its sessions is left: a claim that
-- committed after the child died (after the release at its death, which skipped the
-- rows the claim had locked). They never started: pending at once, attempt refunded.
-- No SKIP LOCKED: the child's sessions are gone, and the master's lock_timeout bounds a
-- wait on anyone else. The jobs it was running at its death (``running``) are not
-- touched: their failed attempt is the death's settlement, or the reaper's.
UPDATE {job}
SET state = 'pending', attempts = greatest(job.attempts - 1, 0),
    locked_by = NULL, locked_until = NULL, updated_at = now()
WHERE state = 'processing' AND locked_by = %(worker)s
  AND NOT (id = ANY(%(running)b::uuid[]))
RETURNING id, topic
