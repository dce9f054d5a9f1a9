"""The overview's line about the oldest snapshot (pure): who and how long, escaped, a
note once it is a minute old."""

from __future__ import annotations

from dataclasses import replace

from brooq.operator.snapshots import SESSION, SLOT, Holder
from brooq.page.lines import SNAPSHOT_NOTE_AFTER, snapshot_line

HOLDER = Holder(
    SESSION, 4242, "<script>alert(1)</script>", "alice", "10.0.0.5", "idle in transaction",
    None, None, None, None, 312.0, 48211, "7932",
)  # fmt: skip


def test_the_oldest_holder_is_named_escaped_with_its_age() -> None:
    line = snapshot_line(HOLDER)
    assert line.startswith('<p class="note">')
    assert "session 4242 (&lt;script&gt;alert(1)&lt;/script&gt;, alice, 10.0.0.5, " in line
    assert "<script>" not in line
    assert "idle in transaction), held for 5m 12s, 48,211 transactions old." in line


def test_a_young_holder_is_muted_a_slot_without_a_clock_too_and_none_says_so() -> None:
    young = snapshot_line(replace(HOLDER, seconds=SNAPSHOT_NOTE_AFTER - 1))
    assert young.startswith('<p class="muted">') and "held for 59s" in young
    slot = Holder(
        SLOT, None, "standby_1", None, None, "inactive", None, None, None, None, None, 9, "1"
    )
    assert snapshot_line(slot) == (
        '<p class="muted">Oldest snapshot holding back the job table&#x27;s cleanup: '
        "replication slot standby_1 (inactive), 9 transactions old.</p>"
    )
    assert "No snapshot" in snapshot_line(None)


def test_a_page_reading_a_standby_names_no_holder_and_says_where_to_look() -> None:
    line = snapshot_line(None, unseen=True)
    assert "reads a standby" in line and "event=snapshot_held" in line
