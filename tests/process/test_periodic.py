"""Periodic jobs on a real PostgreSQL: the claim of a tick under races, the duty on real
connections (a master whose clock is behind), two real masters, a restart after a pause,
`brooq periodic`, and brooq-master refusing a bad schedule."""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

import brooq
from brooq.settings import load as load_settings
from brooq.sql import Q
from brooq.supervisor.connections import Connections
from brooq.supervisor.duties.periodic import PERIODIC_CLOCK_TOLERANCE, Periodic
from tests.cliproc import run_brooq
from tests.harness import APPS, MasterProcess, wait_for
from tests.process.test_operations import get, ops_addr

UTC = timezone.utc
APP = "brooq_periodicapp:queue"
StartMaster = Callable[..., MasterProcess]


def sample(text: str, metric: str, **labels: str) -> float:
    """One sample of the Prometheus text (0 when absent); test_operations' own takes a
    parameter called name, which is this metric's label."""
    for line in text.splitlines():
        if not line.startswith(metric + "{"):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return 0.0


def parse_key(key: str) -> datetime:
    stamp = key.split(":", 2)[2]  # periodic:<name>:<stamp>
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def ticks(db: psycopg.Connection[Any], name: str = "tick") -> list[datetime]:
    rows = db.execute(
        "SELECT idempotency_key FROM job_all WHERE idempotency_key LIKE %s",
        (f"periodic:{name}:%",),
    ).fetchall()
    return sorted(parse_key(r[0]) for r in rows)


# -- the claim statement under races --------------------------------------------------------


def claim_params(name: str, tick: datetime) -> dict[str, Any]:
    return {"name": name, "tick": tick, "tolerance": PERIODIC_CLOCK_TOLERANCE}


def test_one_connection_of_many_wins_each_tick(dsn: str) -> None:
    """Eight connections claim the same tick at the same moment, ten ticks running: one row
    back per tick; an older tick after a newer one is refused."""
    n = 8
    conns = [psycopg.connect(dsn) for _ in range(n)]
    base = datetime(2026, 12, 1, 12, tzinfo=UTC)
    try:
        for i in range(10):
            tick = base + timedelta(seconds=i)
            barrier = threading.Barrier(n)
            won: list[int] = []

            def claim(
                k: int,
                tick: datetime = tick,
                barrier: threading.Barrier = barrier,
                won: list[int] = won,
            ) -> None:
                conn = conns[k]
                barrier.wait()
                with conn.transaction():
                    row = conn.execute(Q.periodic_claim, claim_params("race", tick)).fetchone()
                    time.sleep(0.02)  # hold the row: the others wait on it, then see it moved
                assert row is not None  # one row always; its name says who won
                if row[0] is not None:
                    won.append(k)

            threads = [threading.Thread(target=claim, args=(k,)) for k in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(won) == 1, (i, won)
        with conns[0].transaction():
            older = base + timedelta(seconds=3)
            row = conns[0].execute(Q.periodic_claim, claim_params("race", older)).fetchone()
            assert row is not None and row[0] is None
        last = conns[0].execute("SELECT last_tick FROM brooq_periodic").fetchone()
        assert last == (base + timedelta(seconds=9),)
    finally:
        for c in conns:
            c.close()


def _connections(dsn: str) -> Connections:
    conns = Connections(dsn, schema_verified=True, wake=lambda: None, reconnected=lambda: None)
    assert conns.connect()
    return conns


def test_duty_on_real_connections_and_a_clock_behind(dsn: str, db: psycopg.Connection[Any]) -> None:
    """Two duties, one clock 3 s behind the other: every tick gets one job whichever
    claims first; the one behind never enqueues a tick the other already passed, and a
    rolled-back claim leaves neither row nor job. Retention deleting the job changes
    nothing: the tick stays claimed in brooq_periodic."""
    app = brooq.Queue(dsn)
    app.handler("p.tick", queue="ticks")(print)
    schedules = {"hb": app.periodic("hb", every="1s", job=brooq.Job("p.tick"))}
    now = [datetime(2026, 12, 1, 12, tzinfo=UTC)]
    settings = load_settings()
    ahead = Periodic(
        _connections(dsn), schedules, app.handlers, settings, None, clock=lambda: now[0]
    )
    behind = Periodic(
        _connections(dsn),
        schedules,
        app.handlers,
        settings,
        None,
        clock=lambda: now[0] - timedelta(seconds=3),
    )
    try:
        for step in range(10):
            now[0] += timedelta(seconds=1)
            first, second = (ahead, behind) if step % 2 else (behind, ahead)
            first.run_once(0)
            second.run_once(0)
        got = ticks(db, "hb")
        assert len(got) == len(set(got))
        # Ticks the master behind enqueued before the one ahead claimed a later one stay
        # single; once ahead claimed T, behind's T-3 is refused.
        assert got[-1] == now[0].replace(microsecond=0)
        row = db.execute(
            "SELECT queue FROM job_all WHERE idempotency_key LIKE 'periodic:hb:%%' LIMIT 1"
        ).fetchone()
        assert row == ("ticks",)  # the handler's queue
        # Retention may delete the rows, and release their idempotency keys with them (a
        # partition dropped): the tick is still claimed, nothing enqueued again.
        db.execute("DELETE FROM job")
        db.execute("DELETE FROM job_history")
        db.execute("DELETE FROM brooq_job_key")
        behind.settled.clear()
        ahead.settled.clear()
        ahead.run_once(0)
        behind.run_once(0)
        assert ticks(db, "hb") == []
        last_job = db.execute("SELECT last_job FROM brooq_periodic WHERE name = 'hb'").fetchone()
        assert last_job is not None and last_job[0] is not None
    finally:
        ahead.conns.close()
        behind.conns.close()


def test_a_tick_whose_job_does_not_fit_its_typed_handler_is_skipped(
    dsn: str, db: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """The duty checks a typed topic's payload as Queue.enqueue does: a schedule whose job
    cannot fit is logged and its tick skipped, instead of a row that goes dead unrun."""

    @dataclass
    class Report:
        day: str

    app = brooq.Queue(dsn)
    app.handler("p.report", payload=Report)(print)
    schedules = {
        "bad": app.periodic("bad", every="1s", job=brooq.Job("p.report", {"day": 1})),
        "good": app.periodic("good", every="1s", job=brooq.Job("p.report", {"day": "mon"})),
    }
    now = [datetime(2026, 12, 1, 12, tzinfo=UTC)]
    duty = Periodic(
        _connections(dsn), schedules, app.handlers, load_settings(), None, clock=lambda: now[0]
    )
    try:
        for _ in range(3):
            now[0] += timedelta(seconds=1)
            duty.run_once(0)
    finally:
        duty.conns.close()
    assert ticks(db, "bad") == [] and len(ticks(db, "good")) >= 1
    assert "event=periodic_failed name=bad" in caplog.text
    assert "payload.day: expected str, got int (Report)" in caplog.text


def skews(text: str) -> list[float]:
    """The skew=...s of each event=periodic_clock_ahead line."""
    return [float(m) for m in re.findall(r"event=periodic_clock_ahead skew=([0-9.]+)s", text)]


def test_a_tick_from_the_future_is_refused_and_one_stored_does_not_block(
    dsn: str, db: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A master an hour ahead of the database's clock: its claim is refused (no job, the
    row not moved) and it warns naming its skew. A last_tick stored an hour in the future
    (as such a master left it when its ticks were taken) does not keep a correct master
    from the present tick, nor from the next."""
    app = brooq.Queue(dsn)
    app.handler("p.tick")(print)
    schedules = {"hb": app.periodic("hb", every="1s", job=brooq.Job("p.tick"))}
    settings = load_settings()
    ahead = Periodic(
        _connections(dsn),
        schedules,
        app.handlers,
        settings,
        None,
        clock=lambda: datetime.now(UTC) + timedelta(hours=1),
    )
    correct = Periodic(_connections(dsn), schedules, app.handlers, settings, None)
    db.execute(
        "INSERT INTO brooq_periodic (name, last_tick) VALUES ('hb', now() + interval '1 hour')"
    )

    def stored_in_the_future() -> bool:
        row = db.execute(
            "SELECT last_tick > now() + interval '2 s' FROM brooq_periodic WHERE name = 'hb'"
        ).fetchone()
        return bool(row and row[0])

    try:
        assert correct.run_once(0)["enqueued"] == 1
        assert not stored_in_the_future()
        with caplog.at_level(logging.WARNING, logger="brooq.master"):
            assert ahead.run_once(0) == {"enqueued": 0, "lost": 0, "failed": 1}
        [skew] = skews(caplog.text)
        assert 3590 < skew < 3610, caplog.text
        assert not stored_in_the_future()
        # The next second's tick goes to the correct master as usual.
        wait_for(lambda: correct.run_once(0)["enqueued"], what="the next tick")
        got = ticks(db, "hb")
        assert len(got) == 2 and got[1] - got[0] == timedelta(seconds=1)
        now = db.execute("SELECT now()").fetchone()
        assert now is not None and got[-1] <= now[0]
    finally:
        ahead.conns.close()
        correct.conns.close()


# -- real masters -----------------------------------------------------------------------------


def test_two_masters_one_job_per_tick(
    db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    """Two masters, every="1s", for ten seconds and more: one job per tick, consecutive
    ticks, none twice; the enqueued lines of both logs add up to the jobs. The broken
    schedules (a callable that raises, one that returns a str) are logged and do not stop
    the master or the other schedules."""
    env = {"BROOQ_PERIODIC_BROKEN": "1"}
    began = db.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    a = start_master(app=APP, workers=1, env=env)
    b = start_master(app=APP, workers=1, env=env)
    a.wait_ready(1)
    b.wait_ready(1)
    wait_for(lambda: len(ticks(db)) >= 12, timeout=40, what="12 ticks")
    # brooq_periodic_enqueued_total{name}: what this master enqueued, read between two
    # counts of its log lines (it goes on ticking meanwhile).
    scraped = 0.0
    for m in (a, b):
        low = m.log().count("event=periodic_enqueued name=tick ")
        status, text = get(ops_addr(m), "/metrics")
        high = m.log().count("event=periodic_enqueued name=tick ")
        assert status == 200
        value = sample(text, "brooq_periodic_enqueued_total", name="tick")
        assert low <= value <= high, (low, value, high)
        scraped += value
    assert scraped >= 11
    stopping = db.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    for m in (a, b):
        m.signal(15)
    assert a.wait() == 0 and b.wait() == 0
    got = ticks(db)
    keys = db.execute(
        "SELECT idempotency_key FROM job_all WHERE idempotency_key LIKE 'periodic:tick:%%'"
    ).fetchall()
    assert len(keys) == len({k for (k,) in keys}) == len(got)
    assert [y - x for x, y in itertools.pairwise(got)] == [timedelta(seconds=1)] * (len(got) - 1)
    logs = a.log() + b.log()
    assert logs.count("event=periodic_enqueued name=tick ") == len(got)
    assert "event=periodic_failed name=raises" in logs and "RuntimeError: boom" in logs
    assert "event=periodic_failed name=not-a-job" in logs

    # The digest (@hourly) and nightly-report (03:00) schedules are new: their last ticks
    # passed before they existed, so nothing was missed. Each is recorded once, by one
    # master, as its start, and its first job comes with its next tick: none, unless the
    # run went past the top of an hour (or 03:00 in Berlin), whose tick it then enqueued.
    # A tick in the last two seconds before the stop may or may not have been enqueued.
    def expected(tick: datetime) -> list[list[datetime]]:
        if tick <= began or tick > stopping:
            return [[]]
        return [[tick]] if tick <= stopping - timedelta(seconds=2) else [[], [tick]]

    hour = began.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    three = stopping.astimezone(ZoneInfo("Europe/Berlin")).replace(
        hour=3, minute=0, second=0, microsecond=0
    )
    digest, nightly = ticks(db, "digest"), ticks(db, "nightly-report")
    assert digest in expected(hour) and nightly in expected(three), (digest, nightly)
    started = db.execute(
        "SELECT name, last_job IS NOT NULL FROM brooq_periodic"
        " WHERE name IN ('digest', 'nightly-report') ORDER BY name"
    ).fetchall()
    assert started == [("digest", bool(digest)), ("nightly-report", bool(nightly))]
    assert logs.count("event=periodic_started name=digest ") == 1
    assert logs.count("event=periodic_started name=nightly-report ") == 1
    states = db.execute(
        "SELECT count(*) FILTER (WHERE state = 'done'), count(*) FROM job_all "
        "WHERE idempotency_key LIKE 'periodic:tick:%%'"
    ).fetchone()
    assert states is not None and states[0] >= states[1] - 2  # the jobs run too


def test_restart_after_a_pause_enqueues_one_catch_up_job(
    db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    """every="1s", the master stopped for ~2.6 s: at the restart exactly one job, for the
    most recent tick, and none for the ticks missed in between."""
    env = {"BROOQ_PERIODIC_EVERY": "1s"}
    m = start_master(app=APP, workers=1, env=env)
    wait_for(lambda: len(ticks(db)) >= 2, timeout=20, what="2 ticks")
    m.signal(15)
    assert m.wait() == 0
    before = ticks(db)
    time.sleep(2.6)  # the pause under test: at least two ticks go by
    restart = datetime.now(UTC)
    m2 = start_master(app=APP, workers=1, env=env)
    wait_for(lambda: len(ticks(db)) > len(before), timeout=20, what="the catch-up job")
    first = datetime.now(UTC)
    m2.signal(15)
    assert m2.wait() == 0
    after = ticks(db)[len(before) :]
    assert after, after
    catch_up = after[0]
    # The stop lasted more than two periods: at least one tick went by unclaimed between
    # the last one before the stop and the catch-up one, and none of them has a job.
    assert catch_up - before[-1] >= timedelta(seconds=2)
    assert not [t for t in ticks(db) if before[-1] < t < catch_up]
    assert restart - timedelta(seconds=1) <= catch_up <= first  # the most recent one
    assert [y - x for x, y in itertools.pairwise(after)] == [timedelta(seconds=1)] * (
        len(after) - 1
    )
    assert m2.log().count("event=periodic_enqueued name=tick ") == len(after)


def test_the_schedule_ticks_on_time_beside_a_master_an_hour_ahead(
    db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    """A master whose clock runs an hour ahead, started first, and a correct one: every
    tick enqueued is the database's present, one job each, consecutive, all from the
    correct master; the one ahead enqueues nothing and says once how far ahead it is."""
    skewed = start_master(app=APP, workers=1, env={"BROOQ_PERIODIC_CLOCK_AHEAD": "3600"})
    wait_for(lambda: skews(skewed.log()), what="the skewed master's warning")
    correct = start_master(app=APP, workers=1)
    wait_for(lambda: len(ticks(db)) >= 4, timeout=30, what="4 ticks")
    for m in (skewed, correct):
        m.signal(15)
    assert skewed.wait() == 0 and correct.wait() == 0
    got = ticks(db)
    now = db.execute("SELECT now()").fetchone()
    assert now is not None and got[-1] <= now[0], got
    assert [y - x for x, y in itertools.pairwise(got)] == [timedelta(seconds=1)] * (len(got) - 1)
    assert correct.log().count("event=periodic_enqueued name=tick ") == len(got)
    assert "event=periodic_enqueued" not in skewed.log()
    [skew] = skews(skewed.log())  # once a minute, and the run was shorter
    assert 3590 < skew < 3610
    future = db.execute(
        "SELECT count(*) FROM brooq_periodic WHERE last_tick > now() + interval '2 s'"
    ).fetchone()
    assert future == (0,)  # the hourly and nightly schedules' ticks were refused too


def test_master_exits_2_listing_every_problem_of_a_bad_schedule(tmp_path: Any, dsn: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_")}
    env.update(
        BROOQ_PERIODIC_BAD="1",
        DATABASE_URL=dsn,
        PYTHONPATH=os.pathsep.join([str(APPS), str(APPS.parent.parent)]),
    )
    out = subprocess.run(
        [sys.executable, "-m", "brooq.master_cli", "--app", APP, "--workers", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=APPS,
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.splitlines()
    assert lines[0] == "brooq-master: cannot start:", out.stderr
    assert len(lines) == 6, out.stderr
    assert "Traceback" not in out.stderr
    for expected in (
        "name 'Bad Name' does not match",
        "exactly one of cron= and every=",
        "'61 * * * *' is invalid",
        "every must be at least 1s",
        "unknown time zone 'Mars/Olympus'",
    ):
        assert sum(expected in line for line in lines[1:]) == 1, (expected, out.stderr)


# -- brooq periodic -------------------------------------------------------------------------------


def brooq_cli(
    dsn: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_")}
    full.pop("DATABASE_URL", None)
    full["PYTHONPATH"] = os.pathsep.join([str(APPS), str(APPS.parent.parent)])
    full.update(env or {})
    return run_brooq(["--database", dsn, *args], env=full, cwd=APPS)


def test_cli_lists_the_schedules(dsn: str, db: psycopg.Connection[Any], queue: brooq.Queue) -> None:
    out = brooq_cli(dsn, "periodic", "--app", APP)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == [
        "NAME",
        "SCHEDULE",
        "TZ",
        "NEXT",
        "TICK",
        "LAST",
        "TICK",
        "LAST",
        "JOB",
        "STATE",
    ]
    assert [line.split()[0] for line in lines[1:]] == ["digest", "nightly-report", "tick"]
    assert "every 1s" in lines[3] and "0 3 * * *" in lines[2] and "Europe/Berlin" in lines[2]
    assert lines[3].rstrip().endswith("-")  # nothing claimed yet

    # A claimed tick with its job, and one whose job retention deleted.
    job_id, _ = queue.enqueue(brooq.Job("p.tick", idempotency_key="periodic:tick:x"))
    queue.cancel(job_id)
    db.execute(
        "INSERT INTO brooq_periodic (name, last_tick, last_job) VALUES "
        "('tick', '2026-12-01T12:00:00Z', %s), "
        "('digest', '2026-12-01T12:00:00Z', '0190f3a2-0000-7000-8000-000000000000'), "
        "('gone-from-the-app', '2026-12-01T12:00:00Z', NULL)",
        (job_id,),
    )
    out = brooq_cli(dsn, "periodic", "--app", APP, "--json")
    assert out.returncode == 0, out.stderr
    listed = {r["name"]: r for r in json.loads(out.stdout)}
    assert sorted(listed) == ["digest", "nightly-report", "tick"]
    assert listed["tick"]["last_job"] == str(job_id) and listed["tick"]["last_state"] == "canceled"
    assert listed["tick"]["schedule"] == "every 1s" and listed["tick"]["tz"] == "UTC"
    assert listed["tick"]["last_tick"] == "2026-12-01T12:00:00+00:00"
    assert listed["digest"]["last_state"] == "deleted"
    assert listed["nightly-report"]["last_job"] is None
    assert listed["nightly-report"]["tz"] == "Europe/Berlin"
    nxt = datetime.fromisoformat(listed["digest"]["next_tick"])
    assert nxt.minute == 0 and nxt > datetime.now(UTC)
    text = brooq_cli(dsn, "periodic", "--app", APP).stdout
    assert f"{job_id}  canceled" in text and "deleted" in text


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (("periodic", "--app", "no_such_module_x:queue"), None, "cannot import"),
        (("periodic", "--app", "brooq_periodicapp:"), None, "--app must be MODULE:ATTR"),
        (("periodic", "add", "x", "--topic", "t.x"), None, "exactly one of --cron and --every"),
        (("periodic", "add", "x", "--topic", "t.x", "--every", "0s"), None, "at least 1s"),
        (("periodic", "--json", "pause", "x"), None, "give --app and --json without a command"),
        (("periodic", "--app", APP), {"BROOQ_PERIODIC_BAD": "1"}, "unknown time zone"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(
    dsn: str, args: tuple[str, ...], env: dict[str, str] | None, expected: str
) -> None:
    out = brooq_cli(dsn, *args, env=env)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert len(out.stderr.splitlines()) == 1 and expected in out.stderr, out.stderr
    assert out.stdout == ""


def test_a_schedule_added_from_the_command_line_runs_once_per_tick_on_two_masters(
    dsn: str, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    """Two masters running: `brooq periodic add` stores a 1 s schedule; its ticks come
    within a second of the add, one job each, none twice; paused, none; resumed, they come
    again; `run` enqueues one now; removed, none."""

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "brooq", "--database", dsn, "periodic", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

    masters = [start_master(app=APP, workers=1) for _ in range(2)]
    for m in masters:
        m.wait_ready(1)
    added = cli("add", "stored", "--topic", "p.tick", "--every", "1s", "--payload", '{"a": 1}')
    assert added.returncode == 0, added.stderr
    wait_for(lambda: len(ticks(db, "stored")) >= 4, timeout=20, what="4 ticks")
    got = ticks(db, "stored")
    assert [y - x for x, y in itertools.pairwise(got)] == [timedelta(seconds=1)] * (len(got) - 1)
    assert cli("pause", "stored").returncode == 0
    time.sleep(1.5)  # a pass of the duty reads the pause
    paused = len(ticks(db, "stored"))
    time.sleep(2.2)  # two ticks go by paused
    assert len(ticks(db, "stored")) == paused
    assert cli("resume", "stored").returncode == 0
    wait_for(lambda: len(ticks(db, "stored")) > paused, timeout=20, what="ticks again")
    ran = cli("run", "stored")
    assert ran.returncode == 0 and ran.stdout.startswith("enqueued ")
    job_id = ran.stdout.split()[1]
    row = db.execute("SELECT topic, payload FROM job_all WHERE id = %s", (job_id,)).fetchone()
    assert row == ("p.tick", {"a": 1})
    assert cli("remove", "stored").returncode == 0
    time.sleep(1.5)
    removed = len(ticks(db, "stored"))
    time.sleep(2.2)
    assert len(ticks(db, "stored")) == removed
    for m in masters:
        m.signal(15)
    assert [m.wait() for m in masters] == [0, 0]
    keys = db.execute(
        "SELECT idempotency_key FROM job_all WHERE idempotency_key LIKE 'periodic:stored:%%'"
    ).fetchall()
    assert len(keys) == len({k for (k,) in keys})  # once per tick across both masters


def test_a_stored_schedule_backfills_the_ticks_missed_while_no_master_ran(
    db: psycopg.Connection[Any], queue: brooq.Queue, start_master: StartMaster
) -> None:
    """backfill=2, every 1 s, the master stopped for about 4 s: at the restart the two
    ticks before the due one come too, and no more."""
    queue.add_schedule("filled", "p.tick", every="1s", backfill=2)
    m = start_master(app=APP, workers=1)
    wait_for(lambda: len(ticks(db, "filled")) >= 2, timeout=20, what="2 ticks")
    m.signal(15)
    assert m.wait() == 0
    before = ticks(db, "filled")
    time.sleep(4.2)  # four ticks go by
    m2 = start_master(app=APP, workers=1)
    wait_for(lambda: len(ticks(db, "filled")) >= len(before) + 3, timeout=20, what="backfill")
    m2.signal(15)
    assert m2.wait() == 0
    after = ticks(db, "filled")[len(before) :]
    # The first pass after the restart enqueued the due tick and the two before it
    # (created together), consecutive; the ones before those were missed for good.
    created = db.execute(
        "SELECT idempotency_key, created_at FROM job_all "
        "WHERE idempotency_key LIKE 'periodic:filled:%%' ORDER BY created_at"
    ).fetchall()[len(before) :]
    first_pass = [parse_key(k) for k, at in created if at - created[0][1] < timedelta(seconds=0.3)]
    assert len(first_pass) == 3, created
    assert [y - x for x, y in itertools.pairwise(sorted(first_pass))] == [timedelta(seconds=1)] * 2
    assert [y - x for x, y in itertools.pairwise(after)] == [timedelta(seconds=1)] * (
        len(after) - 1
    )
    assert after[0] - before[-1] >= timedelta(seconds=2)  # at least one missed for good
    assert queue.stored_schedules("filled")[0].last_tick == ticks(db, "filled")[-1]
