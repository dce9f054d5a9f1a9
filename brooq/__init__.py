"""brooq: a PostgreSQL job queue for Python, run by a preforking supervisor.

The names applications use are imported here; inside brooq every module imports from the
module that defines a name, never from this package.

- `app`: loading the application named by --app MODULE:ATTR
- `cli`: the `brooq` command: migrate, enqueue, jobs, queues, stats, top, periodic
- `db`: the connect timeout, plain connections for commands, failures as brooq's errors
- `devdb`: a throwaway PostgreSQL for trying brooq out
- `dsn`: where the connection strings come from, and naming a database without its password
- `durations`: durations given as numbers, timedeltas or text, and their words
- `encoding`: a payload as the JSON text jsonb stores, its refusals and its size limit
- `enqueue_line`: the connection Queue.enqueue keeps for itself: one job, one libpq round trip
- `errors`: brooq's exceptions
- `handlers`: a registered handler and its options, policy and typed payload
- `ids`: UUIDv7 job ids
- `ipc`: the master and its children talking: the board, the channel, the protocol
- `job`: the vocabulary: Job, JobRecord, Claim, the states and the operator's transition rules
- `job_options`: a Job's unique_key, debounce, tags, group and after: their checks and refusals
- `job_wait`: waiting for a job's end: the wait clock, one wait loop, its sync and async drivers
- `limits`: the time limits' ordering and caps, for settings and handler options
- `logs`: brooq's log lines and their formats
- `masters`: the masters' table as its readers see it: live masters, what no master handles
- `master_cli`: the `brooq-master` entry point
- `metrics`: the Prometheus metrics the master and its children write and serve
- `migrate`: applying and reverting the schema's migrations, and the version check
- `migration_files`: the migration files: found, read, checked, split into statements
- `migration_check`: the version records and the schema checked against them
- `migration_script`: the migrations' SQL for another tool (`brooq migrate sql`, Django)
- `operator`: the operator's reads and writes as functions of a connection
- `opsport`: what the ops port's two processes share: HTTP messages, Host rule, hand-over
- `page`: the status page's own process: its loop, sign-in, actions, reads and rendering
- `payload_checks`: the checkers of typed payloads, one per annotation, and their refusals' words
- `payloads`: typed payloads: a handler's model to a codec of its jobs' JSON, and back
- `periodic`: schedules: cron and every, their ticks and the job of each tick
- `poolcheck`: the check of a pooled connection before it is handed out
- `pooler`: running behind a transaction pooler: connect arguments, the direct rule, errors
- `pools`: a Queue's sync and async connection pools, their fork rules and errors
- `progress`: a running handler's progress: its checks and where a report goes
- `produce`: putting jobs into the job table: enqueue and enqueue_many, sync and async, one logic
- `produce_drive`: the drivers of the insert steps; a graph's steps in one transaction
- `produce_graph`: the insert steps of a batch with jobs that wait (after): names, then edges
- `produce_options`: the insert steps of a job with a unique_key, debounce or tags
- `produce_steps`: what an insert asks its driver to run, the rows it answers, a job's queue,
  the COPY rows of a batch without keys
- `queue`: brooq.Queue, the application object: its face, delegating to the modules here
- `rates`: rates (at most N starts per period): Rate, the forms the options accept, the allowance
- `registry`: what an application declares: handlers, middleware, schedules, settings
- `rules`: what master and children both read: backoff, error text, timing, worked queues
- `settings`: the settings: defaults, QUEUE_* environment, validation
- `signals`: the signals a handler raises (Delay, CancelJob, ...) and brooq's interruptions
- `sql`: brooq's SQL as named statements, rendered per schema
- `plans`: a statement PREPAREd as a worker child plans it, for the EXPLAIN tools
- `stacks`: a running job's Python stack, asked and answered through PostgreSQL
- `standby`: a server that refuses writes: telling a standby from a primary, and saying so
- `supervisor`: brooq-master: the supervisor that forks, watches and replaces the children
- `targets`: what a caller's transaction may be: psycopg, Django and SQLAlchemy connections
- `testing`: running a Queue's jobs in tests, and the pytest plugin
- `tracing`: OpenTelemetry: is a tracer configured, the producer's span and trace context
- `wait_listener`: the one LISTEN connection every waiter of a Queue shares in a process
- `worker`: the child: claiming, running and writing the outcome of jobs
"""

from brooq.errors import (
    BrooqError,
    DatabaseUnavailable,
    InvalidAfter,
    InvalidDebounce,
    InvalidDsn,
    InvalidGroup,
    InvalidIdempotencyKey,
    InvalidJob,
    InvalidJobId,
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
    Claim,
    Delay,
    Job,
    JobRecord,
    LeaseLost,
    PreserveAttempt,
    UpstreamJob,
)
from brooq.operator.records import (
    AttemptLog,
    BulkResult,
    HolderStats,
    InFlight,
    QueueStats,
    TopicLimits,
    TopicStats,
)
from brooq.produce import enqueue, enqueue_async, enqueue_many, enqueue_many_async
from brooq.queue import Queue
from brooq.rates import Rate
from brooq.stacks import JobStack

__version__ = "0.1.0"

__all__ = [
    "AttemptLog",
    "AttemptTimeout",
    "BrooqError",
    "BulkResult",
    "CancelJob",
    "Claim",
    "DatabaseUnavailable",
    "Delay",
    "HolderStats",
    "InFlight",
    "InvalidAfter",
    "InvalidDebounce",
    "InvalidDsn",
    "InvalidGroup",
    "InvalidIdempotencyKey",
    "InvalidJob",
    "InvalidJobId",
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
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
]
