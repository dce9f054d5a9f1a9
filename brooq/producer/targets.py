"""What a caller's transaction may be: the connections brooq.enqueue and brooq.enqueue_many
write through, and the psycopg connection behind a framework's.

``target`` is a psycopg Connection or Cursor, a Django connection (``django.db.connection``
or ``connections[alias]``) or a SQLAlchemy Session or Connection on psycopg 3; the async
forms take a psycopg AsyncConnection or AsyncCursor. The job joins the transaction of
whichever it is.

Owns: telling these apart (a TypeError naming what is accepted otherwise), reaching the
psycopg connection of a framework's object, and the cursor brooq's statements run on.
Must never: commit, roll back or change the caller's connection (its row_factory
included: statements run on a cursor of their own); import Django or SQLAlchemy (an
object is one of theirs only if its module is already in ``sys.modules``, as
brooq/declare/payloads.py finds pydantic).
"""

from __future__ import annotations

import sys
from typing import Any

import psycopg
from psycopg.rows import scalar_row

Target = psycopg.Connection[Any] | psycopg.Cursor[Any]
AsyncTarget = psycopg.AsyncConnection[Any] | psycopg.AsyncCursor[Any]
# What brooq.enqueue and brooq.enqueue_many take: a Target, or a Django connection or a
# SQLAlchemy Session/Connection on psycopg 3 (told apart at run time: typed ``object`` so
# that a type checker accepts them without brooq naming the frameworks' types).
AnyTarget = Target | object


def cursor(target: Target) -> psycopg.Cursor[Any]:
    """A new cursor on the caller's connection, so in the caller's transaction, that
    returns the id column itself (scalar_row: every statement of brooq.producer.insert answers
    ids) whatever row_factory the caller chose (dict_row, class_row, ...) and whatever
    kind of cursor was passed (a server-side one cannot run an INSERT)."""
    conn = target if isinstance(target, psycopg.Connection) else target.connection
    return conn.cursor(row_factory=scalar_row)


def async_cursor(target: AsyncTarget) -> psycopg.AsyncCursor[Any]:
    """``cursor`` for an AsyncConnection or AsyncCursor."""
    conn = target if isinstance(target, psycopg.AsyncConnection) else target.connection
    return conn.cursor(row_factory=scalar_row)


_ACCEPTED = (
    "a psycopg Connection or Cursor, a Django connection or a SQLAlchemy "
    "Session/Connection (psycopg 3)"
)


def resolve_target(target: object, caller: str) -> Target:
    """The psycopg connection behind a framework object, so that the job joins the
    framework's transaction; a TypeError naming what is accepted otherwise. Called only
    once ``target`` is known not to be a psycopg Connection or Cursor."""
    if isinstance(target, psycopg.AsyncConnection | psycopg.AsyncCursor):
        raise TypeError(
            f"{caller} takes a psycopg Connection or Cursor, not an async one: "
            f"use {caller}_async for a {type(target).__name__}"
        )
    raw = _django_connection(target)
    if raw is not None:
        return _driver_checked(raw, caller, "a Django connection", "Django's psycopg 3 backend")
    raw = _sqlalchemy_connection(target)
    if raw is not None:
        return _driver_checked(
            raw, caller, "a SQLAlchemy connection", "the postgresql+psycopg:// dialect"
        )
    raise TypeError(f"{caller} takes {_ACCEPTED}, not {_type_name(target)}")


def _type_name(value: object) -> str:
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"


def _driver_checked(raw: object, caller: str, what: str, needed: str) -> Target:
    if isinstance(raw, psycopg.Connection):
        return raw
    if isinstance(raw, psycopg.AsyncConnection):
        hint = f"an asyncio engine's (use {caller}_async on its psycopg AsyncConnection)"
    else:
        hint = f"{type(raw).__module__.split('.')[0]}'s {type(raw).__name__}"
    raise TypeError(f"{caller} takes {what} only on psycopg 3 ({needed}); this one is {hint}")


def _django_connection(target: object) -> object | None:
    """The DB-API connection of a Django connection wrapper (``django.db.connection``, a
    proxy to the default alias's wrapper, or ``connections[alias]``), else None. Opens it
    if need be: in Django's autocommit mode (outside ``atomic``) the job commits at once."""
    proxy = sys.modules.get("django.utils.connection")
    if proxy is None:  # imported by django.db, which every Django connection comes from
        return None
    if not isinstance(target, proxy.ConnectionProxy):
        base = sys.modules.get("django.db.backends.base.base")
        if base is None or not isinstance(target, base.BaseDatabaseWrapper):
            return None
    wrapper: Any = target
    wrapper.ensure_connection()
    wrapper.validate_no_broken_transaction()  # as Django's own cursors refuse to run then
    raw: object = wrapper.connection
    return raw


def _sqlalchemy_connection(target: object) -> object | None:
    """The driver connection of a SQLAlchemy Session (its transaction for the default
    bind, begun if need be) or Connection (a transaction begun if none is, as SQLAlchemy
    would on its next statement: else its commit() would not commit the job), else None."""
    orm = sys.modules.get("sqlalchemy.orm")
    engine = sys.modules.get("sqlalchemy.engine")
    if engine is None:
        return None
    conn: Any
    if orm is not None and isinstance(target, orm.Session | orm.scoped_session):
        conn = target.connection()
    elif isinstance(target, engine.Connection):
        conn = target
        if not conn.in_transaction():
            conn.begin()
    else:
        return None
    raw: object = conn.connection.driver_connection
    return raw
