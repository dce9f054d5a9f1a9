-- brooq.migrate: the version table, its lock, and the checks around a migration.

-- name: schema_check
-- Before the master forks: is the job table that the search_path finds brooq's, and is
-- the migrations' bookkeeping there? One row, whatever exists; the table names resolve
-- exactly as brooq's statements will resolve them (search_path, DSN options included).
SELECT n.nspname AS job_schema,
       coalesce(ARRAY(SELECT a.attname::text FROM pg_attribute a
                      WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
                '{}') AS job_columns,
       to_regclass({brooq_migration:name}) IS NOT NULL AS has_versions,
       current_setting('search_path') AS search_path
FROM (SELECT to_regclass({job:name}) AS oid) AS j
LEFT JOIN pg_class c ON c.oid = j.oid
LEFT JOIN pg_namespace n ON n.oid = c.relnamespace

-- name: migration_versions
-- The versions recorded by `brooq migrate` (run only once schema_check or
-- migration_table_exists found the table), each with its state: 'applied', or, for a
-- no-transaction file stopped part-way, 'applying' or 'reverting'. A table of an older
-- brooq has no state column: its rows read as 'applied' (to_jsonb reads whatever
-- columns the row has).
SELECT v.version, v.applied_at, coalesce(to_jsonb(v) ->> 'state', 'applied') AS state
FROM {brooq_migration} AS v
ORDER BY v.version

-- The migrator's own bookkeeping (brooq/migrate.py). The version table's name is fixed
-- (brooq.migrate.VERSION_TABLE); the migration files' own text is the one SQL run from
-- elsewhere (brooq.migrate._run, marked sql-outside).

-- name: migration_lock
-- A session advisory lock held while migrating (key brooq.migrate.LOCK_KEY), so that two
-- deploy steps cannot race. Tried, never waited for inside a statement: a session
-- waiting in pg_advisory_lock holds a snapshot, and CREATE INDEX CONCURRENTLY in the
-- session that has the lock waits for every older snapshot to go (a deadlock nobody
-- detects). The migrator polls instead.
SELECT pg_try_advisory_lock(%(key)s) AS locked

-- name: migration_unlock
SELECT pg_advisory_unlock(%(key)s)

-- name: migration_create_schema
-- QUEUE_SCHEMA: `brooq migrate up` creates the schema. Composed with psycopg.sql: the
-- placeholder is the schema's Identifier.
CREATE SCHEMA IF NOT EXISTS {}

-- name: migration_use_schema
-- QUEUE_SCHEMA: the migration files name brooq's relations bare, so they run with the
-- schema alone on the search_path (session-wide; the former path is kept for
-- migration_restore_search_path). Composed with psycopg.sql: the placeholder is the
-- Literal of the schema's quoted name.
SELECT set_config('brooq.saved_search_path', current_setting('search_path'), false),
       set_config('search_path', {}, false)

-- name: migration_restore_search_path
SELECT set_config('search_path', current_setting('brooq.saved_search_path'), false)

-- name: migration_table_exists
SELECT to_regclass({brooq_migration:name}) IS NOT NULL AS present

-- name: migration_create_table
CREATE TABLE IF NOT EXISTS {brooq_migration} (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    state text NOT NULL DEFAULT 'applied' CHECK (state IN ('applied', 'applying', 'reverting'))
)

-- name: migration_add_state
-- The state column, on a version table an older brooq made (a catalog change).
ALTER TABLE {brooq_migration}
    ADD COLUMN IF NOT EXISTS state text NOT NULL DEFAULT 'applied'
        CHECK (state IN ('applied', 'applying', 'reverting'))

-- name: migration_record
-- A version's state: 'applied', or 'applying' / 'reverting' while a no-transaction file's
-- statements run (written in the transaction of the statement that changes the schema).
INSERT INTO {brooq_migration} (version, name, state)
VALUES (%(version)s, %(name)s, %(state)s)
ON CONFLICT (version) DO UPDATE SET state = excluded.state, applied_at = now()

-- name: migration_missing
-- Which of the objects (as brooq.schema.files.leaves names them: "table x",
-- "index x", "function x", "trigger x", "constraint x", "column t.c") are not in the
-- schema the migrator's search_path creates in, in the order given. An invalid index
-- (a failed concurrent build) and a constraint not validated count as missing.
SELECT o.what
FROM unnest(%(objects)s::text[]) WITH ORDINALITY AS o(what, n)
CROSS JOIN LATERAL (
    SELECT split_part(o.what, ' ', 1) AS kind, split_part(o.what, ' ', 2) AS name,
           (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) AS ns
) AS x
WHERE NOT CASE x.kind
    WHEN 'table' THEN EXISTS (
        SELECT FROM pg_class c WHERE c.relname = x.name AND c.relnamespace = x.ns)
    WHEN 'index' THEN EXISTS (
        SELECT FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid
        WHERE c.relname = x.name AND c.relnamespace = x.ns AND i.indisvalid)
    WHEN 'function' THEN EXISTS (
        SELECT FROM pg_proc p WHERE p.proname = x.name AND p.pronamespace = x.ns)
    WHEN 'trigger' THEN EXISTS (
        SELECT FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        WHERE t.tgname = x.name AND c.relnamespace = x.ns)
    WHEN 'constraint' THEN EXISTS (
        SELECT FROM pg_constraint k
        WHERE k.conname = x.name AND k.connamespace = x.ns AND k.convalidated)
    WHEN 'column' THEN EXISTS (
        SELECT FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        WHERE c.relname = split_part(x.name, '.', 1) AND c.relnamespace = x.ns
          AND a.attname = split_part(x.name, '.', 2) AND a.attnum > 0 AND NOT a.attisdropped)
    ELSE true
END
ORDER BY o.n

-- name: migration_index_states
-- Each named index of the migrator's schema: valid, invalid, or absent (NULL); compared
-- before and after a concurrent statement that failed, to know whether it changed
-- anything.
SELECT n.name::text,
       (SELECT i.indisvalid FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid
        WHERE c.relname = n.name
          AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()))
           AS valid
FROM unnest(%(names)s::text[]) AS n(name)
ORDER BY 1

-- name: migration_delete
DELETE FROM {brooq_migration} WHERE version = %(version)s

-- name: migration_count
SELECT count(*) AS applied FROM {brooq_migration}

-- name: migration_drop_table
-- Undoing the first migration leaves nothing of brooq's, its bookkeeping included.
DROP TABLE {brooq_migration}

-- name: migration_set_lock_timeout
-- For the no-transaction migrations (brooq/migrate.py says why they exist).
-- Session-wide on the migrator's own connection, reset after the file.
SELECT set_config('lock_timeout', %(timeout)s, false)

-- name: migration_reset_lock_timeout
RESET lock_timeout

-- name: migration_invalid_indexes
-- The invalid indexes of the job table among the given names: what a failed
-- CREATE INDEX CONCURRENTLY leaves behind.
SELECT n.nspname::text AS schema, c.relname::text AS name
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE i.indrelid = to_regclass({job:name}) AND NOT i.indisvalid
  AND c.relname = ANY(%(names)s::text[])
ORDER BY 1, 2

-- name: migration_drop_index
-- Composed with psycopg.sql: the placeholder is the index's qualified Identifier.
DROP INDEX CONCURRENTLY IF EXISTS {}

-- name: migration_lock_holders
-- Who may be holding what a timed-out statement waited for: other sessions whose
-- transaction has been open at least as long as the wait (shorter ones cannot have
-- held it all along) and holds a lock on job or a snapshot (CREATE INDEX CONCURRENTLY
-- waits for every older transaction). No query text: it may hold literals.
SELECT a.pid,
       coalesce(nullif(a.application_name, ''), a.usename::text) || ', ' || a.state
           || ', transaction open for ' || date_trunc('second', now() - a.xact_start)::text AS what
FROM pg_stat_activity a
WHERE a.pid <> pg_backend_pid()
  AND a.datname = current_database()
  AND a.xact_start <= now() - %(waited)s::interval
  AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL
       OR EXISTS (SELECT FROM pg_locks l
                  WHERE l.pid = a.pid AND l.relation = to_regclass({job:name})
                    AND l.database = (SELECT d.oid FROM pg_database d
                                      WHERE d.datname = current_database())))
ORDER BY a.xact_start
LIMIT 5
