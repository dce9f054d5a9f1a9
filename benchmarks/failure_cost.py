"""What a failed attempt costs to write now that its traceback is kept: the child's
job_set_failed of the release before (the error history appended inline, four keys) beside
today's (brooq_errors_append, migration 0018: seven keys, the traceback), alternated for
ROUNDS rounds of JOBS writes each, in one database of this tree's schema; and the child's
Python per failure (brooq.ipc.tracebacks.format_exception, beside the traceback it already
formats for its log line).

Run by hand (never part of `make test`); a few minutes on 2 cores:

    .venv/bin/python benchmarks/failure_cost.py [--dsn ADMIN_DSN] [--jobs 2000] [--rounds 5]

Each write is one autocommit statement on a row held as a child holds it, timed from the
client (a round trip and the server's work; synchronous_commit off, as the children's
sessions run by default); the two statements take turns, write by write, so both meet
the same load. Each round's median and 10th percentile, then the medians of the rounds.
Cases: a job's first failure, and a job with a full history (19 entries before: for
today's statement each of the newest 5 with a traceback the size of the case's, as it
leaves them; for the one before, the four keys it wrote).
Tracebacks: a typical one (three frames, formatted here) and one at the bound (8,192
characters). Prints Markdown tables and the medians of the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's brooq

import psycopg
from brooq.ipc import tracebacks
from brooq.sql import Q
from psycopg.types.json import Jsonb

from common import DEFAULT_DSN, fresh_database, migrate_tree

# job_set_failed of the release before migration 0018 (brooq/sql/child.sql): what a child
# wrote for a failed attempt, the error history appended inline.
OLD_SET_FAILED = """
UPDATE job
SET state = CASE
        WHEN NOT %(refund)s AND attempts >= %(max_attempts)s THEN 'dead'
        ELSE 'failed'
    END,
    attempts = CASE WHEN %(refund)s THEN greatest(attempts - 1, 0) ELSE attempts END,
    available_at = now() + make_interval(secs => %(delay)s),
    last_error = %(error)s,
    errors = jsonb_path_query_array(
        coalesce(job.errors, '[]'::jsonb)
            || jsonb_build_object('attempt', job.attempts, 'at', now(),
                                  'error', %(history_error)s::text,
                                  'worker', %(worker)s::text),
        '$[last - 19 to last]'),
    updated_at = now()
WHERE id = %(id)s AND (state = 'processing') IS TRUE AND locked_by = %(worker)s
RETURNING state
"""
ERROR = "ZeroDivisionError: division by zero"


def order_total(order: dict[str, Any]) -> int:
    return sum(order["prices"])


def price_per_item(order: dict[str, Any]) -> float:
    return order_total(order) / len(order["prices"])


def handler() -> float:
    return price_per_item({"prices": []})


def ping(n: int) -> int:
    return pong(n + 1)


def pong(n: int) -> int:
    return ping(n + 1)


def raised(fn: Any, *args: Any) -> BaseException:
    try:
        fn(*args)
    except BaseException as exc:
        return exc
    raise AssertionError("did not raise")


def python_cost(calls: int = 2000) -> dict[str, float]:
    """Microseconds per failure in the child: the log's traceback (paid before too) and the
    kept one, for a typical exception and a ~1,000-frame recursion."""
    out = {}
    for name, exc in (("typical", raised(handler)), ("deep", raised(ping, 0))):
        n = calls if name == "typical" else max(calls // 50, 10)
        for what, fn in (
            ("log", lambda e=exc: "".join(traceback.format_exception(e))),
            ("kept", lambda e=exc: tracebacks.format_exception(e)),
        ):
            fn()
            start = time.perf_counter()
            for _ in range(n):
                fn()
            out[f"{name}_{what}_us"] = (time.perf_counter() - start) / n * 1e6
    return out


def held_jobs(conn: psycopg.Connection[Any], n: int, errors: list[dict[str, Any]]) -> list[Any]:
    """``n`` jobs held by worker w (as a child's claim leaves them), with ``errors``."""
    rows = conn.execute(
        "INSERT INTO job (topic, state, attempts, locked_by, locked_until, errors) "
        "SELECT 'bench.fail', 'processing', 1, 'w', now() + interval '1 hour', %s "
        "FROM generate_series(1, %s) RETURNING id",
        (Jsonb(errors) if errors else None, n),
    ).fetchall()
    return [r[0] for r in rows]


def write(conn: psycopg.Connection[Any], statement: str, job_id: Any, tb: str | None) -> float:
    """One failed attempt's write; seconds."""
    params: dict[str, Any] = {
        "id": job_id,
        "worker": "w",
        "refund": False,
        "max_attempts": 5,
        "delay": 60.0,
        "error": ERROR,
        "history_error": ERROR,
    }
    if statement is not OLD_SET_FAILED:
        params |= {"kind": "raised", "traceback": tb}
    start = time.perf_counter()
    row = conn.execute(statement, params, prepare=True).fetchone()
    elapsed = time.perf_counter() - start
    assert row == ("failed",), row
    return elapsed


def alternated(
    conn: psycopg.Connection[Any], jobs: int, errors: list[dict[str, Any]], tb: str
) -> tuple[list[float], list[float]]:
    """``jobs`` writes of each statement, one before and one after in turn (so both meet
    the same load): microseconds per write, before and after."""
    # The release before wrote four keys and no traceback: its history, as it left it.
    four = [{k: e[k] for k in ("attempt", "at", "error", "worker")} for e in errors]
    olds, news = held_jobs(conn, jobs, four), held_jobs(conn, jobs, errors)
    before, after = [], []
    for old_id, new_id in zip(olds, news, strict=True):
        before.append(write(conn, OLD_SET_FAILED, old_id, None) * 1e6)
        after.append(write(conn, Q.job_set_failed, new_id, tb) * 1e6)
    conn.execute("DELETE FROM job")
    return before, after


def p10(values: list[float]) -> float:
    return sorted(values)[len(values) // 10]


def history(size: int, tb: str) -> list[dict[str, Any]]:
    """19 entries, the newest 5 with ``tb``, as today's statement leaves a full history."""
    return [
        {
            "attempt": n,
            "at": "2026-12-04T10:00:00+00:00",
            "started_at": "2026-12-04T09:59:59+00:00",
            "worker": "host:1:abcdef",
            "error": ERROR,
            "kind": "raised",
            "traceback": tb if n > size - 5 else None,
        }
        for n in range(1, size + 1)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    typical = tracebacks.format_exception(raised(handler))
    bound = (typical + "\n") * (tracebacks.TRACEBACK_MAX // (len(typical) + 1))
    bound = bound[: tracebacks.TRACEBACK_MAX]
    cases = [
        ("first failure, typical traceback", [], typical),
        ("first failure, 8,192-character traceback", [], bound),
        ("20th entry, typical tracebacks", history(19, typical), typical),
        ("20th entry, 8,192-character tracebacks", history(19, bound), bound),
    ]
    figures: dict[str, Any] = {"python": python_cost(), "typical_chars": len(typical)}
    with fresh_database(args.dsn, "failure_cost") as dsn:
        migrate_tree(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = off")
            figures["server"] = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
            for label, errors, tb in cases:
                rounds = [alternated(conn, args.jobs, errors, tb) for _ in range(args.rounds)]
                figures[label] = {
                    "before_median_us": [statistics.median(b) for b, _ in rounds],
                    "after_median_us": [statistics.median(a) for _, a in rounds],
                    "before_p10_us": [p10(b) for b, _ in rounds],
                    "after_p10_us": [p10(a) for _, a in rounds],
                }
                f = figures[label]
                print(
                    f"{label}: medians before {[round(x) for x in f['before_median_us']]}, "
                    f"after {[round(x) for x in f['after_median_us']]}; 10th percentiles "
                    f"before {[round(x) for x in f['before_p10_us']]}, "
                    f"after {[round(x) for x in f['after_p10_us']]}",
                    flush=True,
                )
    py = figures["python"]
    print(f"\nPostgreSQL {figures['server']}; {args.jobs} writes per round, {args.rounds} rounds\n")
    print(
        "| case | before, µs per write (median; 10th percentile) "
        "| after, µs per write (median; 10th percentile) |"
    )
    print("|---|---:|---:|")
    for label, _, _ in cases:
        f = figures[label]
        before = [statistics.median(f[k]) for k in ("before_median_us", "before_p10_us")]
        after = [statistics.median(f[k]) for k in ("after_median_us", "after_p10_us")]
        print(f"| {label} | {before[0]:.0f}; {before[1]:.0f} | {after[0]:.0f}; {after[1]:.0f} |")
    chars = figures["typical_chars"]
    print(f"\nThe child's Python per failure (typical traceback {chars} characters):\n")
    print("| exception | the log line's traceback (before too), µs | the kept traceback, µs |")
    print("|---|---:|---:|")
    print(f"| three frames | {py['typical_log_us']:.0f} | {py['typical_kept_us']:.0f} |")
    print(f"| ~1,000-frame recursion | {py['deep_log_us']:.0f} | {py['deep_kept_us']:.0f} |")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
