"""The supervisor: everything that runs in the master process, and only there.

The master imports the application once, forks children (brooq.worker) and never runs a
handler. It owns the fleet (spawn, reap, generations, respawn backoff), the watchdog,
lease renewal, the reaper, retention, the job-count gauges, the ops HTTP surface and the
systemd notifications. It is single-threaded so that fork() is always safe.

    master       the loop and the signal table
    fleet        the children: fork, read, reap, generations, crash streak, scaling
    childproc    what the master knows of one child; SIGKILL, the stack file
    settlement   how a child ended -> what happens to its jobs (pure)
    accounting   writing what dead children owe the table
    watchdog     kill decisions (pure); enforce carries them out
    duties       the periodic duties and the one scheduler that runs them
    maintenance  the statements the duties run
    connections  the maintenance and LISTEN connections, with backoff
    respawn      the crash streak's backoff (pure)
    admin, ops   the ops HTTP surface: what it answers, and HTTP itself
    sdnotify     systemd's notify protocol
    command      brooq-master: validate, then start the Master
"""
