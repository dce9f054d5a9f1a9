"""``claim.upstream`` in a child: the records of the jobs a claimed job waited for, read
on a connection of this reader's own, opened at the first read (a child whose handlers
never read upstream jobs opens none) and again after it broke.

Owns: ``UpstreamReader``, set as ``Claim.reader`` once per child (brooq.worker.process).
Must never: use the child's claim connection (an async child's loop shares it), or be
called on the claim round trip's path: only a handler reading ``claim.upstream`` does.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg

from brooq.db import connect
from brooq.job import UpstreamJob
from brooq.operator import reads
from brooq.sql import queries


class UpstreamReader:
    def __init__(self, dsn: str, schema: str | None) -> None:
        self.dsn = dsn
        self.q = queries(schema)
        self.conn: psycopg.Connection[Any] | None = None
        self.lock = threading.Lock()  # an async child's handlers may run in threads

    def __call__(self, job_id: uuid.UUID) -> list[UpstreamJob]:
        with self.lock:
            if self.conn is None or self.conn.closed or self.conn.broken:
                self.conn = connect(self.dsn, autocommit=True)
            return reads.upstream(self.conn, job_id, q=self.q)
