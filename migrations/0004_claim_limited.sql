-- global_limit: claim at most one job of a topic while fewer than `cap` jobs of
-- it are processing, fleet-wide. A function, because the count must be taken after the
-- topic's lock is granted: in READ COMMITTED a VOLATILE PL/pgSQL function takes a new
-- snapshot for each statement, so the count sees every claim committed by whoever held
-- the lock before (the calling statement's own snapshot is older and would not).
-- pg_advisory_xact_lock serialises the claimers of one topic until their commit; its
-- two-int key space ('broo' as the first int) never meets the migrator's bigint key, and
-- a hashtext collision between two topics only serialises them, never breaks a cap.
-- The count leaves out the rows this very statement is writing `done` (ours, in p_done):
-- they are done when the lock is released. Rows leaving `processing` by other paths
-- (release, reaper, cancel) can only make the count larger than the truth, never smaller.
-- The first, unlocked count lets pollers of a topic at its cap go without queueing on
-- the lock. p_queues holds no paused queue (the child leaves them out). A transactional
-- file: its body holds $$.
-- migrate:up
CREATE FUNCTION brooq_claim_limited(
    p_topic text, p_cap integer, p_queues text[], p_done uuid[], p_worker text,
    p_lease float8, p_max integer
)
RETURNS TABLE (id uuid, topic text, payload jsonb, attempts integer, locked_by text,
               locked_until timestamptz, available_at timestamptz, queue text,
               priority smallint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    room integer;
BEGIN
    IF p_max < 1 OR p_topic IS NULL THEN
        RETURN;
    END IF;
    SELECT p_cap - count(*) INTO room FROM job j
    WHERE j.state = 'processing' AND j.topic = p_topic
      AND NOT (j.locked_by = p_worker AND j.id = ANY(p_done));
    IF room <= 0 THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(1651666799, hashtext(p_topic));
    SELECT p_cap - count(*) INTO room FROM job j
    WHERE j.state = 'processing' AND j.topic = p_topic
      AND NOT (j.locked_by = p_worker AND j.id = ANY(p_done));
    IF room <= 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH next AS MATERIALIZED (
        SELECT c.id
        FROM unnest(p_queues) AS q(name)
        CROSS JOIN LATERAL (
            SELECT j.id FROM job j
            WHERE j.queue = q.name
              AND j.state IN ('pending', 'failed')
              AND j.available_at <= now()
              AND j.topic = p_topic
            ORDER BY j.priority DESC, j.available_at, j.id
            LIMIT least(room, p_max)
            FOR NO KEY UPDATE OF j SKIP LOCKED
        ) AS c
        LIMIT least(room, p_max)
    )
    UPDATE job
    SET state = 'processing',
        attempts = job.attempts + 1,
        locked_by = p_worker,
        locked_until = now() + make_interval(secs => p_lease),
        updated_at = now()
    WHERE job.id = ANY(ARRAY(SELECT next.id FROM next))
    RETURNING job.id, job.topic, job.payload, job.attempts, job.locked_by,
              job.locked_until, job.available_at, job.queue, job.priority;
END;
$$;

-- migrate:down
DROP FUNCTION brooq_claim_limited(text, integer, text[], uuid[], text, float8, integer);
