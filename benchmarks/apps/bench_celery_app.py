"""Celery application of the benchmark (prefork pool, Redis broker):
`celery -A bench_celery_app worker -P prefork -c 2 ...`.

Settings come from the environment so that the driver can write them next to the figures:
BENCH_CELERY_QUEUE, BENCH_CELERY_ACKS_LATE, BENCH_CELERY_PREFETCH.
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

from benchwork import hang_forever, record, record_cpu, spin

BROKER = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")

app = Celery("bench", broker=BROKER, backend=BROKER)
app.conf.update(
    task_default_queue=os.environ.get("BENCH_CELERY_QUEUE", "bench"),
    task_acks_late=os.environ.get("BENCH_CELERY_ACKS_LATE", "1") == "1",
    worker_prefetch_multiplier=int(os.environ.get("BENCH_CELERY_PREFETCH", "128")),
    task_ignore_result=True,
    task_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)

_redis: redis.Redis | None = None
_pid = 0


@app.task(name="noop")
def noop(i: int) -> None:
    pass


@app.task(name="noop_counted")
def noop_counted(counter: str, i: int) -> None:
    """No-op that counts itself, for early-ack runs, where Redis no longer holds a
    message once the worker has taken it and only the handler can tell it ran."""
    global _redis, _pid
    if _redis is None or _pid != os.getpid():
        _redis, _pid = redis.Redis.from_url(BROKER), os.getpid()
    _redis.incr(counter)


@app.task(name="cpu")
def cpu(k: str, n: int) -> None:
    t0, c0 = time.time(), time.thread_time()
    spin(n)
    c1, t1 = time.thread_time(), time.time()
    record_cpu(k, t0, t1, c1 - c0)


@app.task(name="pickup")
def pickup(k: str) -> None:
    record(k, "start", time.time())


@app.task(name="probe")
def probe(k: str) -> None:
    record(k, "start", time.time())


# The hung-handler workload: hard time limit 2 s; its result is kept so that the state it
# ends in can be read back.
@app.task(name="hung", time_limit=2, ignore_result=False)
def hung(k: str) -> None:
    record(k, "start", time.time())
    hang_forever()
