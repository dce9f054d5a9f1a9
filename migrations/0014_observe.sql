-- What a job says about itself while and after it runs (docs/how-to/job-logs-and-progress.md,
-- docs/how-to/tracing.md):
--   job.progress, job.progress_message: the last `claim.progress(fraction, message)` of a
--     running handler, carried by the master's lease renewal (job_renew_leases_progress).
--   job.logs: the log records of a `keep_logs=True` handler, one entry per attempt
--     ({"attempt", "at", "text"}, the last 20 attempts), written with the outcome.
--   job.traceparent: the W3C trace context of the span that enqueued the job, when the
--     producer traced it (brooq[otel]); NULL for a job enqueued without tracing.
-- Every column is nullable without a default: adding them is a catalog change, the
-- table is not rewritten; ACCESS EXCLUSIVE on job for about a millisecond
-- (benchmarks/migration_locks.py --migration 14, docs/reference/schema.md).
-- No-transaction: the one statement runs under the migrator's lock_timeout and is
-- retried, so a long transaction reading job never queues producers behind it; it is
-- idempotent.
-- migrate:no-transaction
-- migrate:up
ALTER TABLE job ADD COLUMN IF NOT EXISTS progress double precision,
                ADD COLUMN IF NOT EXISTS progress_message text,
                ADD COLUMN IF NOT EXISTS logs jsonb,
                ADD COLUMN IF NOT EXISTS traceparent text;

-- migrate:down
ALTER TABLE job DROP COLUMN IF EXISTS traceparent,
                DROP COLUMN IF EXISTS logs,
                DROP COLUMN IF EXISTS progress_message,
                DROP COLUMN IF EXISTS progress;
