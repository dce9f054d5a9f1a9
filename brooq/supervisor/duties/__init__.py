"""The master's periodic duties, one module each, and the one scheduler that runs them.

Each duty is a small object with its name, its period and a ``run_once(now)`` returning
counts (brooq.supervisor.duties.scheduler.Duty); the master builds them in its order and
runs what the Scheduler says is due, once per pass of its loop. The statements they run
are brooq.supervisor.maintenance's (Periodic's own: periodic_claim and periodic_set_job,
with brooq.producer.insert's insert; the snapshot watch's: brooq.operator.snapshots' read). No
duty ever waits: one that cannot reach the database returns nothing and runs again next
period; a long statement (the job count, a VACUUM) goes off the loop
(brooq.supervisor.offloop), its duty being a source of the master's select too.

- `scheduler`: the Duty protocol and the Scheduler (pure: its clock is the now it is given)
- `sdwatchdog`: the systemd watchdog ping, twice per WatchdogSec
- `reconnect`: reconnecting the database every pass while it is away, then paying what is owed
- `renewal`: extending the leases children hold, and telling a child the ones it lost
- `progress`: the running handlers' claim.progress() reports to their rows, on a short tick,
  only when a child reported since the last write
- `reaper`: expired leases back to pending, or dead after max_lease_expiries
- `beat`: this master's row in brooq_master, written off the loop; the live fleet's pairs
- `stats`: the job-count gauges, counted off the loop and paced by their duration
- `snapshot`: the oldest snapshot holding back cleanup: its gauge, each holder named once
- `retention`: deleting terminal jobs older than retention_ttl, in bounded passes
- `keys`: ordered keys handed on where the database could not, and the dead ones of the
  topics that skip them
- `periodic`: each schedule's due tick enqueued once across every master; ClockAhead
- `vacuum`: the master's own VACUUM of the job table when its dead tuples pile up
"""
