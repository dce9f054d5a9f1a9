-- A failed attempt's traceback kept in its error history entry (job.errors, migration
-- 0006), bounded per job (docs/how-to/handlers.md, "Tracebacks kept").
--   brooq_errors_append(p_errors, p_entry): the history with p_entry appended, the last
--     20 entries kept (oldest first, as before), and the "traceback" of the entry that
--     leaves the newest 5 set to null: a job that failed 20 times carries at most 5
--     tracebacks (each bounded by its writer to 8,192 characters) beside 20 one-line
--     errors. A history that is not an array (written by hand) starts again from the
--     entry. Every statement that writes a failure (a child's failed and canceled
--     outcomes, the master's settlement of a dead child, the reaper, the release of an
--     async child's suspects) appends through it, in the statement that writes the
--     outcome.
-- The entries' keys: attempt, at, started_at (the attempt's claim, the database's clock
-- as `at`), worker, error (one line, bounded), kind (raised, timeout, refused, canceled,
-- killed, worker_died, lease_expired) and traceback (text or null). Entries written
-- before this version keep the four keys they had.
-- A function only, no column: CREATE FUNCTION takes no lock on job (measured on
-- 1,000,000 rows with benchmarks/migration_locks.py --migration 18, docs/reference/schema.md).
-- migrate:up
CREATE OR REPLACE FUNCTION brooq_errors_append(p_errors jsonb, p_entry jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    history jsonb := jsonb_path_query_array(
        CASE WHEN jsonb_typeof(p_errors) = 'array' THEN p_errors ELSE '[]'::jsonb END
            || jsonb_build_array(p_entry),
        '$[last - 19 to last]');  -- a lax range is clamped: a shorter history stays whole
    n integer := jsonb_array_length(history);
BEGIN
    -- Each append moves one entry out of the newest 5: it alone loses its traceback (an
    -- SQL function re-planned at every call, or one that rewrote every entry, cost a
    -- failed attempt's write several times what this does: benchmarks/failure_cost.py).
    IF n > 5 AND jsonb_typeof(history -> (n - 6)) = 'object'
       AND (history -> (n - 6)) ? 'traceback' THEN
        history := jsonb_set(history, ARRAY[(n - 6)::text],
                             (history -> (n - 6)) || '{"traceback": null}'::jsonb);
    END IF;
    RETURN history;
END
$$;

-- migrate:down
-- The statements of the release before this one append inline; the entries' extra keys
-- stay in the rows (that release's readers read attempt, at, error and worker).
DROP FUNCTION IF EXISTS brooq_errors_append(jsonb, jsonb);
