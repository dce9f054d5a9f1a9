"""The producer: putting jobs into the table and waiting for what became of them.

Runs in any process that enqueues (a web request, a script, the CLI, a handler chaining a
job) and in no process brooq forks for itself, but the master's periodic duty. Imports the
vocabulary below it (``brooq.job``, ``brooq.db``, ``brooq.sql``) and never the master or a
child.

- `insert`: enqueue one or many (COPY), in the caller's transaction or not: the checks,
  the steps of a plain job, a keyed or tagged one (unique_key, debounce) and a graph
  (`after`), and the drivers that run them (sync, async) with the transaction brooq opens
- `line`: the connection `Queue.enqueue` keeps for itself, its INSERT prepared once
- `pools`: a Queue's sync and async pools, opened late, forgotten in a fork's child
- `poolcheck`: the check a pooled connection passes on checkout
- `targets`: what a caller's transaction may be (psycopg, Django, SQLAlchemy)
- `ids`: the UUIDv7 ids a producer gives its jobs
- `wait`: `queue.wait` and `wait_async`
- `wait_listener`: the one LISTEN connection every waiter of a Queue shares
- `stacks`: a running job's stack asked for and answered through PostgreSQL
- `events`: emitting the events durable handlers wait for, in the caller's transaction
- `cancel`: `brooq.cancel`, a job canceled in the caller's transaction
"""
