-- The fleet, visible: each brooq-master keeps one row here while it runs (written at
-- start and on every beat, QUEUE_FLEET_BEAT; refreshed when its children change; deleted
-- when it stops). A row not written for MISSED_BEATS (brooq.masters) of its own beats is
-- a master that vanished (SIGKILL, a host gone): readers ignore it, and a master deletes
-- it now and then. `brooq fleet`, the status page's /fleet, and the "no handler" mark of
-- `brooq stats` and of the overview read it. A new, empty table: transactional, and no
-- lock on the job table.
-- migrate:up
CREATE TABLE brooq_master (
    id uuid PRIMARY KEY,
    host text NOT NULL,
    pid integer NOT NULL,
    version text NOT NULL,
    app text NOT NULL,
    queues text[] NOT NULL,
    topics text[] NOT NULL,
    children jsonb NOT NULL DEFAULT '[]'::jsonb,
    beat_seconds float8 NOT NULL CHECK (beat_seconds > 0),
    started_at timestamptz NOT NULL,
    seen_at timestamptz NOT NULL DEFAULT now()
);

-- migrate:down
DROP TABLE brooq_master;
