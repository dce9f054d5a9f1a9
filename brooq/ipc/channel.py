"""The LISTEN/NOTIFY channel on which producers wake the master.

Python code names the channel through CHANNEL only. SQL cannot import it: the channel is
spelled in brooq/sql/queries.sql (`listen_jobs`, `job_retry`) and in the trigger of
migrations/0001_job.sql, and tests/test_units.py checks that every one of them says
CHANNEL. The payload is always empty: a notification means "jobs may be ready", never
which ones, so a lost or folded notification costs latency, never a job.
"""

from typing import Final

CHANNEL: Final = "brooq_job"
