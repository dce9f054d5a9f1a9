"""Settings: defaults, the QUEUE_* environment, Queue(**settings) and flags, validated at once.

Precedence, lowest first: built-in defaults, the environment, keyword arguments of
``brooq.Queue``, command-line flags. An empty environment variable counts as unset, with
one exception: ``QUEUE_OPS_ADDR=`` turns the ops surface off (an environment file must be
able to). Every problem is collected and reported together (InvalidSettings.problems).

Owns: the settings, their defaults, their QUEUE_* names, converting and validating them
(brooq.settings words the ordering of the time limits, for handler options too).
Must never: read anything but the environment and the values it is given (no files, no
database), or let an invalid combination through: load() raises with every problem.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from brooq.durations import parse_duration_string, to_seconds, too_long
from brooq.errors import InvalidJob, InvalidSettings
from brooq.job import DEFAULT_MAX_PAYLOAD_BYTES, validate_queue
from brooq.sql import schema_problem

# The queues a master works, with their weights: (("default", 4), ("bulk", 1)).
QueueWeights = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Settings:
    workers: int = 2
    poll_interval: float = 1.0
    lease: float = 30.0
    attempt_timeout: float = 60.0
    max_execution_timeout: float = 300.0
    backoff_base: float = 1.0
    backoff_max: float = 60.0
    max_attempts: int = 5
    # Expired leases (a worker vanished with the job) before the reaper makes a job dead.
    max_lease_expiries: int = 5
    reaper_period: float = 0.0  # 0: max(5s, lease/4)
    retention_ttl: float = 30 * 86400.0  # 0: retention disabled
    retention_batch: int = 1000
    retention_period: float = 0.0  # 0: computed
    # The span of one partition of job_history (brooq.supervisor.history): whole hours
    # that divide a day, or whole days.
    history_partition: float = 86400.0
    graceful_timeout: float = 30.0
    watchdog_grace: float = 0.0  # 0: equal to the lease
    ops_addr: str = "127.0.0.1:8090"
    # Host names the ops port answers beyond its own (brooq.opsport.hosts): a proxy's.
    ops_allowed_hosts: tuple[str, ...] = ()
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    max_jobs_per_child: int = 0  # 0: never recycle by count
    max_memory_per_child: int = 0  # MiB of resident memory; 0: never recycle by memory
    stats_period: float = 5.0
    # The master's own VACUUM of the job table (brooq/supervisor/vacuum.py): started when
    # its dead tuples reach this many (0: leave it to autovacuum), looked at every period.
    vacuum_dead_tuples: int = 100_000
    vacuum_period: float = 2.0
    # A snapshot held this long (a long transaction elsewhere, a standby's feedback, a
    # slot, a prepared transaction) is named in the master's log, once (0: never).
    snapshot_warn: float = 300.0
    # How often a master writes its row in brooq_master (brooq.operator.masters): a master that
    # missed MISSED_BEATS of them is taken for gone.
    fleet_beat: float = 10.0
    # 1: always one job per claim. Each claim walks the front of the ready index, which
    # holds the entries of every job claimed since the last VACUUM (killed, still read):
    # fewer, larger claims of short jobs walk it less often (docs/decisions.md).
    claim_batch_max: int = 256
    # The workers' own claim and outcome commits. "on" (the default) waits for each
    # commit's WAL flush, as the peers' workers do; its cost to a no-op drain is within
    # the 10 % the rule allows (docs/decisions.md). "off" risks only a re-run after a
    # crash of PostgreSQL (at least once allows it); enqueue is never affected.
    worker_synchronous_commit: str = "on"
    # "transaction": DATABASE_URL goes through a transaction pooler such as PgBouncer
    # (docs/poolers.md): no session state on its connections, prepared statements off;
    # LISTEN and the master's own connections use QUEUE_LISTEN_DATABASE_URL.
    pooler: str = "none"
    # The queues this master works and their weights (--queues default=4,bulk=1). Empty:
    # every queue its handlers declare, weight 1 each (brooq.supervisor.command decides).
    queues: QueueWeights = ()
    # Async handlers (docs/async.md): jobs one async child runs at once; how many of the
    # children run the async topics when the application has both kinds; how long an
    # async child's event loop may stop reporting before the master kills it.
    concurrency: int = 100
    async_workers: int = 1
    loop_block_timeout: float = 5.0
    # brooq's own schema (QUEUE_SCHEMA, docs/design.md): every statement names brooq's
    # relations in it. None: unqualified, found through the connection's search_path.
    schema: str | None = None

    @property
    def effective_reaper_period(self) -> float:
        return self.reaper_period or max(5.0, self.lease / 4)

    @property
    def effective_retention_period(self) -> float:
        return self.retention_period or 60.0

    @property
    def effective_watchdog_grace(self) -> float:
        return self.watchdog_grace or self.lease

    @property
    def renew_period(self) -> float:
        return self.lease / 3


_DURATIONS = {
    "poll_interval",
    "lease",
    "attempt_timeout",
    "max_execution_timeout",
    "backoff_base",
    "backoff_max",
    "reaper_period",
    "retention_ttl",
    "retention_period",
    "history_partition",
    "graceful_timeout",
    "watchdog_grace",
    "stats_period",
    "loop_block_timeout",
    "vacuum_period",
    "fleet_beat",
    "snapshot_warn",
}
_INTEGERS = {
    "workers",
    "max_attempts",
    "max_lease_expiries",
    "retention_batch",
    "max_payload_bytes",
    "max_jobs_per_child",
    "max_memory_per_child",
    "claim_batch_max",
    "concurrency",
    "async_workers",
    "vacuum_dead_tuples",
}
_STRINGS = {"ops_addr", "worker_synchronous_commit", "pooler"}
_QUEUE_LISTS = {"queues"}
_HOST_LISTS = {"ops_allowed_hosts"}
_SCHEMAS = {"schema"}
# Integer settings reach int4 columns and parameters (attempts, LIMIT): PostgreSQL's integer.
MAX_INTEGER = 2**31 - 1
# Jobs one async child runs at once: its board holds a slot for each (brooq.ipc.board).
MAX_CONCURRENCY = 10_000

ENVIRONMENT: dict[str, str] = {
    "QUEUE_WORKERS": "workers",
    "QUEUE_POLL_INTERVAL": "poll_interval",
    "QUEUE_LEASE": "lease",
    "QUEUE_ATTEMPT_TIMEOUT": "attempt_timeout",
    "QUEUE_MAX_EXECUTION_TIMEOUT": "max_execution_timeout",
    "QUEUE_BACKOFF_BASE": "backoff_base",
    "QUEUE_BACKOFF_MAX": "backoff_max",
    "QUEUE_MAX_ATTEMPTS": "max_attempts",
    "QUEUE_MAX_LEASE_EXPIRIES": "max_lease_expiries",
    "QUEUE_REAPER_PERIOD": "reaper_period",
    "QUEUE_RETENTION_TTL": "retention_ttl",
    "QUEUE_RETENTION_BATCH": "retention_batch",
    "QUEUE_RETENTION_PERIOD": "retention_period",
    "QUEUE_HISTORY_PARTITION": "history_partition",
    "QUEUE_GRACEFUL_TIMEOUT": "graceful_timeout",
    "QUEUE_WATCHDOG_GRACE": "watchdog_grace",
    "QUEUE_OPS_ADDR": "ops_addr",
    "QUEUE_OPS_ALLOWED_HOSTS": "ops_allowed_hosts",
    "QUEUE_MAX_PAYLOAD_BYTES": "max_payload_bytes",
    "QUEUE_MAX_JOBS_PER_CHILD": "max_jobs_per_child",
    "QUEUE_MAX_MEMORY_PER_CHILD": "max_memory_per_child",
    "QUEUE_STATS_PERIOD": "stats_period",
    "QUEUE_VACUUM_DEAD_TUPLES": "vacuum_dead_tuples",
    "QUEUE_VACUUM_PERIOD": "vacuum_period",
    "QUEUE_FLEET_BEAT": "fleet_beat",
    "QUEUE_SNAPSHOT_WARN": "snapshot_warn",
    "QUEUE_CLAIM_BATCH_MAX": "claim_batch_max",
    "QUEUE_WORKER_SYNCHRONOUS_COMMIT": "worker_synchronous_commit",
    "QUEUE_QUEUES": "queues",
    "QUEUE_POOLER": "pooler",
    "QUEUE_CONCURRENCY": "concurrency",
    "QUEUE_ASYNC_WORKERS": "async_workers",
    "QUEUE_LOOP_BLOCK_TIMEOUT": "loop_block_timeout",
    "QUEUE_SCHEMA": "schema",
}
FIELDS = {f.name for f in dataclasses.fields(Settings)}
# Variables whose empty value is a value ("off"), not "unset".
EMPTY_MEANS_OFF = {"QUEUE_OPS_ADDR"}


class _Problems(ValueError):
    """Several problems with one value (a queue list), each to be listed."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


def _weight(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def parse_queues(value: Any, source: str) -> QueueWeights:
    """``"default=4,bulk=1"`` (a bare name weighs 1), a mapping {name: weight} or a
    sequence of names or (name, weight) pairs; raises _Problems listing every problem:
    a malformed name, a weight that is not an integer or is below 1, a repeated name."""
    items: list[tuple[Any, Any]] = []
    if isinstance(value, str):
        for part in value.split(","):
            text, sep, given = part.strip().partition("=")
            items.append((text.strip(), given if sep else "1"))
    elif isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, list | tuple):
        for v in value:
            pair = (v, 1) if isinstance(v, str) else tuple(v) if isinstance(v, list | tuple) else ()
            if len(pair) != 2:
                raise _Problems([f"{source}: expected queue names or (name, weight) pairs"])
            items.append((pair[0], pair[1]))
    else:
        raise _Problems([f"{source}: expected NAME=WEIGHT,... , got {type(value).__name__}"])
    problems: list[str] = []
    parsed: list[tuple[str, int]] = []
    seen: set[str] = set()
    for name, raw in items:
        if name == "":
            problems.append(f"{source}: an empty queue name (NAME=WEIGHT items, comma-separated)")
            continue
        try:
            validate_queue(name)
        except InvalidJob as exc:
            problems.append(f"{source}: {exc}")
            continue
        weight: int | None = (
            raw if isinstance(raw, int) and not isinstance(raw, bool) else _weight(str(raw))
        )
        if isinstance(raw, bool) or weight is None:
            problems.append(
                f"{source}: the weight of queue {name!r} must be an integer, got {raw!r}"
            )
        elif weight < 1:
            problems.append(
                f"{source}: the weight of queue {name!r} must be at least 1, got {weight}"
            )
        elif weight > MAX_INTEGER:
            problems.append(f"{source}: the weight of queue {name!r} must be at most {MAX_INTEGER}")
        if name in seen:
            problems.append(f"{source}: queue {name!r} is named twice")
        seen.add(name)
        if weight is not None:
            parsed.append((name, weight))
    if problems:
        raise _Problems(problems)
    return tuple(parsed)


def parse_hosts(value: Any, source: str) -> tuple[str, ...]:
    """``"jobs.example.com,10.0.0.5"`` (or a sequence of names): host names or IP
    literals without a port; raises _Problems listing every malformed one."""
    from brooq.opsport.hosts import name_problem

    if isinstance(value, str):
        names = [part.strip() for part in value.split(",")]
    elif isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        names = [v.strip() for v in value]
    else:
        raise _Problems([f"{source}: expected host names, comma-separated"])
    problems = [f"{source}: {p}" for n in names if n and (p := name_problem(n))]
    if problems:
        raise _Problems(problems)
    return tuple(n.lower() for n in names if n)


def _convert(name: str, value: Any, source: str, *, from_text: bool) -> Any:
    """Convert one raw value; raises ValueError with a message naming the source."""
    if name in _QUEUE_LISTS:
        return parse_queues(value, source)
    if name in _HOST_LISTS:
        return parse_hosts(value, source)
    if name in _DURATIONS:
        try:
            seconds = parse_duration_string(str(value)) if from_text else to_seconds(value)
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None
        reason = too_long(seconds)
        if reason:
            raise ValueError(f"{source}: {reason}")
        return seconds
    if name in _INTEGERS:
        if isinstance(value, bool):
            raise ValueError(f"{source}: {value!r} is not an integer")
        if isinstance(value, int):
            number = value
        else:
            try:
                number = int(str(value).strip())
            except ValueError:
                raise ValueError(f"{source}: {value!r} is not an integer") from None
        if number > MAX_INTEGER:
            # Not {number}: the text of an int over 4,300 digits raises ValueError itself.
            raise ValueError(
                f"{source}: more than the largest integer brooq accepts, {MAX_INTEGER}"
            )
        return number
    if name in _STRINGS:
        return str(value)
    if name in _SCHEMAS:
        if not isinstance(value, str):
            raise ValueError(f"{source}: a schema name is text, got {type(value).__name__}")
        problem = schema_problem(value.strip() if from_text else value)
        if problem:
            raise ValueError(f"{source}: {problem}")
        return value.strip() if from_text else value
    raise ValueError(f"{source}: unknown setting")


# A partition of job_history spans whole hours that divide a day (1h, 2h, 3h, 4h, 6h,
# 8h, 12h) or whole days, up to a week: its bounds then fall on the same hours every day
# whatever the span was when earlier partitions were made.
HOUR = 3600.0
MAX_HISTORY_PARTITION = 7 * 86400.0


def history_partition_problems(span: float) -> list[str]:
    if span < HOUR or span > MAX_HISTORY_PARTITION:
        return [f"history_partition must be between 1h and 7d, got {span:g}s"]
    if span % HOUR or (span < 86400 and 86400 % span) or (span > 86400 and span % 86400):
        return [
            "history_partition must be whole hours dividing a day (1h, 2h, 3h, 4h, 6h, "
            f"8h, 12h) or whole days, got {span:g}s"
        ]
    return []


def validate(settings: Settings) -> list[str]:
    """Every rule a combination of settings breaks, as readable sentences."""
    problems: list[str] = []
    s = settings
    for name in (
        "workers",
        "max_attempts",
        "max_lease_expiries",
        "retention_batch",
        "max_payload_bytes",
        "claim_batch_max",
        "concurrency",
        "async_workers",
    ):
        if getattr(s, name) < 1:
            problems.append(f"{name} must be at least 1, got {getattr(s, name)}")
    for name in ("max_jobs_per_child", "max_memory_per_child", "vacuum_dead_tuples"):
        if getattr(s, name) < 0:
            problems.append(f"{name} must be 0 (off) or positive, got {getattr(s, name)}")
    for name in (
        "poll_interval",
        "lease",
        "attempt_timeout",
        "max_execution_timeout",
        "backoff_base",
        "backoff_max",
        "graceful_timeout",
        "stats_period",
        "vacuum_period",
        "fleet_beat",
    ):
        if getattr(s, name) <= 0:
            problems.append(f"{name} must be positive, got {getattr(s, name):g}s")
    for name in (
        "reaper_period",
        "retention_period",
        "watchdog_grace",
        "retention_ttl",
        "snapshot_warn",
    ):
        if getattr(s, name) < 0:
            problems.append(f"{name} must not be negative (0 means default/off)")
    problems += history_partition_problems(s.history_partition)
    if s.concurrency > MAX_CONCURRENCY:
        problems.append(f"concurrency must be at most {MAX_CONCURRENCY}, got {s.concurrency}")
    if s.loop_block_timeout < 1:
        # Under a second, a GC pause or a first import would kill children.
        problems.append(f"loop_block_timeout must be at least 1s, got {s.loop_block_timeout:g}s")
    problems += ordering_problems({name: getattr(s, name) for name in NAMES})
    if s.worker_synchronous_commit not in ("on", "off"):
        problems.append(
            f"worker_synchronous_commit must be on or off, got {s.worker_synchronous_commit!r}"
        )
    if s.pooler not in ("none", "transaction"):
        problems.append(f"pooler must be none or transaction, got {s.pooler!r}")
    host, sep, port = s.ops_addr.rpartition(":")
    if s.ops_addr and (not sep or not port.isdigit() or not 0 <= int(port) <= 65535 or not host):
        problems.append(f"ops_addr must be HOST:PORT (e.g. 127.0.0.1:8090), got {s.ops_addr!r}")
    return problems


def load(
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> Settings:
    """Combine the layers and validate; raise InvalidSettings listing every problem."""
    env = os.environ if environ is None else environ
    problems: list[str] = []
    values: dict[str, Any] = {}
    for var, name in ENVIRONMENT.items():
        raw = env.get(var, "")
        if raw.strip() == "":
            if var in EMPTY_MEANS_OFF and var in env:
                values[name] = ""
            continue
        try:
            values[name] = _convert(name, raw, f"{var}={raw!r}", from_text=True)
        except _Problems as exc:
            problems.extend(exc.problems)
        except ValueError as exc:
            problems.append(str(exc))
    for layer, label in ((overrides or {}, "Queue({}=...)"), (flags or {}, "--{}")):
        for name, raw in layer.items():
            if raw is None:
                continue
            if name not in FIELDS:
                problems.append(f"unknown setting {name!r}")
                continue
            source = label.format(name.replace("_", "-") if label.startswith("--") else name)
            try:
                values[name] = _convert(name, raw, source, from_text=False)
            except _Problems as exc:
                problems.extend(exc.problems)
            except ValueError as exc:
                problems.append(str(exc))
    settings = Settings(**values)
    problems.extend(validate(settings))
    if problems:
        raise InvalidSettings(problems)
    return settings


def getenv(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """An environment variable, with the empty value counting as unset."""
    value = (os.environ if environ is None else environ).get(name, "")
    return value if value.strip() else None


# -- the time limits' ordering ---------------------------------------------------------------------
# The ordering of a job's time limits: one attempt fits in the whole execution budget, and
# the first backoff in the longest one.
#
#     attempt_timeout <= max_execution_timeout        backoff_base <= backoff_max
#
# Owns: that rule, its wording (settings.validate and handler registration report the same
# sentence, a handler's prefixed with its topic), and how an unset handler option is capped
# so that a default never contradicts a value given at registration.
# Must never: know where a value came from (environment, Queue(**settings), flags, handler
# options: the callers say so), or check anything but the ordering (positivity and ranges
# are settings' and handlers' own).

# (lower, upper): the lower limit must not exceed the upper one.
ORDERED: Final = (
    ("attempt_timeout", "max_execution_timeout"),
    ("backoff_base", "backoff_max"),
)
NAMES: Final = tuple(name for pair in ORDERED for name in pair)


def ordering_problems(seconds: Mapping[str, float | None], prefix: str = "") -> list[str]:
    """Each pair of ``seconds`` out of order, as a sentence: "attempt_timeout (600s) must
    not exceed max_execution_timeout (300s)". A pair with a value missing (None), or whose
    upper value is not positive (reported as such elsewhere), is not judged."""
    problems = []
    for low, high in ORDERED:
        low_s, high_s = seconds.get(low), seconds.get(high)
        if low_s is not None and high_s is not None and low_s > high_s > 0:
            problems.append(f"{prefix}{low} ({low_s:g}s) must not exceed {high} ({high_s:g}s)")
    return problems


def resolve(given: Mapping[str, float | None], defaults: Mapping[str, float]) -> dict[str, float]:
    """The four limits of a handler: a value given wins, else the default. An unset lower
    limit is capped by the upper one actually used: a handler registered with
    max_execution_timeout="30s" runs attempts of at most 30s even if the queue's
    attempt_timeout is 1m (and the same for backoff_base under backoff_max)."""
    limits: dict[str, float] = {}
    for low, high in ORDERED:
        given_high = given.get(high)
        upper = defaults[high] if given_high is None else given_high
        given_low = given.get(low)
        limits[low] = min(defaults[low], upper) if given_low is None else given_low
        limits[high] = upper
    return limits
