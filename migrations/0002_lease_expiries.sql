-- How many times a job's lease expired (its worker vanished while it ran): the reaper
-- returns such a job with its attempt refunded, since an expired lease is a crash and not
-- a recorded failure, and this count is what bounds a job that takes whole hosts down
-- (QUEUE_MAX_LEASE_EXPIRIES, then dead).
-- A NOT NULL column with a constant default is a catalog change since PostgreSQL 11: the
-- table is not rewritten, and the ACCESS EXCLUSIVE lock is held for milliseconds whatever
-- the table's size (measured in RELIABILITY.md).
-- migrate:up
ALTER TABLE job ADD COLUMN lease_expiries integer NOT NULL DEFAULT 0;

-- migrate:down
ALTER TABLE job DROP COLUMN lease_expiries;
