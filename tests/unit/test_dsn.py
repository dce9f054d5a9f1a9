"""DSNs (brooq.dsn): checked and described without ever echoing the password."""

from __future__ import annotations

import string
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from psycopg import conninfo

from brooq import dsn as dsn_mod
from brooq.errors import InvalidDsn

# -- connection strings ------------------------------------------------------------------

_SECRET = "Hunter2-s3cret"


@pytest.mark.parametrize(
    "bad",
    [
        f"host=db password={_SECRET} 'unterminated",
        f"password={_SECRET} host",
        f"postgresql://u:{_SECRET}@db:5432/app?nonsense_option=1",
        f"postgresql://u:{_SECRET}@[::1/app",
    ],
)
def test_check_refuses_without_echoing_the_password(bad: str) -> None:
    with pytest.raises(InvalidDsn) as info:
        dsn_mod.check(bad)
    assert _SECRET not in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert dsn_mod.describe(bad) == "<unparsable dsn>"
    with pytest.raises(InvalidDsn) as info:
        dsn_mod.resolve(environ={"DATABASE_URL": bad})
    assert _SECRET not in str(info.value)


def test_describe_names_the_database_without_the_password() -> None:
    uri = f"postgresql://alice:{_SECRET}@db.example.org:6543/app"
    assert dsn_mod.check(uri) == uri
    assert dsn_mod.describe(uri) == "alice@db.example.org:6543/app"
    kv = f"host=/run/postgresql user=bob password={_SECRET} dbname=jobs"
    assert dsn_mod.describe(kv) == "bob@/run/postgresql:5432/jobs"


_NAME = st.text(alphabet=string.ascii_letters + string.digits + "_-", min_size=1, max_size=20)


@given(
    user=_NAME,
    host=st.from_regex(r"[a-z][a-z0-9-]{0,20}(\.[a-z][a-z0-9-]{0,10}){0,2}", fullmatch=True),
    port=st.integers(1, 65535),
    dbname=_NAME,
    password=st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
        min_size=8,
        max_size=30,
    ),
    uri=st.booleans(),
)
def test_describe_never_shows_the_password(
    user: str, host: str, port: int, dbname: str, password: str, uri: bool
) -> None:
    assume(password not in f"{user}@{host}:{port}/{dbname}")
    if uri:
        text = f"postgresql://{quote(user)}:{quote(password, safe='')}@{host}:{port}/{dbname}"
    else:
        text = conninfo.make_conninfo(
            user=user, password=password, host=host, port=str(port), dbname=dbname
        )
    described = dsn_mod.describe(dsn_mod.check(text))
    assert described == f"{user}@{host}:{port}/{dbname}"
    assert password not in described
    assert quote(password, safe="") not in described


# -- the read target (QUEUE_READ_DATABASE_URL) ----------------------------------------------


def test_the_read_target_comes_from_the_flag_the_variable_its_file_or_the_credential(
    tmp_path: Path,
) -> None:
    standby = "postgresql://u@standby:5432/app"
    assert dsn_mod.resolve_read(environ={}) is None  # unset: the reads go where writes go
    assert dsn_mod.resolve_read(environ={"QUEUE_READ_DATABASE_URL": "  "}) is None
    assert dsn_mod.resolve_read(environ={"QUEUE_READ_DATABASE_URL": standby}) == standby
    (tmp_path / "read-url").write_text(standby + "\n")
    from_file = {"QUEUE_READ_DATABASE_URL_FILE": str(tmp_path / "read-url")}
    assert dsn_mod.resolve_read(environ=from_file) == standby
    (tmp_path / "read-database-url").write_text(standby)
    creds = {"CREDENTIALS_DIRECTORY": str(tmp_path)}
    assert dsn_mod.resolve_read(environ=creds) == standby
    # The flag wins over the environment; the variable over its file and the credential.
    other = "host=standby2 dbname=app"
    assert dsn_mod.resolve_read(other, environ={"QUEUE_READ_DATABASE_URL": standby}) == other
    both = {"QUEUE_READ_DATABASE_URL": other, **from_file, **creds}
    assert dsn_mod.resolve_read(environ=both) == other
    # It never stands in for the other connection strings.
    assert dsn_mod.resolve_listen("host=main", environ={"QUEUE_READ_DATABASE_URL": standby}) == (
        "host=main"
    )
    with pytest.raises(InvalidDsn, match="no database configured"):
        dsn_mod.resolve(environ={"QUEUE_READ_DATABASE_URL": standby})


@pytest.mark.parametrize(
    ("explicit", "environ", "named"),
    [
        (f"postgresql://u:{_SECRET}@db/app?bogus=1", {}, "--read-database-url"),
        (None, {"QUEUE_READ_DATABASE_URL": f"password={_SECRET} host"}, "QUEUE_READ_DATABASE_URL"),
    ],
)
def test_a_malformed_read_target_is_named_without_its_value(
    explicit: str | None, environ: dict[str, str], named: str
) -> None:
    with pytest.raises(InvalidDsn) as info:
        dsn_mod.resolve_read(explicit, environ=environ)
    assert str(info.value).startswith(f"{named} cannot be parsed")
    assert _SECRET not in str(info.value) and "\n" not in str(info.value)


def test_a_read_target_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    missing = {"QUEUE_READ_DATABASE_URL_FILE": str(tmp_path / "nowhere")}
    with pytest.raises(InvalidDsn, match="cannot read QUEUE_READ_DATABASE_URL_FILE"):
        dsn_mod.resolve_read(environ=missing)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(InvalidDsn, match=r"QUEUE_READ_DATABASE_URL_FILE .* is empty"):
        dsn_mod.resolve_read(environ={"QUEUE_READ_DATABASE_URL_FILE": str(tmp_path / "empty")})
    (tmp_path / "read-database-url").write_text(f"postgresql://u:{_SECRET}@db/app?bogus=1")
    with pytest.raises(InvalidDsn, match="the credential read-database-url cannot") as info:
        dsn_mod.resolve_read(environ={"CREDENTIALS_DIRECTORY": str(tmp_path)})
    assert _SECRET not in str(info.value)
