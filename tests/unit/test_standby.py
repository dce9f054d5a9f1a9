"""The words of a refusal for a read-only server (brooq.db): which server, which kind
of read-only, and what to change; never a password."""

from __future__ import annotations

from brooq.db import read_only, refusal
from brooq.errors import DatabaseUnavailable, ReadOnlyDatabase


def test_a_standby_is_named_with_the_setting_that_avoids_it() -> None:
    error = refusal("app@db2:5432/shop")
    assert isinstance(error, ReadOnlyDatabase)
    assert isinstance(error, DatabaseUnavailable)  # what callers catching outages catch
    text = str(error)
    assert text.startswith("the database server app@db2:5432/shop is a read-only standby")
    assert "(in recovery)" in text
    assert "target_session_attrs=read-write" in text
    assert "\n" not in text


def test_a_read_only_primary_and_an_unknown_kind_are_said_apart() -> None:
    assert "default_transaction_read_only is on" in str(refusal("app@db1:5432/shop", False))
    assert "standby" not in str(refusal("app@db1:5432/shop", False))
    either = str(refusal("app@db1:5432/shop", None))
    assert "a standby in recovery, or default_transaction_read_only" in either


def test_without_a_connection_the_dsn_names_the_server_without_its_password() -> None:
    text = str(read_only(None, "postgresql://app:s3cret@db1:6432/shop"))
    assert "app@db1:6432/shop" in text
    assert "s3cret" not in text
