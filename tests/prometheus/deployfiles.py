"""What tests/prometheus/ reads: brooq's Prometheus rules and Grafana dashboard under
deploy/, the metric names their expressions read, and Debian's promtool and prometheus
(missing: the test is skipped, or failed under BROOQ_REQUIRE_PROMETHEUS=1)."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "brooq-rules.yml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "brooq-rules.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "brooq-dashboard.json"

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_BROOQ_NAME = re.compile(r"(?<![\w:])brooq_[A-Za-z0-9_]+")


def binary(name: str) -> str:
    """The path of Debian's ``name`` (promtool, prometheus), or the test is skipped."""
    found = shutil.which(name) or (
        f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None
    )
    if found is None:
        message = f"{name} is not installed (Debian: apt-get install prometheus)"
        if os.environ.get("BROOQ_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(message + " (BROOQ_REQUIRE_PROMETHEUS=1)", pytrace=False)
        pytest.skip(message)
    return found


def rules() -> list[dict[str, Any]]:
    """Every rule of the rules file, recording and alerting."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_exprs(board: dict[str, Any]) -> list[str]:
    """The PromQL of every panel's queries."""
    return [t["expr"] for p in panels(board) for t in p.get("targets", [])]


def variable_queries(board: dict[str, Any]) -> list[str]:
    """The template variables' queries (Grafana's label_values(...), not PromQL)."""
    found = []
    for var in board.get("templating", {}).get("list", []):
        query = var.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if var.get("type") == "query" and query:
            found.append(str(query))
    return found


def concrete(expr: str) -> str:
    """A dashboard expression as Grafana would send it: its variables given values."""
    return (
        expr.replace("$__rate_interval", "1m")
        .replace('"$job"', '".+"')
        .replace('"$instance"', '".+"')
    )


def metric_names(expr: str) -> set[str]:
    """The brooq_* names an expression reads (names in its label values left out)."""
    return set(_BROOQ_NAME.findall(_STRING.sub('""', expr)))


def referenced() -> dict[str, list[str]]:
    """Each brooq_* name the rules and the dashboard read: where it is read."""
    where: dict[str, list[str]] = {}
    board = dashboard()
    sources = [(f"rule {r.get('alert') or r.get('record')}", str(r["expr"])) for r in rules()]
    sources += [
        (f"panel {p['title']!r}", t["expr"]) for p in panels(board) for t in p.get("targets", [])
    ]
    sources += [("dashboard variable", q) for q in variable_queries(board)]
    for source, expr in sources:
        for name in metric_names(expr):
            where.setdefault(name, []).append(source)
    return where


def sample_names(exposition: str) -> set[str]:
    """The series names a /metrics answer holds: what PromQL selects (a histogram's
    ``_bucket``, ``_sum`` and ``_count``, a counter's ``_total``), not its family names."""
    return {s.name for family in text_string_to_metric_families(exposition) for s in family.samples}
