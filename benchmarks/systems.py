"""One driver per system: how to install its schema, enqueue, start its workers, and see
from the outside how many jobs are left.

Every driver offers the same verbs, used by the workloads in run.py:
  prepare(dsn)                 install the schema in a fresh database
  enqueue_single(kind, items)  one API call (and one transaction or message) per job
  enqueue_bulk(kind, items, chunk)
                               the system's bulk API, chunk jobs per call (CHUNK unless
                               told; the enqueue_bulk workload passes them all at once)
  enqueue_one(kind, item)      one job; returns time.time() once it is committed
  workers(workload)            the worker processes to start, not yet started
  remaining()                  jobs not yet finished, as the database (or Redis) says
  job_states(keys)             the state each job of the given keys ended in
  settings(workload)           the configuration, written next to the figures
Kinds: noop, cpu, pickup, probe, hung, prio, limited, rated, grouped, io, io_http. Items are
dicts like {"k": key, "n": iterations} (a grouped item also names its group: "g").
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from common import APPS_DIR, REDIS_URL, Worker, backends_cpu, base_env, cpu_of, venv_bin

CHUNK = 1000  # jobs per bulk call

# Worker processes for the peers: one per core, as each one's documentation advises for
# CPU-bound work (pgqueuer "One Process per CPU Core", procrastinate "launch multiple
# workers, each using their own process", Celery prefork concurrency = cores).
PEER_PROCESSES = 2
IO_WORKLOADS = ("io", "io_http")  # the I/O-bound workloads


class System:
    name = ""
    dsn = ""
    # Workloads beyond the common ones (run.py's BROOQ_ONLY) this system runs.
    extra_workloads: tuple[str, ...] = ()
    # Common workloads this system does not run here: workload -> why (in the report).
    skip_workloads: dict[str, str] = {}
    # The io_http workload's server (run.py sets it while one runs); passed to workers.
    http_url = ""
    # Whether run.py measures the CPU per job of its throughput workloads.
    measures_cpu = True

    def available(self) -> str | None:
        """None when the system can run here, else why not."""
        return None

    def prepare(self, dsn: str) -> None:
        self.dsn = dsn

    def close(self) -> None:
        pass

    def enqueue_single(self, kind: str, items: Sequence[dict[str, Any]]) -> None:
        raise NotImplementedError

    def enqueue_bulk(self, kind: str, items: Sequence[dict[str, Any]], chunk: int = CHUNK) -> None:
        raise NotImplementedError

    def enqueue_one(self, kind: str, item: dict[str, Any]) -> float:
        raise NotImplementedError

    def workers(self, workload: str, variant: str = "") -> list[Worker]:
        raise NotImplementedError

    def remaining(self) -> int:
        raise NotImplementedError

    def job_states(self, keys: Sequence[str]) -> dict[str, str]:
        raise NotImplementedError

    def settings(self, workload: str, variant: str = "") -> dict[str, Any]:
        raise NotImplementedError

    def slots(self, workload: str, variant: str = "") -> int:
        """How many jobs the started workers run at the same time at most."""
        return PEER_PROCESSES

    def analyze(self) -> None:
        """ANALYZE the run's database after loading it, as autovacuum would have done by
        then in a long-lived one: a never-analyzed table can get a very different plan."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("ANALYZE")

    def poll_conn(self) -> psycopg.Connection[Any]:
        """The harness's one connection to the run's database, kept for the run (a new
        connection per look would fork a backend every 50 ms)."""
        conn = self.__dict__.get("_poll_conn")
        if conn is None or conn.closed or self.__dict__.get("_poll_dsn") != self.dsn:
            self.close_poll()
            conn = self.__dict__["_poll_conn"] = psycopg.connect(self.dsn, autocommit=True)
            self.__dict__["_poll_dsn"] = self.dsn
        return conn  # type: ignore[no-any-return]

    def _count(self, query: str) -> int:
        """One number from the run's database, over the poll connection."""
        row = self.poll_conn().execute(query, prepare=True).fetchone()  # type: ignore[arg-type]
        return int(row[0]) if row else 0

    def server_cpu(self) -> dict[int, float]:
        """The CPU so far of the processes serving the system's queue, by pid: the run
        database's backends, the harness's poll connection left out (its counting is the
        instrument's, not the system's)."""
        return backends_cpu(self.poll_conn())

    def _io_env(self) -> dict[str, str]:
        return {"BENCH_HTTP_URL": self.http_url} if self.http_url else {}

    def close_poll(self) -> None:
        conn = self.__dict__.pop("_poll_conn", None)
        if conn is not None:
            conn.close()


# -- brooq ---------------------------------------------------------------------------------


# The grouped drain: no-op jobs spread over so many groups, each at most so many at once.
GROUPED_DRAIN_GROUPS = 1_000
GROUPED_DRAIN_LIMIT = 2
# The rated drain: the drain's jobs under a rate that allows them (the claims of a rated
# topic at speed).
RATED_DRAIN_RATES = "rate:50000/s"
# The ordered drain: no-op jobs spread over so many ordering keys (each key's jobs one at a
# time, in order).
ORDERED_DRAIN_KEYS = 1_000


class Brooq(System):
    name = "brooq"
    extra_workloads = (
        "priority",
        "limited",
        "rated",
        "grouped",
        "grouped_drain",
        "rated_drain",
        "ordered_drain",
        "durability",
    )
    TOPIC = {
        "noop": "bench.noop",
        "cpu": "bench.cpu",
        "pickup": "bench.pickup",
        "probe": "bench.pickup",
        "hung": "bench.hung",
        "prio": "bench.prio",
        "limited": "api.limited",
        "rated": "api.rated",
        "grouped": "tenant.work",
        "grouped_drain": "bench.groups",
        "rated_drain": "bench.groups",
        "ordered_drain": "bench.noop",
        "io": "bench.io",
        "io_http": "bench.io_http",
    }
    # The limited workload: masters and children per master (2 x 8).
    LIMITED_MASTERS = 2
    LIMITED_WORKERS = 8
    # The async variants (run.py's BROOQ_IO_VARIANTS, BROOQ_PICKUP_VARIANTS):
    # variant -> the --concurrency on the command line (None: brooq's default, 100), each
    # with ASYNC_WORKERS children of apps/bench_brooq_async_app.py, all of them async.
    ASYNC_VARIANTS: dict[str, int | None] = {
        "async": None,
        "async200": 200,
        "async500": 500,  # run.py's io_best: brooq's best configurations here
        "async1000": 1000,
    }
    ASYNC_WORKERS = 2

    def prepare(self, dsn: str) -> None:
        import brooq
        from brooq import migrate

        super().prepare(dsn)
        migrate.up(dsn)
        self.queue = brooq.Queue(dsn)

    def close(self) -> None:
        if getattr(self, "queue", None) is not None:
            self.queue.close()
            self.queue = None  # type: ignore[assignment]

    def _job(self, kind: str, item: dict[str, Any], priority: int = 0) -> Any:
        import brooq

        group = item.get("g") if kind in ("grouped", "grouped_drain", "rated_drain") else None
        key = item.get("o") if kind == "ordered_drain" else None
        return brooq.Job(self.TOPIC[kind], item, priority=priority, group=group, ordering_key=key)

    def enqueue_single(self, kind: str, items: Sequence[dict[str, Any]]) -> None:
        for item in items:
            self.queue.enqueue(self._job(kind, item))

    def enqueue_bulk(
        self, kind: str, items: Sequence[dict[str, Any]], chunk: int = CHUNK, priority: int = 0
    ) -> None:
        for i in range(0, len(items), chunk):
            # A generator: the Queue takes, checks and sends it a block at a time.
            self.queue.enqueue_many(self._job(kind, it, priority) for it in items[i : i + chunk])

    def enqueue_one(self, kind: str, item: dict[str, Any]) -> float:
        self.queue.enqueue(self._job(kind, item))
        return time.time()

    def _app(self, workload: str, variant: str = "") -> str:
        # A master with a global_limit topic claims through another statement: only the
        # limited workload loads that application. The async variants load one whose
        # handlers are all async (so are its children).
        if workload in ("limited", "rated", "grouped"):
            return f"bench_brooq_{workload}_app:queue"
        if workload in ("grouped_drain", "rated_drain"):  # bench.groups as BENCH_GROUPS says
            return "bench_groups_app:queue"
        if variant in self.ASYNC_VARIANTS:
            return "bench_brooq_async_app:queue"
        return "bench_brooq_app:queue"

    def _masters(self, workload: str, variant: str) -> tuple[int, int]:
        """(masters, children per master). The variant of the drain and sync I/O
        workloads is the number of children (run.py's BROOQ_DRAIN_WORKERS,
        BROOQ_IO_VARIANTS); an async variant has ASYNC_WORKERS."""
        if workload in ("limited", "rated", "grouped"):
            return self.LIMITED_MASTERS, self.LIMITED_WORKERS
        if workload == "durability":  # the variant is the children's synchronous_commit
            return 1, 2
        if variant in self.ASYNC_VARIANTS:
            return 1, self.ASYNC_WORKERS
        return 1, int(variant or 2)

    def _concurrency(self, variant: str) -> tuple[int, list[str]]:
        """Jobs each child runs at once, and the flags that say so: (1, []) for a sync
        child; an async variant's --concurrency, or brooq's own default when the variant
        leaves the flag out (read from brooq.settings, so a new default is counted)."""
        if variant not in self.ASYNC_VARIANTS:
            return 1, []
        given = self.ASYNC_VARIANTS[variant]
        if given is None:
            from brooq.settings import Settings

            return Settings().concurrency, []
        return given, ["--concurrency", str(given)]

    def _argv(self, workload: str, variant: str) -> list[str]:
        """The command line after brooq-master."""
        _, n = self._masters(workload, variant)
        flags = self._concurrency(variant)[1]
        return ["--app", self._app(workload, variant), "--workers", str(n), *flags]

    def workers(self, workload: str, variant: str = "") -> list[Worker]:
        masters, n = self._masters(workload, variant)
        extra = {"QUEUE_OPS_ADDR": "127.0.0.1:0", **self._io_env()}
        if workload == "durability":
            extra["QUEUE_WORKER_SYNCHRONOUS_COMMIT"] = variant  # named, whatever the default
        if workload == "grouped_drain":
            extra["BENCH_GROUPS"] = f"limit:{GROUPED_DRAIN_LIMIT}"
        if workload == "rated_drain":
            extra["BENCH_GROUPS"] = RATED_DRAIN_RATES
        env = base_env(self.dsn, extra)
        argv = [venv_bin("brooq-master"), *self._argv(workload, variant)]
        name = f"brooq-{workload}-{variant or n}"
        return [Worker(argv, env, f"{name}-{i}") for i in range(masters)]

    def slots(self, workload: str, variant: str = "") -> int:
        masters, n = self._masters(workload, variant)
        return masters * n * self._concurrency(variant)[0]

    def remaining(self) -> int:
        # waiting: the ordered drain's jobs behind their key's running one.
        return self._count(
            "SELECT count(*) FROM job WHERE state IN ('pending', 'processing', 'waiting')"
        )

    def job_states(self, keys: Sequence[str]) -> dict[str, str]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT payload->>'k', state, attempts, "
                "split_part(coalesce(last_error, ''), '; stack', 1) "
                "FROM job WHERE payload->>'k' = ANY(%s)",
                (list(keys),),
            ).fetchall()
        return {k: f"{state} (attempts={a}; {err})" for k, state, a, err in rows}

    def settings(self, workload: str, variant: str = "") -> dict[str, Any]:
        from brooq.settings import Settings

        commit = Settings().worker_synchronous_commit  # the children's, by default
        masters, n = self._masters(workload, variant)
        s: dict[str, Any] = {
            "command": (f"{masters} x " if masters > 1 else "")
            + "brooq-master "
            + " ".join(self._argv(workload, variant)),
            "settings": "defaults (poll_interval 1s, lease 30s, log level INFO, the "
            f"children's synchronous_commit {commit}"
            + (": durable, as the peers' workers)" if commit == "on" else ")"),
            "enqueue": "Queue.enqueue (one transaction per job); bulk: one "
            "Queue.enqueue_many of a generator of all the jobs, taken, checked and sent a "
            f"block at a time (other workloads' set-up: chunks of {CHUNK})",
        }
        if workload == "hung":
            s["timeout"] = "handler max_execution_timeout=2s, attempt_timeout=2s, max_attempts=1"
        if workload == "priority":
            s["jobs"] = "bench.prio, ~1 ms (time.sleep(0.001)); low ones priority 0, high 10"
        if workload == "limited":
            s["jobs"] = "api.limited, @queue.handler(global_limit=4), time.sleep(0.02)"
        if workload == "rated":
            s["jobs"] = 'api.rated, @queue.handler(rate_limit="200/s"), time.sleep(0.001)'
        if workload == "grouped":
            s["jobs"] = (
                "tenant.work, @queue.handler(group_limit=1), 20 groups of 50 jobs, time.sleep(0.02)"
            )
        if workload == "grouped_drain":
            s["jobs"] = (
                f"bench.groups, no-op, @queue.handler(group_limit={GROUPED_DRAIN_LIMIT}), "
                f"{GROUPED_DRAIN_GROUPS:,} groups"
            )
        if workload == "rated_drain":
            s["jobs"] = (
                'bench.groups, no-op, @queue.handler(rate_limit="50000/s"), each job in one '
                f"of {GROUPED_DRAIN_GROUPS:,} groups (no option reads them)"
            )
        if workload == "ordered_drain":
            s["jobs"] = f"bench.noop, no-op, Job(ordering_key=...) over {ORDERED_DRAIN_KEYS:,} keys"
        if workload == "durability":
            s["settings"] = (
                "defaults (poll_interval 1s, lease 30s, log level INFO); "
                f"QUEUE_WORKER_SYNCHRONOUS_COMMIT={variant}"
            )
        if variant in self.ASYNC_VARIANTS:
            c, flags = self._concurrency(variant)
            default = "" if flags else " (--concurrency left at brooq's default)"
            s["concurrency"] = f"{n} async children x {c} jobs at once = {n * c} slots{default}"
            if workload == "pickup":
                s["jobs"] = "bench.pickup, an async handler (its start written as the sync one)"
            if workload == "io":
                s["jobs"] = "bench.io, an async handler: await asyncio.sleep(0.05)"
            if workload == "io_http":
                s["jobs"] = (
                    "bench.io_http, an async handler: a raw HTTP/1.1 GET of the local server "
                    "(answers after 50 ms) over asyncio.open_connection, one connection per "
                    "request (benchwork.http_get_async, the peers' client)"
                )
        elif workload == "io":
            s["jobs"] = "bench.io, a sync handler: time.sleep(0.05)"
        elif workload == "io_http":
            s["jobs"] = (
                "bench.io_http, a sync handler: urllib.request.urlopen of the local server "
                "(answers after 50 ms), one connection per request"
            )
        return s


# -- procrastinate ------------------------------------------------------------------------


class Procrastinate(System):
    name = "procrastinate"
    # Async no-op tasks: concurrency per process (procrastinate's "sub-workers").
    NOOP_CONCURRENCY = 30  # the docs example; 1 -> ~185, 10 and 30 -> ~250-280 jobs/s here
    # I/O-bound async tasks: the docs' own example ("Execute multiple jobs at the same
    # time": while a job waits for I/O, others run; `--concurrency=30`).
    IO_CONCURRENCY = 30

    def available(self) -> str | None:
        try:
            import procrastinate  # noqa: F401
        except ImportError:
            return "procrastinate is not installed (make bench installs it into .bench-venv)"
        return None

    def prepare(self, dsn: str) -> None:
        import procrastinate

        super().prepare(dsn)

        self.app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
        self.app.open()
        self.app.schema_manager.apply_schema()

    def close(self) -> None:
        if getattr(self, "app", None) is not None:
            self.app.close()
            self.app = None  # type: ignore[assignment]

    def _args(self, kind: str, item: dict[str, Any]) -> dict[str, Any]:
        return dict(item)

    def _get(self, kind: str) -> Any:
        # By name: the tasks themselves live in the worker's module.
        return self.app.configure_task(name=kind, queue="bench")

    def enqueue_single(self, kind: str, items: Sequence[dict[str, Any]]) -> None:
        task = self._get(kind)
        for item in items:
            task.defer(**self._args(kind, item))

    def enqueue_bulk(self, kind: str, items: Sequence[dict[str, Any]], chunk: int = CHUNK) -> None:
        task = self._get(kind)
        for i in range(0, len(items), chunk):
            task.batch_defer(*[self._args(kind, it) for it in items[i : i + chunk]])

    def enqueue_one(self, kind: str, item: dict[str, Any]) -> float:
        self._get(kind).defer(**self._args(kind, item))
        return time.time()

    def _concurrency(self, workload: str) -> int:
        if workload in IO_WORKLOADS:
            return self.IO_CONCURRENCY
        return self.NOOP_CONCURRENCY if workload in ("drain", "pickup") else 1

    def workers(self, workload: str, variant: str = "") -> list[Worker]:
        env = base_env(self.dsn, self._io_env())
        argv = [
            venv_bin("procrastinate"),
            "--app",
            "bench_procrastinate_app.app",
            "worker",
            "--queues",
            "bench",
            "--concurrency",
            str(self._concurrency(workload)),
        ]
        return [Worker(argv, env, f"procrastinate-{workload}-{i}") for i in range(PEER_PROCESSES)]

    def slots(self, workload: str, variant: str = "") -> int:
        return PEER_PROCESSES * self._concurrency(workload)

    def remaining(self) -> int:
        return self._count(
            "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
        )

    def job_states(self, keys: Sequence[str]) -> dict[str, str]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT args->>'k', status::text, attempts FROM procrastinate_jobs "
                "WHERE args->>'k' = ANY(%s)",
                (list(keys),),
            ).fetchall()
        return {k: f"{status} (attempts={a})" for k, status, a in rows}

    def settings(self, workload: str, variant: str = "") -> dict[str, Any]:
        c = self._concurrency(workload)
        s: dict[str, Any] = {
            "command": f"{PEER_PROCESSES} x procrastinate --app bench_procrastinate_app.app "
            f"worker --queues bench --concurrency {c}",
            "settings": "listen_notify on, fetch_job_polling_interval 5s, delete_jobs never "
            "(defaults); PsycopgConnector",
            "tasks": "no-op, pickup and I/O-bound (io, io_http) tasks are async; cpu and hung "
            "tasks are sync (run in a thread by procrastinate), hence concurrency 1 for them",
            "enqueue": "task.defer() per job; bulk: one task.batch_defer() of all the jobs "
            f"(other workloads' set-up: chunks of {CHUNK})",
        }
        if workload == "hung":
            s["timeout"] = (
                "none available: procrastinate has no execution time limit; a running job "
                "can only be aborted cooperatively, and stalled-job retry needs a dead worker"
            )
        return s


# -- pgqueuer ----------------------------------------------------------------------------


class PgQueuer(System):
    name = "pgqueuer"
    BATCH_SIZE = 50  # after trying 10, 50, 100 and 200 (see README)
    # I/O-bound jobs: a cap on each process's picked jobs, the performance guide's own
    # example of a global cap (`max_concurrent_tasks=100`); without one, pgqueuer picks
    # every ready job at once. It must be at least 2 x batch_size.
    IO_MAX_CONCURRENT = 100

    def available(self) -> str | None:
        try:
            import asyncpg  # noqa: F401
            import pgqueuer  # noqa: F401
        except ImportError:
            return "pgqueuer/asyncpg are not installed (make bench installs them)"
        return None

    def prepare(self, dsn: str) -> None:
        super().prepare(dsn)
        pgq = venv_bin("pgq")
        for cmd in (["install"], ["autovac"]):
            subprocess.run(
                [pgq, "--pg-dsn", dsn, *cmd],
                check=True,
                capture_output=True,
                timeout=60,
            )
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        self.loop = asyncio.new_event_loop()
        self.conn = self.loop.run_until_complete(asyncpg.connect(dsn))
        self.queries = Queries(AsyncpgDriver(self.conn))

    def close(self) -> None:
        if getattr(self, "loop", None) is not None:
            self.loop.run_until_complete(self.conn.close())
            self.loop.close()
            self.loop = None  # type: ignore[assignment]

    @staticmethod
    def _payload(item: dict[str, Any]) -> bytes:
        return json.dumps(item).encode()

    def enqueue_single(self, kind: str, items: Sequence[dict[str, Any]]) -> None:
        async def go() -> None:
            for item in items:
                await self.queries.enqueue(kind, self._payload(item))

        self.loop.run_until_complete(go())

    def enqueue_bulk(self, kind: str, items: Sequence[dict[str, Any]], chunk: int = CHUNK) -> None:
        async def go() -> None:
            for i in range(0, len(items), chunk):
                part = items[i : i + chunk]
                await self.queries.enqueue(
                    [kind] * len(part), [self._payload(it) for it in part], [0] * len(part)
                )

        self.loop.run_until_complete(go())

    def enqueue_one(self, kind: str, item: dict[str, Any]) -> float:
        self.loop.run_until_complete(self.queries.enqueue(kind, self._payload(item)))
        return time.time()

    def _args(self, workload: str, variant: str = "") -> list[str]:
        if workload in ("cpu", "hung"):
            # Long, blocking jobs: the performance guide's "decrease batch_size when jobs
            # are long-running", with the smallest cap it allows (2 x batch_size).
            args = ["--batch-size", "1", "--max-concurrent-tasks", "2"]
        elif workload in IO_WORKLOADS:
            args = ["--batch-size", str(self.BATCH_SIZE)]
            if variant != "unlimited":  # run.py's io_best: its best is without a cap
                args += ["--max-concurrent-tasks", str(self.IO_MAX_CONCURRENT)]
        else:
            args = ["--batch-size", str(self.BATCH_SIZE)]
        if workload == "hung":
            args += ["--heartbeat-timeout", "2"]
        return args

    def workers(self, workload: str, variant: str = "") -> list[Worker]:
        env = base_env(self.dsn, self._io_env())
        argv = [venv_bin("pgq"), "run", "bench_pgqueuer_app:main", *self._args(workload, variant)]
        return [Worker(argv, env, f"pgqueuer-{workload}-{i}") for i in range(PEER_PROCESSES)]

    def slots(self, workload: str, variant: str = "") -> int:
        if workload in IO_WORKLOADS:
            # Without a cap, as many as are ready: no bound to compare with (0).
            return 0 if variant == "unlimited" else PEER_PROCESSES * self.IO_MAX_CONCURRENT
        return PEER_PROCESSES * (2 if workload in ("cpu", "hung") else self.BATCH_SIZE)

    def remaining(self) -> int:
        return self._count("SELECT count(*) FROM pgqueuer WHERE status IN ('queued', 'picked')")

    def job_states(self, keys: Sequence[str]) -> dict[str, str]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT convert_from(payload, 'UTF8')::jsonb->>'k', status::text "
                "FROM pgqueuer WHERE convert_from(payload, 'UTF8')::jsonb->>'k' = ANY(%s)",
                (list(keys),),
            ).fetchall()
        found = {k: str(status) for k, status in rows}
        for k in keys:
            found.setdefault(k, "gone from the queue table")
        return found

    def settings(self, workload: str, variant: str = "") -> dict[str, Any]:
        s: dict[str, Any] = {
            "command": f"{PEER_PROCESSES} x pgq run bench_pgqueuer_app:main "
            + " ".join(self._args(workload, variant)),
            "settings": "AsyncpgDriver on one asyncpg connection per QueueManager; durability "
            "durable (default); `pgq autovac` applied; dequeue_timeout 30s (default)",
            "tasks": "async entrypoints (io, io_http await on the event loop); cpu and hung "
            "work in asyncio.to_thread",
            "enqueue": "Queries.enqueue(name, payload) per job; bulk: one Queries.enqueue(lists) "
            f"of all the jobs (other workloads' set-up: chunks of {CHUNK})",
        }
        if workload == "hung":
            s["timeout"] = (
                "heartbeat_timeout=2s (pgqueuer has no execution time limit; a job whose "
                "heartbeat stops is picked again after heartbeat_timeout)"
            )
        return s


# -- Celery ----------------------------------------------------------------------------------


class Celery(System):
    name = "celery"
    PREFETCH = 128  # "Say 64, or 128" for many short tasks (Celery's optimizing guide)
    skip_workloads = dict.fromkeys(
        IO_WORKLOADS,
        "for I/O-bound tasks Celery's documentation advises the eventlet or gevent pool "
        "(`-P eventlet -c 1000`); neither is installed (not in requirements-peers.txt), and "
        "the prefork pool of 2 processes would only repeat brooq's one job per process",
    )

    def __init__(self, acks_late: bool = True) -> None:
        self.acks_late = acks_late
        if not acks_late:
            self.name = "celery-early-ack"

    def available(self) -> str | None:
        try:
            import celery  # noqa: F401
            import redis
        except ImportError:
            return "celery/redis are not installed (make bench installs them)"
        try:
            redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
        except Exception as exc:
            return f"no Redis at {REDIS_URL}: {exc}"
        return None

    def prepare(self, dsn: str) -> None:
        import redis

        super().prepare(dsn)
        sys.path.insert(0, str(APPS_DIR))
        os.environ["BENCH_DSN"] = dsn
        import bench_celery_app

        self.mod = bench_celery_app
        self.app = bench_celery_app.app
        self.queue = f"bench-{uuid.uuid4().hex[:8]}"
        self.counter = f"{self.queue}-done"
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.ids: dict[str, str] = {}
        self.expected = 0
        self._clear()

    def _clear(self) -> None:
        # Only our keys, in the Redis database the benchmark uses (9).
        self.redis.delete(self.queue, self.counter, "unacked", "unacked_index", "unacked_mutex")
        for key in self.redis.scan_iter(f"_kombu.binding*{self.queue}"):
            self.redis.delete(key)

    def close(self) -> None:
        if getattr(self, "redis", None) is not None:
            self._clear()
            for task_id in self.ids.values():
                self.redis.delete(f"celery-task-meta-{task_id}")
            self.redis.close()
            self.redis = None  # type: ignore[assignment]

    def _sig(self, kind: str, item: dict[str, Any]) -> Any:
        if kind == "noop":
            if self.acks_late:
                return self.mod.noop.s(item["i"])
            return self.mod.noop_counted.s(self.counter, item["i"])
        if kind == "cpu":
            return self.mod.cpu.s(item["k"], item["n"])
        return getattr(self.mod, kind).s(item["k"])

    def enqueue_single(self, kind: str, items: Sequence[dict[str, Any]]) -> None:
        self.expected += len(items)
        for item in items:
            self._sig(kind, item).apply_async(queue=self.queue)

    def enqueue_bulk(self, kind: str, items: Sequence[dict[str, Any]], chunk: int = CHUNK) -> None:
        from celery import group

        self.expected += len(items)
        for i in range(0, len(items), chunk):
            group(self._sig(kind, it) for it in items[i : i + chunk]).apply_async(queue=self.queue)

    def enqueue_one(self, kind: str, item: dict[str, Any]) -> float:
        self.expected += 1
        result = self._sig(kind, item).apply_async(queue=self.queue)
        self.ids[item["k"]] = result.id
        return time.time()

    def workers(self, workload: str, variant: str = "") -> list[Worker]:
        env = base_env(
            self.dsn,
            {
                "BENCH_CELERY_QUEUE": self.queue,
                "BENCH_CELERY_ACKS_LATE": "1" if self.acks_late else "0",
                "BENCH_CELERY_PREFETCH": str(self.PREFETCH),
                "BENCH_REDIS_URL": REDIS_URL,
            },
        )
        argv = [venv_bin("celery"), "-A", "bench_celery_app", "worker", *self._args()]
        return [Worker(argv, env, f"{self.name}-{workload}")]

    def _args(self) -> list[str]:
        return [
            "--pool",
            "prefork",
            "--concurrency",
            str(PEER_PROCESSES),
            "--queues",
            self.queue if hasattr(self, "queue") else "QUEUE",
            "--prefetch-multiplier",
            str(self.PREFETCH),
            "--without-gossip",
            "--without-mingle",
            "--loglevel",
            "WARNING",
            "--hostname",
            f"bench-{uuid.uuid4().hex[:6]}@%h",
        ]

    def analyze(self) -> None:
        pass  # the jobs are in Redis

    def server_cpu(self) -> dict[int, float]:
        """The broker's: the Redis server's process, when it runs on this machine (the
        jobs never reach PostgreSQL)."""
        pid = int(self.redis.info("server")["process_id"])
        try:
            local = Path(f"/proc/{pid}/comm").read_text().startswith("redis")
        except OSError:
            local = False
        cpu = cpu_of(pid) if local else None
        return {} if cpu is None else {pid: cpu}

    def remaining(self) -> int:
        if self.acks_late:
            # Waiting in the list, or taken by the worker and not yet acknowledged.
            return int(self.redis.llen(self.queue)) + int(self.redis.hlen("unacked"))
        return self.expected - int(self.redis.get(self.counter) or 0)

    def job_states(self, keys: Sequence[str]) -> dict[str, str]:
        from celery.result import AsyncResult

        out = {}
        for k in keys:
            r = AsyncResult(self.ids[k], app=self.app)
            info = r.info
            out[k] = f"{r.state} ({type(info).__name__}: {info})" if info else r.state
        return out

    def settings(self, workload: str, variant: str = "") -> dict[str, Any]:
        args = " ".join(self._args()[:-2]).replace(getattr(self, "queue", "QUEUE"), "<queue>")
        s: dict[str, Any] = {
            "command": f"celery -A bench_celery_app worker {args}",
            "settings": f"broker Redis {REDIS_URL}; task_acks_late={self.acks_late}; "
            f"worker_prefetch_multiplier={self.PREFETCH}; task_ignore_result=True; "
            "json serializer; -O default (prefetch into the pool processes)",
            "enqueue": "task.apply_async() per job; bulk: one group(...).apply_async() of all "
            "the jobs (Celery has no batch publish: a group sends one message per task; other "
            f"workloads' set-up: chunks of {CHUNK})",
        }
        if not self.acks_late:
            s["measure"] = (
                "the no-op task INCRs a Redis counter (one extra Redis round trip per job): "
                "with early acknowledgement nothing else outside the worker knows a job ran"
            )
        if workload == "hung":
            s["timeout"] = "task time_limit=2 (hard: the pool process is killed and replaced)"
        return s


class PgbenchInsert(Brooq):
    """Not a queue: the pgbench ceiling of a single enqueue, run in the plan
    next to the systems' enqueue_single so that its repetitions interleave with theirs.
    brooq's migrations make the table (and its NOTIFY trigger); pgbench then runs
    ceiling.INSERT_ONE once per job, one client, in the protocol of the variant
    (``prepared`` or ``simple``). Its figure is pgbench's tps; the run's wall time, pgbench
    started and connected included, is kept as seconds."""

    name = "pgbench"
    MODES = ("prepared", "simple")
    # Its client is pgbench, a process of its own that connects inside the timed call,
    # and its backend is gone before the window's end.
    measures_cpu = False

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.tps: float | None = None

    def enqueue_single(self, kind: str, items: Sequence[dict[str, Any]]) -> None:
        import ceiling

        self.tps = ceiling.insert_one(self.dsn, len(items), self.mode)

    def settings(self, workload: str, variant: str = "") -> dict[str, Any]:
        return {
            "command": f"pgbench -n -M {self.mode} -c 1 -j 1 -t N",
            "script": "ceiling.INSERT_ONE",
        }


def all_systems() -> list[System]:
    return [Brooq(), Procrastinate(), PgQueuer(), Celery(acks_late=True)]
