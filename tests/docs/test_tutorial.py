"""The tutorial (docs/tutorial/index.md), followed as a new user follows it: its files
written, its commands run in order in one shell session (a `cd` or an `export` holds for
the next block), its master started and stopped with Ctrl-C as it says, and every output
it shows compared with what brooq printed.

Each fenced block of the page follows a marker, an HTML comment the site does not show:

- ``<!-- tutorial: install -->``: a ``sh`` block installing brooq or pytest. Not run (the
  suite runs in its virtualenv already); its lines are checked (the extras exist, the
  pytest the plugin needs is installed before a block runs pytest).
- ``<!-- tutorial: db-up -->``: ``make db-up``. Checked: the Makefile's target runs
  brooq.schema.devdb start, which is run for real in a stand-in checkout (an embedded
  PostgreSQL, stopped after); its output must be the ``output`` block after it, with
  ``/home/you/brooq`` for the checkout.
- ``<!-- tutorial: env -->``: the ``export DATABASE_URL=...`` line. Its URL, ``$PWD``
  expanded in the stand-in checkout, must be the one ``make db-up`` printed; for the run,
  the test's database stands in for that URL, nothing else of the line changed.
- ``<!-- tutorial: run -->``: commands, run with bash (-euo pipefail) in the session's
  directory and environment; each must exit 0. An ``output`` block after one must be its
  output (stdout and stderr, as a terminal shows them).
- ``<!-- tutorial: file PATH -->``: a ``python`` block written to PATH.
- ``<!-- tutorial: edit PATH -->``: a one-line ``python`` block replacing the line of PATH
  that assigns the same name (``queue = ...``).
- ``<!-- tutorial: terminal -->``: a second terminal's set-up, run from the checkout's
  parent (where the first terminal started); ``master`` blocks run in its state.
- ``<!-- tutorial: master -->``: ``brooq-master``, started in the background (the second
  terminal). An ``output`` block after it holds log lines that must show up in order.
- ``<!-- tutorial: master-log -->``: log lines the running master must write next.
- ``<!-- tutorial: ctrl-c -->`` (no block): SIGINT to the master's process group, as a
  terminal's Ctrl-C; it must stop with exit 0 and log master_stopped.

Outputs are compared line by line with runs of spaces made one, ids, times, pids, ports
and durations masked; a line of an output block ending in `` ...`` matches a line
starting with what comes before. What stands in for the reader's machine: the suite's
database for the URL, the suite's virtualenv for the checkout's ``.venv``, a free port for
the ops port (``QUEUE_OPS_ADDR``; the page's 8090 is masked).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest

import brooq
from tests.docs.conftest import ROOT

PAGE = ROOT / "docs" / "tutorial" / "index.md"
CHECKOUT_PLACEHOLDER = "/home/you/brooq"
COMMAND_TIMEOUT = 60.0
LOG_TIMEOUT = 30.0

MARKER = re.compile(r"^<!-- tutorial: (?P<kind>[a-z-]+)(?: (?P<arg>[^ >]+))? -->[ \t]*$", re.M)
FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
LANGUAGE = {
    "install": "sh",
    "db-up": "sh",
    "env": "sh",
    "run": "sh",
    "terminal": "sh",
    "master": "sh",
    "output": "text",
    "master-log": "text",
    "file": "python",
    "edit": "python",
}
NEEDS_ARG = {"file", "edit"}
ENV_LINE = re.compile(r'^export DATABASE_URL="(?P<dsn>[^"]+)"$')


@dataclass
class Step:
    kind: str
    arg: str | None
    body: str | None
    line: int

    def where(self) -> str:
        return f"{PAGE.relative_to(ROOT)} line {self.line} ({self.kind})"


def parse(text: str) -> list[Step]:
    """The page's marked blocks, in order; AssertionError for a fenced block no marker
    claims, a marker without its block, or a block of the wrong language."""
    fences = {m.start(): m for m in FENCE.finditer(text)}
    claimed: set[int] = set()
    steps = []
    for marker in MARKER.finditer(text):
        kind, arg = marker.group("kind"), marker.group("arg")
        line = text.count("\n", 0, marker.start()) + 1
        assert kind == "ctrl-c" or kind in LANGUAGE, f"line {line}: unknown marker {kind!r}"
        assert (arg is not None) == (kind in NEEDS_ARG), f"line {line}: {kind} and its argument"
        if kind == "ctrl-c":
            steps.append(Step(kind, None, None, line))
            continue
        start = marker.end() + 1
        while start < len(text) and text[start] == "\n":
            start += 1
        fence = fences.get(start)
        assert fence is not None, f"line {line}: the marker {kind!r} is not followed by a block"
        language = fence.group("info").split()[0] if fence.group("info").strip() else ""
        assert language == LANGUAGE[kind], (
            f"line {line}: a {kind} block is ```{LANGUAGE[kind]}, not ```{language}"
        )
        claimed.add(start)
        steps.append(Step(kind, arg, fence.group("body"), line))
    escaped = [text.count("\n", 0, s) + 1 for s in fences if s not in claimed]
    assert not escaped, f"blocks with no <!-- tutorial: ... --> marker at lines {escaped}"
    return steps


# -- outputs -----------------------------------------------------------------------------

MASKS = [
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<id>"),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)"), "<time>"),
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"), "<time>"),
    (re.compile(r"\bpid=\d+"), "pid=<pid>"),
    (re.compile(r"127\.0\.0\.1:\d+"), "127.0.0.1:<port>"),
    (re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:ms|s)\b"), "<duration>"),
]


def mask(line: str) -> str:
    for pattern, replacement in MASKS:
        line = pattern.sub(replacement, line)
    return " ".join(line.split())


def lines_of(text: str) -> list[str]:
    return [mask(line) for line in text.splitlines() if line.strip()]


def matches(sample: str, actual: str) -> bool:
    if sample.endswith(" ..."):
        return actual.startswith(sample[: -len(" ...")])
    return sample == actual


def same_output(sample: str, actual: str) -> bool:
    want, got = lines_of(sample), lines_of(actual)
    return len(want) == len(got) and all(matches(w, g) for w, g in zip(want, got, strict=True))


def in_order(sample: str, log: str) -> bool:
    """Whether every line of ``sample`` is a line of ``log``, in the same order."""
    got = iter(lines_of(log))
    return all(any(matches(want, line) for line in got) for want in lines_of(sample))


# -- the reader's session ----------------------------------------------------------------


@dataclass
class Shell:
    """One terminal: its directory and environment carried from block to block."""

    cwd: Path
    env: dict[str, str]
    state: Path

    def run(self, source: str, where: str) -> str:
        self.state.mkdir(exist_ok=True)
        trailer = f"\npwd > {self.state}/cwd\nenv -0 > {self.state}/env\n"
        try:
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", source + trailer],
                cwd=self.cwd,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=COMMAND_TIMEOUT,
            )
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(
                f"{where}: no exit within {COMMAND_TIMEOUT:g}s:\n{source}"
            ) from exc
        output = done.stdout.decode()
        print(f"$ {source.strip()}\n{output}")
        assert done.returncode == 0, f"{where}: exit {done.returncode}:\n{source}\n{output}"
        self.cwd = Path((self.state / "cwd").read_text().strip())
        pairs = (item.partition("=") for item in (self.state / "env").read_text().split("\0"))
        self.env = {name: value for name, _, value in pairs if name}
        return output

    def copy(self, state: Path) -> Shell:
        return Shell(self.cwd, dict(self.env), state)


@dataclass
class Master:
    proc: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, sample: str, where: str) -> None:
        deadline = time.monotonic() + LOG_TIMEOUT
        while not in_order(sample, self.text()):
            assert self.proc.poll() is None, f"{where}: the master exited:\n{self.text()}"
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{where}: the master's log never showed\n{sample}--- its log\n{self.text()}",
                    pytrace=False,
                )
            time.sleep(0.05)

    def wait_for_event(self, event: str, where: str) -> None:
        deadline = time.monotonic() + LOG_TIMEOUT
        while f" event={event} " not in self.text():
            assert self.proc.poll() is None, f"{where}: the master exited:\n{self.text()}"
            if time.monotonic() > deadline:
                pytest.fail(f"{where}: no {event} in\n{self.text()}", pytrace=False)
            time.sleep(0.05)

    def ctrl_c(self, where: str) -> None:
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            code = self.proc.wait(timeout=LOG_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{where}: no exit {LOG_TIMEOUT:g}s after Ctrl-C") from None
        assert code == 0, f"{where}: exit {code} after Ctrl-C:\n{self.text()}"
        assert "event=master_stopped" in self.text(), self.text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@dataclass
class Reader:
    """What the reader has: a checkout, a first terminal, a second for the master."""

    root: Path  # where the reader's terminals start: the checkout's parent
    dsn: str  # the test's database: stands in for make db-up's
    first: Shell
    second: Shell | None = None
    master: Master | None = None
    masters: list[Master] = field(default_factory=list)
    last_output: str | None = None

    @property
    def checkout(self) -> Path:
        return self.root / "brooq"

    def start_master(self, source: str, where: str) -> None:
        assert self.master is None, f"{where}: a master runs already (Ctrl-C it first)"
        assert self.second is not None, f"{where}: the master's terminal was never set up"
        log = self.root / f"master-{len(self.masters)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["bash", "-euo", "pipefail", "-c", source],
                cwd=self.second.cwd,
                env=self.second.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.master = Master(proc, log)
        self.masters.append(self.master)

    def stop(self) -> None:
        for master in self.masters:
            master.kill()
            print(f"---- {master.log.name} (exit {master.proc.returncode})\n{master.text()}")


def user_env(dsn_free_env: dict[str, str]) -> dict[str, str]:
    """A terminal's environment: the test's, without what a reader's shell would not have
    (the suite's database settings, pytest's variables), the virtualenv activated."""
    env = {
        name: value
        for name, value in dsn_free_env.items()
        if not name.startswith(("PG", "QUEUE_", "BROOQ_", "PYTEST_", "DATABASE_URL"))
        and name not in ("CREDENTIALS_DIRECTORY", "VIRTUAL_ENV")
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # Stands in for the page's 127.0.0.1:8090: tests run side by side.
    env["QUEUE_OPS_ADDR"] = "127.0.0.1:0"
    return env


@pytest.fixture
def reader(empty_dsn: str) -> Iterator[Reader]:
    # Not under pytest's tmp_path: the embedded PostgreSQL of `make db-up` runs as another
    # user when the tests run as root, and must reach its directory (and its socket's path
    # must stay short).
    root = Path(tempfile.mkdtemp(prefix="brooq-tutorial-"))
    os.chmod(root, 0o755)
    checkout = root / "brooq"
    checkout.mkdir()
    venv = Path(sys.prefix)
    if (venv / "bin" / "activate").is_file():
        (checkout / ".venv").symlink_to(venv)
    else:  # not in a virtualenv: an activate that puts this Python first
        (checkout / ".venv" / "bin").mkdir(parents=True)
        (checkout / ".venv" / "bin" / "activate").write_text(
            f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH\n"
        )
    env = user_env(dict(os.environ))
    first = Shell(checkout, env, root / ".shell-1")  # after the install block's `cd brooq`
    run = Reader(root, empty_dsn, first)
    try:
        yield run
    finally:
        run.stop()
        shutil.rmtree(root, ignore_errors=True)


# -- the checks of what is not run ---------------------------------------------------------


def check_install(step: Step) -> set[str]:
    """The packages an install block installs (the extras checked against brooq's)."""
    assert step.body is not None
    extras = set(metadata.metadata("brooq").get_all("Provides-Extra") or [])
    installed = set()
    for raw in step.body.splitlines():
        line = raw.split("  #")[0].strip()
        for command in (c.strip() for c in line.split("&&")):
            words = shlex.split(command)
            if words[:2] == ["pip", "install"]:
                args = [w for w in words[2:] if w != "-e"]
                for arg in args:
                    match = re.fullmatch(r"\.(?:\[(?P<extras>[\w,-]+)\])?", arg)
                    if match:
                        asked = set((match.group("extras") or "").split(",")) - {""}
                        assert asked <= extras, f"{step.where()}: no extra {asked - extras}"
                        installed.add("brooq")
                        installed |= asked
                    else:
                        installed.add(arg)
            else:
                assert words in (
                    ["cd", "brooq"],
                    ["python3", "-m", "venv", ".venv"],
                    [".", ".venv/bin/activate"],
                ), f"{step.where()}: an install line the test does not know: {command!r}"
    return installed


def check_db_up(reader: Reader, sample: Step | None) -> str:
    """Run what `make db-up` runs in the stand-in checkout; its output must be the page's.
    Returns the URL it printed."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^db-up:.*\n\t(?P<command>.+)$", makefile, re.M)
    assert recipe and recipe.group("command").strip() == "@$(PY) -m brooq.schema.devdb start"
    assert sample is not None and sample.kind == "output", "make db-up's output is not shown"
    assert sample.body is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "PG"))}
    env.pop("CREDENTIALS_DIRECTORY", None)
    devdb = [sys.executable, "-W", "ignore", "-m", "brooq.schema.devdb"]
    try:
        done = subprocess.run(
            [*devdb, "start"], cwd=reader.checkout, env=env, capture_output=True, timeout=120
        )
        printed = done.stdout.decode()
        assert done.returncode == 0, printed + done.stderr.decode()
    finally:
        subprocess.run([*devdb, "stop"], cwd=reader.checkout, env=env, capture_output=True)
    expected = sample.body.replace(CHECKOUT_PLACEHOLDER, str(reader.checkout))
    if not same_output(expected, printed):
        pytest.fail(
            f"{sample.where()}: make db-up prints\n{printed}the page shows\n{sample.body}",
            pytrace=False,
        )
    match = re.match(r"export DATABASE_URL='(?P<dsn>[^']+)'\n", printed)
    assert match, printed
    return match.group("dsn")


def check_env_line(step: Step, printed_dsn: str, checkout: Path) -> str:
    """The page's export line as the test runs it: the suite's database for its URL."""
    assert step.body is not None
    line = step.body.strip()
    match = ENV_LINE.match(line)
    assert match, f"{step.where()}: not an export of DATABASE_URL: {line!r}"
    expanded = match.group("dsn").replace("$PWD", str(checkout))
    assert expanded == printed_dsn, (
        f"{step.where()}: in the checkout, the page's URL is\n  {expanded}\n"
        f"make db-up printed\n  {printed_dsn}"
    )
    return line


def substituted(line: str, dsn: str) -> str:
    match = ENV_LINE.match(line)
    assert match
    return line[: match.start("dsn")] + dsn + line[match.end("dsn") :]


# -- the tutorial, followed ----------------------------------------------------------------


def test_the_tutorial_runs_as_written(reader: Reader) -> None:
    steps = parse(PAGE.read_text())
    installed: set[str] = set()
    env_line: str | None = None
    for index, step in enumerate(steps):
        after = steps[index + 1] if index + 1 < len(steps) else None
        where = step.where()
        body = step.body or ""
        if step.kind == "install":
            installed |= check_install(step)
        elif step.kind == "db-up":
            assert body.strip() == "make db-up", where
            printed_dsn = check_db_up(reader, after)
            reader.last_output = None
        elif step.kind == "env":
            env_line = check_env_line(step, printed_dsn, reader.checkout)
            reader.first.run(substituted(env_line, reader.dsn), where)
        elif step.kind == "run":
            if re.search(r"\bpytest\b", body):
                assert "pytest" in installed, f"{where}: runs pytest before installing it"
            reader.last_output = reader.first.run(body, where)
        elif step.kind == "output":
            assert step.body is not None
            previous = steps[index - 1]
            if previous.kind == "master":
                assert reader.master is not None
                reader.master.wait_for(step.body, where)
            elif previous.kind == "run":
                assert reader.last_output is not None
                if not same_output(step.body, reader.last_output):
                    pytest.fail(
                        f"{where}: the command printed\n{reader.last_output}"
                        f"the page shows\n{step.body}",
                        pytrace=False,
                    )
            else:
                assert previous.kind == "db-up", f"{where}: an output of a {previous.kind}"
        elif step.kind == "file":
            path = reader.first.cwd / str(step.arg)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)
        elif step.kind == "edit":
            edit(reader.first.cwd / str(step.arg), body, where)
        elif step.kind == "terminal":
            assert env_line is not None, f"{where}: before the DATABASE_URL line"
            lines = [line.split("  #")[0].strip() for line in body.strip().splitlines()]
            # The same set-up as the first terminal's: the checkout, its virtualenv, the
            # page's DATABASE_URL line, then the application's directory.
            assert lines[0] == "cd brooq && . .venv/bin/activate", where
            assert lines[1] == env_line, f"{where}: not the DATABASE_URL line of step 1"
            lines[1] = substituted(env_line, reader.dsn)
            second = Shell(reader.root, user_env(dict(os.environ)), reader.root / ".shell-2")
            second.env["PATH"] = os.environ.get("PATH", "")  # a new terminal: no venv yet
            second.run("\n".join(lines), where)
            assert second.cwd == reader.first.cwd, (
                f"{where}: the second terminal is in {second.cwd}, the first in {reader.first.cwd}"
            )
            reader.second = second
        elif step.kind == "master":
            reader.start_master(body, where)
        elif step.kind == "master-log":
            assert reader.master is not None, f"{where}: no master runs"
            reader.master.wait_for(body, where)
        elif step.kind == "ctrl-c":
            assert reader.master is not None, f"{where}: no master runs"
            reader.master.ctrl_c(where)
            reader.master = None
    assert reader.master is None, "the page leaves its master running"
    kinds = {step.kind for step in steps}
    assert {"db-up", "env", "terminal", "master", "ctrl-c", "edit"} <= kinds


def edit(path: Path, line: str, where: str) -> None:
    new = line.strip()
    assert "\n" not in new, f"{where}: an edit is one line"
    name = new.partition("=")[0].strip()
    assert name.isidentifier(), f"{where}: an edit assigns a name: {new!r}"
    old = path.read_text().splitlines(keepends=True)
    hits = [i for i, text in enumerate(old) if text.partition("=")[0].strip() == name]
    assert len(hits) == 1, f"{where}: {path.name} has {len(hits)} lines assigning {name}"
    old[hits[0]] = new + "\n"
    path.write_text("".join(old))


def test_every_block_of_the_tutorial_is_marked() -> None:
    """No block escapes the run: each has its marker, of its language (parse says)."""
    steps = parse(PAGE.read_text())
    assert len(steps) > 20


def test_a_reload_takes_the_module_named_in_include(dsn: str, tmp_path: Path) -> None:
    """What the tutorial says of SIGHUP, instead of its restart: the application of step 2
    under a master; tasks/flaky.py and the include= edit of step 6; SIGHUP; a flaky.call
    job then runs in the reloaded children (its first attempt failing), the master never
    stopped."""
    steps = parse(PAGE.read_text())
    files = [s for s in steps if s.kind == "file"]
    app = next(s for s in files if s.arg == "tasks/app.py")
    flaky = next(s for s in files if s.arg == "tasks/flaky.py")
    include = next(s for s in steps if s.kind == "edit" and s.arg == "tasks/app.py")
    command = next(s for s in steps if s.kind == "master")
    assert app.body and flaky.body and include.body and command.body
    project = tmp_path / "hello-brooq"
    (project / "tasks").mkdir(parents=True)
    (project / "tasks" / "__init__.py").write_text("")
    (project / "tasks" / "app.py").write_text(app.body)
    env = user_env(dict(os.environ))
    env["DATABASE_URL"] = dsn
    log = tmp_path / "master.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            shlex.split(command.body.strip()),
            cwd=project,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    master = Master(proc, log)
    queue = brooq.Queue(dsn)
    try:
        master.wait_for_event("master_started", command.where())
        (project / "tasks" / "flaky.py").write_text(flaky.body)
        edit(project / "tasks" / "app.py", include.body, include.where())
        os.kill(proc.pid, signal.SIGHUP)
        master.wait_for_event("reload_done", "after SIGHUP")
        job_id, _ = queue.enqueue(brooq.Job("flaky.call", {}))
        record = queue.wait(job_id, timeout=LOG_TIMEOUT)
        assert (record.state, record.attempts, record.result) == ("done", 2, {"attempt": 2})
        assert proc.poll() is None
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=LOG_TIMEOUT) == 0
    finally:
        queue.close()
        master.kill()
        print(master.text())
