"""brooq's Prometheus rules and Grafana dashboard (deploy/), checked without a master:
promtool checks the rules and runs their unit tests, each alert has a case where it fires
and one where it does not, the dashboard holds the panels an operator needs, and the
documentation includes the rules file rather than a copy of it. promtool is Debian's
(`prometheus` package); without it those two tests skip, or fail under
BROOQ_REQUIRE_PROMETHEUS=1 (.ci/run sets it)."""

from __future__ import annotations

import re
import subprocess

import yaml

import brooq
from tests.prometheus.deployfiles import (
    DASHBOARD,
    ROOT,
    RULES,
    RULES_TEST,
    binary,
    dashboard,
    dashboard_exprs,
    metric_names,
    panels,
    rules,
)


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run(
        [binary("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout + done.stderr


def test_promtool_runs_the_rules_unit_tests() -> None:
    done = subprocess.run(
        [binary("promtool"), "test", "rules", RULES_TEST.name],
        cwd=RULES_TEST.parent,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def test_each_alert_has_a_case_that_fires_and_one_that_does_not() -> None:
    suite = yaml.safe_load(RULES_TEST.read_text())
    assert suite["rule_files"] == [RULES.name]
    fires: set[str] = set()
    quiet: set[str] = set()
    recorded: set[str] = set()
    for case in suite["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check["exp_alerts"] else quiet).add(check["alertname"])
        for check in case.get("promql_expr_test", []):
            recorded.add(check["expr"])
    alerts = {r["alert"] for r in rules() if "alert" in r}
    records = {r["record"] for r in rules() if "record" in r}
    assert len(alerts) >= 11
    assert alerts - fires == set(), "alerts without a case where they fire"
    assert alerts - quiet == set(), "alerts without a case where they stay quiet"
    assert (fires | quiet) - alerts == set(), "cases of alerts the rules do not have"
    assert records - recorded == set(), "recording rules without a case"


def test_every_rule_reads_brooq_series_and_says_what_to_do() -> None:
    for rule in rules():
        if "alert" in rule:
            assert rule["alert"].startswith("Brooq"), rule
            assert rule["labels"]["severity"] in {"info", "warning", "critical"}, rule
            assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule
            if rule["alert"] != "BrooqMasterDown":  # reads up{job="brooq"}
                assert metric_names(rule["expr"]), rule
        else:
            assert rule["record"].startswith("brooq:"), rule
            assert metric_names(rule["expr"]), rule


def test_the_names_an_expression_reads() -> None:
    expr = (
        'sum by (le) (rate(brooq_attempt_duration_seconds_bucket{topic="brooq_not_a_name",'
        'job=~"$job"}[$__rate_interval])) / ignoring(x) brooq:outcomes:rate5m'
        " + on() label_values(brooq_children_configured, instance)"
    )
    assert metric_names(expr) == {
        "brooq_attempt_duration_seconds_bucket",
        "brooq_children_configured",
    }


IMPORTANT_PANELS = {
    "Throughput by outcome": {"brooq_outcomes_total"},
    "Queue depth by state": {"brooq_jobs"},
    "Pickup wait: oldest ready job": {"brooq_ready_oldest_age_seconds"},
    "In flight": {"brooq_child_jobs_running", "brooq_children_busy", "brooq_children_configured"},
    "Children killed by the watchdog": {"brooq_children_killed_total"},
    "Children replaced": {"brooq_child_restarts_total"},
    "Oldest snapshot age": {"brooq_oldest_snapshot_age_seconds"},
    "Held jobs": {"brooq_jobs_held"},
}


def test_the_dashboard_has_the_panels_an_operator_needs() -> None:
    board = dashboard()
    by_title = {p["title"]: p for p in panels(board)}
    for title, names in IMPORTANT_PANELS.items():
        assert title in by_title, f"no panel {title!r}"
        read = set().union(*(metric_names(t["expr"]) for t in by_title[title]["targets"]))
        assert names <= read, (title, read)


def _overlap(a: dict[str, int], b: dict[str, int]) -> bool:
    return (
        a["x"] < b["x"] + b["w"]
        and b["x"] < a["x"] + a["w"]
        and a["y"] < b["y"] + b["h"]
        and b["y"] < a["y"] + a["h"]
    )


def test_the_dashboard_is_well_formed() -> None:
    board = dashboard()
    every = list(panels(board))
    ids = [p["id"] for p in every]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    assert board["uid"] == "brooq"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in every:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["description"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            assert target["datasource"] == panel["datasource"], panel["title"]
    for i, a in enumerate(every):
        for b in every[i + 1 :]:
            assert not _overlap(a["gridPos"], b["gridPos"]), (a["title"], b["title"])
    # Gauges counted from the table by every master are read once (max), never summed.
    for expr in dashboard_exprs(board):
        for name in ("brooq_jobs{", "brooq_ready_oldest_age_seconds", "brooq_jobs_held"):
            if name in expr:
                assert "max" in expr and "sum(brooq" not in expr, expr


def test_the_docs_include_the_rules_file_and_name_only_its_alerts() -> None:
    page = (ROOT / "docs" / "how-to" / "metrics.md").read_text()
    rel = RULES.relative_to(ROOT).as_posix()
    assert f'--8<-- "{rel}"' in page
    assert DASHBOARD.relative_to(ROOT).as_posix() in page
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for path in docs:
        text = path.read_text()
        assert not re.search(r"^\s*-\s*alert:", text, re.M), f"{path}: an alert written inline"
        named = set(re.findall(r"\bBrooq[A-Z]\w+", text)) - set(dir(brooq))  # BrooqError
        alerts = {r["alert"] for r in rules() if "alert" in r}
        assert named <= alerts, f"{path} names alerts the rules do not have: {named - alerts}"


def test_the_sdist_carries_the_deploy_files() -> None:
    """(.ci/run builds the sdist and lists the files in the tarball.)"""
    pyproject = (ROOT / "pyproject.toml").read_text()
    found = re.search(
        r"\[tool\.hatch\.build\.targets\.sdist\]\ninclude = \[(.*?)\]", pyproject, re.S
    )
    assert found is not None
    assert '"deploy"' in found.group(1)
