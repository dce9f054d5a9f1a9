"""The `brooq` command's one-line errors (brooq.cli)."""

from __future__ import annotations


def test_a_one_line_error_keeps_an_options_dashes_and_drops_only_bullets() -> None:
    from brooq.cli import _one_line

    assert _one_line("--timeout: 0s is out of range") == "--timeout: 0s is out of range"
    assert _one_line("cannot start:\n  - a\n  - --queues: bad") == "cannot start: a; --queues: bad"


def test_ps_shows_neither_databases_value() -> None:
    from brooq.cli import _hide_database

    argv = ["--database", "postgresql://u:pw@db/app", "--read-database-url=host=s password=pw"]
    assert _hide_database([*argv, "stats"]) == (
        "brooq --database *** --read-database-url=*** stats"
    )
    argv = ["--read-database-url", "postgresql://u:pw@standby/app", "--database=x", "top"]
    assert _hide_database(argv) == "brooq --read-database-url *** --database=*** top"
    assert _hide_database(["jobs", "list", "--database-hint"]) == "brooq jobs list --database-hint"


def test_a_replicas_standing_in_words() -> None:
    from datetime import datetime, timezone

    from brooq.operator.replica import ReplicaLag

    at = datetime(2030, 1, 31, 9, 0, tzinfo=timezone.utc)
    assert ReplicaLag(True, True, 0.0, at).summary() == "a standby, 0.0s behind its primary"
    assert ReplicaLag(True, True, 95.0, at).summary() == "a standby, 1.6m behind its primary"
    assert ReplicaLag(True, False, 30.0, at).summary() == (
        "a standby not streaming from its primary: the last transaction it replayed "
        "committed 30.0s ago"
    )
    assert "how far behind is unknown" in ReplicaLag(True, True, None, None).summary()
    primary = ReplicaLag(False, False, None, None)
    assert primary.summary() == "not a standby (it takes writes): nothing to lag behind"
    assert ReplicaLag(True, True, 1.5, at).to_dict() == {
        "standby": True,
        "streaming": True,
        "lag_seconds": 1.5,
        "replayed_at": "2030-01-31T09:00:00+00:00",
    }
