-- A partition's idempotency keys released a batch at a time before it is dropped.
--   brooq_history_release_keys(name, after, batch): the keys of the partition's next
--     `batch` keyed jobs after the id `after` (its keyed index, in id order) deleted from
--     brooq_job_key; returns the last id read (the next call's `after`), the jobs read and
--     the keys released. A key costs about 12 us of the server's time: a day of keyed jobs
--     released in one statement held one backend for seconds and raised the pickup of
--     the jobs flowing meanwhile; in batches the master spreads it over short passes.
--   brooq_history_release_links(name): the rest of what brooq_history_release deletes
--     (edges, steps, event waits), once every key is released.
-- brooq_history_release stays as it was, for a master of the previous release running
-- beside this one. Functions only: no lock on job. No-transaction, every statement
-- idempotent.
-- migrate:no-transaction
-- migrate:up
CREATE OR REPLACE FUNCTION brooq_history_release_keys(
    p_name text, p_after uuid, p_batch integer,
    OUT last_id uuid, OUT seen integer, OUT released integer)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    EXECUTE format(
        'WITH batch AS MATERIALIZED ('
        '    SELECT t.id, t.topic, t.idempotency_key FROM %I t'
        '    WHERE t.idempotency_key IS NOT NULL AND t.id > $1 ORDER BY t.id LIMIT $2),'
        ' gone AS (DELETE FROM brooq_job_key k USING batch b'
        '    WHERE k.topic = b.topic AND k.idempotency_key = b.idempotency_key'
        '      AND k.job_id = b.id RETURNING 1)'
        ' SELECT (SELECT b.id FROM batch b ORDER BY b.id DESC LIMIT 1),'
        '        (SELECT count(*) FROM batch)::integer, (SELECT count(*) FROM gone)::integer',
        p_name)
    INTO last_id, seen, released USING p_after, p_batch;
END;
$$;

CREATE OR REPLACE FUNCTION brooq_history_release_links(p_name text) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
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
END;
$$;

-- migrate:down
DROP FUNCTION IF EXISTS brooq_history_release_links(text);

DROP FUNCTION IF EXISTS brooq_history_release_keys(text, uuid, integer);
