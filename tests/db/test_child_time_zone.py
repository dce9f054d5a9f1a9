"""A child's session on a server whose time zone is another name of UTC takes the name
UTC (brooq.worker.connection): its timestamps load with datetime's own UTC, the same
instants and offsets; any other zone is left as it is."""

from __future__ import annotations

from datetime import timezone
from zoneinfo import ZoneInfo

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from brooq.settings import Settings
from brooq.worker.connection import ChildConnection
from brooq.worker.state import ChildState


def _with_zone(dsn: str, zone: str) -> str:
    options = conninfo_to_dict(dsn).get("options") or ""
    return make_conninfo(dsn, options=f"{options} -c TimeZone={zone}".strip())


@pytest.mark.parametrize("zone", ["Etc/UTC", "Etc/Universal", "Zulu", "UTC"])
def test_a_name_of_utc_becomes_utc(dsn: str, zone: str) -> None:
    db = ChildConnection(_with_zone(dsn, zone), "test:1:tz", Settings(), ChildState())
    try:
        conn = db.get()
        row = conn.execute(
            "SELECT current_setting('TimeZone'), now(), to_char(now(), 'TZ')"
        ).fetchone()
        assert row is not None
        assert row[0] == "UTC" and row[1].tzinfo is timezone.utc and row[2] == "UTC"
        assert conn.info.parameter_status("TimeZone") == "UTC"
    finally:
        db.drop()


@pytest.mark.parametrize("zone", ["America/New_York", "GMT", "Europe/Paris"])
def test_another_zone_is_left_alone(dsn: str, zone: str) -> None:
    db = ChildConnection(_with_zone(dsn, zone), "test:1:tz", Settings(), ChildState())
    try:
        conn = db.get()
        row = conn.execute("SELECT current_setting('TimeZone'), now()").fetchone()
        assert row is not None
        assert row[0] == zone and row[1].tzinfo == ZoneInfo(zone)
    finally:
        db.drop()
