"""`brooq-master` and `python -m brooq.master_cli`: the command line of the master.

Kept at this path because systemd units and scripts run `python -m brooq.master_cli`;
the command itself lives in brooq.supervisor.command.

Stands alone: its path is the entry point the unit files and `brooq-master` name.
"""

from brooq.supervisor.command import command, main

__all__ = ["command", "main"]

if __name__ == "__main__":
    main()
