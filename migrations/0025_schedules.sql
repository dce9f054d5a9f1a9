-- Periodic schedules stored in the database, beside those an application declares in
-- code (docs/how-to/periodic.md, "Schedules at runtime"): added, changed, paused and
-- removed through Queue, `brooq periodic` and the status page, read by every master's
-- periodic duty at each pass (every second); each tick claimed once in brooq_periodic
-- as the code's are. A name that code declares too is the code's.
--   cron, every_seconds: exactly one (as queue.periodic's cron= and every=); tz an IANA
--     name; topic, payload, queue (NULL: the topic handler's), priority: the job of a tick.
--   backfill: after downtime, how many missed ticks before the due one are enqueued
--     too (0: only the most recent, as always).
--   paused: no tick is enqueued; resumed, the next tick comes (missed ones as backfill
--     says).
-- A new, empty table: transactional.
-- migrate:up
CREATE TABLE IF NOT EXISTS brooq_schedule (
    name          text        NOT NULL,
    cron          text,
    every_seconds integer,
    tz            text        NOT NULL DEFAULT 'UTC',
    topic         text        NOT NULL,
    payload       jsonb,
    queue         text,
    priority      smallint    NOT NULL DEFAULT 0,
    backfill      integer     NOT NULL DEFAULT 0,
    paused        boolean     NOT NULL DEFAULT false,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT brooq_schedule_pkey PRIMARY KEY (name),
    CONSTRAINT brooq_schedule_when_check CHECK ((cron IS NULL) <> (every_seconds IS NULL)),
    CONSTRAINT brooq_schedule_every_check CHECK (every_seconds IS NULL OR every_seconds >= 1),
    CONSTRAINT brooq_schedule_backfill_check CHECK (backfill BETWEEN 0 AND 1000)
);

-- migrate:down
DROP TABLE IF EXISTS brooq_schedule;
