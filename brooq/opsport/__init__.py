"""What the master and its page process both run: the ops port's shared rules.

The master serves the ops port (brooq.supervisor.ops) and hands each status-page request
to the page process (brooq.page), which parses it again, checks its Host again and
answers it. Both import this package; it imports neither of them, so neither imports
the other's rooms for what they share.

Must never: open a socket or a connection, start a thread, or import brooq.supervisor or
brooq.page.

- `httpmsg`: HTTP/1.x requests parsed from the bytes read, and plain answers, with their limits
- `hosts`: which Host names the ops port answers: the defence against DNS rebinding
- `handover`: the messages between the master and the page process over their socket
- `budget`: the wrong admin tokens' budget, per source and over every source
"""
