-- Stands in for the workflows migration of the same number, which replaces this file
-- when the branches meet: it changes nothing.
-- migrate:up
SELECT 1;

-- migrate:down
SELECT 1;
