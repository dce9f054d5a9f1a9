"""What a port from Celery (or SQLAlchemy) brings that brooq used to refuse: datetime,
Decimal and UUID in payloads (written as text, read back as their types by a typed
payload), and SQLAlchemy's postgresql+psycopg:// URLs (the driver suffix dropped)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid
from decimal import Decimal
from typing import Any

import pydantic
import pytest

from brooq import Job
from brooq.declare.payloads import codec_for
from brooq.dsn import check, describe, resolve, resolve_listen, resolve_read, session_options
from brooq.encoding import encode_payload, to_json
from brooq.errors import InvalidDsn, InvalidPayload, PayloadMismatch

UTC = dt.timezone.utc
PARIS = dt.timezone(dt.timedelta(hours=1))
REF = uuid.UUID("0b9f2c64-8a1e-4c53-9d7e-3f1f2a6b9c10")


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC), '"2026-01-02T03:04:05.000006+00:00"'),
        (dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=PARIS), '"2026-01-02T03:04:05+01:00"'),
        (dt.datetime(2026, 1, 2, 3, 4), '"2026-01-02T03:04:00"'),  # naive stays naive
        (dt.date(2026, 1, 2), '"2026-01-02"'),
        (dt.time(3, 4, 5), '"03:04:05"'),
        (Decimal("12.50"), '"12.50"'),  # the exact string: no float, no lost zero
        (Decimal("0.1000000000000000000000000001"), '"0.1000000000000000000000000001"'),
        (Decimal("-1E+3"), '"-1E+3"'),
        (REF, '"0b9f2c64-8a1e-4c53-9d7e-3f1f2a6b9c10"'),
    ],
)
def test_datetime_decimal_and_uuid_are_written_as_text(value: Any, text: str) -> None:
    assert encode_payload(value) == text
    assert encode_payload({"v": [value]}) == '{"v":[' + text + "]}"
    assert Job("t", {"v": value}).payload_json == '{"v":' + text + "}"


@pytest.mark.parametrize("value", [dt.timedelta(seconds=1), {1, 2}, b"x", object(), 1j])
def test_other_types_are_still_refused_naming_the_type(value: Any) -> None:
    with pytest.raises(InvalidPayload, match=rf"not JSON-serialisable: .*{type(value).__name__}"):
        Job("t", {"v": value})


@dataclasses.dataclass
class Paid:
    order: uuid.UUID
    amount: Decimal
    at: dt.datetime
    day: dt.date
    clock: dt.time
    refunds: list[Decimal] = dataclasses.field(default_factory=list)
    settled: dt.datetime | None = None


class PPaid(pydantic.BaseModel):
    order: uuid.UUID
    amount: Decimal
    at: dt.datetime


def test_a_typed_dataclass_payload_reads_them_back_as_their_types() -> None:
    value = Paid(
        REF,
        Decimal("12.50"),
        dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=PARIS),
        dt.date(2026, 1, 2),
        dt.time(3, 4),
        [Decimal("0.10")],
    )
    job = Job("t", value)
    back = codec_for(Paid).decode(json.loads(job.payload_json))
    assert back == value
    assert type(back.order) is uuid.UUID and type(back.amount) is Decimal
    assert str(back.amount) == "12.50" and str(back.refunds[0]) == "0.10"
    assert back.at.utcoffset() == dt.timedelta(hours=1)


def test_a_pydantic_payload_reads_them_back_as_their_types() -> None:
    value = PPaid(order=REF, amount=Decimal("12.50"), at=dt.datetime(2026, 1, 2, tzinfo=UTC))
    back = codec_for(PPaid).decode(json.loads(Job("t", value).payload_json))
    assert back == value and type(back.amount) is Decimal


@pytest.mark.parametrize(
    ("given", "field", "expected"),
    [
        ({"at": "tomorrow"}, "at", "expected datetime (ISO 8601 text), got a str not in that form"),
        ({"at": 1700000000}, "at", "expected datetime (ISO 8601 text), got int"),
        ({"amount": 12.5}, "amount", "expected Decimal (a decimal string or an int), got float"),
        ({"amount": "12,5"}, "amount", "got a str not in that form"),
        ({"order": "not-a-uuid"}, "order", "expected UUID (its text), got a str not in that form"),
        ({"day": "2026-01-02T00:00:00"}, "day", "expected date (ISO 8601 text)"),
        ({"refunds": ["1", True]}, "refunds[1]", "expected Decimal (a decimal string or an int)"),
    ],
)
def test_text_that_is_not_its_type_is_refused_naming_the_field(
    given: dict[str, Any], field: str, expected: str
) -> None:
    good = {
        "order": str(REF),
        "amount": "1",
        "at": "2026-01-02T03:04:05Z",  # Z is UTC (another producer's JSON)
        "day": "2026-01-02",
        "clock": "03:04",
    }
    assert codec_for(Paid).decode(good).at.tzinfo == UTC
    with pytest.raises(PayloadMismatch) as info:
        codec_for(Paid).decode({**good, **given})
    assert str(info.value).startswith(f"payload.{field}: ") and expected in str(info.value)
    assert "tomorrow" not in str(info.value) and "12,5" not in str(info.value)


def test_a_decimal_field_takes_an_int_exactly() -> None:
    good = {
        "order": str(REF),
        "amount": 10**30,
        "at": "2026-01-02",
        "day": "2026-01-02",
        "clock": "03:04",
    }
    assert codec_for(Paid).decode(good).amount == Decimal(10**30)


def test_results_and_dataclass_fields_use_the_same_text() -> None:
    assert to_json(
        Paid(REF, Decimal("1.0"), dt.datetime(2026, 1, 2), dt.date(2026, 1, 2), dt.time(0))
    ) == {
        "order": REF,
        "amount": Decimal("1.0"),
        "at": dt.datetime(2026, 1, 2),
        "day": dt.date(2026, 1, 2),
        "clock": dt.time(0),
        "refunds": [],
        "settled": None,
    }  # left for encode_payload, which writes each as text
    text = encode_payload(
        to_json(Paid(REF, Decimal("1.0"), dt.datetime(2026, 1, 2), dt.date(2026, 1, 2), dt.time(0)))
    )
    assert '"amount":"1.0"' in text and '"at":"2026-01-02T00:00:00"' in text


# -- SQLAlchemy's URLs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "plain"),
    [
        ("postgresql+psycopg://u:pw@h:5433/db", "postgresql://u:pw@h:5433/db"),
        ("postgresql+psycopg2://u@h/db?sslmode=require", "postgresql://u@h/db?sslmode=require"),
        ("postgres+psycopg://h/db", "postgres://h/db"),
        ("POSTGRESQL+PSYCOPG://h/db", "postgresql://h/db"),
        ("postgresql://h/db", "postgresql://h/db"),
        ("host=h dbname=db", "host=h dbname=db"),
    ],
)
def test_the_psycopg_driver_suffixes_are_dropped_everywhere_a_dsn_is_read(
    given: str, plain: str, tmp_path: Any
) -> None:
    assert check(given) == plain
    assert resolve(given) == plain
    assert resolve(None, {"DATABASE_URL": given}) == plain
    (tmp_path / "url").write_text(given)
    assert resolve(None, {"DATABASE_URL_FILE": str(tmp_path / "url")}) == plain
    assert resolve_listen("postgresql://other/db", given) == plain
    assert resolve_listen("x", None, {"QUEUE_LISTEN_DATABASE_URL": given}) == plain
    assert resolve_read(given) == plain
    assert resolve_read(None, {"QUEUE_READ_DATABASE_URL": given}) == plain
    assert describe(given) == describe(plain)
    assert session_options(given, {}, {}) == ""


@pytest.mark.parametrize("driver", ["asyncpg", "pg8000", "psycopg2cffi", ""])
def test_another_driver_is_refused_naming_the_suffix_never_the_password(driver: str) -> None:
    url = f"postgresql+{driver}://user:s3cret@h/db"
    for read in (
        lambda: resolve(url),
        lambda: resolve(None, {"DATABASE_URL": url}),
        lambda: resolve_read(None, {"QUEUE_READ_DATABASE_URL": url}),
    ):
        with pytest.raises(InvalidDsn) as info:
            read()
        message = str(info.value)
        assert f"names the driver '+{driver}' (postgresql+{driver}://)" in message
        assert "postgresql+psycopg://" in message and "s3cret" not in message
        assert "\n" not in message
