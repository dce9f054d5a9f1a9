"""Where the connection strings come from (the DSN, the direct one for LISTEN, the read
target of the operator's reads), and how to name a database without its password."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from psycopg import conninfo

from brooq.errors import InvalidDsn

# brooq's own connections that carry jobs' text (the producers' pools and line, the
# children, the master's, the status page's, the commands') talk UTF-8, whatever the
# database's encoding. psycopg decodes a jsonb answer as UTF-8 regardless of the
# connection's client_encoding, so on a LATIN1 database a payload holding "é" came back
# undecodable (queue.get raised UnicodeDecodeError, a child failed the job). With UTF8
# the server converts both ways, and text the database cannot hold is refused by it
# with a message naming the character. The caller's own connections
# (brooq.enqueue(conn, ...)) keep the caller's setting.
CLIENT_ENCODING = "UTF8"


def server_codec(conn: Any) -> str | None:
    """The Python codec of the database's own encoding when it is not UTF-8 (what text
    brooq writes must fit, as brooq.worker.execute.storable makes it), None for UTF8
    and SQL_ASCII (which stores the UTF-8 bytes brooq sends as they are). An encoding
    Python has no codec for gives "ascii": every non-ASCII character is then escaped."""
    name = str(conn.info.parameter_status("server_encoding") or "UTF8")
    if name in ("UTF8", "SQL_ASCII"):
        return None
    try:  # psycopg's own table of PostgreSQL's encodings (not public API: guarded)
        from psycopg._encodings import pg2pyenc

        return str(pg2pyenc(name.encode()))
    except Exception:  # unknown to it, or moved: be safe rather than fail a write
        return "ascii"


CREDENTIAL_NAME = "database-url"
LISTEN_CREDENTIAL_NAME = "listen-database-url"
READ_CREDENTIAL_NAME = "read-database-url"


def _read_file(path: str, what: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise InvalidDsn(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InvalidDsn(f"{what} {path} is not UTF-8 text") from None
    if not text:
        raise InvalidDsn(f"{what} {path} is empty")
    return text


def resolve(
    explicit: str | None = None,
    environ: Mapping[str, str] | None = None,
    explicitly: str = "--database",
) -> str:
    """The DSN: the explicit argument, else DATABASE_URL, else the file named by
    DATABASE_URL_FILE, else the systemd credential ``database-url``. Empty counts as unset.
    ``explicitly``: how the caller's user gives one (a flag for a command, an argument
    for Python), named in the error."""
    env = os.environ if environ is None else environ
    if explicit is not None and explicit.strip():
        return check(explicit.strip())
    url = env.get("DATABASE_URL", "").strip()
    if url:
        return check(url)
    path = env.get("DATABASE_URL_FILE", "").strip()
    if path:
        return check(_read_file(path, "DATABASE_URL_FILE"))
    creds = env.get("CREDENTIALS_DIRECTORY", "").strip()
    if creds and (Path(creds) / CREDENTIAL_NAME).exists():
        return check(_read_file(str(Path(creds) / CREDENTIAL_NAME), "credential"))
    raise InvalidDsn(
        "no database configured: set DATABASE_URL, DATABASE_URL_FILE, or a systemd "
        f"credential named {CREDENTIAL_NAME!r}, or give {explicitly}"
    )


def resolve_listen(
    dsn: str, explicit: str | None = None, environ: Mapping[str, str] | None = None
) -> str:
    """The direct connection string (docs/poolers.md): the explicit argument, else
    QUEUE_LISTEN_DATABASE_URL, else the file named by QUEUE_LISTEN_DATABASE_URL_FILE,
    else the systemd credential ``listen-database-url``, else ``dsn`` itself. LISTEN
    cannot go through a transaction pooler, so every LISTEN brooq makes (the master's,
    queue.wait's, a stack request's), the master's own connections and ``brooq
    migrate`` (a session lock) use this one."""
    if explicit is not None and explicit.strip():
        return check(explicit.strip(), "the direct connection string (listen_dsn)")
    found = _configured("QUEUE_LISTEN_DATABASE_URL", LISTEN_CREDENTIAL_NAME, environ)
    return dsn if found is None else found


def resolve_read(
    explicit: str | None = None,
    environ: Mapping[str, str] | None = None,
    explicitly: str = "--read-database-url",
) -> str | None:
    """The read target (docs/how-to/read-replica.md): where the status page and the
    commands that only read (``brooq stats``, ``top``, ``jobs list``...) read, a
    standby most often. The explicit argument (``explicitly`` names it in an error),
    else QUEUE_READ_DATABASE_URL, else the file named by QUEUE_READ_DATABASE_URL_FILE,
    else the systemd credential ``read-database-url``; None when none is set: the reads
    go where the writes go. Nothing that writes ever uses it."""
    if explicit is not None and explicit.strip():
        return check(explicit.strip(), explicitly)
    return _configured("QUEUE_READ_DATABASE_URL", READ_CREDENTIAL_NAME, environ)


def _configured(
    variable: str, credential: str, environ: Mapping[str, str] | None = None
) -> str | None:
    """A connection string of brooq's besides the DSN: the variable, else the file named
    by the variable with _FILE, else the systemd credential; None when none is set (an
    empty value counts as unset). Checked, never echoed."""
    env = os.environ if environ is None else environ
    url = env.get(variable, "").strip()
    if url:
        return check(url, variable)
    path = env.get(f"{variable}_FILE", "").strip()
    if path:
        return check(_read_file(path, f"{variable}_FILE"), f"{variable}_FILE")
    creds = env.get("CREDENTIALS_DIRECTORY", "").strip()
    if creds and (Path(creds) / credential).exists():
        text = _read_file(str(Path(creds) / credential), "credential")
        return check(text, f"the credential {credential}")
    return None


# SQLAlchemy's form of a URL names its driver after the scheme: postgresql+psycopg://.
# libpq knows only postgresql:// and postgres://. The drivers that speak libpq's
# protocol the way brooq's psycopg 3 does are dropped from it; any other is refused.
_DRIVER_URL = re.compile(r"(postgres(?:ql)?)\+([A-Za-z0-9_.-]{0,40})://", re.IGNORECASE)
DRIVERS_DROPPED = ("psycopg", "psycopg2")


def without_driver(dsn: str, what: str = "the database connection string") -> str:
    """``dsn`` without SQLAlchemy's driver suffix: ``postgresql+psycopg://...`` and
    ``postgresql+psycopg2://...`` become ``postgresql://...``; InvalidDsn naming the
    suffix for any other driver (``+asyncpg``, ``+pg8000``: brooq connects with psycopg
    3, whatever the URL names). Any other DSN is returned as it is."""
    found = _DRIVER_URL.match(dsn)
    if found is None:
        return dsn
    scheme, driver = found.groups()
    if driver.lower() not in DRIVERS_DROPPED:
        raise InvalidDsn(
            f"{what} names the driver '+{driver}' ({scheme}+{driver}://): brooq connects "
            "with psycopg 3 and accepts postgresql://, postgres://, postgresql+psycopg:// "
            "and postgresql+psycopg2:// (the suffix is dropped)"
        )
    return f"{scheme.lower()}://{dsn[found.end() :]}"


def check(dsn: str, what: str = "the database connection string") -> str:
    """The DSN without SQLAlchemy's driver suffix (``without_driver``); refuse one that
    libpq cannot parse, without echoing it (it may hold a password)."""
    dsn = without_driver(dsn, what)
    try:
        conninfo.conninfo_to_dict(dsn)
    except Exception:
        raise InvalidDsn(
            f"{what} cannot be parsed; expected "
            "postgresql://user@host:port/dbname or 'host=... dbname=...' "
            "(the value is not shown because it may contain a password)"
        ) from None
    return dsn


def describe(dsn: str) -> str:
    """user@host:port/dbname, never the password."""
    try:
        params = conninfo.conninfo_to_dict(without_driver(dsn))
    except Exception:
        return "<unparsable dsn>"
    user = params.get("user") or os.environ.get("PGUSER") or ""
    host = params.get("host") or params.get("hostaddr") or "localhost"
    port = params.get("port") or "5432"
    db = params.get("dbname") or user
    return f"{user}@{host}:{port}/{db}" if user else f"{host}:{port}/{db}"


_SETTING_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


def _escape_option(value: str) -> str:
    # The server splits `options` at whitespace; a backslash keeps the next character.
    return re.sub(r"(\s|\\)", r"\\\1", value)


def session_options(
    dsn: str, settings: Mapping[str, str], environ: Mapping[str, str] | None = None
) -> str:
    """The libpq ``options`` of one of brooq's own connections: the user's options (the
    DSN's ``options``, else the ``PGOPTIONS`` environment variable, as libpq would pick
    them), then ``-c name=value`` for each of ``settings``.

    Passing ``options=`` to connect replaces the DSN's and ``PGOPTIONS`` entirely, so a
    ``search_path`` (or any ``-c``) given there would be lost. Keeping them first and
    brooq's after means the server applies brooq's last: they win for the settings brooq
    owns, and only for those."""
    env = os.environ if environ is None else environ
    try:
        params = conninfo.conninfo_to_dict(without_driver(dsn))
    except InvalidDsn:
        raise
    except Exception:
        raise InvalidDsn("the database connection string cannot be parsed") from None
    user = params.get("options")
    if user is None:
        user = env.get("PGOPTIONS")
    parts = [str(user).strip()] if user and str(user).strip() else []
    for name, value in settings.items():
        if not _SETTING_NAME.fullmatch(name):
            raise ValueError(f"not a setting name: {name!r}")
        parts.append(f"-c {name}={_escape_option(str(value))}")
    return " ".join(parts)


# -- connect timeouts and the host that answers -------------------------------------------

# brooq's connect timeout, in seconds per host, when neither the DSN's ``connect_timeout``
# nor PGCONNECT_TIMEOUT sets one.
DEFAULT_CONNECT_TIMEOUT = 5
# What psycopg waits for a host when the timeout is 0 or less ("none"), and its floor.
_NO_TIMEOUT_S = 130
_MIN_TIMEOUT_S = 2


def _params(dsn: str) -> dict[str, Any]:
    try:
        return conninfo.conninfo_to_dict(without_driver(dsn))
    except InvalidDsn:
        raise
    except Exception:
        raise InvalidDsn("the database connection string cannot be parsed") from None


def _given_timeout(dsn: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The DSN's ``connect_timeout``, else PGCONNECT_TIMEOUT; None when neither is set."""
    env = os.environ if environ is None else environ
    value = _params(dsn).get("connect_timeout")
    if value is None or not str(value).strip():
        value = env.get("PGCONNECT_TIMEOUT", "").strip() or None
    return None if value is None else str(value).strip()


def timeout_kwargs(dsn: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """psycopg.connect's ``connect_timeout`` for one of brooq's connections on ``dsn``:
    none (the DSN's or PGCONNECT_TIMEOUT's then applies, as libpq reads them) when the
    user set one, else brooq's DEFAULT_CONNECT_TIMEOUT. A keyword argument replaces the
    DSN's value, so brooq passes one only when the user gave none."""
    if _given_timeout(dsn, environ) is not None:
        return {}
    return {"connect_timeout": DEFAULT_CONNECT_TIMEOUT}


def _split(value: Any) -> list[str]:
    return str(value).split(",") if value is not None and str(value) != "" else []


def host_timeout(dsn: str, environ: Mapping[str, str] | None = None) -> int:
    """Seconds one host of ``dsn`` may take to answer, as psycopg counts them: the
    timeout in force (``timeout_kwargs``), 2 at least, 130 for 0 or less (no timeout)."""
    given = _given_timeout(dsn, environ)
    try:
        seconds = int(float(given)) if given is not None else DEFAULT_CONNECT_TIMEOUT
    except ValueError:
        raise InvalidDsn(f"connect_timeout is not a number of seconds: {given!r}") from None
    if seconds <= 0:
        return _NO_TIMEOUT_S
    return max(seconds, _MIN_TIMEOUT_S)


def attempt_timeout(dsn: str, environ: Mapping[str, str] | None = None) -> int:
    """Seconds one connection attempt on ``dsn`` may take before its last host's answer:
    ``host_timeout`` for each host it lists (psycopg tries them in turn, each with the
    whole timeout)."""
    params = _params(dsn)
    hosts = max(len(_split(params.get("host"))), len(_split(params.get("hostaddr"))), 1)
    return host_timeout(dsn, environ) * hosts


# The host of each multi-host DSN that answered last in this process (its index in the
# DSN's list). A process tries it first from then on: a first host that never answers
# costs its connect timeout once, not on every connection (a pool's, a command's check
# and then its pool, a waiter's LISTEN). A hint only: every other host stays listed, in
# order, after it; a fork's child inherits it.
_answered: dict[str, int] = {}


def _hosts(params: Mapping[str, Any]) -> tuple[list[str], list[str], list[str]] | None:
    """The DSN's host, hostaddr and port lists, or None when it does not list several
    hosts of its own, or asks libpq to pick them at random (load_balance_hosts)."""
    hosts, addrs, ports = (_split(params.get(k)) for k in ("host", "hostaddr", "port"))
    count = max(len(hosts), len(addrs))
    if count < 2 or (hosts and addrs and len(hosts) != len(addrs)) or 1 < len(ports) != count:
        return None
    balance = params.get("load_balance_hosts") or os.environ.get("PGLOADBALANCEHOSTS")
    if balance == "random":
        return None
    return hosts, addrs, ports


def preferred(dsn: str) -> str:
    """``dsn``, with the host that answered last in this process listed first (the
    others after it, in their order); ``dsn`` itself when none did or it lists one."""
    first = _answered.get(dsn, 0)
    if not first:
        return dsn
    params = _params(dsn)
    lists = _hosts(params)
    if lists is None:
        return dsn
    for key, values in zip(("host", "hostaddr", "port"), lists, strict=True):
        if len(values) > first:
            params[key] = ",".join([values[first], *values[:first], *values[first + 1 :]])
    return conninfo.make_conninfo("", **params)


def answered(dsn: str, conn: Any) -> None:
    """Remember which of ``dsn``'s hosts the new connection ``conn`` is on."""
    try:
        params = _params(dsn)
    except InvalidDsn:
        return
    lists = _hosts(params)
    if lists is None:
        return
    hosts, addrs, ports = lists
    info = conn.info
    default_port = os.environ.get("PGPORT") or "5432"
    count = max(len(hosts), len(addrs))
    found = [
        i
        for i in range(count)
        if (hosts and hosts[i] == info.host) or (not hosts and addrs[i] == info.hostaddr)
    ]
    if len(found) > 1 and ports:
        port = str(info.port)
        found = [i for i in found if (ports[i if len(ports) > 1 else 0] or default_port) == port]
    if len(found) == 1:
        _answered[dsn] = found[0]
