"""The LISTEN/NOTIFY channels: producers wake the master on CHANNEL; the end of a job
someone waits for (queue.wait) is notified on OUTCOME_CHANNEL.

Python code names the channels through these constants only. SQL cannot import them:
CHANNEL is spelled in brooq/sql (`listen_jobs`, `job_retry`) and in the
trigger of migrations/0001_job.sql, OUTCOME_CHANNEL in `listen_outcomes` and the trigger
function of migrations/0006_handlers.sql; tests/unit/test_settings.py checks that every one of
them says one of these. CHANNEL's payload is the job table's schema (migration 0009;
empty from an older brooq): a notification means "jobs may be ready in that schema",
never which ones, so a lost or folded notification costs latency, never a job; a master
wakes its children for its own schema only (QUEUE_SCHEMA: two installations in one
database share the channel). OUTCOME_CHANNEL's payload is the job's id; a waiter that
misses one finds the outcome by its poll. `brooq jobs stack` (brooq.producer.stacks) asks on
STACK_CHANNEL, the job id
as payload (`stack_request`, `listen_stack_requests`), and the master answers on
STACK_ANSWER_CHANNEL with the job id, unique across schemas (`stack_answer`,
`listen_stack_answers`). A processing job canceled (`job_cancel`) is notified on
CANCEL_CHANNEL, the job id as payload (`listen_cancels`): the master whose child holds it
renews at once; a lost notification costs the wait for the next renewal, nothing more.
Stands alone: master, children, producers and tests name the channels from here.
"""

from typing import Final

CHANNEL: Final = "brooq_job"
OUTCOME_CHANNEL: Final = "brooq_outcome"
STACK_CHANNEL: Final = "brooq_stack"
STACK_ANSWER_CHANNEL: Final = "brooq_stack_answer"
CANCEL_CHANNEL: Final = "brooq_cancel"
