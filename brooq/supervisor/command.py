"""`brooq-master`: import the application once, validate everything, then fork.

Exit codes: 0 drained cleanly; 1 stopped with jobs returned to pending (drain budget
exceeded, SIGQUIT); 2 bad usage, bad settings, an application that cannot load, a
reachable database without brooq's schema or that is a read-only standby, or a pooler
brooq was not told about (nothing was forked); 3 fatal supervision error
(children cannot start, or the schema found missing once the database came up).

Owns the command line, the admin token file and the schema check before the first fork.
It must never fork, or open a connection that outlives the check, before every problem
is found: a bad start fails here, with every problem listed, and nothing runs.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click
from setproctitle import setproctitle

from brooq import __version__, logs
from brooq import app as app_mod
from brooq import dsn as dsn_mod
from brooq import metrics as metrics_mod
from brooq import settings as settings_mod
from brooq.db import NONE, REFUSED, need_direct, options_ignored
from brooq.declare.handlers import Handler, is_async_callable, policy_problems
from brooq.errors import (
    AppLoadError,
    DatabaseUnavailable,
    InvalidDsn,
    InvalidSettings,
    PoolerMismatch,
    ReadOnlyDatabase,
    SchemaMissing,
)
from brooq.rules import worked_queues
from brooq.supervisor import admintoken

log = logging.getLogger("brooq.master")

DURATION_FLAGS = [
    ("poll_interval", "Idle children look for jobs this often even without NOTIFY."),
    ("lease", "Lease length; the master renews every lease/3."),
    ("attempt_timeout", "Default soft limit: AttemptTimeout raised in the handler."),
    ("max_execution_timeout", "Default hard limit: the child is killed."),
    ("graceful_timeout", "Drain budget on SIGTERM."),
    ("reaper_period", "Reaper period (default max(5s, lease/4))."),
    ("retention_ttl", "Delete terminal jobs older than this (0s: never)."),
    ("watchdog_grace", "How long a child may run on after its lease was lost (default: lease)."),
    (
        "snapshot_warn",
        "Log who holds a snapshot this old, holding back the job table's cleanup "
        "(default 5m; 0s: never).",
    ),
    (
        "loop_block_timeout",
        "Kill an async child whose event loop is blocked this long (default 5s).",
    ),
]


def _options(fn: Any) -> Any:
    for name, text in reversed(DURATION_FLAGS):
        fn = click.option(f"--{name.replace('_', '-')}", name, metavar="DURATION", help=text)(fn)
    return fn


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="brooq-master")
@click.option(
    "--app",
    "app_spec",
    required=True,
    metavar="MODULE:ATTR",
    help="The brooq.Queue of your application, e.g. myapp.jobs:queue.",
)
@click.option("--workers", type=int, help="Number of child processes (QUEUE_WORKERS).")
@click.option(
    "--concurrency",
    type=int,
    help="Async jobs one child runs at once (QUEUE_CONCURRENCY, default 100); "
    "sync handlers run one at a time.",
)
@click.option(
    "--async-workers",
    type=int,
    help="In an application with sync and async handlers: how many of the children "
    "run the async ones (QUEUE_ASYNC_WORKERS, default 1).",
)
@click.option(
    "--queues",
    metavar="NAME=WEIGHT,...",
    help="The queues this master works and their weights, e.g. default=4,bulk=1 "
    "(QUEUE_QUEUES; a bare name weighs 1). Default: every queue its handlers declare.",
)
@click.option(
    "--database",
    metavar="DSN",
    help="Default: DATABASE_URL, DATABASE_URL_FILE or the systemd credential database-url. "
    "A password given here shows in ps (/proc/PID/cmdline) until the master has started "
    "Python and parsed its flags; prefer DATABASE_URL_FILE or the credential.",
)
@click.option(
    "--read-database-url",
    "read_database",
    metavar="DSN",
    help="Where the status page reads (QUEUE_READ_DATABASE_URL, its _FILE or the systemd "
    "credential read-database-url), a standby most often; its actions and everything the "
    "master and its children do go to the database. Default: the database. A password "
    "given here shows in ps until the master has started Python; prefer the file.",
)
@click.option(
    "--schema",
    metavar="NAME",
    help="brooq's own schema (QUEUE_SCHEMA): every statement names its tables there, "
    "whatever the search_path. Default: the job table the search_path finds.",
)
@click.option("--max-jobs-per-child", type=int, help="Retire a child after N jobs.")
@click.option(
    "--max-memory-per-child",
    type=int,
    metavar="MB",
    help="Retire a child whose resident memory exceeds MB after its job.",
)
@click.option(
    "--ops-addr",
    metavar="HOST:PORT",
    help="Ops HTTP surface (QUEUE_OPS_ADDR); '' turns it off.",
)
@click.option(
    "--ops-allowed-hosts",
    metavar="NAME,...",
    help="Host names the ops port answers besides its own, e.g. a proxy's "
    "(QUEUE_OPS_ALLOWED_HOSTS); any other Host gets 421.",
)
@click.option(
    "--metrics-dir",
    metavar="DIR",
    envvar="PROMETHEUS_MULTIPROC_DIR",
    help="Directory for multiprocess metrics (wiped at start; default: a new "
    "temporary directory). Under systemd: $RUNTIME_DIRECTORY/metrics.",
)
@click.option(
    "--log-format",
    type=click.Choice(["kv", "json"]),
    default="kv",
    show_default=True,
    envvar="QUEUE_LOG_FORMAT",
    help="key=value lines or JSON lines (QUEUE_LOG_FORMAT).",
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], case_sensitive=False),
    default="INFO",
    show_default=True,
    envvar="QUEUE_LOG_LEVEL",
    help="The least level logged, brooq's and the application's (QUEUE_LOG_LEVEL).",
)
@click.option(
    "--log-config",
    default=logs.EVERY,
    show_default=True,
    metavar="brooq|own|FILE",
    envvar="QUEUE_LOG_CONFIG",
    help="brooq: every logger's records in brooq's format, a handler's with its job; "
    "own: brooq formats only its own loggers (the application configures the rest); "
    "FILE: a logging configuration applied after brooq's, JSON (dictConfig) or INI "
    "(fileConfig) (QUEUE_LOG_CONFIG).",
)
@_options
def command(
    app_spec: str,
    database: str | None,
    read_database: str | None,
    metrics_dir: str | None,
    log_format: str,
    log_level: str,
    log_config: str,
    **flags: Any,
) -> None:
    """Run the workers of a brooq application: one master, N forked children."""
    # The command line may hold --database with a password, readable by every local user
    # in /proc/PID/cmdline: replace it before importing the application, which can take
    # seconds. (Master.run sets the final title.)
    setproctitle(f"brooq-master: app={app_spec} starting")
    problem = logs.check_config(log_config)
    if problem is not None:
        click.echo(f"brooq-master: cannot start:\n  - {problem}", err=True)
        sys.exit(2)
    try:
        logs.setup(log_format, log_level, log_config)
    except Exception as exc:  # a configuration file logging itself refuses
        click.echo(f"brooq-master: cannot start:\n  - --log-config {log_config}: {exc}", err=True)
        sys.exit(2)
    # Before anything imports prometheus_client: it picks multiprocess mode at import.
    metrics_path = metrics_mod.prepare_dir(metrics_dir)
    try:
        code = _start(app_spec, database, read_database, metrics_path, flags)
    finally:
        metrics_mod.remove_dir(metrics_path, owned=metrics_dir is None)
    sys.exit(code)


def _start(
    app_spec: str, database: str | None, read_database: str | None, metrics_path: Path, flags: Any
) -> int:
    baseline = frozenset(sys.modules)
    try:
        queue = app_mod.load(app_spec)
    except AppLoadError as exc:
        if exc.problems:
            click.echo("brooq-master: cannot start:", err=True)
            for p in exc.problems:
                click.echo(f"  - {p}", err=True)
        else:
            click.echo(f"brooq-master: {exc}", err=True)
        return 2
    problems: list[str] = []
    settings = None
    try:
        settings = settings_mod.load(overrides=queue._overrides, flags=flags)
    except InvalidSettings as exc:
        problems.extend(exc.problems)
    try:
        dsn = dsn_mod.resolve(database or queue._dsn_arg)
    except InvalidDsn as exc:
        problems.append(str(exc))
        dsn = ""
    listen_dsn = dsn
    if dsn:
        try:
            listen_dsn = dsn_mod.resolve_listen(dsn, queue._listen_dsn_arg)
        except InvalidDsn as exc:
            problems.append(str(exc))
        if settings is not None:
            problem = need_direct(settings.pooler, dsn, listen_dsn, "brooq-master")
            if problem:
                problems.append(problem)
    read_dsn: str | None = None
    try:
        read_dsn = dsn_mod.resolve_read(read_database)
    except InvalidDsn as exc:
        problems.append(str(exc))
    if settings is not None:
        for topic, handler in sorted(queue.handlers.items()):
            problems.extend(policy_problems(topic, handler.policy(settings)))
    token: bytes | None = None
    try:
        token = admin_token()
    except ValueError as exc:
        problems.append(str(exc))
    if problems or settings is None:
        click.echo("brooq-master: cannot start:", err=True)
        for p in problems:
            click.echo(f"  - {p}", err=True)
        return 2
    try:
        schema_verified = check_schema(listen_dsn, settings.schema)
        if listen_dsn != dsn and settings.pooler == NONE:
            check_children_dsn(dsn)
    except (SchemaMissing, PoolerMismatch, ReadOnlyDatabase) as exc:
        click.echo(f"brooq-master: cannot start: {exc}", err=True)
        return 2
    queue.configure(settings)
    _log_queues(settings, queue.handlers)
    _log_middleware_kinds(queue.middlewares, queue.handlers)
    if read_dsn is not None:
        log.info("event=pages_read_from database=%s", dsn_mod.describe(read_dsn))

    from brooq.supervisor.master import Master

    return Master(
        queue,
        app_spec,
        settings,
        dsn,
        baseline,
        metrics_dir=metrics_path,
        admin_token=token,
        admin_token_file=admintoken.token_path(),
        schema_verified=schema_verified,
        listen_dsn=listen_dsn,
        read_dsn=read_dsn,
    ).run()


def _log_middleware_kinds(middlewares: list[Any], handlers: dict[str, Handler]) -> None:
    """A global middleware wraps the handlers of its own kind only (docs/async.md): say
    so at start when some topics get none of the Queue's middleware because of it, so a
    missing trace or timing is seen now, not in production."""
    if not middlewares:
        return
    for kind_is_async, kind in ((True, "async"), (False, "sync")):
        topics = sorted(t for t, h in handlers.items() if h.is_async == kind_is_async)
        wrapping = [m for m in middlewares if is_async_callable(m) == kind_is_async]
        if topics and not wrapping:
            names = ",".join(getattr(m, "__name__", type(m).__name__) for m in middlewares)
            log.warning(
                "event=middleware_skips kind=%s topics=%d middleware=%s: the Queue's "
                "middleware is of the other kind and does not wrap these handlers; "
                "register a twin written as %s to wrap them",
                kind,
                len(topics),
                names,
                "async def fn(claim, call_next)" if kind_is_async else "def fn(claim, call_next)",
            )


def _log_queues(settings: settings_mod.Settings, handlers: dict[str, Handler]) -> None:
    """Say which queues this master works, and which handler's queue it does not."""
    worked = worked_queues(settings.queues, handlers)
    names = {name for name, _ in worked}
    log.info(
        "event=queues queues=%s",
        ",".join(f"{name}={weight}" for name, weight in worked),
    )
    for topic, handler in sorted(handlers.items()):
        if handler.queue not in names:
            log.warning(
                "event=queue_not_worked topic=%s queue=%s: jobs of this topic enqueued "
                "without a queue go to %s, which this master does not work",
                topic,
                handler.queue,
                handler.queue,
            )


def check_schema(dsn: str, schema: str | None = None) -> bool:
    """Whether brooq's schema was found in order. Raise SchemaMissing when the database
    answers but the schema is not there (or is older than this brooq): children forked now
    would crash on their first claim, over and over; ReadOnlyDatabase when the server is a
    standby (they could claim nothing there). An unreachable database is not an
    error here (False): the master retries its connection and checks once connected; a
    server that answers without the database named is (DatabaseMissing).
    ``schema`` (QUEUE_SCHEMA): the tables checked are that schema's."""
    import psycopg

    from brooq import migrate
    from brooq.db import connect, refuse_standby
    from brooq.supervisor.connections import (
        MASTER_CONNECT_TIMEOUT,
        check_options,
        master_options,
        missing_database,
    )

    try:
        conn = connect(
            dsn,
            autocommit=True,
            connect_timeout=MASTER_CONNECT_TIMEOUT,
            options=master_options(dsn),
            application_name="brooq-master",
        )
    except DatabaseUnavailable as exc:
        if REFUSED in str(exc):  # a pooler, not an outage: retrying cannot help
            raise PoolerMismatch(str(exc)) from None
        if (missing := missing_database(dsn, exc)) is not None:  # nor a database not there
            raise missing from None
        return False
    try:
        refuse_standby(conn)
        check_options(conn)
        migrate.verify(conn, schema)
    except psycopg.Error:
        return False  # lost meanwhile, or timed out: the master checks once connected
    finally:
        conn.close()
    return True


def check_children_dsn(dsn: str) -> None:
    """PoolerMismatch when the children's DSN (not the master's own, checked by
    check_schema) goes through a pooler that refuses or drops their session options
    without QUEUE_POOLER=transaction: every child would fail on connecting, over and
    over. Unreachable is not an error here, as in check_schema."""
    from brooq.db import connect, refuse_standby
    from brooq.dsn import session_options
    from brooq.sql import Q
    from brooq.supervisor.connections import MASTER_CONNECT_TIMEOUT, missing_database

    try:
        conn = connect(
            dsn,
            autocommit=True,
            connect_timeout=MASTER_CONNECT_TIMEOUT,
            options=session_options(dsn, {"enable_bitmapscan": "off"}),
            application_name="brooq-master",
        )
    except DatabaseUnavailable as exc:
        if REFUSED in str(exc):
            raise PoolerMismatch(str(exc)) from None
        if (missing := missing_database(dsn, exc)) is not None:
            raise missing from None
        return
    refuse_standby(conn)
    try:
        row = conn.execute(Q.session_setting_get, {"name": "enable_bitmapscan"}).fetchone()
    except Exception:  # lost meanwhile: each child checks its own connection anyway
        return
    finally:
        conn.close()
    if row is None or row[0] != "off":
        raise options_ignored("enable_bitmapscan", "off", str(row[0]) if row else "?")


def admin_token() -> bytes | None:
    """The bearer token of the admin endpoints: QUEUE_ADMIN_TOKEN_FILE, or the systemd
    credential admin-token (brooq.supervisor.admintoken). None turns them off."""
    path = admintoken.token_path()
    return None if path is None else admintoken.read(path)


def main() -> None:
    command(prog_name="brooq-master")


if __name__ == "__main__":
    main()
