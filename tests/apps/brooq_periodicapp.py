"""The application of tests/process/test_periodic.py under a real brooq-master.

BROOQ_PERIODIC_EVERY: the period of schedule "tick" (default 1s). BROOQ_PERIODIC_BROKEN=1
adds a schedule whose callable raises, and one whose callable returns a string.
BROOQ_PERIODIC_BAD=1 registers a schedule with five problems (the import fails).
BROOQ_PERIODIC_CLOCK_AHEAD=SECONDS: the master's periodic duty reads a clock that far ahead.
"""

from __future__ import annotations

import os

import brooq

queue = brooq.Queue()


@queue.handler("p.tick", queue="ticks")
def tick(claim: brooq.Claim) -> None:
    """Nothing to do: the job's row is what the tests look at."""


queue.periodic("tick", every=os.environ.get("BROOQ_PERIODIC_EVERY", "1s"), job=brooq.Job("p.tick"))
queue.periodic(
    "nightly-report",
    cron="0 3 * * *",
    tz="Europe/Berlin",
    job=brooq.Job("p.tick", {"kind": "nightly"}),
)
queue.periodic("digest", cron="@hourly", job=lambda t: brooq.Job("p.tick", {"hour": t.isoformat()}))

if os.environ.get("BROOQ_PERIODIC_BROKEN") == "1":

    def explode(tick: object) -> brooq.Job:
        raise RuntimeError("boom")

    queue.periodic("raises", every="1s", job=explode)
    queue.periodic("not-a-job", every="1s", job=lambda t: "nope")  # type: ignore[arg-type,return-value]

if os.environ.get("BROOQ_PERIODIC_BAD") == "1":
    queue.periodic(
        "Bad Name", cron="61 * * * *", every="500ms", tz="Mars/Olympus", job=brooq.Job("p.tick")
    )

if os.environ.get("BROOQ_PERIODIC_CLOCK_AHEAD"):
    # A master whose clock runs this many seconds ahead, as its Periodic duty sees it: the
    # master builds the duty after importing this module, from the name its own module
    # holds, so the class swapped in here is the one it builds.
    from datetime import datetime, timedelta, timezone

    from brooq.supervisor import master as master_mod
    from brooq.supervisor.duties import periodic as duties

    _ahead = timedelta(seconds=float(os.environ["BROOQ_PERIODIC_CLOCK_AHEAD"]))

    class _AheadPeriodic(duties.Periodic):
        def __init__(self, *args: object, **kwargs: object) -> None:
            kwargs["clock"] = lambda: datetime.now(timezone.utc) + _ahead
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    master_mod.Periodic = _AheadPeriodic  # type: ignore[misc]
