"""The groups' windows counted and taken a claim at a time (migration 0029): the places
brooq_windows_places finds for many windows in one statement are the places
brooq_window_places finds for each alone, whatever state a window is in; a claim of a
group-rated topic takes each group's places in turn, never more than its rate, and
leaves the windows as starting the same jobs one group at a time would. Against a real
PostgreSQL, through the statement a child sends (tests/db/test_rate_limits.py's
helpers)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import tuple_row

from tests.db.test_rate_limits import claim, group_of, handler, jobs

Conn = psycopg.Connection[Any]
TOPIC = "tenant.rated"


@pytest.fixture
def db(connect: Callable[..., Conn]) -> Conn:
    conn = connect()
    conn.row_factory = tuple_row  # type: ignore[assignment]
    return conn


def one_window(db: Conn, group: str, limit: int, stamp: datetime, most: int) -> list[int]:
    row = db.execute(
        "SELECT brooq_window_places(%s, %s, %s, %s, %s)", (TOPIC, group, limit, stamp, most)
    ).fetchone()
    assert row is not None
    return list(row[0])


def many_windows(
    db: Conn, groups: list[str], limits: list[int | None], stamp: datetime, most: list[int]
) -> dict[str, list[int]]:
    rows = db.execute(
        "SELECT ord, slot, turn FROM brooq_windows_places(%s, %s, %s, %s, %s) ORDER BY ord, turn",
        (TOPIC, groups, limits, stamp, most),
    ).fetchall()
    found: dict[str, list[int]] = {g: [] for g in groups}
    for ord_, slot, turn in rows:
        places = found[groups[ord_ - 1]]
        assert turn == len(places) + 1  # the turns of a window count 1, 2, 3, ...
        places.append(slot)
    return found


def test_many_windows_give_the_places_each_window_gives_alone(db: Conn) -> None:
    """Windows in every state: empty, partly used, full, with free and busy places in
    any order, a cursor anywhere (or none), a limit lowered below the slots it had; each
    asked for up to some places, or none."""
    rnd = random.Random(29)
    stamp = db.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    groups, limits, most = [], [], []
    for i in range(120):
        group = f"g{i:03d}"
        slots = rnd.choice([0, 1, 3, 5, 8, 12])
        for slot in range(1, slots + 1):
            busy = rnd.random() < rnd.choice([0.0, 0.3, 0.7, 1.0])
            at = stamp + timedelta(seconds=rnd.uniform(0.1, 30) * (1 if busy else -1))
            db.execute(
                "INSERT INTO brooq_rate_slot (topic, group_key, slot, free_at)"
                " VALUES (%s, %s, %s, %s)",
                (TOPIC, group, slot, at),
            )
        if slots and rnd.random() < 0.8:
            db.execute(
                "INSERT INTO brooq_rate_cursor (topic, group_key, last_slot) VALUES (%s, %s, %s)",
                (TOPIC, group, rnd.randint(1, slots + 2)),
            )
        groups.append(group)
        limits.append(rnd.choice([1, 2, 4, 6, 10, 16]))  # below the slots it had, at times
        most.append(rnd.choice([0, 1, 2, 5, 20]))
    alone = {
        g: one_window(db, g, lim, stamp, n) for g, lim, n in zip(groups, limits, most, strict=True)
    }
    assert many_windows(db, groups, limits, stamp, most) == alone
    # Cases of every kind were drawn: windows with none free, some, and all asked for.
    sizes = Counter(
        "none" if not alone[g] else "all" if len(alone[g]) == n else "some"
        for g, n in zip(groups, most, strict=True)
        if n
    )
    assert sizes["none"] and sizes["some"] and sizes["all"], sizes


def test_a_window_without_a_rate_or_asked_for_nothing_gives_no_place(db: Conn) -> None:
    stamp = db.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    found = many_windows(db, ["A", "B", "C"], [None, 5, 5], stamp, [3, 0, 2])
    assert found == {"A": [], "B": [], "C": [1, 2]}


def test_a_claim_takes_each_groups_places_in_turn_up_to_its_rate(db: Conn) -> None:
    """40 groups of 5 jobs under group_rate_limit="3/m": one claim of 200 starts 3 of
    each group's jobs, each group's window holds its three places until a minute after
    the claim, its cursor on the last; the next claim is held back until then."""
    h = handler(TOPIC, group_rate_limit="3/m")
    names = [f"t{i:02d}" for i in range(40)]
    for name in names:
        jobs(db, TOPIC, 5, name)
    got = claim(db, h, limit=200)
    started = Counter(group_of(db, row["id"]) for row in got)
    assert started == dict.fromkeys(names, 3)
    slots = db.execute(
        "SELECT group_key, array_agg(slot ORDER BY slot),"
        " min(free_at - now()), max(free_at - now())"
        " FROM brooq_rate_slot WHERE topic = %s GROUP BY group_key",
        (TOPIC,),
    ).fetchall()
    assert {row[0] for row in slots} == set(names)
    for _, places, soonest, latest in slots:
        assert places == [1, 2, 3]
        # until the stamp plus the window (the period and the allowance)
        assert timedelta(seconds=59) < soonest <= latest < timedelta(seconds=62)
    cursors = db.execute(
        "SELECT DISTINCT last_slot FROM brooq_rate_cursor WHERE topic = %s", (TOPIC,)
    ).fetchall()
    assert cursors == [(3,)]
    [held] = claim(db, h, "w2", limit=200)
    assert held["id"] is None  # every window full


def test_a_claim_takes_the_places_in_turn_after_the_one_taken_last(db: Conn) -> None:
    """A window of 4 whose places 1 and 2 were taken long ago and 3 just now (cursor on
    3): the claim's two starts take 4, then 1 (2 after it is free too, but the claim
    gives two); the cursor moves to 1; place 3 is left as it was."""
    h = handler(TOPIC, group_rate_limit="4/h")
    jobs(db, TOPIC, 5, "A")
    db.execute(
        "INSERT INTO brooq_rate_slot (topic, group_key, slot, free_at) VALUES"
        " (%(t)s, 'A', 1, now() - interval '2 h'), (%(t)s, 'A', 2, now() - interval '1 h'),"
        " (%(t)s, 'A', 3, now() + interval '59 min')",
        {"t": TOPIC},
    )
    db.execute(
        "INSERT INTO brooq_rate_cursor (topic, group_key, last_slot) VALUES (%s, 'A', 3)", (TOPIC,)
    )
    got = claim(db, h, limit=2)
    assert len(got) == 2
    rows = db.execute(
        "SELECT slot, free_at > now() + interval '50 min' FROM brooq_rate_slot"
        " WHERE topic = %s ORDER BY slot",
        (TOPIC,),
    ).fetchall()
    assert rows == [(1, True), (2, False), (3, True), (4, True)]
    assert db.execute(
        "SELECT last_slot FROM brooq_rate_cursor WHERE topic = %s", (TOPIC,)
    ).fetchone() == (1,)


def test_the_sweep_deletes_a_swept_windows_cursor_and_those_left_without_slots(
    db: Conn,
) -> None:
    """A window deleted whole takes its cursor with it (a row per rated group would
    otherwise stay for good); a busy window keeps its own; a cursor whose window has no
    slot left goes too. A window whose slots are gone starts from its first place
    whatever its cursor said, so nothing a claim counts changes."""
    db.execute(
        "INSERT INTO brooq_rate_slot (topic, group_key, slot, free_at) VALUES"
        " (%(t)s, 'idle', 1, now() - interval '1 s'), (%(t)s, 'idle', 2, now() - interval '2 s'),"
        " (%(t)s, 'busy', 1, now() + interval '1 h')",
        {"t": TOPIC},
    )
    db.execute(
        "INSERT INTO brooq_rate_cursor (topic, group_key, last_slot) VALUES"
        " (%(t)s, 'idle', 2), (%(t)s, 'busy', 1), (%(t)s, 'orphan', 7)",
        {"t": TOPIC},
    )
    stamp = db.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    before = many_windows(db, ["orphan"], [5], stamp, [5])
    assert db.execute("SELECT brooq_window_sweep(10)").fetchone() == (2,)
    left = db.execute("SELECT group_key FROM brooq_rate_cursor ORDER BY 1").fetchall()
    assert left == [("busy",)]
    assert [r[0] for r in db.execute("SELECT group_key FROM brooq_rate_slot").fetchall()] == [
        "busy"
    ]
    assert many_windows(db, ["orphan"], [5], stamp, [5]) == before == {"orphan": [1, 2, 3, 4, 5]}


def release_late(db: Conn, h: Any, ids: list[Any], worker: str = "w") -> int:
    """The child's give-back of claims that could not start in time
    (RoundTrips.release with the rated topic): how many places were set free."""
    from brooq.sql import Q
    from brooq.worker.pacing import turns

    [turn] = turns({h.topic: h})
    p = turn.params
    row = db.execute(
        Q.job_release_ids_rated,
        {
            "ids": ids,
            "worker": worker,
            "topic": h.topic,
            "rate": p["rate"],
            "window": p["window"],
            "group_rate": p["group_rate"],
            "group_window": p["group_window"],
            "allowance": turn.allowance,
        },
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("own", [False, True])
def test_a_late_claim_given_back_frees_its_places_and_no_more(
    db: Conn, queue: Any, own: bool
) -> None:
    """Under rate_limit="3/h" and group_rate_limit="2/h" (or a group's own "2/h"), a
    claim takes 2 of A's jobs and places in both windows; one goes back late: one place
    of each window is free again (at the claim's stamp, never later), so the next claim
    starts one more of A's jobs, and no claim after it starts anything within the hour:
    the windows hold the two starts that happened, never three."""
    if own:
        h = handler(TOPIC, rate_limit="3/h", group_rate_limit="100/h")
        queue.set_group_rate(TOPIC, "A", "2/h")
    else:
        h = handler(TOPIC, rate_limit="3/h", group_rate_limit="2/h")
    jobs(db, TOPIC, 5, "A")
    got = claim(db, h, limit=5)
    assert len(got) == 2  # A's window: 2 an hour
    stamps = db.execute(
        "SELECT DISTINCT started_at FROM job WHERE id = ANY(%s)", ([r["id"] for r in got],)
    ).fetchall()
    assert len(stamps) == 1  # the claim's stamp, one for its batch
    assert release_late(db, h, [got[1]["id"]]) == 2  # one place in each window
    assert db.execute("SELECT state FROM job WHERE id = %s", (got[1]["id"],)).fetchone() == (
        "pending",
    )
    freed = db.execute(
        "SELECT group_key, free_at FROM brooq_rate_slot WHERE free_at <= now() ORDER BY 1"
    ).fetchall()
    assert freed == [("", stamps[0][0]), ("A", stamps[0][0])]
    again = claim(db, h, "w2", limit=5)
    assert len(again) == 1  # the freed place, and not one more
    [held] = claim(db, h, "w3", limit=5)
    assert held["id"] is None  # A's window holds its two starts
    # Given back twice, or by another worker, or a job not given back: nothing more.
    assert release_late(db, h, [got[1]["id"]]) == 0
    assert release_late(db, h, [again[0]["id"]], worker="other") == 0


def test_a_late_give_back_through_the_child_frees_the_places(db: Conn) -> None:
    """RoundTrips.release with the late claim's topic, as the sync and async children
    call it, sends the rated give-back on the child's connection; without a topic (a
    drain's give-back) the plain one, which leaves the places taken."""
    from brooq.settings import Settings
    from brooq.sql import Q
    from brooq.worker.pacing import turns
    from brooq.worker.roundtrip import RoundTrips

    class OnThisConnection:
        def get(self) -> Conn:
            return db

    h = handler(TOPIC, group_rate_limit="1/h")
    unused: Any = None
    trips = RoundTrips(
        "w", Settings(), Q, OnThisConnection(), unused, {}, [],  # type: ignore[arg-type]
        turns({h.topic: h}), unused, 1, print, print,
    )  # fmt: skip
    jobs(db, TOPIC, 2, "A")
    jobs(db, TOPIC, 1, "B")
    got = claim(db, h, limit=5)
    by_group = {group_of(db, r["id"]): r["id"] for r in got}
    trips.release([by_group["B"]])  # not late: its place stays taken
    trips.release([by_group["A"]], late_topic=TOPIC)
    free = db.execute("SELECT group_key FROM brooq_rate_slot WHERE free_at <= now()").fetchall()
    assert free == [("A",)]
    again = claim(db, h, "w2", limit=5)
    assert [group_of(db, r["id"]) for r in again] == ["A"]
