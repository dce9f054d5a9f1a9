"""Rules both sides of the fork read: the master (brooq.supervisor) and its children
(brooq.worker) must agree on them, so they live below both and belong to neither.

Pure: no I/O, no clock, no process state. A rule changed here changes both processes at
once (a rolling reload forks children from the running master's code).

- `backoff`: the wait between attempts, and a handler's Delay clamped to backoff_max.
- `errortext`: the bound on last_error's length and the cut that keeps to it.
- `timing`: how long a job runs before it counts as long (its batchmates go back).
- `queues`: which queues a master and its children work when none are configured.
"""
