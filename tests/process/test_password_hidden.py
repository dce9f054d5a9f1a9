"""The password of --database (and of --read-database-url) stays out of ps: in a `brooq`
command, and in brooq-master before it imports the application.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from psycopg import conninfo

from tests.harness import StartMaster, wait_for

ROOT = Path(__file__).resolve().parents[2]
SECRET = "SECRETPW7"


# -- --database stays out of ps ---------------------------------------------------------------


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


@pytest.mark.parametrize("option", ["--database", "--read-database-url"])
def test_a_command_hides_the_password_of_database_from_ps(option: str) -> None:
    # `enqueue --payload-file -` waits on standard input: a command that stays alive.
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CRED"))}
    environ["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "brooq",
            option,
            f"postgresql://u:{SECRET}@127.0.0.1:1/x",
            *(["--database", "postgresql://u@127.0.0.1:1/x"] if option != "--database" else []),
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
        assert f"{option} *** " in title and "enqueue t --payload-file -" in title, title
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
