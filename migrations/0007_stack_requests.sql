-- `brooq jobs stack ID`: the request for a running job's Python stack and its
-- answer travel through PostgreSQL, so that the command works from any host. The command
-- inserts a request and notifies brooq_stack with the job id; the master whose child
-- runs the job asks that child, writes the stack into the request row and notifies
-- brooq_stack_answer with the request id; the command reads the row and deletes it. A
-- request nobody answers is deleted by the command at its timeout (and by the master's
-- retention, an hour later, if the command died). A new, empty table: transactional, and
-- no lock on the job table.
-- migrate:up
CREATE TABLE brooq_stack_request (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id uuid NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT now(),
    answered_at timestamptz,
    worker text,
    stack text
);
CREATE INDEX brooq_stack_request_job ON brooq_stack_request (job_id) WHERE answered_at IS NULL;

-- migrate:down
DROP TABLE brooq_stack_request;
