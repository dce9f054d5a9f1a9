"""The worker: everything that runs in a child process, and only there.

A child is forked by the master (brooq.supervisor), opens its own connection, claims
jobs, runs their handlers and writes their outcomes. It never renews a lease, never
reaps, and never forks (except what a handler itself starts). Two loops run jobs, the
sync one and the async one; both stand on the same core below them (the process's
parts, the round trip, the attempt) and answer the control thread through one protocol.

- `child`: `Child`, the sync loop with its adaptive batches; `main`, the entry point after fork.
- `aio`: `AsyncLoop`, an async child's event loop running up to `concurrency` jobs.
- `culprit`: an async child seen from its control thread: the job blocking its loop, its title.
- `tasks`: one async job as a task: its slot, its soft limit, its cancellation with a reason;
  the claims waiting for a slot.
- `process`: `ChildProcess`, what every child is whatever its loop: its parts, set up after fork.
- `roundtrip`: one claim round trip (`done` written, next claims), the held list, releases.
- `pacing`: the topics claimed apart in turn (limits of the fleet), their windows, start deadlines.
- `attempt`: one attempt's bookkeeping around its handler (board, payload, outcome, metering)
  and the sync handler call with its interruptions armed (the signal table).
- `control`: `LoopControl`, what the control thread asks of whichever loop runs.
- `traces`: a running job's stack as text: a thread's frames, a task's await chain.
- `state`: what the master hands a child (`ChildConfig`), its identity, the constants; and the
  little the pieces share (`ChildState`: stopping, the running job, the wake pipe, the loop).
- `execute`: what a handler did -> the outcome to write (pure).
- `weights`: the order a child tries its worked queues in, round after round.
- `floors`: where a claim starts in the ready index, and when it reads the index whole.
- `chain`: a topic's middleware composed around its handler.
- `joblogs`: a keep_logs handler's records during an attempt, bounded, kept for the outcome.
- `spans`: a consumer span per attempt, when traced; the claimed jobs' trace context.
- `outcome`: writing an outcome, and the log line and count of what was written.
- `link`: the pipes to the master (the control thread, the non-blocking writer), the title.
- `connection`: the child's database connection, and the payload decoder.
- `upstream`: `claim.upstream` read on a connection of its own, opened at the first read.
- `durable`: `claim.step`, sleeps, event waits and child jobs: records and parks on a
  connection of its own per thread, opened at the first durable operation.
- `meter`: the child's metrics, and its resident memory.
"""
