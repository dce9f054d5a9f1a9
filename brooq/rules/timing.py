"""When a running job counts as long: its batchmates go back to the queue.

A child claims a few short jobs at once; a job running LONG_JOB seconds gives back the
jobs claimed after it in its batch, so that other children run them meanwhile. The child
decides (brooq.worker.child) and the master writes the release when told
(brooq.supervisor.enforce), so both read this one number.

Must never hold anything but constants.
"""

from __future__ import annotations

LONG_JOB = 0.5
