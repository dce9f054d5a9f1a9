"""A keep_logs attempt's text: bounded, the oldest lines dropped first and said; the
capture keeps only what the running attempt's context emits."""

from __future__ import annotations

import logging

import pytest

from brooq.declare.handlers import KEEP_LOGS_BYTES, build
from brooq.errors import InvalidSettings
from brooq.worker import joblogs


def test_nothing_logged_is_nothing_kept() -> None:
    assert joblogs.Kept(1024).text() is None


def test_the_oldest_lines_go_first_and_the_text_says_so() -> None:
    kept = joblogs.Kept(1024)
    for i in range(100):
        kept.add(f"line {i:03d} " + "x" * 40)  # 49 bytes and a newline each
    text = kept.text()
    assert text is not None
    head, *lines = text.splitlines()
    assert len(lines) == 1024 // 50 == 20
    assert head == (
        "[brooq: 80 earlier lines (4000 bytes) dropped; an attempt keeps its last 1024 "
        "bytes of log]"
    )
    assert lines[0].startswith("line 080") and lines[-1].startswith("line 099")
    assert len("\n".join(lines).encode()) + 1 <= 1024


def test_a_line_longer_than_the_bound_keeps_its_start() -> None:
    kept = joblogs.Kept(1024)
    kept.add("é" * 2000)
    text = kept.text()
    assert text is not None and text.endswith(" [cut]") and text.startswith("éé")
    assert len(text.encode()) < 1024


def test_the_capture_keeps_the_running_attempts_records_only() -> None:
    log = logging.getLogger("joblogs.test")
    log.setLevel(logging.INFO)
    # Alone: a Capture another test installed on the root logger of this process
    # (joblogs.install) would keep each record a second time.
    log.propagate = False
    capture = joblogs.Capture()
    log.addHandler(capture)
    try:
        log.info("before the attempt")
        with joblogs.keeping(4096) as kept:
            log.info("charged %d cents", 250)
            try:
                raise ValueError("boom")
            except ValueError:
                log.exception("it failed")
        log.info("after the attempt")
    finally:
        log.removeHandler(capture)
        log.propagate = True
    text = kept.text()
    assert text is not None
    lines = text.splitlines()
    assert lines[0].startswith("time=") and lines[0].endswith(
        "level=info logger=joblogs.test pid="
        + lines[0].split("pid=")[1].split()[0]
        + " charged 250 cents"
    )
    # One line per record: the traceback is the record's exception="..." value.
    assert len(lines) == 2 and "it failed exception=" in lines[1]
    assert lines[1].endswith('\\nValueError: boom"')
    assert "before" not in text and "after" not in text


@pytest.mark.parametrize(
    ("given", "kept"), [(False, 0), (True, KEEP_LOGS_BYTES), (1024, 1024), (1048576, 1048576)]
)
def test_keep_logs_takes_true_or_bytes(given: bool | int, kept: int) -> None:
    assert build("t", lambda c: None, **_no_limits(), keep_logs=given).keep_logs == kept


@pytest.mark.parametrize("given", [1023, 1048577, "64k", 0.5, None])
def test_keep_logs_refuses_the_rest(given: object) -> None:
    with pytest.raises(InvalidSettings) as refused:
        build("t", lambda c: None, **_no_limits(), keep_logs=given)  # type: ignore[arg-type]
    assert refused.value.problems == [
        f"t: keep_logs must be True, False or a number of bytes from 1024 to 1048576, got {given!r}"
    ]


def _no_limits() -> dict[str, None]:
    return dict.fromkeys(
        ("max_attempts", "attempt_timeout", "max_execution_timeout", "backoff_base", "backoff_max")
    )
