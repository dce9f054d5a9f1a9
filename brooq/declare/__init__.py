"""What an application declares: its handlers and their options, payload types, periodic
schedules and rates. Checked when declared, before any fork or connection, so a mistake
fails at import time with the words of its refusal.

Imported by the application's face (``brooq.queue``), the master and its children; imports
only the vocabulary below it (``brooq.job``, ``brooq.settings``, ``brooq.durations``).

- `registry`: handlers, middleware, schedules, settings and DSNs resolved late (`Queue`'s base)
- `handlers`: a registered handler: its kind, options, middleware and retry policy
- `payloads`: typed payloads: a handler's model to a codec of its jobs' JSON
- `payload_checks`: the checkers of typed payloads, one per annotation
- `periodic`: `queue.periodic` schedules: validation and tick arithmetic
- `rates`: `brooq.Rate`: a handler's rate limit, parsed and checked
"""
