"""The supervisor: everything that runs in the master process, and only there.

The master imports the application once, forks children (brooq.worker) and never runs a
handler. It owns the fleet (spawn, reap, generations, respawn backoff), the watchdog,
lease renewal, the reaper, retention, the job-count gauges, the ops HTTP surface and the
systemd notifications. It is single-threaded so that fork() is always safe.
"""
