"""The status page's process: server-rendered HTML of the ops port, stdlib only.

    GET  /                  the overview: per queue and topic the counts (waiting,
                            scheduled, ready, held, retrying, parked, on_hold,
                            processing, dead), done per minute, the last hour's charts,
                            paused queues, the masters alive
    GET  /charts            throughput, failures, latency, run time and backlog, per queue
                            and topic, over the last hour or day
    GET  /in-flight         jobs being processed (keyset pages)
    GET  /failed, /dead     jobs waiting for a retry, jobs given up on (keyset pages)
    GET  /on-hold           jobs held by an operator until released (keyset pages)
                            (each filtered by topic, group and tag; /list picks the state)
    GET  /jobs/<id>         one job: what it is, where it stands, its attempts, its graph,
                            every column behind a toggle; /find?id= finds one
    GET  /fleet             the live masters (brooq.operator.masters) and their children
    GET  /schedules         the periodic schedules stored in the database
                            (brooq.operator.schedules): when, the job, next and last tick
    GET  /keys              the ordered keys whose next job cannot start
                            (brooq.operator.keys): why, the job in the way, jobs waiting
    POST /jobs/<id>/stack   the stack button (signed in)
    GET  /sign-in, /actions; POST /sign-in, /sign-out,
         /jobs/<id>/{cancel,retry,hold,release}, /queues/<name>/{pause,resume},
         /bulk/{retry,cancel,hold,release},
         /schedules/<name>/{pause,resume,run,remove},
         /keys/unblock      the actions (signed in)

Everything here runs in the page process, which the master forks on demand and hands
each page request with its socket (brooq.supervisor.pagekeeper, over
brooq.opsport.handover), so no page is ever rendered in the master's loop;
docs/status-page.md describes it. brooq.page.routes.serve renders the read-only pages: a
request's method and target and a psycopg connection in, a Response (status, headers,
HTML bytes) out.

This package never imports brooq.supervisor; the master imports its process's entry
point (process.run) and the sign-in's revocation (signin.revoke), and nothing that
renders.

Must never: write to the database but through actions, read a socket but the one
handed, start a thread, load anything from the internet, or put a value into a page
without escaping it.

- `process`: the page process's loop, its signal table and its reports to the master
- `dispatch`: one handed request in, its whole answer out: Host check, actions, stack, pages
- `bulk`: the helper process a bulk action runs in, one at a time
- `signin`: the session cookie, the CSRF tokens, the wrong-token budget, revocation (pure)
- `actions`: sign-in, cancel, retry, hold, release, pause, resume, the bulk actions, a
  stored schedule's pause, resume, run now and remove, and an ordered key's unblock
- `routes`: a read-only page's method and target in, a Response out; the error pages
- `views`: each page's HTML assembled from its reads and render's pieces
- `jobview`: one job's page: what it is, where it stands, its attempts, graph, logs, raw row
- `schedules`: the stored periodic schedules' page, with each one's buttons
- `keys`: the blocked ordered keys' page, with a dead key's unblock button
- `charts`: the charts (throughput, failures, latency, run time, backlog) as inline SVG
- `lines`: the pages' one-line notes: the replica's lag, the fleet, the oldest snapshot
- `reads`: the pages' read-only reads under a statement timeout, and the keyset cursors
- `render`: pure functions from values to escaped HTML, the layout and the one stylesheet
- `headers`: the security headers every answer carries
"""
