"""The fleet, visible, with real masters on the real database: each master's row in
brooq_master (`brooq fleet`, the status page's /fleet), a master killed dropping out after
its missed beats, one stopped dropping out at once, and ready jobs no live master
handles flagged (the log line once, `brooq stats`, the overview, the gauge) until one
does."""

from __future__ import annotations

import os
import re
import signal
import time
from typing import Any

import psycopg

import brooq
from brooq.operator import masters
from brooq.operator.masters import MISSED_BEATS
from tests.db.test_cli import as_json
from tests.harness import MasterProcess, StartMaster, wait_for
from tests.process.test_ops_slow_clients import ops_addr
from tests.process.test_status_page import get

APP = "brooq_topicsapp:queue"
BEAT = 0.3  # seconds: QUEUE_FLEET_BEAT of these masters
FAST_FLEET = {"QUEUE_FLEET_BEAT": f"{int(BEAT * 1000)}ms", "QUEUE_STATS_PERIOD": "200ms"}


def master(start_master: StartMaster, topics: str, workers: int = 1, **kw: Any) -> MasterProcess:
    env = {**FAST_FLEET, "BROOQ_TOPICS": topics}
    return start_master(app=APP, workers=workers, env=env, **kw)


def live(db: psycopg.Connection[Any]) -> dict[int, masters.MasterRow]:
    return {m.pid: m for m in masters.live(db)}


def listed(db: psycopg.Connection[Any], m: MasterProcess, children: int) -> bool:
    """m's row is live and names exactly its children, once it has them all."""
    row = live(db).get(m.pid)
    kids = m.children()
    return (
        row is not None
        and len(row.children) == children
        and sorted(c.pid for c in row.children) == sorted(kids)
    )


def test_two_masters_are_listed_with_their_children_then_drop_out(
    dsn: str, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    one = master(start_master, "calc.hash,calc.sum:bulk", workers=2, new_session=True)
    two = master(start_master, "mail.send")
    wait_for(lambda: listed(db, one, 2) and listed(db, two, 1), what="both masters listed")

    shown = {m["pid"]: m for m in as_json(dsn, "fleet")["masters"]}
    assert set(shown) == {one.pid, two.pid}
    first, second = shown[one.pid], shown[two.pid]
    assert first["app"] == APP and first["version"] == brooq.__version__
    assert first["host"] == os.uname().nodename
    assert first["topics"] == ["calc.hash", "calc.sum"]
    assert first["queues"] == ["bulk", "default"]
    assert sorted(c["pid"] for c in first["children"]) == one.children()
    assert {(c["kind"], c["generation"]) for c in first["children"]} == {("sync", 0)}
    assert (second["topics"], second["queues"]) == (["mail.send"], ["default"])
    assert second["beat_seconds"] == BEAT and second["seen_seconds_ago"] < 5
    text = as_text(dsn)
    assert f"pid {one.pid}" in text and f"pid {two.pid}" in text and "3 children" in text

    # A child replaced: the row follows (refreshed when the children change).
    old = one.children()[0]
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: listed(db, one, 2) and old not in one.children(), what="new child listed")

    # SIGTERM: the row is gone as soon as the master has exited.
    two.signal(signal.SIGTERM)
    assert two.wait(30) == 0
    assert two.pid not in live(db)
    assert db.execute("SELECT count(*) FROM brooq_master WHERE pid = %s", [two.pid]).fetchone() == (
        0,
    )

    # SIGKILL of the master and its children (a host gone): listed until it missed its
    # beats, then ignored by every reader although its row is still there...
    os.killpg(one.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: one.pid not in live(db), timeout=MISSED_BEATS * BEAT + 10, what="drop out")
    assert time.monotonic() - killed_at >= (MISSED_BEATS - 1) * BEAT
    assert as_json(dsn, "fleet") == {"masters": []}
    assert "no live master" in as_text(dsn)
    stale = "SELECT count(*) FROM brooq_master WHERE pid = %s"
    assert db.execute(stale, [one.pid]).fetchone() == (1,)
    # ... and deleted by the next master that sweeps.
    three = master(start_master, "calc.hash")
    wait_for(lambda: db.execute(stale, [one.pid]).fetchone() == (0,), what="stale row swept")
    wait_for(lambda: listed(db, three, 1), what="the new master listed")


def as_text(dsn: str) -> str:
    from tests.db.test_cli import ok

    return ok(dsn, "fleet")


def unhandled_lines(m: MasterProcess, topic: str) -> int:
    return len(re.findall(rf"event=unhandled_topic topic={re.escape(topic)} ", m.log()))


def gauge(addr: tuple[str, int], queue: str, topic: str) -> float | None:
    status, _, body = get(addr, "/metrics")
    assert status == 200
    pattern = rf'brooq_jobs_unhandled\{{queue="{queue}",topic="{topic}"\}} (\S+)'
    found = re.search(pattern, body.decode())
    return float(found.group(1)) if found else None


def marked(addr: tuple[str, int], topic: str) -> bool:
    """The overview's row of ``topic`` carries the "no handler" mark."""
    status, _, body = get(addr, "/")
    assert status == 200
    paused = r"(?: <strong>\(paused\)</strong>)?"
    row = re.search(
        rf"<tr><td>default{paused}</td><td>{re.escape(topic)}</td>(.*?)</tr>", body.decode()
    )
    assert row is not None, body.decode()[-3000:]
    return ">no handler</strong>" in row.group(1)


def stats_row(dsn: str, topic: str) -> dict[str, Any]:
    rows = [r for r in as_json(dsn, "stats")["topics"] if r["topic"] == topic]
    assert len(rows) == 1
    return rows[0]


def test_ready_jobs_no_master_handles_are_flagged_until_one_does(
    dsn: str, db: psycopg.Connection[Any], queue: brooq.Queue, start_master: StartMaster
) -> None:
    typo = "calc.hsah"  # a producer's typo of calc.hash
    one = master(start_master, "calc.hash")
    addr = ops_addr(one)
    wait_for(lambda: listed(db, one, 1), what="the master listed")
    queue.enqueue_many([brooq.Job(typo, {"n": i}) for i in range(3)])

    wait_for(lambda: unhandled_lines(one, typo), what="event=unhandled_topic")
    assert f"event=unhandled_topic topic={typo} queue=default count=3" in one.log()
    assert stats_row(dsn, typo)["no_handler"] is True
    assert marked(addr, typo)
    wait_for(lambda: gauge(addr, "default", typo) == 3.0, what="the gauge at 3")
    # More jobs of it: the gauge follows, the line is not said again.
    queue.enqueue_many([brooq.Job(typo, {"n": i}) for i in range(2)])
    wait_for(lambda: gauge(addr, "default", typo) == 5.0, what="the gauge at 5")
    assert unhandled_lines(one, typo) == 1

    # A master with that topic starts: handled, the marks clear. The queue is paused so
    # that its jobs stay ready: what clears the mark is the handler, not an empty queue.
    queue.pause("default")
    two = master(start_master, typo)
    wait_for(lambda: f"event=unhandled_topic_handled topic={typo}" in one.log(), what="handled")
    wait_for(lambda: gauge(addr, "default", typo) == 0.0, what="the gauge at 0")
    row = stats_row(dsn, typo)
    assert row["no_handler"] is False and row["ready"] == 5
    assert not marked(addr, typo)

    # Unhandled again once that master is gone: said again, once.
    two.signal(signal.SIGTERM)
    assert two.wait(30) == 0
    wait_for(lambda: unhandled_lines(one, typo) == 2, what="said again")
    wait_for(lambda: gauge(addr, "default", typo) == 5.0, what="the gauge back at 5")
    assert stats_row(dsn, typo)["no_handler"] is True
    assert marked(addr, typo)
