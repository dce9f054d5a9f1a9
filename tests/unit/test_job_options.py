"""A Job's unique_key, debounce and tags: what each accepts, and the one-line refusal of
everything else, naming the option and the forms it takes."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

import brooq
from brooq.job_options import TAG_FORM, check_tag
from brooq.producer.insert import tags_literal


def test_a_plain_job_has_no_options() -> None:
    job = brooq.Job("t", {"a": 1})
    assert (job.unique_key, job.debounce, job.tags) == (None, None, None)
    assert "unique_key" not in repr(job) and "tags" not in repr(job)


def test_the_options_as_given() -> None:
    job = brooq.Job(
        "t", 1, unique_key="k", debounce=timedelta(seconds=2), tags=["billing", "eu", "billing"]
    )
    assert (job.unique_key, job.debounce, job.tags) == ("k", 2.0, ("billing", "eu"))
    assert repr(job).endswith("unique_key='k', debounce=2.0, tags=('billing', 'eu'))")
    assert brooq.Job("t", debounce="250ms", unique_key="k").debounce == 0.25
    assert brooq.Job("t", debounce=1.5, unique_key="k").debounce == 1.5
    assert brooq.Job("t", tags=[]).tags is None  # no tags
    assert brooq.Job("t", tags=("a", "b")).tags == ("a", "b")
    assert brooq.Job("t", unique_key="").unique_key is None  # as idempotency_key
    edge = "A" + "b" * 63
    assert brooq.Job("t", tags=[edge, "tenant:42", "k=v", "team/ops", "x_y.z-1"]).tags


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"unique_key": 42}, brooq.InvalidUniqueKey, "unique_key must be a string or None"),
        ({"unique_key": "a\x00b"}, brooq.InvalidUniqueKey, "unique_key contains"),
        ({"unique_key": "k" * 1025}, brooq.InvalidUniqueKey, "the limit is 1024"),
        ({"unique_key": "€" * 700}, brooq.InvalidUniqueKey, "2100 bytes long in UTF-8"),
        ({"debounce": 2}, brooq.InvalidDebounce, "debounce needs a unique_key"),
        ({"unique_key": "k", "debounce": 0}, brooq.InvalidDebounce, "more than 0 s"),
        ({"unique_key": "k", "debounce": -1}, brooq.InvalidDebounce, "got -1 s"),
        ({"unique_key": "k", "debounce": "2"}, brooq.InvalidDebounce, "has no unit"),
        ({"unique_key": "k", "debounce": "2d"}, brooq.InvalidDebounce, "at most 1 day"),
        ({"unique_key": "k", "debounce": [2]}, brooq.InvalidDebounce, "a timedelta, a number"),
        ({"unique_key": "k", "debounce": True}, brooq.InvalidDebounce, "not a duration"),
        (
            {"unique_key": "k", "debounce": 1, "idempotency_key": "i"},
            brooq.InvalidDebounce,
            "cannot be combined with idempotency_key",
        ),
        (
            {
                "unique_key": "k",
                "debounce": 1,
                "available_at": datetime(2030, 1, 1, tzinfo=timezone.utc),
            },
            brooq.InvalidDebounce,
            "cannot be combined with available_at",
        ),
        ({"tags": "billing"}, brooq.InvalidTags, "tags must be a list of strings, not str"),
        ({"tags": 3}, brooq.InvalidTags, "tags must be a list of strings, not int"),
        ({"tags": ["ok", 3]}, brooq.InvalidTags, "tags must be strings, not int"),
        ({"tags": ["a b"]}, brooq.InvalidTags, "tag 'a b' is not a tag"),
        ({"tags": [""]}, brooq.InvalidTags, "tag '' is not a tag"),
        ({"tags": ["-lead"]}, brooq.InvalidTags, "starting with a letter or a digit"),
        ({"tags": ["a" * 65]}, brooq.InvalidTags, "1 to 64 characters"),
        ({"tags": ["null\n"]}, brooq.InvalidTags, "is not a tag"),
        ({"tags": [str(i) for i in range(9)]}, brooq.InvalidTags, "at most 8 tags, got 9"),
    ],
)
def test_a_bad_option_is_refused_in_one_line_naming_it(
    kwargs: dict[str, object], error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as refused:
        brooq.Job("t", 1, **kwargs)  # type: ignore[arg-type]
    message = str(refused.value)
    assert words in message and "\n" not in message, message
    assert isinstance(refused.value, brooq.InvalidJob)


def test_eight_tags_and_repeats_are_fine() -> None:
    eight = [str(i) for i in range(8)]
    assert brooq.Job("t", tags=eight + eight).tags == tuple(eight)


def test_a_tag_filter_is_checked_as_a_tag() -> None:
    assert check_tag("billing") == "billing"
    with pytest.raises(brooq.InvalidTags, match=r"--tag 'a,b' is not a tag: 1 to 64"):
        check_tag("a,b", "--tag")
    assert "letters, digits" in TAG_FORM


def test_tags_as_an_array_literal_quote_every_element() -> None:
    assert tags_literal(None) is None
    assert tags_literal(("null", "a:b")) == '{"null","a:b"}'


def test_jobs_show_prints_the_options_only_when_a_job_has_them() -> None:
    import dataclasses
    import uuid

    from brooq.cli.jobs import show_lines

    now = datetime(2030, 1, 1, tzinfo=timezone.utc)
    plain = brooq.JobRecord(
        id=uuid.UUID(int=1),
        topic="t",
        payload=1,
        state="pending",
        attempts=0,
        available_at=now,
        locked_by=None,
        locked_until=None,
        last_error=None,
        idempotency_key=None,
        created_at=now,
        updated_at=now,
    )
    lines = show_lines(plain, now)
    assert not any(line.startswith(("unique key:", "tags:")) for line in lines)
    waiting = dataclasses.replace(
        plain,
        unique_key="doc-7",
        tags=["billing", "eu"],
        available_at=datetime(9999, 1, 1, tzinfo=timezone.utc),
        start_after=now + timedelta(seconds=2),
    )
    shown = show_lines(waiting, now)
    assert "unique key:      doc-7" in shown and "tags:            billing, eu" in shown
    assert (
        "available at:    the active job of its key, then from 2030-01-01 00:00:02 UTC (in 2.0s)"
        in shown
    )
    assert len(shown) <= 24
