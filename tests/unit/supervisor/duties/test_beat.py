"""The beat duty: this master's row written off the loop, the fleet read back (pure, with
fake connections)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import pytest

import brooq
from brooq import settings as settings_mod
from brooq.declare.handlers import Handler
from brooq.errors import InvalidSettings
from brooq.settings import Settings
from brooq.supervisor.duties.beat import AGAIN_AFTER, SWEEP_EVERY, Beat
from brooq.supervisor.duties.scheduler import Scheduler
from brooq.supervisor.offloop import Answer

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=timezone.utc)


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


def beat(
    clock: list[float], handlers: dict[str, Handler] | None = None
) -> tuple[Beat, FakeConns, FakeLine, SimpleNamespace]:
    conns, line = FakeConns(), FakeLine()
    fleet = SimpleNamespace(children={})
    handlers = handlers or {"b.one": handler(), "a.two": handler("bulk")}
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


def test_the_beat_publishes_each_topics_limits() -> None:
    q = brooq.Queue(dsn="postgresql://x@127.0.0.1:1/x")
    q.handler("api.rated", rate_limit="50/s", queue="bulk")(lambda claim: None)
    q.handler("tenant.work", group_limit=2, global_limit=9)(lambda claim: None)
    q.handler("plain")(lambda claim: None)
    duty, _, line, _ = beat([0.0], dict(q.handlers))
    assert duty.run_once(0.0)["sent"] == 1
    assert json.loads(line.sent[0][1][12]) == {  # type: ignore[arg-type]
        "api.rated": {
            "queue": "bulk",
            "rate_limit": {"limit": 50, "per_seconds": 1.0, "text": "50/s"},
        },
        "tenant.work": {"queue": "default", "global_limit": 9, "group_limit": 2},
    }


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
    assert params[8:] == [b"2.0", params[9], b"3", b"true", b"{}"]  # no topic has limits
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


def test_the_beat_setting() -> None:
    assert Settings().fleet_beat == 10.0
    assert settings_mod.load(environ={"QUEUE_FLEET_BEAT": "500ms"}).fleet_beat == 0.5
    with pytest.raises(InvalidSettings, match="fleet_beat must be positive"):
        settings_mod.load(environ={"QUEUE_FLEET_BEAT": "0s"})


# -- the statements, on the real database --------------------------------------------------------
