"""The `brooq` command: migrations and the operator's reads and writes.

Exit codes: 0 success; 1 refused (unknown id, a transition the job's state does not allow,
database unreachable or schema missing) or an internal error; 2 bad usage (unknown option,
malformed id or value, no database configured, a database that is a read-only standby,
a bulk change not confirmed).
Errors are one line on stderr, never a traceback.

The commands live in modules of their own, each registering on the group of
brooq.cli.common:

- `common`: the `brooq` group and what its commands share (the databases, output, times)
- `migrate`: `brooq migrate up|down|status|sql`, the schema as a deployment step
- `jobs`: the `jobs` group and `brooq jobs list|show|stack`, one job or a listing read
- `cancel_retry`: `brooq [jobs] cancel|retry|hold|release`, one job or every job of a topic
  in a state
- `purge`: `brooq purge --queue Q / --topic T`, every job not yet taken canceled
- `enqueue`: `brooq enqueue TOPIC`, one job from the command line
- `events`: `brooq events emit KEY` and `brooq events waits`, durable handlers' events
- `stats`: `brooq stats`, jobs per queue, topic and state
- `top`: `brooq top`, a live view of the queue on a terminal
- `queues`: `brooq queues [pause|resume NAME]`, the queues and pausing one
- `limits`: `brooq limits list|set|clear`, the groups' own limits set at runtime
- `keys`: `brooq keys [unblock TOPIC KEY]`, the blocked ordered keys and unblocking one
- `periodic`: `brooq periodic --app MODULE:ATTR`, the schedules an application registers
- `fleet`: `brooq fleet`, the live masters and their children
- `terminal`: what every command prints for a person, made harmless on a terminal
- `sql`: `brooq sql list|show`, brooq's SQL statements and each as it runs

Owns: ``main``, the entry point of ``brooq`` and ``python -m brooq``: turning every
error into one line on stderr and its exit code, and hiding --database and
--read-database-url from ps.
Must never: run in the master or a child, talk to the database itself, or let a traceback
reach the operator.
"""

from __future__ import annotations

import logging
import os
import sys

import click
import psycopg
from setproctitle import setproctitle

from brooq import migrate as migrate_mod  # noqa: F401  (tests replace migrate_mod.script)
from brooq.cli import (  # noqa: F401  (they register)
    cancel_retry,
    enqueue,
    events,
    fleet,
    jobs,
    keys,
    limits,
    migrate,
    periodic,
    purge,
    queues,
    sql,
    stats,
    top,
)
from brooq.cli.common import cli
from brooq.cli.jobs import show_lines
from brooq.cli.stats import stats_lines
from brooq.cli.terminal import one_line, say
from brooq.errors import (
    BrooqError,
    InvalidDsn,
    InvalidJob,
    InvalidJobId,
    InvalidSettings,
    ReadOnlyDatabase,
)

__all__ = ["cli", "main", "show_lines", "stats_lines"]

# Errors that mean "the command was given something wrong" (exit 2); every other
# BrooqError means "refused" (exit 1).
USAGE_ERRORS = (InvalidDsn, InvalidJob, InvalidJobId, InvalidSettings, ReadOnlyDatabase)

# click >= 8.2 raises this for a group called without a command.
NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


# The options whose value may hold a password: hidden from ps.
SECRET_OPTIONS = ("--database", "--read-database-url")


def _hide_database(argv: list[str]) -> str:
    """The command line as ps should show it: the values of --database and
    --read-database-url replaced by *** (only what ps shows changes; click parses
    sys.argv, a copy)."""
    words = ["brooq"]
    hide_next = False
    for word in argv:
        name = word.partition("=")[0]
        if hide_next:
            word, hide_next = "***", False
        elif word in SECRET_OPTIONS:
            hide_next = True
        elif name in SECRET_OPTIONS:
            word = f"{name}=***"
        words.append(word)
    return " ".join(words)


def _one_line(text: str) -> str:
    """A message on one line: "invalid settings:\n  - a\n  - b" -> "invalid settings: a; b"."""
    parts = [_unbullet(line.strip()) for line in str(text).splitlines() if line.strip()]
    if len(parts) < 2:
        return "".join(parts)
    return parts[0] + (" " if parts[0].endswith(":") else "; ") + "; ".join(parts[1:])


def _unbullet(line: str) -> str:
    """A list item's text without its "- " bullet; "--timeout ..." keeps its dashes."""
    return line[2:] if line.startswith("- ") else line


def _fail(message: str, code: int) -> None:
    say(f"error: {one_line(_one_line(message))}", err=True)
    sys.exit(code)


def main() -> None:
    """Entry point: every error becomes one line on stderr and the documented exit code."""
    # The pool logs each failed reconnection; the command reports the error itself, once
    # (and `brooq top` must not have log lines written over its screen).
    pool_log = logging.getLogger("psycopg.pool")
    pool_log.addHandler(logging.NullHandler())
    pool_log.propagate = False
    # A DSN with its password in the arguments is readable by every local user in
    # /proc/PID/cmdline; a command such as `brooq top` can run for hours.
    if any(arg.partition("=")[0] in SECRET_OPTIONS for arg in sys.argv[1:]):
        setproctitle(_hide_database(sys.argv[1:]))
    try:
        code = cli.main(prog_name="brooq", standalone_mode=False)
    except NO_ARGS_IS_HELP as exc:  # `brooq` or `brooq jobs` alone: the help, as click does
        exc.show()
        sys.exit(2)
    except click.UsageError as exc:
        hint = f" (see: {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
        _fail(exc.format_message() + hint, 2)
    except click.ClickException as exc:
        _fail(exc.format_message(), exc.exit_code)
    except click.Abort:  # Ctrl-C at a prompt or while waiting on the database
        sys.exit(130)
    except USAGE_ERRORS as exc:
        _fail(str(exc), 2)
    except BrooqError as exc:
        _fail(str(exc), 1)
    except psycopg.Error as exc:
        _fail(f"database error: {exc}", 1)
    except BrokenPipeError:
        # The reader went away (brooq jobs list | head): stop quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except Exception as exc:
        # A last resort: bad input is refused above with exit 2; anything arriving here is
        # a defect of brooq, still reported as one line (and exit 1), never a traceback.
        _fail(f"internal error: {type(exc).__name__}: {exc}", 1)
    sys.exit(code if isinstance(code, int) else 0)
