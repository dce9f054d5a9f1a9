-- Its own schema (QUEUE_SCHEMA). brooq's statements name its relations with
-- their schema, but two of its functions are run from a connection whose search_path
-- may not hold that schema (a producer's own connection, a master's with the default
-- search_path):
--   brooq_claim_limited names the table job in its body, resolved at run time through
--   the caller's search_path, so an application's public.job would be found instead.
--   Its search_path is now pinned to the schema the function lives in (pg_catalog
--   first, pg_temp last: nothing can shadow a system function or brooq's table).
--   brooq_job_notify, the insert trigger's function, names no relation (its transition
--   table is not looked up on the search_path), but its notification now carries the
--   table's schema as payload: brooq installations in two schemas of one database share
--   the channel brooq_job, and a master wakes its children only for its own schema's
--   jobs (brooq.ipc.channel).
-- Neither statement touches the job table: CREATE OR REPLACE FUNCTION and ALTER FUNCTION
-- lock the function alone, not the table (measured with 1,000,000 rows in
-- RELIABILITY.md); a claim calling brooq_claim_limited meanwhile waits milliseconds. A
-- transactional file: its bodies hold $$.
-- migrate:up
CREATE OR REPLACE FUNCTION brooq_job_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM brooq_new_job WHERE available_at <= now()) THEN
        PERFORM pg_notify('brooq_job', TG_TABLE_SCHEMA);
    END IF;
    RETURN NULL;
END;
$$;

DO $$
DECLARE
    home text;
BEGIN
    SELECT n.nspname INTO STRICT home FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE p.oid = 'brooq_claim_limited(text, integer, text[], uuid[], text, float8, integer)'
        ::regprocedure;
    EXECUTE format('ALTER FUNCTION %I.brooq_claim_limited(text, integer, text[], uuid[], text, '
                   'float8, integer) SET search_path = pg_catalog, %I, pg_temp', home, home);
END;
$$;

-- migrate:down
ALTER FUNCTION brooq_claim_limited(text, integer, text[], uuid[], text, float8, integer)
    RESET search_path;

CREATE OR REPLACE FUNCTION brooq_job_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM brooq_new_job WHERE available_at <= now()) THEN
        PERFORM pg_notify('brooq_job', '');
    END IF;
    RETURN NULL;
END;
$$;
