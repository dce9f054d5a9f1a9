"""The `brooq` command refuses every bad value in one line with exit 2 and writes nothing
(--payload-file and its refusals included), and an unexpected exception is one line and
exit 1.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

import brooq
from tests.db.test_cli import run

ROOT = Path(__file__).resolve().parents[2]


def refused(dsn: str, *args: str, code: int = 2, **kwargs: Any) -> str:
    """The command fails with ``code``, one line on stderr and nothing on stdout; that line."""
    out = run("--database", dsn, *args, **kwargs)
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr[-3000:])
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-3000:]
    return lines[0]


def count(db: psycopg.Connection[Any]) -> int:
    row = db.execute("SELECT count(*) FROM job_all").fetchone()
    assert row is not None
    return int(row[0])


# -- the CLI never prints a traceback ---------------------------------------------------------


def test_deeply_nested_payload_is_one_line_and_exit_2(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    # 60,000 nested arrays and 100,000 unclosed ones made json.loads raise RecursionError.
    for text in ("[" * 60_000 + "]" * 60_000, "[" * 100_000):
        line = refused(dsn, "enqueue", "t", "--payload", text)
        assert "--payload" in line and "nested too deeply" in line, line
    line = refused(dsn, "enqueue", "t", "--payload", "[" * 300 + "]" * 300)
    assert "--payload" in line and "more than 256 levels" in line, line
    # A 5,000-digit integer made json.loads raise ValueError (not a JSONDecodeError).
    line = refused(dsn, "enqueue", "t", "--payload", "9" * 5000)
    assert "--payload" in line and "4300 digits" in line, line
    assert count(db) == 0


@pytest.mark.parametrize("value", ["99999999d", "100000000000000000d", "3000000d"])
def test_a_delay_past_the_year_9999_is_exit_2(
    dsn: str, db: psycopg.Connection[Any], value: str
) -> None:
    # timedelta() or datetime + timedelta raised OverflowError: a traceback and exit 1.
    line = refused(dsn, "enqueue", "t", "--in", value)
    assert "--in" in line and "too large" in line, line
    assert count(db) == 0


def test_every_bad_value_of_enqueue_names_its_option(dsn: str, db: psycopg.Connection[Any]) -> None:
    assert "for TOPIC" in refused(dsn, "enqueue", "Bad Topic")
    assert "for --key" in refused(dsn, "enqueue", "t", "--key", "k" * 2000)
    assert "for --payload" in refused(dsn, "enqueue", "t", "--payload", "NaN")
    assert "for --payload" in refused(dsn, "enqueue", "t", "--payload", '"\\ud800"')
    assert "for --at" in refused(dsn, "enqueue", "t", "--at", "9999-12-31T23:00:00-05:00")
    small = {"QUEUE_MAX_PAYLOAD_BYTES": "100"}
    line = refused(dsn, "enqueue", "t", "--payload", '"' + "x" * 200 + '"', env=small)
    assert "for --payload" in line and "limit is 100" in line, line
    assert count(db) == 0


@pytest.mark.parametrize(
    ("args", "option", "words"),
    [
        (["--queue", "Bad Queue"], "for --queue", "does not match"),
        (["--queue", "q" * 129], "for --queue", "128"),
        (["--queue", ""], "for --queue", ""),
        (["--priority", "32768"], "for --priority", "-32768 to 32767"),
        (["--priority", "-32769"], "for --priority", "-32768 to 32767"),
        (["--priority", "00032768"], "for --priority", "-32768 to 32767"),
        (["--priority", "1.5"], "for --priority", "not an integer"),
        (["--priority", "high"], "for --priority", "not an integer"),
        (["--priority", "true"], "for --priority", "not an integer"),
        (["--priority", ""], "for --priority", "not an integer"),
        (["--priority", "9" * 5000], "for --priority", "(5000 characters)"),
    ],
)
def test_a_bad_queue_or_priority_is_exit_2_naming_it(
    dsn: str, db: psycopg.Connection[Any], args: list[str], option: str, words: str
) -> None:
    line = refused(dsn, "enqueue", "t", *args)
    assert option in line and words in line, line
    assert count(db) == 0


def test_top_refuses_an_interval_select_cannot_wait(dsn: str) -> None:
    # select() raised OverflowError past the platform's time_t.
    line = refused(dsn, "top", "--once", "--interval", "99999999999999d")
    assert "--interval" in line and "too long" in line, line


def test_a_connection_string_file_that_is_not_text_is_exit_2(tmp_path: Path) -> None:
    binary = tmp_path / "database-url"
    binary.write_bytes(b"postgresql://\xd0\x00\xff/x")
    out = run("stats", env={"DATABASE_URL_FILE": str(binary)})
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == [f"error: DATABASE_URL_FILE {binary} is not UTF-8 text"]


def test_an_unexpected_exception_is_one_line_and_exit_1() -> None:
    # The last resort: a defect of brooq (here simulated) is still one line, never a traceback.
    code = (
        "import sys; import brooq.cli as cli\n"
        "def boom(direction): raise RuntimeError('simulated defect')\n"
        "cli.migrate_mod.script = boom\n"
        "sys.argv = ['brooq', 'migrate', 'sql']\n"
        "cli.main()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 1
    assert out.stderr == "error: internal error: RuntimeError: simulated defect\n"


def test_payload_file_carries_what_the_command_line_cannot(
    dsn: str, queue: brooq.Queue, tmp_path: Path
) -> None:
    payload = {"text": "x" * 300_000, "é": [1, 2.5, None]}
    text = json.dumps(payload, ensure_ascii=False)
    # One argument is limited to 128 KiB on Linux: exec itself refuses it.
    with pytest.raises(OSError) as info:
        run("--database", dsn, "enqueue", "t", "--payload", text)
    assert info.value.errno == errno.E2BIG

    path = tmp_path / "payload.json"
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False), encoding="utf-8")
    out = run("--database", dsn, "enqueue", "t", "--payload-file", str(path), "--json")
    assert out.returncode == 0, out.stderr
    record = queue.get(json.loads(out.stdout)["id"])
    assert record is not None and record.payload == payload

    out = run("--database", dsn, "enqueue", "t", "--payload-file", "-", stdin='{"a": ["é"]}')
    assert out.returncode == 0, out.stderr
    record = queue.get(out.stdout.split()[1])
    assert record is not None and record.payload == {"a": ["é"]}

    path.write_bytes(b'\xef\xbb\xbf{"bom": true}')  # a byte order mark, as editors write
    out = run("--database", dsn, "enqueue", "t", "--payload-file", str(path))
    assert out.returncode == 0, out.stderr
    record = queue.get(out.stdout.split()[1])
    assert record is not None and record.payload == {"bom": True}


def test_payload_file_refusals_name_the_file(
    dsn: str, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    missing = tmp_path / "missing.json"
    line = refused(dsn, "enqueue", "t", "--payload-file", str(missing))
    assert "--payload-file" in line and f"cannot read {missing}" in line, line
    line = refused(dsn, "enqueue", "t", "--payload-file", str(tmp_path))
    assert f"cannot read {tmp_path}: Is a directory" in line, line

    binary = tmp_path / "binary.json"
    binary.write_bytes(b'"\xff\xfe"')
    line = refused(dsn, "enqueue", "t", "--payload-file", str(binary))
    assert f"{binary} is not UTF-8 text" in line, line

    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    line = refused(dsn, "enqueue", "t", "--payload-file", str(bad))
    assert f"--payload-file: {bad}: not JSON" in line, line
    line = refused(dsn, "enqueue", "t", "--payload-file", "-", stdin="{nope")
    assert "standard input: not JSON" in line, line

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    line = refused(dsn, "enqueue", "t", "--payload-file", str(deep))
    assert f"{deep}: nested too deeply" in line, line

    large = tmp_path / "large.json"
    large.write_text('"' + "x" * 200 + '"')
    small = {"QUEUE_MAX_PAYLOAD_BYTES": "100"}
    line = refused(dsn, "enqueue", "t", "--payload-file", str(large), env=small)
    assert "for --payload-file" in line and "limit is 100" in line, line

    line = refused(dsn, "enqueue", "t", "--payload", "1", "--payload-file", str(large))
    assert "not both" in line
    line = refused(dsn, "enqueue", "t", "--payload-file", "/dev/zero")
    assert "/dev/zero is larger than 64 MiB" in line, line
    assert count(db) == 0
