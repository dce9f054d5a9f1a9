"""The schema's files and their tools: the migrations as read from ``migrations/``, the
checks that the recorded version matches the database, the scripts for other migrators,
the embedded PostgreSQL of ``make run``, and the plans of the child's statements.

The migrator itself is ``brooq.migrate`` (its import path is public); it imports this
package, never the reverse.

- `files`: the migration files: their versions, up and down parts, statements
- `check`: the version records and what each applied version must have created
- `script`: a migration as SQL text for another tool (Django's RunSQL, Alembic)
- `devdb`: the embedded PostgreSQL of `make run` and `make db-up`
- `plans`: a statement PREPAREd as a worker child plans it, for EXPLAIN
"""
