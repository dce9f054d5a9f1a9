"""Running behind a transaction pooler (PgBouncer's pool_mode=transaction; docs/poolers.md).

A transaction pooler hands each transaction to whichever server connection is free, so
nothing may outlive a transaction on a connection through it: no session setting, no
prepared statement, no LISTEN, no session advisory lock. ``QUEUE_POOLER=transaction``
(Settings.pooler) says DATABASE_URL goes through one.

Owns: how brooq's connections on DATABASE_URL are opened in each mode (brooq's session
settings in the libpq ``options`` startup parameter, or no ``options`` and prepared
statements off), the parameters of the statement that sets those settings for one
transaction instead, the rule that the pooled mode needs a direct connection for LISTEN,
and the readable errors for a pooler brooq was not told about.
Must never: open a connection, run SQL itself (callers do), or show a connection string.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg

from brooq.dsn import CLIENT_ENCODING, session_options
from brooq.errors import PoolerMismatch

NONE = "none"
TRANSACTION = "transaction"

HOW = (
    "set QUEUE_POOLER=transaction, and QUEUE_LISTEN_DATABASE_URL to a connection that "
    "reaches PostgreSQL directly (docs/poolers.md)"
)
# PgBouncer's answer to a startup parameter it does not know (`options` among them).
REFUSED = "unsupported startup parameter"


def connect_kwargs(mode: str, dsn: str, session: Mapping[str, str]) -> dict[str, Any]:
    """psycopg.connect's keyword arguments for one of brooq's connections on ``dsn``.

    Direct: ``session`` rides in the ``options`` startup parameter (added to the DSN's
    own). Pooled: no ``options`` (PgBouncer refuses the parameter, or with
    ignore_startup_parameters drops it silently), and no prepared statements: one
    prepared on a server connection is unknown to the next transaction's (PgBouncer
    before 1.21 does not track them). ``prepare_threshold=None`` also overrides the
    ``prepare=True`` of brooq's hot statements. Both: UTF-8 (dsn.CLIENT_ENCODING)."""
    if mode == TRANSACTION:
        return {"prepare_threshold": None, "client_encoding": CLIENT_ENCODING}
    if session:
        return {"options": session_options(dsn, session), "client_encoding": CLIENT_ENCODING}
    return {"client_encoding": CLIENT_ENCODING}


def local_params(session: Mapping[str, str]) -> dict[str, list[str]]:
    """The parameters of Q.session_settings_local for ``session``."""
    return {"names": list(session), "values": [str(v) for v in session.values()]}


def need_direct(mode: str, dsn: str, listen_dsn: str, who: str) -> str | None:
    """The problem with running ``who`` pooled without a direct connection, if any."""
    if mode == TRANSACTION and listen_dsn == dsn:
        return (
            f"{who}: QUEUE_POOLER=transaction needs QUEUE_LISTEN_DATABASE_URL (or "
            "QUEUE_LISTEN_DATABASE_URL_FILE), a connection that reaches PostgreSQL "
            "directly: LISTEN cannot go through a transaction pooler"
        )
    return None


def refused_hint(reason: str) -> str:
    """What to add to a connect failure's reason when a pooler refused ``options``."""
    if REFUSED in reason:
        return f" (a pooler such as PgBouncer refuses brooq's session options: {HOW})"
    return ""


def options_ignored(name: str, wanted: str, got: str) -> PoolerMismatch:
    return PoolerMismatch(
        f"the server has {name}={got}, not the {wanted} brooq asked for in the connection's "
        f"options: something between brooq and PostgreSQL (a pooler with "
        f"ignore_startup_parameters) drops them; {HOW}"
    )


# SQLSTATEs of a prepared statement the server connection does not have (26000), has
# already (42P05); a Bind naming another statement's prepared name is a protocol error.
_PREPARED_STATES = ("26000", "42P05")


def prepared_mismatch(exc: psycopg.Error) -> PoolerMismatch | None:
    """A readable error for a prepared statement lost to a transaction pooler, or None."""
    message = (exc.diag.message_primary or str(exc)) if exc.diag else str(exc)
    if exc.sqlstate in _PREPARED_STATES or (
        exc.sqlstate == "08P01" and "prepared statement" in message
    ):
        return PoolerMismatch(
            f"{message.strip()}: the connection's transactions run on different server "
            "connections, as behind a transaction pooler (PgBouncer before 1.21, or "
            f"without max_prepared_statements), so brooq's prepared statements break; {HOW}"
        )
    return None
