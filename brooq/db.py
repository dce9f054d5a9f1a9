"""Connections: opened late, named without passwords, errors made readable."""

from __future__ import annotations

from typing import Any

import psycopg

from brooq.dsn import describe
from brooq.errors import DatabaseUnavailable, SchemaMissing

CONNECT_TIMEOUT = 5


def unavailable(dsn: str, exc: BaseException) -> DatabaseUnavailable:
    """A DatabaseUnavailable naming the database and libpq's reason, never the password."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return DatabaseUnavailable(f"cannot reach the database {describe(dsn)}: {reason}")


def connect(dsn: str, **kwargs: Any) -> psycopg.Connection[tuple[Any, ...]]:
    kwargs.setdefault("connect_timeout", CONNECT_TIMEOUT)
    try:
        return psycopg.connect(dsn, **kwargs)
    except psycopg.OperationalError as exc:
        raise unavailable(dsn, exc) from None


def schema_missing(exc: psycopg.errors.UndefinedTable) -> SchemaMissing:
    return SchemaMissing(
        f"{exc.diag.message_primary or exc}: the brooq schema is not installed in this "
        "database; run `brooq migrate up` (a deployment step) first"
    )
