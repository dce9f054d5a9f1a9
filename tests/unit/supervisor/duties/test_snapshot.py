"""The snapshot watch's decisions (pure): each holder named once past the threshold, its
end said, the ages it judges by, and the words of its lines."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from brooq import logs
from brooq.operator.snapshots import PREPARED, SESSION, SLOT, STANDBY, Holder
from brooq.supervisor.duties.snapshot import (
    LOOK_EVERY_MAX,
    Held,
    Watch,
    held_line,
    look_period,
    released_line,
)

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=timezone.utc)
BEGAN = T0 - timedelta(minutes=10)  # the held transaction's start, whatever its age


def session(pid: int = 4242, seconds: float | None = 10.0, **kw: object) -> Holder:
    fields: dict[str, object] = {
        "kind": SESSION,
        "pid": pid,
        "name": "reporting",
        "user": "alice",
        "client": "10.0.0.5",
        "state": "idle in transaction",
        "backend_start": T0 - timedelta(hours=1),
        "xact_start": None if seconds is None else BEGAN,
        "query_start": T0,
        "since": None if seconds is None else BEGAN,
        "seconds": seconds,
        "xid_age": 1234,
        "xmin": "7932",
    }
    fields.update(kw)
    return Holder(**fields)  # type: ignore[arg-type]


def slot(name: str = "standby_1", xmin: str = "700") -> Holder:
    return Holder(SLOT, None, name, None, None, "inactive", None, None, None, None, None, 99, xmin)


def test_a_holder_is_named_once_past_the_threshold_and_its_end_said_once() -> None:
    watch = Watch(warn=60.0)
    young = watch.judge([session(seconds=30.0)], now=100.0)
    assert young.named == [] and young.oldest is not None and young.oldest.seconds == 30.0
    first = watch.judge([session(seconds=61.0)], now=131.0)
    assert [x.holder.pid for x in first.named] == [4242]
    for now, seconds in ((146.0, 76.0), (161.0, 91.0), (176.0, 106.0)):
        again = watch.judge([session(seconds=seconds)], now=now)
        assert again.named == [] and again.released == []  # never repeated
        assert again.oldest is not None and again.oldest.seconds == seconds
    gone = watch.judge([], now=191.0)
    assert [x.holder.pid for x in gone.released] == [4242]
    assert gone.released[0].seconds == 106.0  # as last seen
    assert gone.oldest is None
    assert watch.judge([], now=206.0).released == []  # said once


def test_a_new_transaction_of_the_same_backend_is_a_new_holding() -> None:
    watch = Watch(warn=60.0)
    assert len(watch.judge([session(seconds=70.0)], 0.0).named) == 1
    # The backend ended that transaction and began another, held as long again.
    later = session(seconds=65.0, xmin="8100", xact_start=T0, since=T0)
    assert later.key != session(seconds=70.0).key
    verdict = watch.judge([later], 200.0)
    assert len(verdict.named) == 1 and len(verdict.released) == 1


def test_without_a_clock_the_age_is_how_long_the_watch_saw_the_same_xmin() -> None:
    """A slot, a standby's feedback, a session whose start is hidden from the reader:
    aged from the first look that saw that xmin held; a moved xmin starts over."""
    watch = Watch(warn=60.0)
    hidden = session(pid=77, seconds=None)
    v = watch.judge([slot(), hidden], now=1000.0)
    assert v.named == [] and v.oldest is not None and v.oldest.seconds == 0.0
    v = watch.judge([slot(), hidden], now=1059.0)
    assert v.named == []
    v = watch.judge([slot(), hidden], now=1060.0)
    assert sorted(x.holder.kind for x in v.named) == [SESSION, SLOT]
    assert all(x.first_seen for x in v.named)
    v = watch.judge([slot(xmin="900"), hidden], now=1075.0)  # the slot's xmin moved on
    assert [x.holder.xmin for x in v.released] == ["700"] and v.named == []
    moved = [x for x in [v.oldest] if x is not None]
    assert moved[0].holder.pid == 77 and moved[0].seconds == 75.0


def test_the_oldest_is_by_age_and_several_are_named_oldest_first() -> None:
    watch = Watch(warn=10.0)
    v = watch.judge([session(1, 20.0), session(2, 500.0), session(3, 5.0)], now=0.0)
    assert [x.holder.pid for x in v.named] == [2, 1]
    assert v.oldest is not None and v.oldest.holder.pid == 2


def test_a_threshold_of_0_names_nobody_and_the_gauge_still_has_its_age() -> None:
    watch = Watch(warn=0.0)
    v = watch.judge([session(seconds=10_000.0)], now=0.0)
    assert v.named == [] and v.oldest is not None and v.oldest.seconds == 10_000.0


def test_what_was_named_is_forgotten_only_once_released() -> None:
    watch = Watch(warn=1.0)
    watch.judge([session(1, 5.0), session(2, 5.0)], 0.0)
    v = watch.judge([session(2, 6.0)], 1.0)
    assert [x.holder.pid for x in v.released] == [1]
    assert set(watch.named) == {session(2, 7.0).key}
    assert set(watch.first_seen) == {session(2, 7.0).key}  # the gone one forgotten


def test_a_read_cut_at_its_limit_releases_nothing_it_did_not_list() -> None:
    watch = Watch(warn=1.0)
    watch.judge([session(1, 5.0)], 0.0)
    # Twenty older holders fill the read: the first one is not listed, and not released.
    crowd = [session(100 + i, 50.0) for i in range(20)]
    v = watch.judge(crowd, 1.0, complete=False)
    assert v.released == [] and len(v.named) == 20
    assert session(1, 6.0).key in watch.named
    assert watch.judge(crowd, 2.0, complete=False).named == []  # none named twice
    v = watch.judge([], 3.0)  # all of them listed (none): now it is over
    assert sorted(x.holder.pid for x in v.released) == [1] + [100 + i for i in range(20)]


def test_the_look_period_is_a_quarter_of_the_threshold_within_bounds() -> None:
    assert look_period(300.0) == LOOK_EVERY_MAX == 15.0
    assert look_period(20.0) == 5.0
    assert look_period(1.0) == 1.0
    assert look_period(0.0) == LOOK_EVERY_MAX


def test_the_held_line_names_the_holder_in_key_value_pairs_without_its_query() -> None:
    h = session(seconds=612.4, name='it\'s "reporting" x=1')
    line = held_line(Held(h, 612.4, False))
    pairs = dict(logs._PAIR.findall(line.split(": ")[0]))
    assert line.startswith("event=snapshot_held kind=session backend=4242 ")
    assert pairs["age"] == "612s" and pairs["age_from"] == "xact_start"
    assert pairs["user"] == "'alice'" and pairs["client"] == "10.0.0.5"
    assert pairs["state"] == "'idle in transaction'"
    assert pairs["xid_age"] == "1234" and pairs["since"] == "2026-12-03T08:50:00+00:00"
    assert "query_start=2026-12-03T09:00:00+00:00" in line
    # A quote or a key=value inside a name stays inside its quoted value.
    assert "application='it\\'s \"reporting\" x=1'" in line and "x=1 " not in line.split("'")[0]
    assert "pg_terminate_backend" in line


def test_each_kind_has_its_words() -> None:
    s = Holder(
        STANDBY, 321, "replica-b", "replicator", "10.0.0.9", "active",
        None, None, None, None, None, 50, "600",
    )  # fmt: skip
    line = held_line(Held(s, 120.0, True))
    assert "kind=standby backend=321 application='replica-b'" in line
    assert "age_from=first_seen" in line and "hot_standby_feedback" in line
    sl = held_line(Held(slot(), 120.0, True))
    assert "kind=slot slot='standby_1' state='inactive'" in sl and "drop it" in sl
    p = Holder(
        PREPARED, None, "tx-42", "alice", None, "prepared", None, None, None,
        T0, 30.0, 10, "555",
    )  # fmt: skip
    pl = held_line(Held(p, 30.0, False))
    assert "kind=prepared gid='tx-42' user='alice'" in pl and "age_from=prepared" in pl
    assert "ROLLBACK PREPARED" in pl and "since=2026-12-03T09:00:00+00:00" in pl
    assert released_line(Held(session(), 640.0, False)) == (
        "event=snapshot_released kind=session backend=4242 application='reporting' held=640s"
    )
    assert s.who() == (
        "standby feedback through walsender 321 (replica-b, replicator, 10.0.0.9, active)"
    )
    assert slot().who() == "replication slot standby_1 (inactive)"
    assert replace(session(), client=None, user=None).who() == (
        "session 4242 (reporting, idle in transaction)"
    )
