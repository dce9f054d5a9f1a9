-- The job table: one row per job, its whole fate in that row.
-- migrate:up
CREATE TABLE job (
    id              uuid        NOT NULL DEFAULT gen_random_uuid(),
    topic           text        NOT NULL,
    payload         jsonb       NOT NULL DEFAULT 'null'::jsonb,
    state           text        NOT NULL DEFAULT 'pending',
    attempts        integer     NOT NULL DEFAULT 0,
    available_at    timestamptz NOT NULL DEFAULT now(),
    locked_by       text,
    locked_until    timestamptz,
    last_error      text,
    idempotency_key text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT job_pkey PRIMARY KEY (id),
    CONSTRAINT job_state_check
        CHECK (state IN ('pending', 'processing', 'failed', 'done', 'dead', 'canceled')),
    CONSTRAINT job_attempts_check CHECK (attempts >= 0),
    CONSTRAINT job_topic_check
        CHECK (length(topic) <= 128 AND topic ~ '^[a-z0-9]+([._-][a-z0-9]+)*$'),
    -- Invariant 1: a processing row always carries its lease. Terminal rows may keep
    -- the last lease, so the converse is not required.
    CONSTRAINT job_processing_lease_check
        CHECK (state <> 'processing' OR (locked_by IS NOT NULL AND locked_until IS NOT NULL)),
    -- "" means "no key" and is stored as NULL by the producer.
    CONSTRAINT job_idempotency_key_check CHECK (idempotency_key <> '')
);

-- Invariant 8: one job per (topic, key) for the lifetime of the row.
CREATE UNIQUE INDEX job_topic_idempotency_key_key
    ON job (topic, idempotency_key) WHERE idempotency_key IS NOT NULL;

-- The claim: ready rows in FIFO order.
CREATE INDEX job_ready_idx ON job (available_at, id) WHERE state IN ('pending', 'failed');

-- The reaper: expired leases.
CREATE INDEX job_processing_lease_idx ON job (locked_until) WHERE state = 'processing';

-- Retention: terminal rows, oldest first.
CREATE INDEX job_terminal_updated_idx
    ON job (updated_at) WHERE state IN ('done', 'dead', 'canceled');

-- A queue churns: frequent short vacuums beat rare long ones.
ALTER TABLE job SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 100);

-- Wake-up: one NOTIFY per inserting statement, and only when a row is ready now.
-- NOTIFY takes a global lock at commit, so it must never run per row; PostgreSQL also
-- folds identical notifications of one transaction into one.
CREATE FUNCTION brooq_job_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM brooq_new_job WHERE available_at <= now()) THEN
        PERFORM pg_notify('brooq_job', '');
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER job_notify_insert
    AFTER INSERT ON job
    REFERENCING NEW TABLE AS brooq_new_job
    FOR EACH STATEMENT EXECUTE FUNCTION brooq_job_notify();

-- migrate:down
DROP TRIGGER job_notify_insert ON job;
DROP FUNCTION brooq_job_notify();
DROP TABLE job;
