"""brooq: a PostgreSQL job queue for Python, run by a preforking supervisor.

The names applications use are imported here; inside brooq every module imports from the
module that defines a name, never from this package.

- `app`: loading the application named by --app MODULE:ATTR
- `queue`: brooq.Queue, the application object: its face, delegating to the rooms below
- `job`: the vocabulary: Job, JobRecord, Claim, states, transition rules, handler signals
- `job_options`: a Job's unique_key, debounce, tags, group and after: their checks and refusals
- `encoding`: a payload or result as the JSON text jsonb stores, a model instance to JSON
- `errors`: brooq's exceptions
- `durations`: durations given as numbers, timedeltas or text, and their words
- `settings`: the settings: defaults, QUEUE_* environment, validation, the time limits' order
- `dsn`: where the connection strings come from, and naming a database without its password
- `db`: connecting: the timeout, plain connections, poolers, standbys, brooq's errors
- `logs`: brooq's log lines and their formats
- `metrics`: the Prometheus metrics the master and its children write and serve
- `rules`: what master and children both read: backoff, error text, timing, worked queues
- `tracing`: OpenTelemetry: is a tracer configured, the producer's span and trace context
- `migrate`: applying and reverting the schema's migrations, and the version check
- `master_cli`: the `brooq-master` entry point

The rooms, each a package (its own `__init__` maps it):

- `producer`: putting jobs into the table and waiting for their end: inserts, pools, waits
- `declare`: what an application declares: handlers, payload types, schedules, rates
- `schema`: the migration files, their checks and scripts, the embedded database
- `operator`: the operator's reads and writes as functions of a connection
- `ipc`: the master and its children talking: the board, the channel, progress, the protocol
- `supervisor`: brooq-master: the supervisor that forks, watches and replaces the children
- `worker`: the child: claiming, running and writing the outcome of jobs
- `opsport`: what the ops port's two processes share: HTTP messages, Host rule, hand-over
- `page`: the status page's own process: its loop, sign-in, actions, reads and rendering
- `cli`: the `brooq` command: migrate, enqueue, jobs, queues, stats, top, periodic, sql
- `sql`: brooq's SQL as named statements, rendered per schema
- `testing`: running a Queue's jobs in tests, and the pytest plugin
"""

from brooq.declare.handlers import HandlerFn
from brooq.declare.rates import Rate
from brooq.errors import (
    AppLoadError,
    BrooqError,
    DatabaseUnavailable,
    EnqueueDeadlock,
    InvalidAfter,
    InvalidDebounce,
    InvalidDsn,
    InvalidGroup,
    InvalidIdempotencyKey,
    InvalidJob,
    InvalidJobId,
    InvalidOrderingKey,
    InvalidPayload,
    InvalidPriority,
    InvalidQueue,
    InvalidResult,
    InvalidSettings,
    InvalidTags,
    InvalidTopic,
    InvalidTransition,
    InvalidUniqueKey,
    JobNotFound,
    JobNotRunning,
    NaiveDatetime,
    PayloadMismatch,
    PoolerMismatch,
    ReadOnlyDatabase,
    SchemaMissing,
    StackUnavailable,
    WaitTimeout,
)
from brooq.job import (
    AttemptTimeout,
    CancelJob,
    ChildJob,
    Claim,
    Delay,
    Job,
    JobRecord,
    LeaseLost,
    PreserveAttempt,
    UpstreamJob,
)
from brooq.operator.keys import BlockedKey
from brooq.operator.records import (
    AttemptLog,
    BulkResult,
    GroupLimit,
    HolderStats,
    InFlight,
    QueueStats,
    TopicLimits,
    TopicStats,
)
from brooq.producer.cancel import (
    cancel,
    cancel_async,
    hold,
    hold_async,
    release,
    release_async,
)
from brooq.producer.events import emit_event, emit_event_async
from brooq.producer.insert import enqueue, enqueue_async, enqueue_many, enqueue_many_async
from brooq.producer.stacks import JobStack
from brooq.queue import Queue

__version__ = "0.1.0"

__all__ = [
    "AppLoadError",
    "AttemptLog",
    "AttemptTimeout",
    "BlockedKey",
    "BrooqError",
    "BulkResult",
    "CancelJob",
    "ChildJob",
    "Claim",
    "DatabaseUnavailable",
    "Delay",
    "EnqueueDeadlock",
    "GroupLimit",
    "HandlerFn",
    "HolderStats",
    "InFlight",
    "InvalidAfter",
    "InvalidDebounce",
    "InvalidDsn",
    "InvalidGroup",
    "InvalidIdempotencyKey",
    "InvalidJob",
    "InvalidJobId",
    "InvalidOrderingKey",
    "InvalidPayload",
    "InvalidPriority",
    "InvalidQueue",
    "InvalidResult",
    "InvalidSettings",
    "InvalidTags",
    "InvalidTopic",
    "InvalidTransition",
    "InvalidUniqueKey",
    "Job",
    "JobNotFound",
    "JobNotRunning",
    "JobRecord",
    "JobStack",
    "LeaseLost",
    "NaiveDatetime",
    "PayloadMismatch",
    "PoolerMismatch",
    "PreserveAttempt",
    "Queue",
    "QueueStats",
    "Rate",
    "ReadOnlyDatabase",
    "SchemaMissing",
    "StackUnavailable",
    "TopicLimits",
    "TopicStats",
    "UpstreamJob",
    "WaitTimeout",
    "__version__",
    "cancel",
    "cancel_async",
    "emit_event",
    "emit_event_async",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "hold",
    "hold_async",
    "release",
    "release_async",
]
