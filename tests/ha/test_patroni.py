"""The failover of test_failover.py with Patroni and etcd doing the promotion: two Patroni
members (synchronous_mode) on loopback with the wheel's PostgreSQL, the leader's host
lost (its Patroni and its postmaster SIGKILLed), the replica promoted by Patroni once the
leader key has expired. The same load, the same counts and the same bounds
(tests/ha/failover.py); the figures are in the terminal summary.

Slow (make test-slow): about a minute and a half. Skipped where Debian's patroni or
etcd-server is missing; failed instead under BROOQ_REQUIRE_PATRONI=1 (.ci/run).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ha.failover import FailoverRun
from tests.ha.patroni import PatroniCluster, binaries

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_failover_under_load_promoted_by_patroni(
    tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    binaries()  # skipped (or failed) here when missing
    with PatroniCluster() as cluster:
        cluster.create_database("brooq")
        assert cluster.replica is not None
        cluster.wait_sync(cluster.replica)
        run = FailoverRun(cluster.dsn("brooq"), tmp_path)
        try:
            run.start()
            run.fail_over(
                kill=cluster.kill_leader,
                standby_dsn=cluster.replica.dsn("brooq"),
                promoted=cluster.wait_promoted,
            )
            run.finish()
            run.check()
        except BaseException:
            print(cluster.logs())
            raise
        finally:
            record_property("failover", run.figures)
            print("failover figures:", run.figures)
            run.close()
