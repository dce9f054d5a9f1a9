"""The pure parts of the fleet view: which pairs the live masters handle and which ready
ones none does (brooq.masters), the once-per-pair watch (brooq.supervisor.unhandled), the
beat duty's sending, pacing and reading (brooq.supervisor.duties.beat, on fakes), the
text of `brooq fleet` and the mark of `brooq stats`, the setting; and the statements
themselves on the real database."""

from __future__ import annotations

import json
import logging
import uuid
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest

import brooq
from brooq import masters
from brooq import settings as settings_mod
from brooq.cli.fleet import fleet_lines
from brooq.cli.stats import stats_lines
from brooq.errors import InvalidSettings
from brooq.handlers import Handler
from brooq.masters import MasterRow, handled, no_handler, pairs, unhandled
from brooq.settings import Settings
from brooq.sql import Q
from brooq.supervisor.duties.beat import AGAIN_AFTER, SWEEP_EVERY, Beat
from brooq.supervisor.duties.scheduler import Scheduler
from brooq.supervisor.offloop import Answer
from brooq.supervisor.unhandled import Unhandled
from tests.test_supervisor_units import FakeGauge

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=timezone.utc)


def row(pid: int, queues: list[str], topics: list[str], children: Any = "[]") -> MasterRow:
    return MasterRow.from_row(
        {
            "id": uuid.UUID(int=pid),
            "host": "h1",
            "pid": pid,
            "version": "0.1.0",
            "app": "app:queue",
            "queues": queues,
            "topics": topics,
            "children": children,
            "beat_seconds": 10.0,
            "started_at": T0,
            "seen_at": T0 + timedelta(seconds=30),
            "seen_seconds_ago": 1.25,
        }
    )


# -- brooq.masters -----------------------------------------------------------------------------


def test_a_master_handles_its_topics_in_every_queue_it_works() -> None:
    assert pairs(["default", "bulk"], ["a", "b"]) == {
        ("default", "a"),
        ("default", "b"),
        ("bulk", "a"),
        ("bulk", "b"),
    }
    live = handled([row(1, ["default"], ["a"]), row(2, ["bulk"], ["b"])])
    assert live == {("default", "a"), ("bulk", "b")}
    assert no_handler("default", "b", 3, live)  # b runs in bulk only
    assert not no_handler("default", "b", 0, live)  # nothing ready: nothing to say
    assert not no_handler("bulk", "b", 3, live)
    rows = [
        {"queue": "default", "topic": "a", "ready": 5},
        {"queue": "default", "topic": "typo", "ready": 2},
        {"queue": "default", "topic": "gone", "ready": 0},
        {"queue": "nobody", "topic": "a", "ready": 1},
    ]
    assert unhandled(rows, live) == {("default", "typo"): 2, ("nobody", "a"): 1}
    assert unhandled(rows, frozenset()) == {
        ("default", "a"): 5,
        ("default", "typo"): 2,
        ("nobody", "a"): 1,
    }


def test_a_row_as_read_and_as_json() -> None:
    child = {"pid": 7, "kind": "async", "generation": 2, "started_at": T0.isoformat()}
    for children in (json.dumps([child]), [child]):  # jsonb arrives parsed; text too
        m = row(5, ["default"], ["a"], children)
        assert m.children[0].pid == 7 and m.children[0].started_at == T0
    d = m.to_dict()
    assert d["children"] == [child] and d["seen_seconds_ago"] == 1.25
    assert d["id"] == str(uuid.UUID(int=5)) and d["started_at"] == T0.isoformat()
    assert json.loads(json.dumps(d)) == d


# -- the watch ---------------------------------------------------------------------------------


def test_unhandled_is_said_once_per_pair_and_again_after_it_was_handled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    live: list[frozenset[tuple[str, str]] | None] = [None]
    metrics = SimpleNamespace(unhandled=FakeGauge())
    watch = Unhandled(lambda: live[0], metrics)  # type: ignore[arg-type]
    typo = [{"queue": "default", "topic": "calc.hsah", "ready": 3}]
    key = (("queue", "default"), ("topic", "calc.hsah"))

    def said() -> int:
        return caplog.text.count("event=unhandled_topic topic=calc.hsah queue=default")

    with caplog.at_level(logging.INFO, logger="brooq.master"):
        assert watch.check(typo) == {}  # the fleet not known yet: nothing judged
        live[0] = frozenset({("default", "calc.hash")})
        assert watch.check(typo) == {("default", "calc.hsah"): 3}
        assert "count=3" in caplog.text and metrics.unhandled.values[key] == 3
        watch.check([{**typo[0], "ready": 5}])  # more jobs: the gauge, not the line
        assert said() == 1 and metrics.unhandled.values[key] == 5
        watch.check([])  # its jobs gone: 0 once, still flagged
        assert metrics.unhandled.values[key] == 0
        metrics.unhandled.written.clear()
        watch.check([])
        assert metrics.unhandled.written == []  # written as zero once, then forgotten
        watch.check(typo)
        assert said() == 1  # not handled in between: not said again
        live[0] = frozenset({("default", "calc.hash"), ("default", "calc.hsah")})
        assert watch.check(typo) == {}
        assert "event=unhandled_topic_handled topic=calc.hsah queue=default" in caplog.text
        assert metrics.unhandled.values[key] == 0
        live[0] = frozenset({("default", "calc.hash")})
        watch.check(typo)
        assert said() == 2


# -- the beat, on fakes ------------------------------------------------------------------------


class FakeLine:
    def __init__(self) -> None:
        self.sent: list[tuple[str, list[bytes | None]]] = []
        self.busy = False
        self.closed = False

    def overdue(self, limit: float) -> bool:
        return False

    def send(self, statement: str, params: list[bytes | None] | None = None) -> bool:
        self.sent.append((statement, params or []))
        return True

    def read_fds(self) -> list[int]:
        return []

    def service(self, readable: Any) -> Any:
        return self.answer

    def close(self) -> None:
        self.closed = True

    answer: Answer | None = None


class FakeResult:
    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self.rows = pairs
        self.ntuples = len(pairs)

    def get_value(self, r: int, c: int) -> bytes:
        return self.rows[r][c].encode()


class FakeConns:
    q = SimpleNamespace(master_beat="beat", master_leave="leave")

    def __init__(self) -> None:
        self.connected = True
        self.ran: list[tuple[str, Any]] = []

    def with_db(self, what: str, fn: Any) -> Any:
        conn = SimpleNamespace(execute=lambda s, p: self.ran.append((s, p)))
        return fn(conn)


def handler(queue: str = "default") -> Handler:
    q = brooq.Queue(dsn="postgresql://x@127.0.0.1:1/x")
    q.handler("t", queue=queue)(lambda claim: None)
    return q.handlers["t"]


def beat(clock: list[float]) -> tuple[Beat, FakeConns, FakeLine, SimpleNamespace]:
    conns, line = FakeConns(), FakeLine()
    fleet = SimpleNamespace(children={})
    handlers = {"b.one": handler(), "a.two": handler("bulk")}
    duty = Beat(
        conns,  # type: ignore[arg-type]
        fleet,  # type: ignore[arg-type]
        "app:queue",
        handlers,
        Settings(fleet_beat=2.0),
        None,
        clock=lambda: clock[0],
        wall=lambda: 1_800_000_000.0,
    )
    duty.line = line  # type: ignore[assignment]
    return duty, conns, line, fleet


def test_the_beat_writes_the_row_sweeps_now_and_then_and_never_waits() -> None:
    clock = [0.0]
    duty, conns, line, fleet = beat(clock)
    fleet.children = {
        11: SimpleNamespace(kind="sync", generation=0, born=-1.0),
        12: SimpleNamespace(kind="async", generation=1, born=0.0),
    }
    assert duty.run_once(0.0) == {"sent": 1, "sweep": 1}
    statement, params = line.sent[0]
    assert statement == "beat" and params[0] == str(duty.id).encode()
    assert json.loads(params[5]) == ["bulk", "default"]  # type: ignore[arg-type]
    assert json.loads(params[6]) == ["a.two", "b.one"]  # type: ignore[arg-type]
    children = json.loads(params[7])  # type: ignore[arg-type]
    assert [(c["pid"], c["kind"], c["generation"]) for c in children] == [
        (11, "sync", 0),
        (12, "async", 1),
    ]
    assert params[8:] == [b"2.0", params[9], b"3", b"true"]
    # A beat in flight is never sent twice; a change of the children asks again soon.
    line.busy = True
    assert duty.run_once(2.0) == {} and duty.again_after is None
    duty.children_changed()
    assert duty.run_once(2.1) == {} and duty.again_after == AGAIN_AFTER
    line.busy = False
    assert duty.run_once(2.2)["sent"] == 1 and duty.again_after is None
    again = json.loads(line.sent[-1][1][7])  # type: ignore[arg-type]
    assert again == children  # the same started_at from one beat to the next
    sweeps = [duty.run_once(float(t))["sweep"] for t in range(SWEEP_EVERY * 2)]
    assert sum(sweeps) == 2
    conns.connected = False  # the database away: no connect of its own
    assert duty.run_once(99.0) == {}


def test_the_fleet_is_known_from_the_second_answer_until_answers_stop() -> None:
    clock = [0.0]
    duty, conns, line, _ = beat(clock)
    line.answer = Answer([FakeResult([("default", "x.y")])], "", 0.01)  # type: ignore[list-item]
    duty.run_once(0.0)
    duty.service([])
    assert duty.live_pairs() is None  # one answer: a master started with this one may lag
    duty.service([])
    live = duty.live_pairs()
    assert live is not None and ("default", "x.y") in live and ("bulk", "b.one") in live
    clock[0] = 3 * 2.0 + 1  # no answer for three beats: unknown again
    assert duty.live_pairs() is None
    line.answer = Answer([], "boom", 0.01)
    duty.service([])  # a failed beat changes nothing
    assert duty.answers == 2
    duty.leave()
    assert line.closed and conns.ran == [("leave", {"id": duty.id})]


def test_a_master_that_never_beat_or_lost_the_database_deletes_nothing() -> None:
    duty, conns, line, _ = beat([0.0])
    duty.leave()
    assert line.closed and conns.ran == []
    duty, conns, line, _ = beat([0.0])
    duty.run_once(0.0)
    conns.connected = False  # no connect on the way out: the row drops out by itself
    duty.leave()
    assert line.closed and conns.ran == []


def test_the_children_changing_makes_the_beat_due_at_once() -> None:
    clock = [0.0]
    duty = beat(clock)[0]
    sched = Scheduler([duty], now=0.0)
    assert [d.name for d in sched.due(0.0)] == ["fleet_beat"]
    assert sched.next_at() == 2.0
    sched.due_now(duty.name)
    assert [d.run_once(0.5) for d in sched.due(0.5)] == [{"sent": 1, "sweep": 1}]


# -- the command line, the setting -------------------------------------------------------------


def test_fleet_lines() -> None:
    child = {"pid": 7, "kind": "sync", "generation": 0, "started_at": T0.isoformat()}
    lines = fleet_lines([row(5, ["default"], ["a", "b"], [child]), row(6, ["bulk"], ["c"])])
    text = "\n".join(lines)
    assert lines[0].startswith("h1 pid 5: brooq 0.1.0, app app:queue, started 2026-12-03")
    assert "seen 1.2s ago" in lines[0]
    assert "  topics: a, b" in text and "  (no children)" in text
    assert lines[-1] == "2 masters, 1 child"
    assert fleet_lines([])[0].startswith("(no live master")


def test_stats_lines_mark_what_no_master_handles() -> None:
    rows = [
        brooq.TopicStats(topic="a", pending=2, ready=2),
        brooq.TopicStats(topic="typo", pending=1, ready=1),
    ]
    lines = stats_lines(rows, {("default", "typo")})
    assert lines[2].endswith("  no handler") and not lines[1].endswith("no handler")
    assert lines[3].startswith("(total)") and "no handler" not in lines[3]
    assert stats_lines(rows) == [line.replace("  no handler", "") for line in lines]


def test_the_beat_setting() -> None:
    assert Settings().fleet_beat == 10.0
    assert settings_mod.load(environ={"QUEUE_FLEET_BEAT": "500ms"}).fleet_beat == 0.5
    with pytest.raises(InvalidSettings, match="fleet_beat must be positive"):
        settings_mod.load(environ={"QUEUE_FLEET_BEAT": "0s"})


# -- the statements, on the real database --------------------------------------------------------


def test_master_beat_writes_its_row_reads_the_others_and_sweeps_when_asked(
    db: psycopg.Connection[Any],
) -> None:
    insert = (
        "INSERT INTO brooq_master (id, host, pid, version, app, queues, topics, beat_seconds, "
        "started_at, seen_at) VALUES (%s, 'h', %s, '0', 'a:q', %s, %s, 1, now(), "
        "now() - %s * interval '1 second')"
    )
    other, stale, me = uuid.UUID(int=1), uuid.UUID(int=2), uuid.UUID(int=3)
    db.execute(insert, [other, 1, ["default", "bulk"], ["a"], 0])
    db.execute(insert, [stale, 2, ["default"], ["gone"], 10])  # missed 10 beats of 1 s

    def beat(children: str, sweep: bool) -> set[tuple[str, str]]:
        params = [
            str(me), "h2", "3", "0.1.0", "app:queue", '["default"]', '["mine"]', children,
            "2.0", T0.isoformat(), "3", "true" if sweep else "false",
        ]  # fmt: skip
        result = db.pgconn.exec_params(Q.master_beat.encode(), [p.encode() for p in params])
        assert result.status == psycopg.pq.ExecStatus.TUPLES_OK, result.error_message
        return {
            (result.get_value(r, 0).decode(), result.get_value(r, 1).decode())  # type: ignore[union-attr]
            for r in range(result.ntuples)
        }

    assert beat("[]", sweep=False) == {("default", "a"), ("bulk", "a")}  # not the stale one
    assert db.execute("SELECT count(*) FROM brooq_master").fetchone() == (3,)  # none swept
    child = [{"pid": 9, "kind": "sync", "generation": 0, "started_at": T0.isoformat()}]
    beat(json.dumps(child), sweep=True)
    rows = {m.id: m for m in masters.live(db)}
    assert set(rows) == {other, me}
    assert db.execute("SELECT count(*) FROM brooq_master").fetchone() == (2,)  # swept
    mine = rows[me]
    assert (mine.queues, mine.topics, mine.started_at) == (("default",), ("mine",), T0)
    assert [c.pid for c in mine.children] == [9] and mine.beat_seconds == 2.0
    db.execute(Q.master_leave, {"id": me})
    assert [m.id for m in masters.live(db)] == [other]
