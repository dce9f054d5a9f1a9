"""What the ops surface asks the master: readiness, the metrics scrape, and the admin
endpoints that cancel, retry, hold or release a job.

Owns the answers behind brooq.supervisor.ops's hooks -- /readyz's reason, /metrics's
body, and the status and JSON body of POST /admin/jobs/<id>/{cancel,retry,hold,release}
-- and starting the ops server. Which states allow which transition is not decided
here: the statements guard it (brooq/sql/operator.sql) and brooq.job words the refusal
(brooq.operator.changes.explain_refusal when the state alone does not say why).

It runs inside the master's loop, so it must never wait: one short guarded statement per
request on the maintenance connection, and an unreachable database answers 503 at once.
It never touches a child.
"""

from __future__ import annotations

import errno
import logging
from pathlib import Path
from typing import Any

from brooq import metrics as metrics_mod
from brooq.job import (
    FROM_STATES,
    HOLDABLE_STATES,
    RETRYABLE_STATES,
    Transition,
    parse_job_id,
    transition_refusal,
)
from brooq.job_options import key_taken
from brooq.operator import changes, reads
from brooq.opsport.hosts import HostRule
from brooq.supervisor.connections import Connections
from brooq.supervisor.fleet import Fleet
from brooq.supervisor.ops import OpsHooks, OpsServer

log = logging.getLogger("brooq.master")

# The actions' path segments as brooq.job's transitions.
_TRANSITIONS: dict[str, Transition] = {action: action for action in FROM_STATES}


class Admin:
    def __init__(self, fleet: Fleet, conns: Connections, metrics_dir: Path | None) -> None:
        self.fleet = fleet
        self.conns = conns
        self.metrics_dir = metrics_dir

    def hooks(self, token: bytes | None, hosts: HostRule) -> OpsHooks:
        return OpsHooks(
            ready=self.readiness, metrics=self.scrape, admin=self.job, token=token, hosts=hosts
        )

    def readiness(self) -> tuple[bool, str]:
        if self.fleet.stopping:
            return False, "draining"
        if not self.conns.ok:
            return False, "database unreachable"
        ready = [c for c in self.fleet.children.values() if c.ready]
        if not ready:
            return False, "no worker ready yet"
        if all(c.claims_failing is not None for c in ready):
            return False, f"every worker's claims fail: {ready[0].claims_failing}"
        return True, "ready"

    def scrape(self) -> bytes:
        if self.metrics_dir is None:
            return b"# metrics are off\n"
        return metrics_mod.render(self.metrics_dir)

    def job(self, action: str, raw_id: str) -> tuple[int, dict[str, Any]]:
        """POST /admin/jobs/<raw_id>/<action>: (HTTP status, JSON body)."""
        try:
            job_id = parse_job_id(raw_id)
        except ValueError as exc:
            return 400, {"error": str(exc)}
        verb = _TRANSITIONS.get(action)
        if verb is None:  # ops routes only brooq.job's transitions here
            return 404, {"error": f"no admin action {action!r}"}
        moved = self.conns.with_db(
            f"admin_{action}", lambda conn: changes.transition(conn, verb, job_id, self.conns.q)
        )
        if moved:
            log.info("event=admin_%s job=%s", action, job_id)
            return 200, {"id": str(job_id), "action": action, "ok": True}
        if not self.conns.ok:
            return 503, {"error": "database unreachable"}
        found = self.conns.with_db("admin_get", lambda conn: reads.get(conn, job_id, self.conns.q))
        if found is None:
            return 404, {"error": f"no job with id {job_id}"}
        state = found.state
        if verb == "retry" and state in RETRYABLE_STATES and found.unique_key is not None:
            key = found.unique_key
            holder = self.conns.with_db(
                "admin_get", lambda conn: changes.key_holder(conn, job_id, self.conns.q)
            )
            if holder is not None:
                body = {"error": key_taken(job_id, key, *holder), "state": state}
                return 409, {**body, "held_by": str(holder[0])}
        if verb == "hold" and state in HOLDABLE_STATES:
            # Refused in a state it takes: a unique_key, or a durable handler's parked
            # job; explain_refusal names which (or that the state changed meanwhile).
            refusal = self.conns.with_db(
                "admin_get",
                lambda conn: changes.explain_refusal(conn, job_id, "hold", self.conns.q),
            )
            if refusal is not None:
                return 409, {"error": str(refusal), "state": state}
        return 409, {"error": transition_refusal(verb, state), "state": state}


def bind_hint(exc: OSError) -> str:
    """What to do when the ops port cannot be bound."""
    if exc.errno == errno.EADDRINUSE:
        return (
            "the address is taken (another master on this host?): give each master its own "
            "with --ops-addr HOST:PORT (QUEUE_OPS_ADDR), or --ops-addr '' for none"
        )
    return "give another address with --ops-addr HOST:PORT (QUEUE_OPS_ADDR)"


def start_ops(addr: str, hooks: OpsHooks) -> OpsServer | None:
    """The ops server on ``addr``, or None when it is off ('') or cannot bind (logged)."""
    if not addr:
        return None
    try:
        server = OpsServer(addr, hooks)
    except OSError as exc:
        log.error(
            "event=ops_bind_failed addr=%s error=%r: running without metrics, status page and "
            "admin endpoints; %s",
            addr,
            exc.strerror,
            bind_hint(exc),
        )
        return None
    log.info("event=ops_listening addr=%s", server.address)
    return server
