"""The crash streak (brooq.supervisor.respawn): the respawn backoff and the fatal storm."""

from __future__ import annotations

# -- respawn storms ----------------------------------------------------------------------


def test_children_dying_before_ready_five_times_in_a_row_is_fatal() -> None:
    from brooq.ipc.reasons import EXIT_APP_LOAD_ERROR, EXIT_BOOT_ERROR
    from brooq.supervisor.respawn import STORM_FATAL, CrashStreak
    from brooq.supervisor.settlement import ChildEnd, outside_job, settle, storm_verdict

    dead_at_boot = ChildEnd(
        code=EXIT_BOOT_ERROR,
        kill_reason=None,
        retiring=None,
        ready=False,
        jobs=(),
        stopping=False,
        now=0.0,
    )
    assert settle(dead_at_boot).outside_job  # it counts in the streak
    assert outside_job(EXIT_BOOT_ERROR, 0, 0, None) == "streak"
    streak = CrashStreak()
    for _ in range(STORM_FATAL - 1):
        streak.died(0.0)
        assert storm_verdict(EXIT_BOOT_ERROR, streak) is None  # not yet
    streak.died(0.0)
    verdict = storm_verdict(EXIT_BOOT_ERROR, streak)
    assert verdict is not None and "died before becoming ready" in verdict

    # A child that could not load the application is fatal at once.
    first = CrashStreak()
    first.died(0.0)
    assert storm_verdict(EXIT_APP_LOAD_ERROR, first) == "children cannot load the application"


def test_a_crash_streak_backs_off_doubling_and_ends_at_five() -> None:
    from brooq.supervisor.respawn import RESPAWN_MAX, STORM_FATAL, CrashStreak

    streak = CrashStreak()
    assert streak.delay() == 0.0 and streak.fork_at() == float("-inf") and not streak.fatal
    delays = []
    for n in range(1, STORM_FATAL):
        streak.died(100.0 + n)
        delays.append(streak.delay())
        assert streak.fork_at() == 100.0 + n + streak.delay()
        assert not streak.fatal
    assert delays == [0.5, 1.0, 2.0, 4.0]
    streak.died(200.0)
    assert streak.fatal
    for _ in range(10):
        streak.died(300.0)
    assert streak.delay() == RESPAWN_MAX  # capped
    streak.healthy()
    assert streak.count == 0 and streak.delay() == 0.0 and streak.fork_at() == float("-inf")
