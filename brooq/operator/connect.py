"""One connection for one operator action, without an application object: the page
process's cancel, retry, pause, resume and bulk changes, a command's reads.

Owns: opening it on ``dsn`` as brooq's connections are opened in the given pooler mode
(brooq.db), committing on success and rolling back on error, closing it, and brooq's
errors for its failures (brooq.db.database_error).
Must never: keep the connection past the block, or choose the statements (the caller
runs brooq.operator's functions on it).
Stands alone: the page process and the CLI take it without the reads or the changes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from brooq.db import NONE, connect, connect_kwargs, database_errors


@contextmanager
def connection(dsn: str, pooler_mode: str = NONE) -> Iterator[psycopg.Connection[Any]]:
    """A new connection (autocommit off), committed when the block ends, rolled back if
    it raises, closed either way; DatabaseUnavailable when ``dsn`` cannot be reached."""
    with database_errors(dsn), connect(dsn, **connect_kwargs(pooler_mode, dsn, {})) as conn:
        yield conn
