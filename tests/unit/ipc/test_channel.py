"""The notification channel (brooq.ipc.channel) spelled the same wherever the SQL names it."""

from __future__ import annotations


def test_the_channel_is_spelled_the_same_wherever_sql_names_it() -> None:
    import re

    from brooq.ipc.channel import (
        CANCEL_CHANNEL,
        CHANNEL,
        OUTCOME_CHANNEL,
        STACK_ANSWER_CHANNEL,
        STACK_CHANNEL,
    )
    from brooq.migrate import load
    from brooq.sql import Q

    assert Q.listen_jobs == f"LISTEN {CHANNEL}"
    assert Q.listen_outcomes == f"LISTEN {OUTCOME_CHANNEL}"
    assert Q.listen_stack_requests == f"LISTEN {STACK_CHANNEL}"
    assert Q.listen_stack_answers == f"LISTEN {STACK_ANSWER_CHANNEL}"
    assert Q.listen_cancels.splitlines()[-1] == f"LISTEN {CANCEL_CHANNEL}"
    texts = [getattr(Q, name) for name in Q.names()] + [m.up for m in load()]
    # pg_notify('name' in a statement, pg_notify(''name'' inside a quoted function body
    spelled = [c for text in texts for c in re.findall(r"pg_notify\((''?)(\w*)\1", text)]
    # 0006's trigger, and 0020's for the rows the claim statement moves to job_history
    # (0026 defines that function again, the ordered keys' end added)
    assert [name for _, name in spelled].count(OUTCOME_CHANNEL) == 3
    assert [name for _, name in spelled].count(CANCEL_CHANNEL) == 1  # job_cancel's
    assert spelled and {name for _, name in spelled} == {
        CANCEL_CHANNEL,
        CHANNEL,
        OUTCOME_CHANNEL,
        STACK_CHANNEL,
        STACK_ANSWER_CHANNEL,
    }
