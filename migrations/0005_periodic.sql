-- Periodic jobs: one row per schedule name, the last tick some master claimed.
-- A master claims a tick by moving last_tick forward (INSERT ... ON CONFLICT DO UPDATE
-- ... WHERE last_tick < the new tick) and enqueues its job in the same transaction, so
-- N masters enqueue each tick once, and a master whose clock is behind cannot claim a
-- tick older than one already claimed. The job rows carry no duty to stay: retention may
-- delete them at any time (last_job then names a job that is gone). A new, empty table:
-- transactional.
-- migrate:up
CREATE TABLE brooq_periodic (
    name text PRIMARY KEY,
    last_tick timestamptz NOT NULL,
    last_job uuid,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- migrate:down
DROP TABLE brooq_periodic;
