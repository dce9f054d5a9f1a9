"""The application of tests/process/test_password_hidden.py and test_app_logging.py under a
real brooq-master.

With BROOQ_CLI_APP_SLOW_IMPORT=PATH set, importing it writes PATH and then takes 3 s, as a
large application's import does: the test reads the master's command line meanwhile.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import brooq

_marker = os.environ.get("BROOQ_CLI_APP_SLOW_IMPORT")
if _marker:
    Path(_marker).write_text(str(os.getpid()))
    time.sleep(3)

queue = brooq.Queue()


@queue.handler("t.says", max_attempts=1)
def says(claim: brooq.Claim) -> None:
    """Fails with the payload's text as the error message, whatever it holds."""
    raise ValueError(claim.payload["message"])
