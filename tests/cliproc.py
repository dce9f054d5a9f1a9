"""`python -m brooq ARGS` in a process of its own, forked from one that has imported brooq.

Why: the suite runs the operator command some 600 times; each new interpreter spent about
0.28 s of CPU importing brooq, click and psycopg before doing anything, a quarter of the
CPU the whole suite used. A zygote process imports them once per test process; each
invocation is a fork of it: a process of its own with the given arguments, environment,
working directory, stdin and stdout/stderr files, which runs brooq's `__main__` as `python
-m brooq` does and exits with its code (an uncaught exception: its traceback and 1, as the
interpreter would). Nothing of one invocation reaches the next.

The interpreter's own settings (PYTHON*, LANG, LC_*: read at its start, PYTHONPATH among
them) get a zygote of their own. A call made while another is under way (a test that runs
two commands at once) gets a new interpreter (subprocess.run), and so does an argument
list that exec would refuse (tests/db/test_cli_refusals.py holds that refusal). The installed
`brooq` script itself is run as a new process by tests/db/test_install.py.
"""

from __future__ import annotations

import atexit
import json
import locale
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Read by the zygote (python -c): serve one request a line, answer its exit code.
ZYGOTE = r"""
import atexit, json, os, random, runpy, signal, sys, traceback
import brooq.cli  # the imports every invocation shares

def child(req):
    code = 1
    try:
        signal.alarm(req["timeout"])
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        for fd, (path, flags) in enumerate(
            [(req["stdin"] or os.devnull, os.O_RDONLY),
             (req["stdout"], os.O_WRONLY | os.O_TRUNC),
             (req["stderr"], os.O_WRONLY | os.O_TRUNC)]):
            opened = os.open(path, flags)
            os.dup2(opened, fd)
            os.close(opened)
        random.seed()
        sys.argv = ["-m", *req["args"]]
        try:
            runpy.run_module("brooq", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)

for line in sys.stdin:
    req = json.loads(line)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        child(req)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    sys.stdout.write(json.dumps(code) + "\n")
    sys.stdout.flush()
"""

# Settings the interpreter reads at its start: a request that changes one needs its own.
_AT_START = ("PYTHON", "LANG", "LC_")


class _Zygote:
    """One zygote, for the requests of one set of interpreter settings."""

    def __init__(self, env: dict[str, str]) -> None:
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=ROOT,
        )
        atexit.register(self.stop)

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# Linux refuses to exec an argument of 128 KiB or more (MAX_ARG_STRLEN): such a call goes
# to exec, so that it fails as the command line would.
MAX_ARG = 128 * 1024


def _beyond_exec(args: list[str], env: dict[str, str]) -> bool:
    sizes = [len(a.encode()) + 1 for a in args]
    sizes += [len(k.encode()) + len(v.encode()) + 2 for k, v in env.items()]
    return max(sizes, default=0) >= MAX_ARG or sum(sizes) >= 1024 * 1024


_zygotes: dict[tuple[tuple[str, str], ...], _Zygote] = {}
_zygotes_lock = threading.Lock()


def _zygote_for(env: dict[str, str]) -> _Zygote:
    key = tuple(sorted((k, v) for k, v in env.items() if k.startswith(_AT_START)))
    with _zygotes_lock:
        zygote = _zygotes.get(key)
        if zygote is None or zygote.proc.poll() is not None:
            zygote = _zygotes[key] = _Zygote(env)
        return zygote


def run_brooq(
    args: list[str],
    *,
    env: dict[str, str],
    cwd: Path = ROOT,
    stdin: str | None = None,
    timeout: int = 60,
) -> subprocess.CompletedProcess[str]:
    """`python -m brooq *args` with exactly ``env``: as subprocess.run(..., text=True,
    capture_output=True) answers it."""
    zygote = _zygote_for(env)
    if _beyond_exec(args, env) or not zygote.lock.acquire(blocking=False):
        return subprocess.run(
            [sys.executable, "-m", "brooq", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=cwd,
            input=stdin,
        )
    try:
        proc = zygote.proc
        with tempfile.TemporaryDirectory(prefix="brooq-cli-") as tmp:
            paths = {name: Path(tmp) / name for name in ("stdin", "stdout", "stderr")}
            for path in paths.values():
                path.touch()
            if stdin is not None:
                paths["stdin"].write_text(stdin)
            request = {
                "args": args,
                "env": env,
                "cwd": str(cwd),
                "stdin": str(paths["stdin"]) if stdin is not None else None,
                "stdout": str(paths["stdout"]),
                "stderr": str(paths["stderr"]),
                "timeout": timeout,
            }
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            answer = proc.stdout.readline()
            if not answer:
                raise RuntimeError("the brooq CLI zygote died")
            encoding = locale.getpreferredencoding(False)
            return subprocess.CompletedProcess(
                [sys.executable, "-m", "brooq", *args],
                json.loads(answer),
                paths["stdout"].read_text(encoding),
                paths["stderr"].read_text(encoding),
            )
    finally:
        zygote.lock.release()
