"""Input that once broke the tools: the `brooq` command refuses every bad value in one
line with exit 2 and writes nothing; --payload-file; enqueue_many names the job it
refused; QUEUE_OPS_ADDR= turns the ops surface off; --database stays out of ps; JSON log
lines keep their own keys and give values back as they were logged."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import conninfo

import brooq
from brooq import logs, produce
from brooq import settings as settings_mod
from tests import harness
from tests.db.test_cli import run
from tests.harness import StartMaster, wait_for

ROOT = Path(__file__).resolve().parents[2]
SECRET = "SECRETPW7"


def refused(dsn: str, *args: str, code: int = 2, **kwargs: Any) -> str:
    """The command fails with ``code``, one line on stderr and nothing on stdout; that line."""
    out = run("--database", dsn, *args, **kwargs)
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr[-3000:])
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-3000:]
    return lines[0]


def count(db: psycopg.Connection[Any]) -> int:
    row = db.execute("SELECT count(*) FROM job").fetchone()
    assert row is not None
    return int(row[0])


# -- point 5: the CLI never prints a traceback ------------------------------------------------


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


def test_enqueue_many_names_the_refused_job(dsn: str, db: psycopg.Connection[Any]) -> None:
    small = brooq.Queue(dsn, max_payload_bytes=100)
    fine = brooq.Job("t", "ok")
    too_big = brooq.Job("t", "x" * 200)
    try:
        with pytest.raises(brooq.InvalidPayload, match=r"^job 2: payload is 202 bytes .* 100$"):
            small.enqueue_many([fine, fine, too_big, fine])
        with pytest.raises(TypeError, match=r"^job 1: expected a brooq.Job, not dict$"):
            small.enqueue_many([fine, {"topic": "t"}])  # type: ignore[list-item]
        with psycopg.connect(dsn) as conn:
            with pytest.raises(brooq.InvalidPayload, match=r"^job 0: payload is 202 bytes"):
                produce.enqueue_many(conn, [too_big], max_payload_bytes=100)
            with pytest.raises(TypeError, match=r"^job 3: expected a brooq.Job, not str$"):
                produce.enqueue_many(conn, [fine, fine, fine, "t"])  # type: ignore[list-item]
        assert count(db) == 0
    finally:
        small.close()


# -- point 6(c): --database stays out of ps -----------------------------------------------------


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_a_command_hides_the_password_of_database_from_ps() -> None:
    # `enqueue --payload-file -` waits on standard input: a command that stays alive.
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CRED"))}
    environ["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "brooq",
            "--database",
            f"postgresql://u:{SECRET}@127.0.0.1:1/x",
            "enqueue",
            "t",
            "--payload-file",
            "-",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environ,
        cwd=ROOT,
    )
    try:

        def hidden() -> str:
            line = _cmdline(proc.pid)
            return line if "brooq" in line and SECRET not in line else ""

        title = wait_for(hidden, timeout=15, what="the password gone from /proc/PID/cmdline")
        assert "--database *** enqueue t --payload-file -" in title, title
        _, stderr = proc.communicate(b"{}", timeout=30)
        assert proc.returncode == 1 and b"cannot reach the database" in stderr
    finally:
        proc.kill()
        proc.wait()


def test_the_master_hides_the_password_before_importing_the_app(
    dsn: str, start_master: StartMaster, tmp_path: Path
) -> None:
    marker = tmp_path / "importing"
    with_password = conninfo.make_conninfo(dsn, password=SECRET)  # trust auth ignores it
    m = start_master(
        app="brooq_cli_app:queue",
        workers=1,
        args=("--database", with_password),
        env={"BROOQ_CLI_APP_SLOW_IMPORT": str(marker)},
    )
    wait_for(marker.exists, timeout=15, what="the app's import under way")
    assert int(marker.read_text()) == m.pid
    title = _cmdline(m.pid)  # the import takes 3 s from here
    assert SECRET not in title and title.startswith("brooq-master: "), title
    m.wait_ready(1)
    assert SECRET not in _cmdline(m.pid)


# -- point 6(b): QUEUE_OPS_ADDR= turns the ops surface off -------------------------------------


def test_empty_ops_addr_in_the_environment_means_off() -> None:
    assert settings_mod.load(environ={}).ops_addr == "127.0.0.1:8090"
    assert settings_mod.load(environ={"QUEUE_OPS_ADDR": ""}).ops_addr == ""
    assert settings_mod.load(environ={"QUEUE_OPS_ADDR": "  "}).ops_addr == ""
    # Every other variable: empty is still unset.
    assert settings_mod.load(environ={"QUEUE_LEASE": ""}).lease == 30.0


def _listening_ports(pid: int) -> set[int]:
    """TCP ports that process ``pid`` listens on (its sockets found in /proc/net/tcp*)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_a_master_with_empty_ops_addr_binds_nothing(
    start_master: StartMaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    off_by_env = start_master(workers=1, env={"QUEUE_OPS_ADDR": ""})
    off_by_flag = start_master(workers=1, args=("--ops-addr", ""))
    on = start_master(workers=1)  # FAST: 127.0.0.1:0, a free port
    monkeypatch.setattr(
        harness, "FAST", {k: v for k, v in harness.FAST.items() if k != "QUEUE_OPS_ADDR"}
    )
    default = start_master(workers=1)  # QUEUE_OPS_ADDR unset
    for m in (off_by_env, off_by_flag, on, default):
        m.wait_ready(1)
    # The ops server is started before the first fork: with children up, it is decided.
    assert "event=ops_listening" in on.log() and _listening_ports(on.pid)
    # The default address is tried (another process on the host may hold 8090 already).
    assert "event=ops_listening addr=127.0.0.1:8090" in default.log() or (
        "event=ops_bind_failed addr=127.0.0.1:8090" in default.log()
    ), default.log()
    for m in (off_by_env, off_by_flag):
        assert "event=ops_" not in m.log(), m.log()
        assert _listening_ports(m.pid) == set()


# -- point 6(e): JSON log lines ----------------------------------------------------------------

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


def test_a_real_childs_json_line_keeps_its_keys_and_the_error(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    text = 'say "hi", it\'s pid=1 level=x event=y \\ back\\slash é'
    job_id, _ = queue.enqueue(brooq.Job("t.says", {"message": text}))
    m = start_master(app="brooq_cli_app:queue", workers=1, args=("--log-format", "json"))
    wait_for(
        lambda: (
            db.execute("SELECT state FROM job WHERE id = %s", (job_id,)).fetchone() == ("dead",)
        ),
        what="the job dead",
    )

    def dead_line() -> dict[str, Any] | None:
        for line in m.log().splitlines():
            if line.startswith("{") and '"job_dead"' in line:
                return dict(json.loads(line))
        return None

    out = wait_for(dead_line, what="the job_dead line")
    assert out["event"] == "job_dead" and out["job"] == str(job_id)
    assert out["level"] == "error" and out["logger"] == "brooq.child"
    assert out["pid"] in m.children() and out["pid"] != m.pid
    assert out["error"] == f"ValueError: {text}"
    assert "msg_pid" not in out  # inside the quoted error: not a key of the line
    assert "Traceback" in out["detail"]
