"""`python -m brooq`: the operator command, the same as `brooq` (brooq.cli)."""

from brooq.cli import main

main()
