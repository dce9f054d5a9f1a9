"""Log lines (brooq.logs): no timestamps of our own under the journal, a batch's lines in one write,
per-job lines, milliseconds kept.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import pytest

from brooq import logs

# Texts a line must show escaped, or as they are (the held lines' slow path and fast one).
TRICKY_TEXTS = ["it's", "two\nlines\r\tand a tab", "é ✓ 𝄞 \x00 \x7f \u200b \x1b[31m", ""]
# -- logs --------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["kv", "json"])
def test_no_timestamps_of_our_own_under_the_journal(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import logging

    from brooq import logs

    record = logging.LogRecord(
        "brooq.x", logging.ERROR, __file__, 1, "event=job_dead job=%s", ("j1",), None
    )
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    logs.setup(fmt)
    with_time = logging.getLogger("brooq").handlers[0].format(record)
    monkeypatch.setenv("JOURNAL_STREAM", "8:12345")
    logs.setup(fmt)
    journal = logging.getLogger("brooq").handlers[0].format(record)
    assert "time" in with_time and "time" not in journal
    assert "job_dead" in journal and "j1" in journal
    if fmt == "json":
        assert json.loads(journal)["event"] == "job_dead"


def test_log_lines_of_a_batch_go_out_in_one_write_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import io
    import logging
    import threading

    from brooq import logs

    class Writes(io.StringIO):
        def __init__(self) -> None:
            super().__init__()
            self.writes: list[str] = []

        def write(self, text: str) -> int:
            self.writes.append(text)
            return len(text)

    stream = Writes()
    monkeypatch.setattr("sys.stderr", stream)
    logs.setup("kv")
    log = logging.getLogger("brooq.child")
    try:
        log.info("event=before")
        assert len(stream.writes) == 1  # outside a batch: at once
        with logs.batch():
            log.info("event=job_done job=%s", "a")
            with logs.batch():  # nested: held until the outer block ends
                log.info("event=job_done job=%s", "b")
            other = threading.Thread(target=log.info, args=("event=from_another_thread",))
            other.start()
            other.join()
            assert len(stream.writes) == 2  # only the other thread's line went out
            assert "from_another_thread" in stream.writes[1]
            log.info("event=job_done job=%s", "c")
        assert len(stream.writes) == 3
        batch = stream.writes[2].splitlines()
        assert [line.rsplit(" ", 1)[-1] for line in batch] == ["job=a", "job=b", "job=c"]
        assert all(line.startswith("time=") and "level=info" in line for line in batch)
        log.info("event=after")
        assert len(stream.writes) == 4

        # An application that configured logging itself keeps its handler's behaviour.
        own = logging.StreamHandler(stream)
        logging.getLogger("brooq").handlers[:] = [own]
        with logs.batch():
            log.info("event=job_done job=%s", "d")
            assert len(stream.writes) == 5
    finally:
        logging.getLogger("brooq").handlers[:] = []


@pytest.mark.parametrize("fmt", ["kv", "json"])
def test_per_job_lines_made_without_a_log_record_read_as_logged_ones(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io
    import json
    import logging

    from brooq import logs
    from brooq.worker import outcome

    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    monkeypatch.setenv("JOURNAL_STREAM", "8:1")  # no timestamps: the lines compare whole
    logs.setup(fmt)
    made_plain: list[bool] = []
    real_emit_plain = logs.emit_plain

    def spy(*args: object) -> bool:
        made_plain.append(real_emit_plain(*args))  # type: ignore[arg-type]
        return made_plain[-1]

    monkeypatch.setattr(logs, "emit_plain", spy)
    fmt_args = ("event=job_%s job=%s attempt=%d duration=%.3fs", "done", "j1", 2, 0.0123)
    try:
        with logs.batch(outcome.log):
            outcome._log_quick(logging.INFO, *fmt_args)
            outcome._log_quick(logging.DEBUG, *fmt_args)  # below the level: nothing
        assert made_plain == [True, True]
        outcome.log.info(*fmt_args)  # the usual way, outside a batch
        plain, usual = stream.getvalue().splitlines()
        assert plain == usual
        if fmt == "json":
            assert json.loads(plain)["event"] == "job_done"

        # A filter on the way must see every record: then lines take the usual path.
        stream.truncate(0)
        stream.seek(0)
        made_plain.clear()
        dropper = logging.Filter("nothing.matches")
        outcome.log.addFilter(dropper)
        try:
            with logs.batch(outcome.log):
                outcome._log_quick(logging.INFO, *fmt_args)
        finally:
            outcome.log.removeFilter(dropper)
        assert made_plain == [False] and stream.getvalue() == ""

        # Another handler further up would miss the line: the usual path again.
        root = logging.getLogger()
        seen = _Collect()
        logging.getLogger("brooq").propagate = True
        root.addHandler(seen)
        made_plain.clear()
        try:
            with logs.batch(outcome.log):
                outcome._log_quick(logging.INFO, *fmt_args)
        finally:
            root.removeHandler(seen)
        assert made_plain == [False] and len(seen.records) == 1
    finally:
        logging.getLogger("brooq").handlers[:] = []
        logging.getLogger("brooq").propagate = False


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_log_timestamps_keep_their_milliseconds_across_seconds() -> None:
    from datetime import datetime, timezone

    from brooq.logs import _Clock

    clock = _Clock()
    # Across a second, rounding into the next one, and back (threads log out of order).
    times = (1764565508.4289, 1764565508.9999, 1764565508.9999996, 1764565509.001, 1764565508.5)
    for t in times:
        expected = datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")
        assert clock.iso(t) == expected


def test_the_clock_reuses_a_milliseconds_text_only_for_times_that_round_to_it() -> None:
    import random
    from datetime import datetime, timezone

    from brooq.logs import _Clock

    clock = _Clock()
    base = 1764565508.0
    # Steps of a tenth of a microsecond across millisecond and second ends, forwards and
    # backwards (threads log out of order), and times at random.
    times = [base + 0.9985 + i * 1e-7 for i in range(30_000)]
    times += times[::-1] + [base + random.random() * 3 for _ in range(20_000)]
    for t in times:
        expected = datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")
        assert clock.iso(t) == expected, t


@pytest.mark.parametrize("fmt", ["kv", "json"])
@pytest.mark.parametrize("value", ["j1", *TRICKY_TEXTS])
def test_held_lines_are_the_lines_logged_the_usual_way(
    fmt: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    monkeypatch.setenv("JOURNAL_STREAM", "8:1")  # no timestamps: the lines compare whole
    logs.setup(fmt)
    log = logging.getLogger("brooq.held_lines_test")
    msg, args = "event=job_done job=%s attempt=%d duration=%.3fs", (value, 2, 0.0123)
    try:
        assert logs.held_lines(log, logging.INFO) is None  # outside a batch: the usual way
        with logs.batch(log):
            write = logs.held_lines(log, logging.INFO)
            assert write is not None
            assert logs.held_lines(logging.getLogger("brooq.other"), logging.INFO) is None
            write(msg % args)
            assert logs.emit_plain(log, logging.INFO, msg, args) is True
        log.info(msg, *args)
        held, plain, usual = stream.getvalue().splitlines()
        assert held == plain == usual
    finally:
        logging.getLogger("brooq").handlers[:] = []


def test_held_lines_have_the_time_they_were_made(monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import time
    from datetime import datetime

    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    logs.setup("kv")
    log = logging.getLogger("brooq.held_lines_test")
    try:
        with logs.batch(log):
            write = logs.held_lines(log, logging.INFO)
            assert write is not None
            before = time.time()
            write("event=first")
            time.sleep(0.01)
            write("event=second")
            after = time.time()
        first, second = stream.getvalue().splitlines()
        stamps = [
            datetime.fromisoformat(line.split()[0][5:]).timestamp() for line in (first, second)
        ]
        assert before - 0.001 <= stamps[0] < stamps[1] <= after
        assert first.endswith(
            f"level=info logger=brooq.held_lines_test pid={os.getpid()} event=first"
        )
    finally:
        logging.getLogger("brooq").handlers[:] = []


# -- JSON log lines --------------------------------------------------------------------------

TRICKY = [
    "it's",
    'say "hi"',
    'say "hi", it\'s',
    "back\\slash \\' \\\" \\n",
    "a=b c=d",
    "pid=1 level=x event=y",
    "two\nlines\r\tand a tab",
    "é ✓ 𝄞 \x00 \x7f \u200b \x1b[31m",
    "",
    "'",
    '"',
    "\\",
]


def _json_line(message: str, pid: int = 42) -> dict[str, Any]:
    formatter = logs.JsonFormatter(timestamps=True)
    return dict(json.loads(formatter.line(logs.Event("ERROR", "brooq.child", pid, 0.0, message))))


@pytest.mark.parametrize("value", TRICKY)
def test_a_value_logged_with_r_comes_back_exactly(value: str) -> None:
    out = _json_line(f"event=job_dead job=j1 error={value!r} attempt=2")
    assert out["error"] == value
    assert (out["event"], out["job"], out["attempt"]) == ("job_dead", "j1", "2")
    assert (out["level"], out["logger"], out["pid"]) == ("error", "brooq.child", 42)


def test_the_header_keys_win_over_the_message() -> None:
    out = _json_line("event=job_dead pid=1 level=x logger=y time=z message=m detail=d exception=e")
    assert (out["level"], out["logger"], out["pid"]) == ("error", "brooq.child", 42)
    assert out["time"] == "1970-01-01T00:00:00.000+00:00"
    assert out["message"].startswith("event=job_dead pid=1")
    assert "detail" not in out and "exception" not in out
    renamed = {k: out[k] for k in out if k.startswith("msg_")}
    assert renamed == {
        "msg_pid": "1",
        "msg_level": "x",
        "msg_logger": "y",
        "msg_time": "z",
        "msg_message": "m",
        "msg_detail": "d",
        "msg_exception": "e",
    }
    # Unquoted values stay as written; an unterminated quote is dropped as before.
    out = _json_line("event=x url=http://h/?a=b retry_in=1.5s error='open")
    assert (out["url"], out["retry_in"], out["error"]) == ("http://h/?a=b", "1.5s", "open")


@pytest.mark.parametrize("value", TRICKY)
def test_lines_made_without_a_log_record_are_the_same(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    monkeypatch.setenv("JOURNAL_STREAM", "8:1")  # no timestamps: the lines compare whole
    logs.setup("json")
    log = logging.getLogger("brooq.cli_input_test")
    msg, args = "event=job_failed job=%s pid=%d error=%r", ("j1", 1, value)
    try:
        with logs.batch(log):
            assert logs.emit_plain(log, logging.WARNING, msg, args) is True
        log.warning(msg, *args)
        plain, usual = stream.getvalue().splitlines()
        assert plain == usual
        out = json.loads(plain)
        assert out["error"] == value and out["pid"] == os.getpid() and out["msg_pid"] == "1"
    finally:
        logging.getLogger("brooq").handlers[:] = []
