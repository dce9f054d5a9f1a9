"""`brooq [jobs] hold` and `brooq [jobs] release` without a database: where they are
registered, and the rules their help spells, which must be brooq.job's."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from brooq.cli import cancel_retry as cli_cancel_retry
from brooq.cli.common import cli
from brooq.cli.jobs import jobs
from brooq.job import BULK_FROM_STATES, HOLDABLE_STATES, ON_HOLD, RELEASABLE_STATES, Transition


def test_the_help_spells_the_rules() -> None:
    hold_help = cli_cancel_retry.hold.help or ""
    release_help = cli_cancel_retry.release.help or ""
    assert "pending or failed -> on_hold" in hold_help
    assert "on_hold -> pending" in release_help
    # the words are the constants' states, all of them
    assert " or ".join(HOLDABLE_STATES) + " -> " + ON_HOLD in hold_help
    assert " or ".join(RELEASABLE_STATES) + " -> pending" in release_help


@pytest.mark.parametrize("group", [cli, jobs])
def test_both_are_registered_on_both_groups(group: object) -> None:
    commands = getattr(group, "commands", {})
    assert commands["hold"] is cli_cancel_retry.hold
    assert commands["release"] is cli_cancel_retry.release


@pytest.mark.parametrize("action", ["hold", "release"])
def test_the_help_names_the_bulk_states(action: Transition) -> None:
    out = CliRunner().invoke(cli, ["jobs", action, "--help"])
    assert out.exit_code == 0
    assert "--state " + "|".join(BULK_FROM_STATES[action]) in out.output
    assert "--dry-run" in out.output


def test_release_needs_no_state() -> None:
    out = CliRunner().invoke(cli, ["release", "--help"])
    assert "on_hold when left out" in out.output
