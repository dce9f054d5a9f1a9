"""The contract between the master and its children: what crosses the fork.

Both processes import this package and nothing here opens a connection or starts a
thread. Changing a message, the board's layout or a reason's spelling changes both sides
at once and is a breaking change for a rolling reload (HUP forks children from the
running master's code, so both sides always run the same version).

- `board`: the job a child runs right now, in a shared page the master reads.
- `protocol`: the JSON lines over the two pipes.
- `channel`: the LISTEN/NOTIFY channel name.
- `progress`: a running handler's progress: its checks, and the sink that writes it on
  the board for the master's progress tick.
- `reasons`: why a child stopped, and why the master replaced it (log and metric labels).
- `tracebacks`: a failed attempt's traceback as the error history keeps it, cut the same
  way by a child (what a handler raised) and the master (a killed child's stack).
"""
