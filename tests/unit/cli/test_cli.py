"""The `brooq` command's one-line errors (brooq.cli)."""

from __future__ import annotations


def test_a_one_line_error_keeps_an_options_dashes_and_drops_only_bullets() -> None:
    from brooq.cli import _one_line

    assert _one_line("--timeout: 0s is out of range") == "--timeout: 0s is out of range"
    assert _one_line("cannot start:\n  - a\n  - --queues: bad") == "cannot start: a; --queues: bad"
