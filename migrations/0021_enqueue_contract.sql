-- The enqueue contract: a job from any PostgreSQL client, by one function call
-- (docs/reference/enqueue-contract.md says what it promises and which options it covers).
--   brooq_contract_version(): the contract's version, 1. A later brooq keeps version 1's
--     function and arguments as they are; a new argument comes with a default, a change
--     that would break a caller comes as a new function and a new version.
--   brooq_uuid7(): a UUIDv7 (RFC 9562: 48 bits of Unix milliseconds, then random bits), as
--     brooq's producers make them, so a job's id sorts by its enqueue time whatever the door.
--   brooq_enqueue(topic, payload, queue, priority, run_at, idempotency_key, tags,
--     group_key): the job inserted, its id returned; with an idempotency key that a job
--     already holds (active or finished: brooq_job_key), that job's id and nothing
--     written. Bad values are refused by job's own CHECKs, which name what was wrong.
--     The insert's trigger wakes the masters as any enqueue does.
-- Functions only: no lock on job. No-transaction, every statement idempotent.
-- migrate:no-transaction
-- migrate:up
CREATE OR REPLACE FUNCTION brooq_contract_version() RETURNS integer
LANGUAGE sql IMMUTABLE AS $$ SELECT 1 $$;

CREATE OR REPLACE FUNCTION brooq_uuid7() RETURNS uuid
LANGUAGE sql VOLATILE AS $$
    -- A random (version 4) UUID, its first 48 bits replaced by the time in milliseconds,
    -- its version bits set from 0100 to 0111.
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp())
                                                     * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$;

CREATE OR REPLACE FUNCTION brooq_enqueue(
    topic text,
    payload jsonb DEFAULT 'null',
    queue text DEFAULT 'default',
    priority integer DEFAULT 0,
    run_at timestamptz DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    tags text[] DEFAULT NULL,
    group_key text DEFAULT NULL
) RETURNS uuid
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    made uuid;
BEGIN
    IF brooq_enqueue.topic IS NULL THEN
        RAISE EXCEPTION 'brooq_enqueue: topic is required' USING ERRCODE = 'not_null_violation';
    END IF;
    IF brooq_enqueue.priority NOT BETWEEN -32768 AND 32767 THEN
        RAISE EXCEPTION 'brooq_enqueue: priority must be between -32768 and 32767, got %',
            brooq_enqueue.priority USING ERRCODE = 'numeric_value_out_of_range';
    END IF;
    IF brooq_enqueue.idempotency_key IS NOT NULL THEN
        SELECT k.job_id INTO made FROM brooq_job_key k
        WHERE k.topic = brooq_enqueue.topic
          AND k.idempotency_key = brooq_enqueue.idempotency_key;
        IF FOUND THEN
            RETURN made;
        END IF;
    END IF;
    INSERT INTO job (id, topic, payload, queue, priority, available_at, idempotency_key,
                     tags, group_key)
    VALUES (brooq_uuid7(), brooq_enqueue.topic, coalesce(brooq_enqueue.payload, 'null'),
            coalesce(brooq_enqueue.queue, 'default'), coalesce(brooq_enqueue.priority, 0)::smallint,
            coalesce(run_at, now()), nullif(brooq_enqueue.idempotency_key, ''),
            brooq_enqueue.tags, brooq_enqueue.group_key)
    ON CONFLICT (topic, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id INTO made;
    IF made IS NULL THEN
        -- Taken meanwhile by a job not yet finished: that one.
        SELECT k.job_id INTO STRICT made FROM brooq_job_key k
        WHERE k.topic = brooq_enqueue.topic
          AND k.idempotency_key = brooq_enqueue.idempotency_key;
    END IF;
    RETURN made;
END;
$$;

-- migrate:down
DROP FUNCTION IF EXISTS brooq_enqueue(text, jsonb, text, integer, timestamptz, text, text[], text);

DROP FUNCTION IF EXISTS brooq_uuid7();

DROP FUNCTION IF EXISTS brooq_contract_version();
