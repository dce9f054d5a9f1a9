"""The Python of one `Queue.enqueue`, warm and cold, without the server's time.

    python benchmarks/cold_enqueue.py --dsn DSN [--evict-mb 4] [--calls 300]

A single enqueue waits for its commit; on a CPU it shares with its backend, the client
then wakes to caches full of the backend's work, so what its Python costs is closer to
the cold figure than to a warm loop's. Cold: before each call a buffer of --evict-mb MiB
is written through (4 MiB: about what a backend's statement and commit displace from a
core's caches; 96 MiB: nothing left), and only the call itself is timed; the median of
--calls. Warm: a tight loop of 3,000 calls. The line's libpq call is replaced by a stub
answering "one row inserted", so no figure includes the server; DSN is a migrated
database the line can prepare its statement on (nothing is inserted). Runs the brooq
first on sys.path: PYTHONPATH=TREE to measure another checkout (the A/B of
benchmarks/README.md, "Placement, and the third change").
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import brooq
from brooq.producer import ids, insert, poolcheck
from psycopg import pq


class _Inserted:
    status = int(pq.ExecStatus.TUPLES_OK)
    ntuples = 1


class _StubPGconn:
    status = int(pq.ConnStatus.OK)
    transaction_status = int(pq.TransactionStatus.IDLE)

    def exec_prepared(self, *args: Any) -> type[_Inserted]:
        return _Inserted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", required=True, help="a migrated database")
    ap.add_argument("--evict-mb", type=int, default=4)
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()
    buffer = bytearray(args.evict_mb * 1024 * 1024)
    ones = b"\x01" * (len(buffer) // 64)

    def cold(fn: Callable[[int], object]) -> float:
        took = []
        for i in range(args.calls):
            buffer[::64] = ones  # one write per cache line
            t = time.perf_counter_ns()
            fn(i)
            took.append(time.perf_counter_ns() - t)
        return statistics.median(took) / 1000

    def warm(fn: Callable[[int], object], n: int = 3000) -> float:
        t = time.perf_counter_ns()
        for i in range(n):
            fn(i)
        return (time.perf_counter_ns() - t) / n / 1000

    queue = brooq.Queue(args.dsn)
    queue._open_line()._ready()  # opened and prepared for real, then stubbed
    line = queue._open_line()
    conn = line._conn
    assert conn is not None
    real_pgconn = line._pgconn
    line._pgconn = _StubPGconn()  # type: ignore[assignment]  # the socket's look stays real
    job = brooq.Job("bench.noop", {"i": 1})
    pieces: dict[str, Callable[[int], object]] = {
        "nothing (the timer)": lambda i: None,
        "brooq.Job(topic, payload)": lambda i: brooq.Job("bench.noop", {"i": i}),
        "uuid7()": lambda i: ids.uuid7(),
        "poolcheck.suspect(line's conn)": lambda i: poolcheck.suspect(conn),
        "insert.check_job(job)": lambda i: insert.check_job(job, 1 << 20, {}),
        "line.insert(job), stubbed": lambda i: line.insert(job, "default"),
        "queue.enqueue(job), stubbed": lambda i: queue.enqueue(job),
        "queue.enqueue(Job(...)), stubbed": lambda i: queue.enqueue(
            brooq.Job("bench.noop", {"i": i})
        ),
    }
    print(f"cold = {args.evict_mb} MiB evicted before each call, median of {args.calls}")
    for name, fn in pieces.items():
        print(f"{name:36s} cold {cold(fn):7.2f} µs   warm {warm(fn):6.2f} µs")
    line._pgconn = real_pgconn
    queue.close()


if __name__ == "__main__":
    main()
