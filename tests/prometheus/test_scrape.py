"""brooq's rules and dashboard against a real brooq-master: every brooq_* series they read
is in the master's /metrics, and a real Prometheus (Debian's, on a free port, its own
configuration and data directory, scraping every second) scrapes the master, loads the
rules file and answers every panel's query with data. Without prometheus the second test
skips, or fails under BROOQ_REQUIRE_PROMETHEUS=1 (.ci/run sets it)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

import brooq
from tests.harness import MasterProcess, StartMaster, free_port, states, wait_for
from tests.process.test_operations import get, ops_addr, sample
from tests.prometheus.deployfiles import (
    RULES,
    binary,
    concrete,
    dashboard,
    dashboard_exprs,
    referenced,
    rules,
    sample_names,
)

APP = "brooq_metricsapp:queue"
ENV = {"QUEUE_STATS_PERIOD": "200ms", "QUEUE_FLEET_BEAT": "300ms"}
NOBODY = "m.nobody"  # a topic no handler has: its jobs are unhandled


def run_every_kind(queue: brooq.Queue, db: psycopg.Connection[Any]) -> None:
    """Jobs done, one dead, a rate-limited backlog, jobs of a topic nobody handles, then
    one whose child the master kills: each series the rules and the dashboard read. (The
    kill comes last, alone: a child killed takes with it the figures of the jobs it ran
    in the same batch.)"""
    queue.enqueue_many(
        [brooq.Job("m.ok") for _ in range(10)]
        + [brooq.Job("m.dead")]
        + [brooq.Job("m.paced") for _ in range(4)]
        + [brooq.Job(NOBODY) for _ in range(2)]
    )
    wait_for(
        lambda: states(db) == {"done": 14, "dead": 1, "pending": 2},
        timeout=30,
        what="the jobs finished",
    )
    queue.enqueue(brooq.Job("m.spin"))
    wait_for(lambda: states(db).get("dead") == 2, timeout=30, what="the spinning job killed")


def served(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample of a /metrics answer; None when it is not there."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def started(start_master: StartMaster) -> tuple[MasterProcess, str]:
    m = start_master(app=APP, workers=2, env=ENV)
    m.wait_ready(2)
    return m, ops_addr(m)


def test_every_series_the_rules_and_the_dashboard_read_is_served(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    wanted = referenced()
    # The rules and the dashboard between them read each kind of figure.
    assert {
        "brooq_outcomes_total",
        "brooq_jobs",
        "brooq_attempt_duration_seconds_bucket",
        "brooq_children_killed_total",
        "brooq_oldest_snapshot_age_seconds",
    } <= set(wanted)
    m, addr = started(start_master)
    # Before any job, the counters whose labels are known are served at 0: a series
    # Prometheus first sees at 1 shows no increase, and the first kill would not alert.
    before = get(addr, "/metrics")[1]
    assert served(before, "brooq_children_killed_total", reason="max_execution_timeout") == 0
    assert served(before, "brooq_child_restarts_total", reason="crash") == 0
    assert served(before, "brooq_outcomes_total", topic="m.dead", outcome="dead") == 0
    assert served(before, "brooq_claims_total", topic="m.ok") == 0
    run_every_kind(queue, db)

    def missing() -> dict[str, list[str]]:
        names = sample_names(get(addr, "/metrics")[1])
        return {name: where for name, where in wanted.items() if name not in names}

    with contextlib.suppress(AssertionError):
        wait_for(lambda: not missing(), what="every series served")
    assert missing() == {}, "series the rules or the dashboard read that the master lacks"
    expected = [
        ("brooq_children_killed_total", {"reason": "max_execution_timeout"}, 1),
        ("brooq_jobs_unhandled", {"queue": "default", "topic": NOBODY}, 2),
        ("brooq_outcomes_total", {"topic": "m.dead", "outcome": "dead"}, 1),
        ("brooq_outcomes_total", {"topic": "m.ok", "outcome": "done"}, 10),
    ]
    for name, labels, value in expected:
        wait_for(
            lambda n=name, ls=labels, v=value: sample(get(addr, "/metrics")[1], n, **ls) == v,
            what=f"{name}{labels} == {value}",
        )
    assert m.proc.poll() is None


class Prometheus:
    """A Prometheus server of the test's own, scraping ``target`` every second under the
    job name brooq, with brooq's rules file loaded."""

    def __init__(self, target: str, workdir: Path) -> None:
        binary_path = binary("prometheus")
        workdir.mkdir()
        config = workdir / "prometheus.yml"
        config.write_text(
            json.dumps(  # JSON is YAML
                {
                    "global": {
                        "scrape_interval": "1s",
                        "scrape_timeout": "1s",
                        "evaluation_interval": "1s",
                    },
                    "rule_files": [str(RULES)],
                    "scrape_configs": [
                        {"job_name": "brooq", "static_configs": [{"targets": [target]}]}
                    ],
                }
            )
        )
        self.log_path = workdir / "prometheus.log"
        self._log = self.log_path.open("ab")
        for _ in range(5):  # another process may take the free port before it binds
            self.port = free_port()
            self.proc = subprocess.Popen(
                [
                    binary_path,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    f"--web.console.templates={workdir}",
                    f"--web.console.libraries={workdir}",
                ],
                stdout=self._log,
                stderr=subprocess.STDOUT,
                cwd=workdir,
            )
            if wait_for(self._up_or_gone, timeout=30, what="prometheus ready") == "ready":
                return
        raise AssertionError(f"prometheus did not start:\n{self.log()}")

    def _up_or_gone(self) -> str | None:
        if self.proc.poll() is not None:
            return "gone"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return "ready" if r.status == 200 else None
        except (OSError, urllib.error.URLError):
            return None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as exc:  # a bad query: 400 with the error
            answer = json.loads(exc.read())
        assert answer["status"] == "success", (path, params, answer)
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] in {"vector", "scalar"}, (expr, data)
        result: list[dict[str, Any]] = data["result"]
        return result

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if len(result) == 1 else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


@pytest.fixture
def prometheus_for(tmp_path: Path) -> Iterator[Any]:
    servers: list[Prometheus] = []

    def start(target: str) -> Prometheus:
        server = Prometheus(target, tmp_path / f"prometheus-{len(servers)}")
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
    for server in servers:  # captured: pytest shows it when the test failed
        print(f"---- prometheus log\n{server.log()[-10000:]}")


def test_a_prometheus_server_scrapes_the_master_and_evaluates_the_rules(
    queue: brooq.Queue,
    db: psycopg.Connection[Any],
    start_master: StartMaster,
    prometheus_for: Any,
) -> None:
    binary("prometheus")  # skip before starting anything
    m, addr = started(start_master)
    server: Prometheus = prometheus_for(addr)
    # Scraped before any job: the counters a master starts at 0 are seen at 0 first, so
    # that increase() counts the first kill.
    killed = 'brooq_children_killed_total{reason="max_execution_timeout"}'
    wait_for(lambda: server.value(killed) == 0.0, what="the master scraped")
    run_every_kind(queue, db)

    # brooq's series through the query API: what the jobs did (a child writes its
    # figures once per claim round trip, so each is waited for, not read once).
    assert server.value('up{job="brooq"}') == 1.0
    expected = {
        'sum(brooq_outcomes_total{job="brooq",outcome="done"})': 14.0,
        'brooq_outcomes_total{topic="m.dead",outcome="dead"}': 1.0,
        'brooq_outcomes_total{topic="m.spin",outcome="dead"}': 1.0,
        killed: 1.0,
        'brooq_jobs_unhandled{topic="m.nobody"}': 2.0,
        "brooq_attempt_duration_seconds_count{topic='m.ok'}": 10.0,
        "brooq_children_configured": 2.0,
    }
    for expr, value in expected.items():
        wait_for(lambda e=expr, v=value: server.value(e) == v, what=f"{expr} == {value}")

    # The rules file loaded and every rule evaluated without an error.
    def evaluated() -> list[dict[str, Any]] | None:
        groups = server.api("rules")["groups"]
        loaded = [r for g in groups for r in g["rules"]]
        return loaded if all(r["health"] == "ok" for r in loaded) else None

    loaded = wait_for(evaluated, what="every rule evaluated")
    assert sorted(r["name"] for r in loaded) == sorted(
        r.get("alert") or r.get("record") for r in rules()
    )
    wait_for(
        lambda: server.value('brooq:jobs:max{topic="m.dead",state="dead"}') == 1.0,
        what="a recording rule's value",
    )
    # A job whose child was killed: BrooqHandlersHanging (no `for`) is firing.
    wait_for(
        lambda: any(
            a["labels"]["alertname"] == "BrooqHandlersHanging" and a["state"] == "firing"
            for a in server.api("alerts")["alerts"]
        ),
        what="BrooqHandlersHanging firing",
    )

    # Every panel of the dashboard, queried as Grafana would: data, not an error.
    for expr in dashboard_exprs(dashboard()):
        query = concrete(expr)
        wait_for(lambda q=query: server.query(q), what=f"data for {query}")
    assert m.proc.poll() is None
