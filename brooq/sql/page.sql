-- The status page's reads (brooq.web.reads): read-only, under a statement timeout.

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
-- parked: a durable handler's jobs sleeping or waiting for an event or child jobs
-- (job.parked, read with the state: pending until a wake time or deadline, or waiting).
-- on_hold: held by an operator until released; only its jobs count (never ready: its
-- available_at is its place in line, kept for the release).
SELECT state, queue, topic, count(*) AS jobs,
       count(*) FILTER (WHERE available_at <= now()) AS ready,
       min(available_at) FILTER (
           WHERE state IN ('pending', 'failed') AND available_at <= now()) AS oldest_ready_at,
       count(*) FILTER (WHERE parked IS NOT NULL AND (state = 'waiting' OR (state = 'pending' AND available_at > now()))) AS parked
FROM {job}
WHERE ctid >= %(lo)s::tid AND ctid < %(hi)s::tid
  AND state IN ('pending', 'failed', 'processing', 'dead', 'waiting', 'on_hold')
GROUP BY state, queue, topic

-- name: web_history_pages
-- The finished jobs' table (job_history) in pages: the sum of its partitions' main forks
-- (their files' sizes), for the overview's sample of its dead jobs; 0 without it.
SELECT coalesce(sum(pg_relation_size(p.relid)), 0)
           / current_setting('block_size')::int AS pages
FROM pg_partition_tree(to_regclass({job_history:name})) AS p
WHERE p.isleaf

-- name: web_history_dead_guess
-- How many dead jobs job_history holds, as its partitions' dead-job indexes
-- (job_history_dead_idx, state = 'dead') last counted them (pg_class.reltuples: at their
-- last VACUUM or ANALYZE; a partition never counted adds nothing): a catalog read, for
-- the overview to choose between counting them (web_history_dead_exact, at most `cap`
-- read: a guess too low costs that read) and sampling them.
SELECT coalesce(sum(greatest(c.reltuples, 0)), 0)::bigint AS dead
FROM pg_partition_tree(to_regclass({job_history:name})) AS p
     JOIN pg_index AS i ON i.indrelid = p.relid
     JOIN pg_class AS c ON c.oid = i.indexrelid
WHERE p.isleaf AND pg_get_expr(i.indpred, i.indrelid) = '(state = ''dead''::text)'

-- name: web_history_dead_sample
-- The dead jobs of `percent` per cent of job_history's pages (TABLESAMPLE SYSTEM over
-- every partition, the same pages while the partitions keep their sizes): one row per
-- queue and topic (`jobs`), and one summary row (queue NULL): `jobs` the pages the
-- sample read (for the scale: their number varies by a few per cent), `dead_sum` and
-- `dead_squares` the dead jobs per sampled page summed and their squares summed (for
-- the estimate's margin).
WITH s AS MATERIALIZED (
    SELECT tableoid AS part, (ctid::text::point)[0] AS block, state = 'dead' AS dead,
           queue, topic
    FROM {job_history} TABLESAMPLE SYSTEM (%(percent)s) REPEATABLE (%(seed)s)
), pages AS (
    SELECT count(*) FILTER (WHERE dead) AS dead FROM s GROUP BY part, block
)
SELECT NULL::text AS queue, NULL::text AS topic, count(*) AS jobs,
       coalesce(sum(dead), 0) AS dead_sum, coalesce(sum(dead * dead), 0) AS dead_squares
FROM pages
UNION ALL
SELECT queue, topic, count(*), NULL, NULL FROM s WHERE dead GROUP BY queue, topic

-- name: web_history_dead_exact
-- The dead jobs of job_history, exactly, per queue and topic, through
-- job_history_dead_idx (state = 'dead'); at most `cap` + 1 rows read (state_jobs above
-- `cap`: cut short, not to be shown), the first `groups` groups.
SELECT queue, topic, count(*) AS jobs, sum(count(*)) OVER () AS state_jobs
FROM (SELECT queue, topic FROM {job_history} WHERE state = 'dead' LIMIT %(cap)s + 1) AS d
GROUP BY queue, topic
ORDER BY queue, topic
LIMIT %(groups)s

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
-- short, not to be shown); parked as in web_overview_page.
SELECT state, queue, topic, count(*) AS jobs,
       count(*) FILTER (WHERE available_at <= now()) AS ready,
       min(available_at) FILTER (WHERE available_at <= now()) AS oldest_ready_at,
       sum(count(*)) OVER () AS state_jobs,
       count(*) FILTER (WHERE parked IS NOT NULL AND (state = 'waiting' OR (state = 'pending' AND available_at > now()))) AS parked
FROM (
    SELECT state, queue, topic, available_at, parked FROM {job}
    WHERE state IN ('pending', 'failed') AND queue = ANY(%(queues)s::text[])
    LIMIT %(cap)s + 1
) AS r
GROUP BY state, queue, topic

-- name: web_overview_exact
-- The overview's exact figures, per state, queue and topic, of the states asked for (a
-- false flag: that state is not read at all, a one-time filter). Each state's rows come
-- through its partial index (job_ready_queue_idx or job_ready_idx for pending and failed,
-- job_processing_lease_idx, job_failed_dead_idx of migration 0008, job_waiting_idx of
-- 0013, job_on_hold_idx of 0023), never the finished jobs (dead: the rows still in job,
-- ended before migration 0020; job_history's are web_history_dead_*'s), and at most
-- `cap` + 1 of them: `state_jobs` above `cap` means that state was cut short and its
-- figures are not to be shown (the sample's stand instead), so this statement reads at
-- most six times `cap` rows however large the backlog.
-- jobs = the group's rows in that state; ready = those due now (pending and failed); the
-- first `groups` groups of each state (by queue, topic), state_jobs counting them all;
-- parked as in web_overview_page (pending and waiting only); on_hold: jobs only.
WITH pending AS (
    SELECT queue, topic, available_at, parked FROM {job}
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
), waiting AS (
    SELECT queue, topic, parked FROM {job}
    WHERE state = 'waiting' AND %(waiting)s LIMIT %(cap)s + 1
), on_hold AS (
    SELECT queue, topic FROM {job}
    WHERE state = 'on_hold' AND %(on_hold)s LIMIT %(cap)s + 1
)
(SELECT 'pending' AS state, queue, topic, count(*) AS jobs,
        count(*) FILTER (WHERE available_at <= now()) AS ready,
        min(available_at) FILTER (WHERE available_at <= now()) AS oldest_ready_at,
        sum(count(*)) OVER () AS state_jobs,
        count(*) FILTER (WHERE parked IS NOT NULL AND available_at > now()) AS parked
 FROM pending GROUP BY queue, topic ORDER BY queue, topic LIMIT %(groups)s)
UNION ALL
(SELECT 'failed', queue, topic, count(*), count(*) FILTER (WHERE available_at <= now()),
        min(available_at) FILTER (WHERE available_at <= now()), sum(count(*)) OVER (), 0
 FROM failed GROUP BY queue, topic ORDER BY queue, topic LIMIT %(groups)s)
UNION ALL
(SELECT 'processing', queue, topic, count(*), 0, NULL, sum(count(*)) OVER (), 0
 FROM processing GROUP BY queue, topic ORDER BY queue, topic LIMIT %(groups)s)
UNION ALL
(SELECT 'dead', queue, topic, count(*), 0, NULL, sum(count(*)) OVER (), 0
 FROM dead GROUP BY queue, topic ORDER BY queue, topic LIMIT %(groups)s)
UNION ALL
(SELECT 'waiting', queue, topic, count(*), 0, NULL, sum(count(*)) OVER (),
        count(*) FILTER (WHERE parked IS NOT NULL)
 FROM waiting GROUP BY queue, topic ORDER BY queue, topic LIMIT %(groups)s)
UNION ALL
(SELECT 'on_hold', queue, topic, count(*), 0, NULL, sum(count(*)) OVER (), 0
 FROM on_hold GROUP BY queue, topic ORDER BY queue, topic LIMIT %(groups)s)

-- name: web_now
-- The snapshot's clock, for the chart's minutes and the ages shown.
SELECT now() AS now, date_trunc('minute', now()) AS minute

-- name: web_paused_queues
SELECT name, updated_at FROM {brooq_queue} WHERE paused ORDER BY name LIMIT %(limit)s

-- name: web_done_per_minute
-- Jobs written done in each minute of the last hour (minutes without any are missing;
-- the page fills them with 0), wherever they are: job_history (its partitions of the
-- last hour only: the bound on updated_at, its partition key, prunes the others when the
-- statement starts) and the rows still in job (job_terminal_updated_idx: state = 'done'
-- implies its predicate). At most `cap` + 1 rows: more (a sum above `cap`) and the page
-- shows web_done_per_minute_sample's estimate instead.
SELECT date_trunc('minute', updated_at) AS minute, count(*) AS jobs
FROM (
    SELECT updated_at FROM {job_all}
    WHERE state = 'done'
      AND updated_at >= date_trunc('minute', now()) - interval '59 minutes'
    LIMIT %(cap)s + 1
) AS done
GROUP BY 1
ORDER BY 1

-- name: web_done_per_minute_sample
-- The same, in `percent` per cent of the pages of job and of job_history's partitions
-- of the last hour, picked by TABLESAMPLE SYSTEM (the number of pages it reads varies
-- by a few per cent; a chart needs no more): a throughput of more than `cap` jobs an
-- hour is charted from a sample. `percent` is of web_charts_pages' pages (window: the
-- hour).
SELECT date_trunc('minute', updated_at) AS minute, count(*) AS jobs
FROM (
    SELECT updated_at FROM {job} TABLESAMPLE SYSTEM (%(percent)s) REPEATABLE (%(seed)s)
    WHERE state = 'done'
      AND updated_at >= date_trunc('minute', now()) - interval '59 minutes'
    UNION ALL
    SELECT updated_at FROM {job_history} TABLESAMPLE SYSTEM (%(percent)s) REPEATABLE (%(seed)s)
    WHERE state = 'done'
      AND updated_at >= date_trunc('minute', now()) - interval '59 minutes'
) AS done
GROUP BY 1
ORDER BY 1

-- name: web_in_flight
-- Jobs in state processing, longest running first (updated_at is the claim: lease
-- renewal leaves it alone), one page after the cursor (after_at, after_id), or the first
-- page from a cursor before every row ('-infinity', the nil UUID): one condition, never
-- an OR, so the row comparison stays an index condition. limit is the page size plus one
-- (is there a next page?).
-- `tag`: only the jobs carrying it (NULL: every job), a filter on the rows read in the
-- keyset's order; `topic` and `group` (job.group_key) the same.
SELECT id, topic, queue, attempts, locked_by, updated_at,
       extract(epoch FROM now() - updated_at)::float8 AS running_for,
       extract(epoch FROM locked_until - now())::float8 AS lease_left,
       coalesce(tags, '{}') AS tags, progress, progress_message
FROM {job}
WHERE state = 'processing'
  AND (updated_at, id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
  AND (%(tag)s::text IS NULL OR tags @> ARRAY[%(tag)s::text])
  AND (%(topic)s::text IS NULL OR topic = %(topic)s::text)
  AND (%(group)s::text IS NULL OR group_key = %(group)s::text)
ORDER BY updated_at, id
LIMIT %(limit)s

-- name: web_finished_badly
-- Failed jobs (waiting for a retry; `state` 'failed': the dead ones are web_dead's, most
-- of them in job_history) or the dead still in job, newest first, one page before the cursor
-- (after_at, after_id); the first page from a cursor after every row ('infinity', the
-- max UUID). Through job_failed_dead_idx (migration 0008), (state, updated_at DESC, id
-- DESC): a page reads its 51 entries wherever the cursor is. The last error is cut to
-- `error_chars` characters here, so a page never carries megabytes of tracebacks. `tag`,
-- `topic`, `group`: as in web_in_flight (a page then reads the state's entries until 51
-- match: docs/status-page.md has the cost). `state` 'on_hold': the held jobs, most
-- recently held first (a hold writes updated_at), through job_on_hold_idx (migration
-- 0023), which has no order of its own: a page reads every held row and keeps the top
-- 51, so its cost follows the number of held jobs (docs/status-page.md).
SELECT id, topic, queue, state, attempts, updated_at, available_at,
       left(last_error, %(error_chars)s) AS last_error,
       length(last_error) AS last_error_length,
       coalesce(jsonb_array_length(errors), 0) AS errors_count,
       coalesce(tags, '{}') AS tags
FROM {job}
WHERE state = %(state)s::text
  AND (updated_at, id) < (%(after_at)s::timestamptz, %(after_id)s::uuid)
  AND (%(tag)s::text IS NULL OR tags @> ARRAY[%(tag)s::text])
  AND (%(topic)s::text IS NULL OR topic = %(topic)s::text)
  AND (%(group)s::text IS NULL OR group_key = %(group)s::text)
ORDER BY updated_at DESC, id DESC
LIMIT %(limit)s

-- name: web_dead
-- Dead jobs, newest first, one page before the cursor (after_at, after_id), as
-- web_finished_badly lists the failed ones, wherever they are: job_history's, through
-- job_history_dead_idx (queue, updated_at DESC, id DESC) one queue at a time (its
-- queues by a loose scan of the index: one probe per queue and partition), each queue's
-- partitions newest first and each read until the page is full, merged with the rows
-- still in job (job_failed_dead_idx); `tag`, `topic`, `group` as in web_in_flight.
WITH RECURSIVE queues AS (
    (SELECT queue FROM {job_history} WHERE state = 'dead' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT h.queue FROM {job_history} AS h
            WHERE h.state = 'dead' AND h.queue > q.queue
            ORDER BY h.queue LIMIT 1)
    FROM queues AS q WHERE q.queue IS NOT NULL
), found AS (
    SELECT h.*
    FROM queues AS q
         CROSS JOIN LATERAL (
             SELECT id, topic, queue, state, attempts, updated_at, available_at,
                    last_error, errors, tags
             FROM {job_history}
             WHERE state = 'dead' AND queue = q.queue
               AND (updated_at, id) < (%(after_at)s::timestamptz, %(after_id)s::uuid)
               AND (%(tag)s::text IS NULL OR tags @> ARRAY[%(tag)s::text])
               AND (%(topic)s::text IS NULL OR topic = %(topic)s::text)
               AND (%(group)s::text IS NULL OR group_key = %(group)s::text)
             ORDER BY updated_at DESC, id DESC
             LIMIT %(limit)s
         ) AS h
    WHERE q.queue IS NOT NULL
    UNION ALL
    (SELECT id, topic, queue, state, attempts, updated_at, available_at, last_error, errors,
            tags
     FROM {job}
     WHERE state = 'dead'
       AND (updated_at, id) < (%(after_at)s::timestamptz, %(after_id)s::uuid)
       AND (%(tag)s::text IS NULL OR tags @> ARRAY[%(tag)s::text])
       AND (%(topic)s::text IS NULL OR topic = %(topic)s::text)
       AND (%(group)s::text IS NULL OR group_key = %(group)s::text)
     ORDER BY updated_at DESC, id DESC
     LIMIT %(limit)s)
)
SELECT id, topic, queue, state, attempts, updated_at, available_at,
       left(last_error, %(error_chars)s) AS last_error,
       length(last_error) AS last_error_length,
       coalesce(jsonb_array_length(errors), 0) AS errors_count,
       coalesce(tags, '{}') AS tags
FROM found
ORDER BY updated_at DESC, id DESC
LIMIT %(limit)s

-- name: web_job_get
-- One job, active or finished (job, then job_history: a job is in one of them; the
-- history's partitions that ended before the job was enqueued are skipped when the
-- statement is planned: brooq_history_floor of its id), every column whatever
-- migrations added (the page lists them in table order), bounded: the kept logs are not
-- in it (web_job_logs reads their tails), and traceparent is given only in the W3C form
-- of version 00 (55 characters; NULL otherwise, its length in traceparent_chars), so a
-- page never carries megabytes of a column. The row is the table's own, two of its
-- fields replaced (jsonb_populate_record), each table's row read as its own (a row of
-- job_all, a view, would be built whole first, its logs read in full).
SELECT r.*, length(j.traceparent) AS traceparent_chars
FROM {job} AS j,
     LATERAL jsonb_populate_record(j, jsonb_build_object(
         'logs', NULL,
         'traceparent',
         CASE WHEN j.traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
              THEN j.traceparent END)) AS r
WHERE j.id = %(id)s
UNION ALL
SELECT r.*, length(h.traceparent)
FROM {job_history} AS h,
     LATERAL jsonb_populate_record(h, jsonb_build_object(
         'logs', NULL,
         'traceparent',
         CASE WHEN h.traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
              THEN h.traceparent END)) AS r
WHERE h.id = %(id)s AND h.updated_at >= {brooq_history_floor}(%(id)s)
LIMIT 1

-- name: web_job_logs
-- The kept logs of a job (job.logs, one entry per attempt; read as web_job_get reads the
-- row), the last `attempts` entries
-- (newest first), each cut to its last `chars` characters: `text_bytes` is the whole
-- text's size in bytes, `shown_bytes` what is shown of it. A page of 20 attempts of
-- 1 MiB each carries 20 tails; `brooq jobs logs ID` prints them whole. Each entry's
-- text is taken out once and cut once (a LATERAL each), and `entries` counts the
-- elements read: each expression of the select list would read its megabyte again, and
-- jsonb_array_length(logs) the whole column for every row.
SELECT l.position, l.entry->>'attempt' AS attempt, l.entry->>'at' AS at,
       c.tail AS text,
       coalesce(octet_length(t.full_text), 0) AS text_bytes,
       coalesce(octet_length(c.tail), 0) AS shown_bytes,
       count(*) OVER () AS entries
FROM {job_all} AS j,
     LATERAL jsonb_array_elements(
         CASE WHEN jsonb_typeof(j.logs) = 'array' THEN j.logs ELSE '[]'::jsonb END
     ) WITH ORDINALITY AS l(entry, position),
     LATERAL (SELECT l.entry->>'text' AS full_text OFFSET 0) AS t,
     LATERAL (SELECT right(t.full_text, %(chars)s) AS tail OFFSET 0) AS c
WHERE j.id = %(id)s AND j.updated_at >= {brooq_history_floor}(%(id)s)
ORDER BY l.position DESC
LIMIT %(attempts)s

-- name: web_job_upstream
-- The jobs a job waits or waited for (in job or job_history), in the order it named
-- them, at most `limit` (no result: the page shows id, topic and state); `total` counts them all, up to `cap` + 1.
SELECT u.id, u.topic, u.state,
       (SELECT count(*) FROM (
            SELECT 1 FROM {brooq_job_edge} AS x JOIN {job_all} AS y ON y.id = x.upstream_id
            WHERE x.downstream_id = %(id)s AND x.position > 0 LIMIT %(cap)s + 1) AS c) AS total
FROM {brooq_job_edge} AS e JOIN {job_all} AS u ON u.id = e.upstream_id
WHERE e.downstream_id = %(id)s AND e.position > 0  -- not a durable handler's children
ORDER BY e.position
LIMIT %(limit)s

-- name: web_job_downstream
-- The jobs that wait or waited for a job (in job or job_history), by id (enqueue
-- order), at most `limit`;
-- `total` counts them all, up to `cap` + 1 (a fan-out may hold many more than a page).
SELECT d.id, d.topic, d.state,
       (SELECT count(*) FROM (
            SELECT 1 FROM {brooq_job_edge} AS x JOIN {job_all} AS y ON y.id = x.downstream_id
            WHERE x.upstream_id = %(id)s LIMIT %(cap)s + 1) AS c) AS total
FROM {brooq_job_edge} AS e JOIN {job_all} AS d ON d.id = e.downstream_id
WHERE e.upstream_id = %(id)s
ORDER BY d.id
LIMIT %(limit)s

-- name: web_in_recovery
-- Whether the page reads a standby (QUEUE_READ_DATABASE_URL): its sessions are not the
-- primary's, so the overview names no snapshot holder there.
SELECT pg_is_in_recovery() AS standby

-- name: web_job_steps
-- A durable handler's recorded steps (brooq_job_step), oldest first, at most `limit`:
-- the name (cut to `name_chars` characters), when recorded and the size of the result's
-- JSON text in bytes, never the result itself; `total` counts them all, up to `cap` + 1.
-- brooq's own steps (__sleep:, __event:, __spawn:, ...) are listed too.
SELECT left(s.name, %(name_chars)s) AS name, length(s.name) AS name_chars,
       s.created_at, octet_length(s.result::text) AS size,
       (SELECT count(*) FROM (
            SELECT 1 FROM {brooq_job_step} AS x WHERE x.job_id = %(id)s
            LIMIT %(cap)s + 1) AS c) AS total
FROM {brooq_job_step} AS s
WHERE s.job_id = %(id)s
ORDER BY s.created_at, s.name
LIMIT %(limit)s

-- name: web_job_event_wait
-- The event key a parked job waits for (cut to `key_chars` characters), and since when.
SELECT left(key, %(key_chars)s) AS key, length(key) AS key_chars, since
FROM {brooq_event_wait} WHERE job_id = %(id)s

-- name: web_job_children
-- The jobs a job spawned (claim.spawn: its __spawn: steps; in job or job_history), in
-- the order spawned, at most `limit`; `total` counts them all, up to `cap` + 1.
SELECT c.id, c.topic, c.state,
       (SELECT count(*) FROM (
            SELECT 1 FROM {brooq_job_step} AS x
            WHERE x.job_id = %(id)s AND x.name LIKE '\_\_spawn:%%'
            LIMIT %(cap)s + 1) AS n) AS total
FROM {brooq_job_step} AS s JOIN {job_all} AS c ON c.id = (s.result #>> '{}')::uuid
WHERE s.job_id = %(id)s AND s.name LIKE '\_\_spawn:%%'
ORDER BY s.created_at, c.id
LIMIT %(limit)s

-- name: web_charts_memory
-- The charts' statement keeps its sources' rows (tens of thousands, narrow) for several
-- aggregates: a transaction-local work_mem that holds them, so it writes no temporary
-- file (with the server's default a busy hour's rows spill to disk).
SELECT set_config('work_mem', %(work_mem)s, true)

-- name: web_charts_pages
-- The pages web_charts_sample and web_done_per_minute_sample sample: job's and those
-- of job_history's partitions that may hold a row of the window (the last `buckets` of
-- `step` seconds: a partition whose upper bound is past the window's start, and the
-- default one), for the per cent of them that makes about the pages wanted.
SELECT (coalesce(pg_relation_size(to_regclass({job:name})), 0)
        + coalesce((
            SELECT sum(pg_relation_size(p.relid))
            FROM pg_partition_tree(to_regclass({job_history:name})) AS p
                 JOIN pg_class AS c ON c.oid = p.relid
                 CROSS JOIN LATERAL (
                     SELECT substring(pg_get_expr(c.relpartbound, c.oid)
                                      FROM 'TO \(''([^'']+)''\)')::timestamptz AS upper_bound
                 ) AS b
            WHERE p.isleaf
              AND (b.upper_bound IS NULL OR b.upper_bound > to_timestamp(
                  (floor(date_part('epoch', now()) / %(step)s) - %(buckets)s + 1) * %(step)s))
          ), 0))
       / current_setting('block_size')::int AS pages

-- name: web_charts_sizes
-- How many rows web_charts' sources hold, each counted up to `cap` + 1 (an index-only
-- scan of its index, after VACUUM), so that a window whose source is past its cap is read
-- from the sample at once instead of after reading `cap` rows for nothing. The ended
-- jobs: job_history's partitions of the window (the bound on updated_at, its partition
-- key, prunes the others when the statement starts; every row there has ended) and the
-- rows still in job.
SELECT (SELECT count(*) FROM (
            SELECT 1 FROM {job}
            WHERE state IN ('done', 'dead', 'canceled')
              AND updated_at >= to_timestamp(
                  (floor(date_part('epoch', now()) / %(step)s) - %(buckets)s + 1) * %(step)s)
            UNION ALL
            SELECT 1 FROM {job_history}
            WHERE updated_at >= to_timestamp(
                  (floor(date_part('epoch', now()) / %(step)s) - %(buckets)s + 1) * %(step)s)
            LIMIT %(cap)s + 1) AS a) AS ended,
       (SELECT count(*) FROM (
            SELECT 1 FROM {job}
            WHERE state = 'failed'
              AND updated_at >= to_timestamp(
                  (floor(date_part('epoch', now()) / %(step)s) - %(buckets)s + 1) * %(step)s)
            LIMIT %(cap)s + 1) AS b) AS failed,
       (SELECT count(*) FROM (
            SELECT 1 FROM {job}
            WHERE state IN ('pending', 'failed') AND available_at <= now()
            LIMIT %(cap)s + 1) AS c) AS ready

-- template: web_charts
-- variant: web_charts
-- variant: web_charts_sample: sample
-- The charts of the status page (docs/status-page.md, "Charts"): per bucket of `step`
-- seconds, the last `buckets` of them (the last one the current, partial, bucket), of
-- the jobs of `queue` and `topic` (NULL: every one), one row per series and bucket:
--   done, dead: jobs that ended so (updated_at is when a terminal row was written);
--   failed: failed attempts, the entries of job.errors whose `at` falls in the bucket
--     (a dead job's last attempt included; each job keeps its last 20 entries);
--   run: the run time of the attempts that ended in the bucket (p = its 50th, 95th and
--     99th percentiles, in seconds): a done job's last attempt (updated_at, its end,
--     less started_at, its claim) and the failed, canceled or dead attempts whose
--     history entry carries `started_at`;
--   pickup: due to claim of the attempts claimed in the bucket (started_at less
--     available_at, the attempt's own due time), whether they ended or not, of the rows
--     whose available_at is still that attempt's: the ones processing, done or
--     canceled (a failed attempt moves available_at to its retry; a processing row an
--     older master claimed has no started_at: its updated_at is the claim);
--   backlog: +1 in the bucket a job became ready (available_at, or the window's start;
--     a job given back to the ready ones, updated_at), -1 in the bucket it was claimed
--     (started_at) or, never claimed, canceled (updated_at); the page adds them up from
--     the window's start. Each row's current attempt only: an earlier attempt's due
--     time is not kept.
--   rows:<part>: the rows each source read, for the page to see a source cut short.
-- A row's `claimed` is its current attempt's claim (started_at; NULL when the row's
-- available_at has moved past it, i.e. the claim is an earlier attempt's).
-- The exact variant reads four sources, each through its index and each at most
-- `cap` + 1 rows before the queue and topic are compared (so a filter never makes a
-- source read more): the terminal rows written since the window's start (job_history's
-- partitions of the window, the others pruned; job_terminal_updated_idx for the rows
-- still in job), the failed ones (job_failed_dead_idx), the processing ones
-- (job_processing_lease_idx) and the ready ones (job_ready_queue_idx). A source cut
-- short: the page asks _sample instead, the same figures from `percent` per cent of the
-- pages of job and of job_history's partitions of the window (TABLESAMPLE SYSTEM;
-- web_charts_pages counts them), counts scaled up by the page.
WITH w AS MATERIALIZED (
    SELECT (floor(date_part('epoch', now()) / %(step)s) - %(buckets)s + 1) * %(step)s AS e0
), ws AS MATERIALIZED (
    SELECT to_timestamp(e0) AS start FROM w
), raw AS (
--#if sample
    SELECT 'sample' AS part, r.state, r.available_at, r.updated_at,
           CASE WHEN r.state = 'processing' THEN coalesce(r.started_at, r.updated_at)
                WHEN r.started_at >= r.available_at THEN r.started_at END AS claimed,
           r.state IN ('done', 'dead', 'canceled')
               AND r.updated_at >= (SELECT start FROM ws) AS ended,
           (r.state IN ('done', 'dead', 'canceled', 'failed')
               AND r.updated_at >= (SELECT start FROM ws)) OR r.state = 'processing' AS tried,
           r.state = 'processing' AS processing,
           r.state IN ('pending', 'failed') AND r.available_at <= now() AS ready,
           r.errors, r.queue, r.topic
    FROM {job} AS r TABLESAMPLE SYSTEM (%(percent)s) REPEATABLE (%(seed)s)
    WHERE r.state <> 'waiting'
    UNION ALL
    -- The finished jobs of the window's partitions (the others pruned at the start).
    SELECT 'sample', r.state, r.available_at, r.updated_at,
           CASE WHEN r.started_at >= r.available_at THEN r.started_at END,
           true, true, false, false, r.errors, r.queue, r.topic
    FROM {job_history} AS r TABLESAMPLE SYSTEM (%(percent)s) REPEATABLE (%(seed)s)
    WHERE r.updated_at >= to_timestamp((SELECT e0 FROM w))
--#else
    SELECT 'ended' AS part, state, available_at, updated_at,
           CASE WHEN started_at >= available_at THEN started_at END AS claimed,
           true AS ended, true AS tried, false AS processing, false AS ready,
           errors, queue, topic
    FROM (SELECT state, available_at, updated_at, started_at, errors, queue, topic
          FROM {job_all}
          WHERE state IN ('done', 'dead', 'canceled') AND updated_at >= (SELECT start FROM ws)
          LIMIT %(cap)s + 1) AS r
    UNION ALL
    -- A failed row's available_at is its retry: its last claim is no pickup to chart.
    SELECT 'failed', state, available_at, updated_at, NULL, false, true, false, false,
           errors, queue, topic
    FROM (SELECT state, available_at, updated_at, started_at, errors, queue, topic
          FROM {job}
          WHERE state = 'failed' AND updated_at >= (SELECT start FROM ws)
          LIMIT %(cap)s + 1) AS r
    UNION ALL
    SELECT 'processing', state, available_at, updated_at, coalesce(started_at, updated_at),
           false, true, true, false, errors, queue, topic
    FROM (SELECT state, available_at, updated_at, started_at, errors, queue, topic
          FROM {job} WHERE state = 'processing' LIMIT %(cap)s + 1) AS r
    UNION ALL
    SELECT 'ready', state, available_at, updated_at,
           CASE WHEN started_at >= available_at THEN started_at END,
           false, false, false, true, NULL, queue, topic
    FROM (SELECT state, available_at, updated_at, started_at, errors, queue, topic
          FROM {job}
          WHERE state IN ('pending', 'failed') AND available_at <= now()
          LIMIT %(cap)s + 1) AS r
--#end
), src AS (
    -- Each row's history entries' times (the ready rows carry none: no attempt to chart),
    -- and whether it is of the queue and topic asked for.
    SELECT r.part, r.state, r.available_at, r.updated_at, r.claimed, h.ats, h.starts,
           r.ended, r.tried, r.processing, r.ready,
           (%(queue)s::text IS NULL OR r.queue = %(queue)s::text)
               AND (%(topic)s::text IS NULL OR r.topic = %(topic)s::text) AS mine
    FROM raw AS r
         CROSS JOIN LATERAL (
             SELECT array_agg(x->>'at') AS ats, array_agg(x->>'started_at') AS starts
             FROM jsonb_array_elements(
                 CASE WHEN jsonb_typeof(r.errors) = 'array' THEN r.errors ELSE '[]' END) AS x
             WHERE jsonb_typeof(x) = 'object') AS h
), attempts AS (
    -- An entry's times as brooq writes them (jsonb_build_object of a timestamptz); any
    -- other text is left out, never an error. The arrays are unnested in the select list
    -- (in step), and the times read once (OFFSET 0: the subquery is not flattened).
    SELECT v.at, v.started
    FROM (
        SELECT CASE WHEN u.a ~ '^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d(:\d\d)?|Z)$'
                    THEN u.a::timestamptz END AS at,
               CASE WHEN u.s ~ '^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d(:\d\d)?|Z)$'
                    THEN u.s::timestamptz END AS started
        FROM (SELECT unnest(src.ats) AS a, unnest(src.starts) AS s
              FROM src WHERE src.mine AND src.tried AND src.ats IS NOT NULL) AS u
        OFFSET 0
    ) AS v
    WHERE v.at >= (SELECT start FROM ws) AND v.at <= now()
), runs AS (
    -- Each attempt that ended in the window, by its end, and how long it ran: the failed
    -- ones from their history entries, a done job's last one from its row (not in its
    -- history: no double count).
    SELECT at AS e, date_part('epoch', at - started) AS d
    FROM attempts WHERE started IS NOT NULL AND started <= at
    UNION ALL
    SELECT updated_at, date_part('epoch', updated_at - claimed)
    FROM src WHERE mine AND ended AND state = 'done' AND claimed <= updated_at
), spans AS (
    -- Each ready span of a row's current attempt, cut at the window's start: from `s`
    -- to `e` (NULL: ready now). Dead rows and failed ones fall out (their available_at is
    -- a retry, after their end).
    SELECT greatest(x.s, (SELECT start FROM ws)) AS s, x.e
    FROM (
        SELECT CASE WHEN ready AND claimed IS NOT NULL THEN updated_at
                    ELSE available_at END AS s,
               CASE WHEN ready THEN NULL
                    WHEN claimed IS NOT NULL THEN claimed
                    WHEN ended THEN updated_at END AS e,
               ready
        FROM src
        WHERE mine AND available_at <= now() AND (ready OR processing OR ended)
    ) AS x
    WHERE x.ready OR (x.e > x.s AND x.e >= (SELECT start FROM ws))
)
SELECT CASE WHEN state = 'done' THEN 'done' ELSE 'dead' END AS series,
       floor((date_part('epoch', updated_at) - (SELECT e0 FROM w)) / %(step)s)::int AS bucket,
       count(*)::float8 AS n, NULL::float8[] AS p
FROM src WHERE mine AND ended AND state IN ('done', 'dead') GROUP BY 1, 2
UNION ALL
SELECT 'failed', floor((date_part('epoch', at) - (SELECT e0 FROM w)) / %(step)s)::int,
       count(*), NULL
FROM attempts GROUP BY 2
UNION ALL
SELECT 'run', floor((date_part('epoch', e) - (SELECT e0 FROM w)) / %(step)s)::int, count(*),
       percentile_cont(ARRAY[0.5, 0.95, 0.99]::float8[]) WITHIN GROUP (ORDER BY d)
FROM runs GROUP BY 2
UNION ALL
SELECT 'pickup', floor((date_part('epoch', claimed) - (SELECT e0 FROM w)) / %(step)s)::int,
       count(*),
       percentile_cont(ARRAY[0.5, 0.95, 0.99]::float8[])
           WITHIN GROUP (ORDER BY greatest(date_part('epoch', claimed - available_at), 0))
FROM src
WHERE mine AND claimed >= available_at AND claimed >= (SELECT start FROM ws)
  AND claimed <= now()
GROUP BY 2
UNION ALL
SELECT 'backlog', d.bucket, sum(d.delta), NULL
FROM (
    SELECT floor((date_part('epoch', s) - (SELECT e0 FROM w)) / %(step)s)::int AS bucket,
           1 AS delta
    FROM spans
    UNION ALL
    SELECT floor((date_part('epoch', e) - (SELECT e0 FROM w)) / %(step)s)::int, -1
    FROM spans WHERE e IS NOT NULL
) AS d
GROUP BY d.bucket
UNION ALL
SELECT 'rows:' || part, NULL, count(*), NULL FROM src GROUP BY part
