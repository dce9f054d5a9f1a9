"""The operator's reads and writes, as functions of a psycopg connection: what
``brooq.Queue``'s get, cancel, retry, cancel_many, retry_many, list_jobs, stats, in_flight,
processing_by_holder, throughput, pause, resume and queues run, usable without an
application object by the master's admin endpoint, the page process and the CLI.

Each function takes the caller's connection and the statement set of its schema
(``brooq.sql.queries(schema)``, ``Q`` by default), checks its arguments before any
statement, and commits nothing (the bulk changes excepted: each batch commits on its
own, so they want a connection outside any transaction of the caller's).

- `changes`: cancel, retry, their bulk forms in batches, pause, resume, why a change did nothing
- `connect`: one connection for one operator action: opened, committed, closed, brooq's errors
- `replica`: the read target's standing: a standby or not, how far behind its primary
- `reads`: a job's row, listings, per-topic and per-queue counts, in-flight jobs and throughput
- `snapshots`: who holds back the cleanup of dead rows: a session, standby, slot, prepared xact
- `masters`: the masters' table as its readers see it: live masters, what no master handles
- `records`: TopicStats, QueueStats, InFlight, HolderStats, BulkResult: what reads return
- `keys`: ordered keys: the blocked ones and an operator's unblock
- `schedules`: the periodic schedules stored in the database: add, change, list, remove
"""
