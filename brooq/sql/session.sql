-- Settings a brooq connection reads or sets, whoever opens it (child, master, pooler).

-- name: session_settings_local
-- Behind a transaction pooler (brooq/pooler.py) a connection has no session of its own:
-- brooq's session settings are set for one transaction, in the same pipeline (the same
-- round trip) as the statement they are for.
SELECT set_config(s.name, s.value, true)
FROM unnest(%(names)s::text[], %(values)s::text[]) AS s(name, value)

-- name: session_setting_get
-- Whether the `options` startup parameter was applied: a pooler that ignores it (PgBouncer's
-- ignore_startup_parameters) would leave brooq without its session settings, silently.
SELECT current_setting(%(name)s)
