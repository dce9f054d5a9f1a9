-- Finished jobs in a history table partitioned by time (docs/explanation/history.md says
-- why this design and not the others measured).
--   job_history:        the finished jobs (done, dead, canceled), the columns of job in
--                       its order, range-partitioned on updated_at (the end of the job).
--                       The master makes the partitions ahead and drops them whole past
--                       retention_ttl (brooq.supervisor.history); rows whose partition
--                       is missing land in job_history_default and never fail.
--   job_all:            job and job_history as one relation, for every read that may
--                       meet a finished job (a job is in exactly one of them).
--   job_zz_history:     AFTER UPDATE OF state, a row entering done, dead or canceled is
--                       moved to job_history in the same statement (its other triggers,
--                       named before it, have run on it in job). The claim statement's
--                       `done` moves its rows itself, without an UPDATE first.
--   job_history_ended:  AFTER INSERT on job_history, for a row the claim statement
--                       moved: what job_waited_notify, job_upstream_ended and
--                       job_unique_key_freed do for an UPDATE (a waiter told, the graph
--                       carried on, a debounced job moved up). Rows moved by
--                       job_zz_history or by the master (brooq.moving on) skip it: their
--                       UPDATE fired those already.
--   brooq_job_key:      every idempotency key for the life of its job, active or
--                       finished (one unique index can no longer see both tables);
--                       written by job_key_taken for every insert with a key, by whatever
--                       door, and deleted with the job's partition.
--   brooq_job_after, brooq_park_jobs: an upstream job or a child job already in
--                       job_history is read there (ended, how it ended).
--   brooq_history_*:    the partition upkeep the master calls (prepare, expired,
--                       release, drop, expire_default).
--   The foreign keys of brooq_job_step and brooq_event_wait to job go: deleting a row
--   from job (its move) would run their cascade per row on the claim statement's path.
--   A finished job's steps stay until its partition is dropped (brooq_history_release).
-- Terminal rows already in job stay there and go by the row-by-row retention as before
-- (job_delete_expired): nothing moves 10,000,000 rows at once. No-transaction, every
-- statement idempotent and retried under the migrator's lock_timeout; only the triggers
-- and the foreign keys touch job's catalog entry (measured: docs/reference/schema.md).
-- migrate:no-transaction
-- migrate:up
CREATE TABLE IF NOT EXISTS job_history (LIKE job INCLUDING DEFAULTS)
    PARTITION BY RANGE (updated_at);

CREATE TABLE IF NOT EXISTS job_history_default PARTITION OF job_history DEFAULT;

-- Today's partition and the next four days' (UTC), made here under ACCESS EXCLUSIVE on
-- job_history for a moment (no insert can choose a partition while one is made): the
-- master then only ever attaches partitions ahead of now (brooq_history_prepare),
-- whatever its span (QUEUE_HISTORY_PARTITION).
DO $$
DECLARE
    day date;
BEGIN
    FOR day IN SELECT generate_series((now() AT TIME ZONE 'UTC')::date,
                                      (now() AT TIME ZONE 'UTC')::date + 4, '1 day')::date
    LOOP
        EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF job_history '
                       'FOR VALUES FROM (%L) TO (%L)',
                       'job_history_' || to_char(day, 'YYYYMMDD') || '_000000',
                       day::timestamp AT TIME ZONE 'UTC',
                       (day + 1)::timestamp AT TIME ZONE 'UTC');
    END LOOP;
END;
$$;

-- A job by its id (job_all's reads, a retry from history).
CREATE INDEX IF NOT EXISTS job_history_id_idx ON job_history (id);

-- The dead jobs, newest first (brooq jobs --state dead, the page, the counts); the topic
-- as a payload, so that the page's count by topic reads the index only.
CREATE INDEX IF NOT EXISTS job_history_dead_idx ON job_history (queue, updated_at DESC, id DESC)
    INCLUDE (topic) WHERE state = 'dead';

-- Reads by time (the page's charts and done counts, brooq top's and Queue.throughput's
-- jobs finished since): rows arrive in updated_at order, so a BRIN's ranges are tight and
-- a window reads its pages only, at a summary's cost per insert.
CREATE INDEX IF NOT EXISTS job_history_updated_brin ON job_history
    USING brin (updated_at) WITH (pages_per_range = 16);

-- A bulk retry of dead or canceled jobs by topic (brooq jobs retry --state ...).
CREATE INDEX IF NOT EXISTS job_history_retry_idx ON job_history (topic, state, id)
    WHERE state IN ('dead', 'canceled');

-- The rows a partition's drop must look after, each kind by its own index (one index
-- of both would make the edges' deletes read every keyed row): the jobs of a graph
-- (edges to delete, upstream jobs a job not yet ended still reads), the keyed ones (keys
-- to release).
CREATE INDEX IF NOT EXISTS job_history_graph_idx ON job_history (id)
    WHERE has_downstream IS TRUE OR upstream_open IS NOT NULL;

CREATE INDEX IF NOT EXISTS job_history_keyed_idx ON job_history (id)
    WHERE idempotency_key IS NOT NULL;

CREATE TABLE IF NOT EXISTS brooq_job_key (
    topic           text NOT NULL,
    idempotency_key text NOT NULL,
    job_id          uuid NOT NULL,
    CONSTRAINT brooq_job_key_pkey PRIMARY KEY (topic, idempotency_key)
);

CREATE INDEX IF NOT EXISTS brooq_job_key_job_idx ON brooq_job_key (job_id);

-- The earliest end a job with this id can have in job_history, for a read by id to skip
-- the partitions before it: a UUIDv7 holds its enqueue time (its first 48 bits, Unix
-- milliseconds), and a job ends after it is enqueued. A day of slack covers a producer's
-- clock ahead of the server's; another id (a version 4 from an older producer, or one
-- made by hand) has no such time: -infinity, every partition.
CREATE OR REPLACE FUNCTION brooq_history_floor(p_id uuid) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN substr(p_id::text, 15, 1) = '7'
        THEN to_timestamp(('x' || substr(replace(p_id::text, '-', ''), 1, 12))::bit(48)::bigint
                          / 1000.0) - interval '1 day'
        ELSE '-infinity'::timestamptz
    END
$$;

CREATE OR REPLACE VIEW job_all AS
    SELECT * FROM job
    UNION ALL
    SELECT * FROM job_history;

CREATE OR REPLACE FUNCTION brooq_job_key_taken() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    owner uuid;
BEGIN
    INSERT INTO brooq_job_key (topic, idempotency_key, job_id)
    VALUES (NEW.topic, NEW.idempotency_key, NEW.id)
    ON CONFLICT (topic, idempotency_key) DO NOTHING;
    IF NOT FOUND THEN
        -- Taken: by this job (a retry from history puts its row back) or by another,
        -- finished, one, which the producer's statement had not seen yet.
        SELECT k.job_id INTO owner FROM brooq_job_key k
        WHERE k.topic = NEW.topic AND k.idempotency_key = NEW.idempotency_key;
        IF owner IS DISTINCT FROM NEW.id THEN
            RAISE EXCEPTION 'idempotency key % of topic % belongs to job %',
                NEW.idempotency_key, NEW.topic, owner
                USING ERRCODE = 'unique_violation', CONSTRAINT = 'brooq_job_key_pkey';
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION brooq_job_to_history() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    -- The row as it is now (a trigger before this one may have written it again).
    PERFORM set_config('brooq.moving', 'on', true);
    WITH gone AS (DELETE FROM job WHERE id = NEW.id RETURNING *)
    INSERT INTO job_history SELECT * FROM gone;
    PERFORM set_config('brooq.moving', '', true);
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION brooq_job_history_ended() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    waiting uuid;
BEGIN
    IF NEW.waited THEN
        PERFORM pg_notify('brooq_outcome', NEW.id::text);
    END IF;
    IF NEW.has_downstream AND current_setting('brooq.cascading', true) IS DISTINCT FROM 'on'
    THEN
        IF brooq_jobs_ended(ARRAY[NEW.id],
                            CASE WHEN NEW.state = 'done' THEN '{}'::uuid[] ELSE ARRAY[NEW.id] END)
        THEN
            PERFORM pg_notify('brooq_job', TG_TABLE_SCHEMA);
        END IF;
    END IF;
    IF NEW.unique_key IS NOT NULL AND NEW.start_after IS NULL THEN
        SELECT j.id INTO waiting FROM job j
        WHERE j.topic = NEW.topic AND j.unique_key = NEW.unique_key
          AND j.start_after IS NOT NULL AND j.state = 'pending'
        FOR NO KEY UPDATE SKIP LOCKED;
        IF FOUND THEN
            PERFORM brooq_job_promote(waiting, true);
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

-- The same trigger on every partition, present and future (PostgreSQL clones it).
DROP TRIGGER IF EXISTS job_history_ended ON job_history;

CREATE TRIGGER job_history_ended AFTER INSERT ON job_history FOR EACH ROW
    WHEN ((NEW.waited OR NEW.has_downstream
           OR (NEW.unique_key IS NOT NULL AND NEW.start_after IS NULL))
          AND current_setting('brooq.moving', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION brooq_job_history_ended();

DROP TRIGGER IF EXISTS job_key_taken ON job;

CREATE TRIGGER job_key_taken AFTER INSERT ON job FOR EACH ROW
    WHEN (NEW.idempotency_key IS NOT NULL)
    EXECUTE FUNCTION brooq_job_key_taken();

-- Keys of the rows already there (the trigger covers every insert from here on).
INSERT INTO brooq_job_key (topic, idempotency_key, job_id)
SELECT j.topic, j.idempotency_key, j.id FROM job j WHERE j.idempotency_key IS NOT NULL
ON CONFLICT (topic, idempotency_key) DO NOTHING;

DROP TRIGGER IF EXISTS job_zz_history ON job;

CREATE TRIGGER job_zz_history AFTER UPDATE OF state ON job FOR EACH ROW
    WHEN (NEW.state IN ('done', 'dead', 'canceled'))
    EXECUTE FUNCTION brooq_job_to_history();

ALTER TABLE brooq_job_step DROP CONSTRAINT IF EXISTS brooq_job_step_job_id_fkey;

ALTER TABLE brooq_event_wait DROP CONSTRAINT IF EXISTS brooq_event_wait_job_id_fkey;

CREATE OR REPLACE FUNCTION brooq_job_after(
    p_jobs uuid[], p_policies text[], p_down uuid[], p_up uuid[]
) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    missing uuid;
    waiting integer;
    ups uuid[];
    states text[];
BEGIN
    -- The upstream rows still in job, in id order: an outcome being written (an UPDATE,
    -- or the claim statement's move) is waited for, never missed; the statements after
    -- this one see its end, in job or in job_history.
    PERFORM 1 FROM job j WHERE j.id = ANY(p_up) ORDER BY j.id FOR NO KEY UPDATE;
    SELECT array_agg(s.id), array_agg(s.state) INTO ups, states FROM (
        SELECT j.id, j.state FROM job j WHERE j.id = ANY(p_up)
        UNION ALL
        SELECT h.id, h.state FROM job_history h
        WHERE h.id = ANY(p_up) AND NOT EXISTS (SELECT FROM job j WHERE j.id = h.id)
    ) AS s;
    SELECT u INTO missing FROM unnest(p_up) AS u
    WHERE u <> ALL(coalesce(ups, '{}')) LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'after names job %, which does not exist', missing
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    UPDATE job j SET has_downstream = true
    WHERE j.id = ANY(p_up) AND j.has_downstream IS NOT TRUE;
    -- A finished upstream job is read by claim.upstream: its row is kept past its
    -- partition's drop while a job waits on it (brooq_history_drop).
    UPDATE job_history h SET has_downstream = true
    WHERE h.id = ANY(p_up) AND h.has_downstream IS NOT TRUE;
    INSERT INTO brooq_job_edge (downstream_id, position, upstream_id, ended)
    SELECT e.down, row_number() OVER (PARTITION BY e.down ORDER BY e.n), e.up,
           u.state IN ('done', 'dead', 'canceled')
    FROM unnest(p_down, p_up) WITH ORDINALITY AS e(down, up, n)
    JOIN unnest(ups, states) AS u(id, state) ON u.id = e.up;
    UPDATE job d
    SET on_upstream_failure = p.policy,
        upstream_open = c.open,
        upstream_failed = c.failed,
        state = CASE
            WHEN c.failed IS NOT NULL AND p.policy = 'cancel' THEN 'canceled'
            WHEN c.open > 0 THEN 'waiting'
            ELSE d.state
        END,
        last_error = CASE
            WHEN c.failed IS NOT NULL AND p.policy = 'cancel'
            THEN format('upstream job %s ended %s', c.failed, c.failed_state)
            ELSE d.last_error
        END
    FROM unnest(p_jobs, p_policies) AS p(id, policy)
    CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE u.state NOT IN ('done', 'dead', 'canceled'))::integer
                   AS open,
               (array_agg(u.id ORDER BY e.position)
                   FILTER (WHERE u.state IN ('dead', 'canceled')))[1] AS failed,
               (array_agg(u.state ORDER BY e.position)
                   FILTER (WHERE u.state IN ('dead', 'canceled')))[1] AS failed_state
        FROM brooq_job_edge e JOIN unnest(ups, states) AS u(id, state) ON u.id = e.upstream_id
        WHERE e.downstream_id = p.id
    ) AS c
    WHERE d.id = p.id AND d.state = 'pending' AND d.upstream_open IS NULL;
    -- A job canceled above is in job_history now: it does not wait.
    SELECT count(*) INTO waiting FROM job j WHERE j.id = ANY(p_jobs) AND j.state = 'waiting';
    RETURN waiting;
END;
$$;

CREATE OR REPLACE FUNCTION brooq_park_jobs(p_job uuid, p_me text, p_ids uuid[]) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    missing uuid;
    open integer;
    base integer;
BEGIN
    -- The children still in job, in id order (as brooq_job_after locks upstream jobs):
    -- an outcome being written is waited for (its trigger then finds the edges below,
    -- or its end is read here), never missed. A child not in job has ended (job_history)
    -- or does not exist.
    PERFORM 1 FROM job j WHERE j.id = ANY(p_ids) ORDER BY j.id FOR NO KEY UPDATE;
    SELECT u INTO missing FROM unnest(p_ids) AS u
    WHERE NOT EXISTS (SELECT 1 FROM job j WHERE j.id = u)
      AND NOT EXISTS (SELECT 1 FROM job_history h WHERE h.id = u) LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'wait_jobs names job %, which does not exist', missing
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    SELECT count(DISTINCT j.id) INTO open FROM job j
    WHERE j.id = ANY(p_ids) AND j.state NOT IN ('done', 'dead', 'canceled');
    IF open = 0 THEN
        RETURN false;
    END IF;
    -- 'run': a failed child never cancels its parent, which reads how each ended.
    UPDATE job
    SET state = 'waiting', upstream_open = open, on_upstream_failure = 'run',
        attempts = greatest(attempts - 1, 0),
        locked_by = NULL, locked_until = NULL, parked = 'jobs', updated_at = now()
    WHERE id = p_job AND state = 'processing' AND locked_by = p_me;
    IF NOT FOUND THEN
        RETURN NULL;  -- the lease was lost (the caller rolls back)
    END IF;
    UPDATE job j SET has_downstream = true
    WHERE j.id = ANY(p_ids) AND j.has_downstream IS NOT TRUE;
    SELECT least(coalesce(min(e.position), 0), 0) INTO base
    FROM brooq_job_edge e WHERE e.downstream_id = p_job;
    -- A child an earlier wait named keeps its edge (it counts once, when it ends).
    INSERT INTO brooq_job_edge (downstream_id, position, upstream_id, ended)
    SELECT p_job, base - row_number() OVER (ORDER BY c.n)::integer, c.id, false
    FROM (
        SELECT u.id, min(u.n) AS n
        FROM unnest(p_ids) WITH ORDINALITY AS u(id, n)
        JOIN job j ON j.id = u.id AND j.state NOT IN ('done', 'dead', 'canceled')
        GROUP BY u.id
    ) AS c
    ON CONFLICT (upstream_id, downstream_id) DO NOTHING;
    RETURN true;
END;
$$;

-- The partitions from the end of the newest one until p_until, each p_step long and
-- aligned on multiples of it since the epoch; at most p_max of them; returns how many
-- were made. A partition is made alone, then attached (SHARE UPDATE EXCLUSIVE on
-- job_history: outcomes go on). Never one whose range starts before p_now plus five
-- minutes: an insert into job_history that chose its partition before an attach commits
-- would send a row of the new range to the default partition, whose constraint then
-- refuses it; a row's end (its transaction's now()) is never in the future. So after a
-- gap (no partition made for a while) the next starts at the first boundary past that,
-- and the rows of the gap stay in the default partition. Rows of the default partition
-- in a new range (an end in the future: a clock set back) move into it first, or the
-- attach would refuse.
CREATE OR REPLACE FUNCTION brooq_history_prepare(
    p_step interval, p_now timestamptz, p_until timestamptz, p_max integer
) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    step float8 := extract(epoch FROM p_step);
    safe timestamptz := to_timestamp(ceil(extract(epoch FROM p_now + interval '5 minutes')
                                          / step) * step);
    lo timestamptz;
    hi timestamptz;
    name text;
    made integer := 0;
BEGIN
    SELECT max(substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([^'']+)''\)')
                   ::timestamptz)
    INTO lo
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'job_history'::regclass
      AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT';
    lo := greatest(lo, safe);
    WHILE lo < p_until AND made < p_max LOOP
        hi := to_timestamp((floor(extract(epoch FROM lo) / step) + 1) * step);
        name := 'job_history_' || to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD_HH24MISS');
        EXECUTE format('CREATE TABLE IF NOT EXISTS %I (LIKE job_history INCLUDING DEFAULTS)',
                       name);
        PERFORM set_config('brooq.moving', 'on', true);
        EXECUTE format('WITH gone AS (DELETE FROM job_history_default '
                       'WHERE updated_at >= $1 AND updated_at < $2 RETURNING *) '
                       'INSERT INTO %I SELECT * FROM gone', name) USING lo, hi;
        PERFORM set_config('brooq.moving', '', true);
        EXECUTE format('ALTER TABLE job_history ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                       name, lo, hi);
        made := made + 1;
        lo := hi;
    END LOOP;
    RETURN made;
END;
$$;

-- The partitions whose every row ended before p_before (their upper bound), oldest first.
CREATE OR REPLACE FUNCTION brooq_history_expired(p_before timestamptz)
RETURNS TABLE (name text, upper_bound timestamptz)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT p.name, p.upper_bound FROM (
        SELECT c.relname::text AS name,
               substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([^'']+)''\)')
                   ::timestamptz AS upper_bound
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'job_history'::regclass
          AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'
    ) AS p
    WHERE p.upper_bound <= p_before
    ORDER BY p.upper_bound
$$;

-- Before a partition is dropped, in its own transaction (no lock that outcomes wait for):
-- the idempotency keys of its jobs released, the edges into its jobs and out of those no
-- job still waits on deleted, the steps and event waits of its jobs deleted. Returns the
-- keys released. Only its graph's and keyed rows are read (job_history_graph_idx,
-- job_history_keyed_idx), and the steps.
CREATE OR REPLACE FUNCTION brooq_history_release(p_name text) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    released integer;
BEGIN
    EXECUTE format('DELETE FROM brooq_job_key k USING %I t '
                   'WHERE t.idempotency_key IS NOT NULL AND k.topic = t.topic '
                   'AND k.idempotency_key = t.idempotency_key AND k.job_id = t.id', p_name);
    GET DIAGNOSTICS released = ROW_COUNT;
    EXECUTE format('DELETE FROM brooq_job_edge e USING %I t '
                   'WHERE t.upstream_open IS NOT NULL AND e.downstream_id = t.id', p_name);
    EXECUTE format('DELETE FROM brooq_job_edge e USING %I t '
                   'WHERE t.has_downstream IS TRUE AND e.upstream_id = t.id '
                   'AND NOT EXISTS (SELECT FROM job d WHERE d.id = e.downstream_id '
                   '    AND d.state IN (''waiting'', ''pending'', ''failed'', ''processing''))',
                   p_name);
    EXECUTE format('DELETE FROM brooq_job_step s WHERE EXISTS '
                   '(SELECT FROM %I t WHERE t.id = s.job_id)', p_name);
    EXECUTE format('DELETE FROM brooq_event_wait w WHERE EXISTS '
                   '(SELECT FROM %I t WHERE t.id = w.job_id)', p_name);
    RETURN released;
END;
$$;

-- A partition detached and dropped: ACCESS EXCLUSIVE on job_history for the catalog
-- change only (the caller's lock_timeout bounds the wait). An upstream job that a job not
-- yet ended still reads (claim.upstream) is kept: copied back first, into
-- job_history_default (its range is no partition's any more). Returns the rows kept.
CREATE OR REPLACE FUNCTION brooq_history_drop(p_name text) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    kept integer;
BEGIN
    EXECUTE format('ALTER TABLE job_history DETACH PARTITION %I', p_name);
    PERFORM set_config('brooq.moving', 'on', true);
    EXECUTE format('INSERT INTO job_history SELECT t.* FROM %I t '
                   'WHERE t.has_downstream IS TRUE AND EXISTS ('
                   '    SELECT FROM brooq_job_edge e JOIN job d ON d.id = e.downstream_id '
                   '    WHERE e.upstream_id = t.id '
                   '      AND d.state IN (''waiting'', ''pending'', ''failed'', ''processing''))',
                   p_name);
    GET DIAGNOSTICS kept = ROW_COUNT;
    PERFORM set_config('brooq.moving', '', true);
    EXECUTE format('DROP TABLE %I', p_name);
    RETURN kept;
END;
$$;

-- The default partition's rows ended before p_before, a batch at a time (rows whose
-- partition was missing, and kept upstream jobs once nothing reads them), with their keys,
-- edges and steps. Returns the topics of the rows deleted.
CREATE OR REPLACE FUNCTION brooq_history_expire_default(p_before timestamptz, p_batch integer)
RETURNS SETOF text
LANGUAGE sql SET search_path FROM CURRENT AS $$
    WITH gone AS (
        DELETE FROM job_history_default AS t
        WHERE t.id IN (
            SELECT o.id FROM job_history_default o
            WHERE o.updated_at < p_before
              AND (o.has_downstream IS NOT TRUE OR NOT EXISTS (
                  SELECT FROM brooq_job_edge e JOIN job d ON d.id = e.downstream_id
                  WHERE e.upstream_id = o.id
                    AND d.state IN ('waiting', 'pending', 'failed', 'processing')))
            ORDER BY o.updated_at
            LIMIT p_batch
            FOR UPDATE SKIP LOCKED
        )
        RETURNING t.id, t.topic, t.idempotency_key, t.has_downstream, t.upstream_open
    ), keys AS (
        DELETE FROM brooq_job_key k USING gone
        WHERE gone.idempotency_key IS NOT NULL AND k.topic = gone.topic
          AND k.idempotency_key = gone.idempotency_key AND k.job_id = gone.id
    ), edges_in AS (
        DELETE FROM brooq_job_edge e
        WHERE e.downstream_id = ANY(ARRAY(SELECT id FROM gone WHERE upstream_open IS NOT NULL))
    ), edges_out AS (
        DELETE FROM brooq_job_edge e
        WHERE e.upstream_id = ANY(ARRAY(SELECT id FROM gone WHERE has_downstream))
    ), steps AS (
        DELETE FROM brooq_job_step s WHERE s.job_id = ANY(ARRAY(SELECT id FROM gone))
    )
    SELECT topic FROM gone
$$;

-- migrate:down
-- First the finished rows go back into job while everything runs: partition by partition,
-- in id order, 10,000 rows a transaction (a DELETE from the partition and an INSERT into
-- job in one statement: a reader of job_all sees each row once), no lock beyond the rows'.
-- A key released with its expired partition (and perhaps taken since by another job) is
-- left off its old row first: job's unique index on the key would refuse the row. A
-- procedure, so that it can commit between batches (no SET clause: a procedure with one
-- cannot); CALL runs outside a transaction block.
CREATE OR REPLACE PROCEDURE brooq_history_move_back(p_batch integer)
LANGUAGE plpgsql AS $$
DECLARE
    part regclass;
    after uuid;
    moved integer;
BEGIN
    UPDATE job_history h SET idempotency_key = NULL
    WHERE h.idempotency_key IS NOT NULL AND NOT EXISTS (
        SELECT FROM brooq_job_key k
        WHERE k.topic = h.topic AND k.idempotency_key = h.idempotency_key AND k.job_id = h.id);
    COMMIT;
    FOR part IN SELECT t.relid FROM pg_partition_tree('job_history'::regclass) AS t
                WHERE t.isleaf LOOP
        after := '00000000-0000-0000-0000-000000000000';
        LOOP
            EXECUTE format(
                'WITH batch AS MATERIALIZED (SELECT o.id FROM %s o WHERE o.id > $1'
                '    ORDER BY o.id LIMIT $2),'
                ' gone AS (DELETE FROM %s t USING batch b WHERE t.id = b.id RETURNING t.*),'
                ' back AS (INSERT INTO job SELECT * FROM gone RETURNING id)'
                ' SELECT (SELECT b.id FROM batch b ORDER BY b.id DESC LIMIT 1),'
                '        (SELECT count(*) FROM back)::integer', part, part)
            INTO after, moved USING after, p_batch;
            COMMIT;
            EXIT WHEN after IS NULL;
        END LOOP;
    END LOOP;
END;
$$;

CALL brooq_history_move_back(10000);

DROP PROCEDURE IF EXISTS brooq_history_move_back(integer);

-- Then one transaction, all or nothing: ACCESS EXCLUSIVE on job and job_history (under
-- the migrator's lock_timeout, retried), the rows that ended since back into job (a few:
-- those of the moments above), the objects dropped, the foreign keys back once the
-- orphans they would refuse are gone (NOT VALID, then validated below without the ACCESS
-- EXCLUSIVE lock).
DO $$
BEGIN
    LOCK TABLE job IN ACCESS EXCLUSIVE MODE;
    LOCK TABLE job_history IN ACCESS EXCLUSIVE MODE;
    DROP TRIGGER IF EXISTS job_zz_history ON job;
    DROP TRIGGER IF EXISTS job_key_taken ON job;
    DROP TRIGGER IF EXISTS job_history_ended ON job_history;
    UPDATE job_history h SET idempotency_key = NULL
    WHERE h.idempotency_key IS NOT NULL AND NOT EXISTS (
        SELECT FROM brooq_job_key k
        WHERE k.topic = h.topic AND k.idempotency_key = h.idempotency_key AND k.job_id = h.id);
    INSERT INTO job SELECT * FROM job_history;
    DROP VIEW IF EXISTS job_all;
    DROP TABLE IF EXISTS job_history;
    DROP TABLE IF EXISTS brooq_job_key;
    DROP FUNCTION IF EXISTS brooq_history_expire_default(timestamptz, integer);
    DROP FUNCTION IF EXISTS brooq_history_drop(text);
    DROP FUNCTION IF EXISTS brooq_history_release(text);
    DROP FUNCTION IF EXISTS brooq_history_expired(timestamptz);
    DROP FUNCTION IF EXISTS brooq_history_prepare(interval, timestamptz, timestamptz, integer);
    DROP FUNCTION IF EXISTS brooq_job_history_ended();
    DROP FUNCTION IF EXISTS brooq_job_to_history();
    DROP FUNCTION IF EXISTS brooq_job_key_taken();
    DROP FUNCTION IF EXISTS brooq_history_floor(uuid);
    DELETE FROM brooq_job_step s WHERE NOT EXISTS (SELECT FROM job j WHERE j.id = s.job_id);
    DELETE FROM brooq_event_wait w WHERE NOT EXISTS (SELECT FROM job j WHERE j.id = w.job_id);
    IF NOT EXISTS (SELECT FROM pg_constraint WHERE conname = 'brooq_job_step_job_id_fkey') THEN
        ALTER TABLE brooq_job_step ADD CONSTRAINT brooq_job_step_job_id_fkey
            FOREIGN KEY (job_id) REFERENCES job (id) ON DELETE CASCADE NOT VALID;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_constraint WHERE conname = 'brooq_event_wait_job_id_fkey') THEN
        ALTER TABLE brooq_event_wait ADD CONSTRAINT brooq_event_wait_job_id_fkey
            FOREIGN KEY (job_id) REFERENCES job (id) ON DELETE CASCADE NOT VALID;
    END IF;
END;
$$;

ALTER TABLE brooq_job_step VALIDATE CONSTRAINT brooq_job_step_job_id_fkey;

ALTER TABLE brooq_event_wait VALIDATE CONSTRAINT brooq_event_wait_job_id_fkey;

-- The functions as 0013 and 0017 left them.
CREATE OR REPLACE FUNCTION brooq_job_after(
    p_jobs uuid[], p_policies text[], p_down uuid[], p_up uuid[]
) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    missing uuid;
    waiting integer;
BEGIN
    PERFORM 1 FROM job j WHERE j.id = ANY(p_up) ORDER BY j.id FOR NO KEY UPDATE;
    SELECT u INTO missing FROM unnest(p_up) AS u
    WHERE NOT EXISTS (SELECT 1 FROM job j WHERE j.id = u) LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'after names job %, which does not exist', missing
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    UPDATE job j SET has_downstream = true
    WHERE j.id = ANY(p_up) AND j.has_downstream IS NOT TRUE;
    INSERT INTO brooq_job_edge (downstream_id, position, upstream_id, ended)
    SELECT e.down, row_number() OVER (PARTITION BY e.down ORDER BY e.n), e.up,
           u.state IN ('done', 'dead', 'canceled')
    FROM unnest(p_down, p_up) WITH ORDINALITY AS e(down, up, n)
    JOIN job u ON u.id = e.up;
    UPDATE job d
    SET on_upstream_failure = p.policy,
        upstream_open = c.open,
        upstream_failed = c.failed,
        state = CASE
            WHEN c.failed IS NOT NULL AND p.policy = 'cancel' THEN 'canceled'
            WHEN c.open > 0 THEN 'waiting'
            ELSE d.state
        END,
        last_error = CASE
            WHEN c.failed IS NOT NULL AND p.policy = 'cancel'
            THEN format('upstream job %s ended %s', c.failed, c.failed_state)
            ELSE d.last_error
        END
    FROM unnest(p_jobs, p_policies) AS p(id, policy)
    CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE u.state NOT IN ('done', 'dead', 'canceled'))::integer
                   AS open,
               (array_agg(u.id ORDER BY e.position)
                   FILTER (WHERE u.state IN ('dead', 'canceled')))[1] AS failed,
               (array_agg(u.state ORDER BY e.position)
                   FILTER (WHERE u.state IN ('dead', 'canceled')))[1] AS failed_state
        FROM brooq_job_edge e JOIN job u ON u.id = e.upstream_id
        WHERE e.downstream_id = p.id
    ) AS c
    WHERE d.id = p.id AND d.state = 'pending' AND d.upstream_open IS NULL;
    SELECT count(*) INTO waiting FROM job j WHERE j.id = ANY(p_jobs) AND j.state = 'waiting';
    RETURN waiting;
END;
$$;

CREATE OR REPLACE FUNCTION brooq_park_jobs(p_job uuid, p_me text, p_ids uuid[]) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    missing uuid;
    open integer;
    base integer;
BEGIN
    PERFORM 1 FROM job j WHERE j.id = ANY(p_ids) ORDER BY j.id FOR NO KEY UPDATE;
    SELECT u INTO missing FROM unnest(p_ids) AS u
    WHERE NOT EXISTS (SELECT 1 FROM job j WHERE j.id = u) LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'wait_jobs names job %, which does not exist', missing
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    SELECT count(DISTINCT j.id) INTO open FROM job j
    WHERE j.id = ANY(p_ids) AND j.state NOT IN ('done', 'dead', 'canceled');
    IF open = 0 THEN
        RETURN false;
    END IF;
    UPDATE job
    SET state = 'waiting', upstream_open = open, on_upstream_failure = 'run',
        attempts = greatest(attempts - 1, 0),
        locked_by = NULL, locked_until = NULL, parked = 'jobs', updated_at = now()
    WHERE id = p_job AND state = 'processing' AND locked_by = p_me;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    UPDATE job j SET has_downstream = true
    WHERE j.id = ANY(p_ids) AND j.has_downstream IS NOT TRUE;
    SELECT least(coalesce(min(e.position), 0), 0) INTO base
    FROM brooq_job_edge e WHERE e.downstream_id = p_job;
    INSERT INTO brooq_job_edge (downstream_id, position, upstream_id, ended)
    SELECT p_job, base - row_number() OVER (ORDER BY c.n)::integer, c.id, false
    FROM (
        SELECT u.id, min(u.n) AS n
        FROM unnest(p_ids) WITH ORDINALITY AS u(id, n)
        JOIN job j ON j.id = u.id AND j.state NOT IN ('done', 'dead', 'canceled')
        GROUP BY u.id
    ) AS c
    ON CONFLICT (upstream_id, downstream_id) DO NOTHING;
    RETURN true;
END;
$$;
