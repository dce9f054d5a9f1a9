"""The failover tests' figures in the terminal summary, whether the output is captured
or not: a passing run shows its counts and its measured bounds as CI prints them."""

from __future__ import annotations

import json
from typing import Any

import pytest

# (test id, figures) of every failover test that recorded them in this session.
_FIGURES: list[tuple[str, Any]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call":
        return
    for name, value in report.user_properties:
        if name == "failover":
            _FIGURES.append((report.nodeid, value))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _FIGURES:
        return
    terminalreporter.section("failover figures")
    for nodeid, figures in _FIGURES:
        terminalreporter.write_line(nodeid)
        for key, value in figures.items():
            terminalreporter.write_line(f"  {key}: {json.dumps(value, default=str)}")
