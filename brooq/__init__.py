"""brooq: a PostgreSQL job queue for Python, run by a preforking supervisor."""

from brooq.errors import (
    BrooqError,
    DatabaseUnavailable,
    InvalidDsn,
    InvalidIdempotencyKey,
    InvalidJob,
    InvalidJobId,
    InvalidPayload,
    InvalidPriority,
    InvalidQueue,
    InvalidSettings,
    InvalidTopic,
    InvalidTransition,
    JobNotFound,
    NaiveDatetime,
    SchemaMissing,
)
from brooq.job import (
    AttemptTimeout,
    CancelJob,
    Claim,
    Delay,
    Job,
    JobRecord,
    LeaseLost,
    PreserveAttempt,
)
from brooq.produce import enqueue, enqueue_async
from brooq.queue import InFlight, Queue, QueueStats, TopicStats

__version__ = "0.1.0"

__all__ = [
    "AttemptTimeout",
    "BrooqError",
    "CancelJob",
    "Claim",
    "DatabaseUnavailable",
    "Delay",
    "InFlight",
    "InvalidDsn",
    "InvalidIdempotencyKey",
    "InvalidJob",
    "InvalidJobId",
    "InvalidPayload",
    "InvalidPriority",
    "InvalidQueue",
    "InvalidSettings",
    "InvalidTopic",
    "InvalidTransition",
    "Job",
    "JobNotFound",
    "JobRecord",
    "LeaseLost",
    "NaiveDatetime",
    "PreserveAttempt",
    "Queue",
    "QueueStats",
    "SchemaMissing",
    "TopicStats",
    "__version__",
    "enqueue",
    "enqueue_async",
]
