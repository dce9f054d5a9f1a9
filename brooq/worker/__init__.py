"""The worker: everything that runs in a child process, and only there.

A child is forked by the master (brooq.supervisor), opens its own connection, claims
jobs, runs their handlers and writes their outcomes. It never renews a lease, never
reaps, and never forks (except what a handler itself starts).

- `child`: `Child`, setup and the claim loop; `main`, the entry point after fork.
- `config`: what the master hands a child (`ChildConfig`), its identity, the constants.
- `state`: the little the pieces share (stopping, the running job, the wake pipe).
- `interrupts`: the signal table, and the handler call with its interruptions armed.
- `execute`: what a handler did -> the outcome to write (pure); `retry`: the backoff.
- `outcome`: writing an outcome, and the log line and count of what was written.
- `link`: the pipes to the master (the control thread, the non-blocking writer), the title.
- `connection`: the child's database connection, and the payload decoder.
- `meter`: the child's metrics, and its resident memory.
"""
