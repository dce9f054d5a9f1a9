"""DSNs (brooq.dsn): checked and described without ever echoing the password."""

from __future__ import annotations

import string
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
