"""The supervisor: everything that runs in the master process, and only there.

The master imports the application once, forks children (brooq.worker) and never runs a
handler. It owns the fleet (spawn, reap, generations, respawn backoff), the watchdog,
lease renewal, the reaper, retention, the job-count gauges, its row in brooq_master (the
fleet, visible: brooq.operator.masters) and the unhandled-topic watch, the ops HTTP surface, the
status page's process (forked on demand; its code is brooq.page) and the systemd
notifications. It is single-threaded so that fork() is always safe: its loop waits on
one list of sources (brooq.supervisor.source) in one select.

- `master`: the loop over its sources, and the signal table
- `source`: the Source protocol: what the loop waits on, services, and closes in a fork
- `signalpipe`: the signal handlers' wakeup pipe, a source that hands the numbers on
- `fleet`: the children: fork, reap, generations, crash streak, scaling; their pipes' source
- `childproc`: what the master knows of one child; SIGKILL, the stack file
- `childmessages`: what a child says on its pipe, applied to its ChildProc
- `settlement`: how a child ended -> what happens to its jobs (pure)
- `accounting`: writing what dead children owe the table
- `leftovers`: a dead child's sessions ended; what a claim committed after its death, given back
- `watchdog`: kill decisions (pure)
- `enforce`: carrying out the watchdog's decisions
- `cancels`: the processing jobs canceled, heard on LISTEN: the renewal brought forward
- `duties`: the periodic duties, one module each, and the one scheduler that runs them
- `maintenance`: the statements the duties run
- `history`: the finished jobs' partitions, made ahead and dropped whole past retention
- `offloop`: a statement sent on a connection of its own, its answer read when readable
- `connections`: the maintenance and LISTEN connections, with backoff; LISTEN's source
- `options`: the handler options it acts on; after a reload, the new children's
- `respawn`: the crash streak's backoff (pure)
- `unhandled`: ready jobs no live master handles: said once per pair, and gauged
- `admin`: what the ops HTTP surface answers: readiness, metrics, the bearer endpoints
- `ops`: the ops HTTP server: non-blocking connections in the master's loop
- `admintoken`: the admin token's file: reading it, and noticing that it changed
- `pagekeeper`: the page process: forked on demand, handed requests, bounded, killed
- `sdnotify`: systemd's notify protocol
- `command`: brooq-master: validate, then start the Master
"""
