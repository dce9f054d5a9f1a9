"""brooq.db.connect: an unreachable database is an error that hides the password (a closed port,
no server).
"""

from __future__ import annotations

import pytest

from brooq.db import connect
from brooq.errors import DatabaseUnavailable

# -- connection strings ------------------------------------------------------------------

_SECRET = "Hunter2-s3cret"


def test_unreachable_database_error_hides_the_password() -> None:
    dsn = f"postgresql://alice:{_SECRET}@127.0.0.1:1/app"
    with pytest.raises(DatabaseUnavailable) as info:
        connect(dsn, connect_timeout=2)
    message = str(info.value)
    assert _SECRET not in message
    assert message.startswith("cannot reach the database alice@127.0.0.1:1/app")
