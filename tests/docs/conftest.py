"""The documentation's examples, run against a real database (tests/docs/test_pages.py).

Each page listed in PAGES is parsed with sybil and its blocks run in order, in one
namespace, on a fresh migrated database of its own (the ``dsn`` fixture of tests/conftest.py):

- ```` ```python ```` blocks run as written, with ``DATABASE_URL`` pointing at the page's
  database and the page's own working directory as the current directory;
- ```` ```python title="NAME.py" ```` blocks are files the reader saves: they are written
  into the working directory (importable from there), not run;
- ```` ```sh ```` blocks are commands: run with bash (``-euo pipefail``) in the working
  directory, each must exit 0 within two minutes; after ``<!-- sh: background -->`` the
  next one is started in the background (a ``brooq-master``, say) and stopped with
  SIGTERM when the page ends;
- ``<!-- skip: next "why" -->`` before a block leaves it out, and says why in the page
  source (test_pages.py refuses a skip without a reason);
- ``<!-- invisible-code-block: python ... -->`` is setup the reader does not see (a stub
  of a client the example calls).

Only the languages above run; a tested page must not label a command block ``bash``,
``shell`` or ``console`` (test_pages.py checks), so none escapes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The pages whose examples run: the README and the how-to guides. The tutorial is followed
# as a reader follows it, in one session with its master, by tests/docs/test_tutorial.py.
PAGES = sorted(
    [
        "README.md",
        "docs/async.md",
        "docs/operator.md",
        "docs/poolers.md",
        "docs/status-page.md",
        *(str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "how-to").glob("*.md")),
    ]
)

COMMAND_TIMEOUT = 120.0


@dataclass
class PageRun:
    """What one page's examples share: its database, directory and background commands."""

    dsn: str
    workdir: Path
    env: dict[str, str]
    background: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)
    background_next: bool = False

    def run(self, source: str) -> str | None:
        if self.background_next:
            self.background_next = False
            log = self.workdir / f"background-{len(self.background)}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    ["bash", "-euo", "pipefail", "-c", source],
                    cwd=self.workdir,
                    env=self.env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self.background.append((proc, log))
            return None
        try:
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", source],
                cwd=self.workdir,
                env=self.env,
                capture_output=True,
                timeout=COMMAND_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            return f"no exit within {COMMAND_TIMEOUT:g}s:\n{source}"
        print(f"$ {source.strip()}\n{done.stdout.decode()}{done.stderr.decode()}")
        if done.returncode != 0:
            return (
                f"exit {done.returncode}:\n{source}\n--- stdout\n{done.stdout.decode()}"
                f"--- stderr\n{done.stderr.decode()}"
            )
        return None

    def stop(self) -> None:
        for proc, log in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=45)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            print(f"---- {log.name} (exit {proc.returncode})\n{log.read_text()[-20000:]}")


@pytest.fixture
def page_run(dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PageRun]:
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = dict(os.environ)
    env.update(
        DATABASE_URL=dsn,
        # A free port: several pages (and test runs) may run masters at once.
        QUEUE_OPS_ADDR="127.0.0.1:0",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=os.pathsep.join(
            p for p in (str(workdir), str(ROOT), env.get("PYTHONPATH", "")) if p
        ),
    )
    env.pop("PGOPTIONS", None)
    for name in ("QUEUE_SCHEMA", "QUEUE_POOLER", "QUEUE_LISTEN_DATABASE_URL"):
        env.pop(name, None)
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DATABASE_URL", dsn)
    monkeypatch.setenv("QUEUE_OPS_ADDR", "127.0.0.1:0")
    monkeypatch.chdir(workdir)
    monkeypatch.syspath_prepend(str(workdir))
    before = set(sys.modules)
    run = PageRun(dsn, workdir, env)
    try:
        yield run
    finally:
        run.stop()
        for name in set(sys.modules) - before:
            module: Any = sys.modules.get(name)
            if str(getattr(module, "__file__", "") or "").startswith(str(workdir)):
                del sys.modules[name]
