-- Settings a brooq connection reads or sets, whoever opens it (child, master, pooler), and
-- whether its server is a standby.

-- name: session_settings_local
-- Behind a transaction pooler (brooq/db.py) a connection has no session of its own:
-- brooq's session settings are set for one transaction, in the same pipeline (the same
-- round trip) as the statement they are for.
SELECT set_config(s.name, s.value, true)
FROM unnest(%(names)s::text[], %(values)s::text[]) AS s(name, value)

-- name: session_setting_get
-- Whether the `options` startup parameter was applied: a pooler that ignores it (PgBouncer's
-- ignore_startup_parameters) would leave brooq without its session settings, silently.
SELECT current_setting(%(name)s)

-- name: session_time_zone_utc
-- A child's session on a server whose time zone is another name of UTC (Etc/UTC, say)
-- takes the name UTC: the same offsets for every statement and every on_success hook, and
-- psycopg reads the claims' timestamps with datetime's own UTC instead of converting
-- each through zoneinfo (brooq/worker/connection.py).
SELECT set_config('TimeZone', 'UTC', false)

-- name: server_in_recovery
-- Whether the server is a standby, on PostgreSQL 13 (14 and later report in_hot_standby
-- when a session starts: brooq/db.py reads that instead, with no round trip).
SELECT pg_is_in_recovery()
