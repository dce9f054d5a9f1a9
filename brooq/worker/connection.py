"""The child's one database connection: opened after the fork, reopened after a failure.

Owns connecting (with brooq's session settings in the ``options`` startup parameter, or,
behind a transaction pooler, set for each transaction by ``scoped``: brooq.db; backing
off while the database is unreachable or a standby: brooq.db), dropping a broken
connection, the `db_error` log line, and the payload decoder that turns a payload json
cannot read into an Undecodable (the job then fails with the reason instead of crashing
the child on every claim).

Must never be shared with the master or opened before the fork (a libpq connection does
not survive one), never run a statement itself but its own settings' (the check at
connect that they arrived, UTC under its own name, the look for a standby on PostgreSQL
13, and behind a pooler their per-transaction form; the claim loop and the outcome
writer run the rest), and never wait for the database once the child is stopping: it
raises Stop.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.adapt import Buffer, Loader
from psycopg.types.json import set_json_loads

from brooq.db import (
    TRANSACTION,
    connect_kwargs,
    local_params,
    options_ignored,
    refuse_standby,
    refused_hint,
)
from brooq.dsn import server_codec
from brooq.errors import ReadOnlyDatabase
from brooq.settings import Settings
from brooq.sql import Q
from brooq.worker.state import ChildState

log = logging.getLogger("brooq.child")


# The time zone names that are UTC under another name (PostgreSQL's tz database); GMT
# and its aliases are left alone (the same offsets, but another abbreviation in to_char).
UTC_NAMES = frozenset(
    (b"Etc/UTC", b"Etc/Universal", b"Etc/Zulu", b"Etc/UCT", b"Universal", b"Zulu", b"UCT")
)


class Stop(Exception):
    """Leave the loop: the child is stopping while it waits for the database."""


class ChildConnection:
    def __init__(self, dsn: str, identity: str, settings: Settings, state: ChildState) -> None:
        self.dsn = dsn
        self.identity = identity
        self.settings = settings
        self.state = state
        self.conn: psycopg.Connection[Any] | None = None
        # The database's encoding when it is not UTF-8 (brooq.dsn.server_codec): the
        # error texts written must fit it. Read at each connect.
        self.codec: str | None = None
        # Behind a transaction pooler: the parameters of Q.session_settings_local.
        self.local: dict[str, list[str]] | None = None
        if settings.pooler == TRANSACTION:
            self.local = local_params(self.session())

    def get(self) -> psycopg.Connection[Any]:
        """The open connection, connecting first if there is none; raises Stop when the
        child stops while the database is unreachable."""
        delay = 0.1
        while self.conn is None or self.conn.closed:
            if self.state.stopping:
                raise Stop
            try:
                self.conn = self._connect()
            except (psycopg.OperationalError, ReadOnlyDatabase) as exc:
                reason = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
                log.warning(
                    "event=db_unreachable who=child worker=%s retry_in=%.1fs error=%r",
                    self.identity,
                    delay,
                    reason + refused_hint(reason),
                )
                self.state.sleep(delay)
                delay = min(delay * 2, 5.0)
        return self.conn

    def session(self) -> dict[str, str]:
        """The child's session settings.

        No bitmap scans for brooq's own statements: before the job table's first ANALYZE
        the planner would read every ready row of the ready index and sort them for each
        claim. No sequential
        scans either: every statement of a child finds its rows through an index, and
        the generic plans made after an ANALYZE of a nearly empty table (a fresh
        deployment) read the whole table in every claim until the next ANALYZE
        (docs/explanation/held-snapshots.md). No sorts: a claim reads the ready
        index in its order and stops at the limit; the same plans, given an index of the
        ready rows by available_at alone, read every ready row of it and sorted them by
        priority, in every claim. Generic plans
        for them: with `auto`, PostgreSQL planned every claim anew, and planning was a
        large share of a claim's cost; the generic plans
        are the ones the EXPLAIN tests guard. Users' on_success writes get both defaults
        back (Q.session_planner_defaults)."""
        return {
            "synchronous_commit": self.settings.worker_synchronous_commit,
            "enable_bitmapscan": "off",
            "enable_seqscan": "off",
            "enable_sort": "off",
            "plan_cache_mode": "force_generic_plan",
        }

    def _connect(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(
            self.dsn,
            autocommit=True,
            connect_timeout=5,
            application_name=f"brooq-child {self.identity}"[:63],
            # Direct: added to the DSN's own options (search_path, ...), never instead.
            **connect_kwargs(self.settings.pooler, self.dsn, self.session()),
        )
        # A standby claims nothing: said (event=db_unreachable) and tried again with the
        # backoff, as an unreachable server is, until the DSN reaches a primary.
        refuse_standby(conn)
        if self.local is None:
            # A pooler that drops the options (ignore_startup_parameters) must not leave
            # the child planning and committing with settings it did not ask for, and
            # its prepared statements on server connections it does not own: say so
            # (once a connection) instead of failing later with a stranger error.
            got = conn.execute(Q.session_setting_get, {"name": "enable_bitmapscan"}).fetchone()
            if got is None or got[0] != "off":
                conn.close()
                raise options_ignored("enable_bitmapscan", "off", str(got[0]) if got else "?")
            # Another name of UTC becomes UTC: psycopg then loads each timestamp (two a
            # claimed job) without a zoneinfo conversion. Not behind a transaction pooler,
            # where a session setting would not stay with this client.
            if conn.pgconn.parameter_status(b"TimeZone") in UTC_NAMES:
                conn.execute(Q.session_time_zone_utc)
        # A payload that cannot be decoded (inserted by hand, nested too deep)
        # must fail its job, not crash the child on every claim.
        set_json_loads(_decode_payload, conn)
        # The claims' payloads come as text: decoded by one call per payload (the
        # loader of set_json_loads adds two), a JSON null (a job without a payload)
        # without the decoder at all.
        for name in ("json", "jsonb"):
            conn.adapters.register_loader(name, _PayloadLoader)
        self.codec = server_codec(conn)
        return conn

    @contextlib.contextmanager
    def scoped(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        """Around one autocommit statement (its own transaction): behind a transaction
        pooler, the session settings go first in the same pipeline, so the server runs
        both in one implicit transaction (the segment up to the Sync) and the statement
        is planned and committed with them, in the same one round trip. Direct: nothing
        (the session has them)."""
        if self.local is None:
            yield
            return
        with conn.pipeline():
            conn.execute(Q.session_settings_local, self.local)
            yield

    def apply_local(self, conn: psycopg.Connection[Any]) -> None:
        """Inside an explicit transaction, behind a transaction pooler: the session
        settings for the rest of it (one statement more). Direct: nothing."""
        if self.local is not None:
            conn.execute(Q.session_settings_local, self.local)

    def failed(self, during: str, exc: BaseException) -> None:
        """A statement failed on the connection: log it and drop the connection (the
        next get() reconnects)."""
        log.warning(
            "event=db_error who=child worker=%s during=%s error=%r",
            self.identity,
            during,
            str(exc).strip().splitlines()[0] if str(exc) else exc,
        )
        self.drop()

    def drop(self) -> None:
        if self.conn is not None:
            # A broken connection may fail to close; it is gone either way.
            with contextlib.suppress(Exception):
                self.conn.close()
        self.conn = None


class Undecodable:
    """Stands for a payload that json could not decode; the job fails with the reason."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


def _decode_payload(data: bytes | str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        return Undecodable(f"{type(exc).__name__}: {str(exc)[:200]}")


# json.loads without its checks of the argument: what PostgreSQL sends is UTF-8 text
# (json.loads would find that out for every payload, and decode it as this does).
_decode_text = json.JSONDecoder().decode


class _PayloadLoader(Loader):
    """A json or jsonb value in text format, decoded as _decode_payload does."""

    def load(self, data: Buffer) -> Any:
        if data == b"null":
            return None
        try:
            return _decode_text(bytes(data).decode("utf-8", "surrogatepass"))
        except (ValueError, RecursionError) as exc:
            return Undecodable(f"{type(exc).__name__}: {str(exc)[:200]}")
