"""The statements of brooq/sql/queries.sql read as text: the _results variants held to their
base.
"""

from __future__ import annotations

import re

import pytest

from brooq.sql import Q

FINISHED = re.compile(r"WITH finished AS \(.*?\n\),", re.S)


@pytest.mark.parametrize(
    "base", ["job_finish_and_claim", "job_finish_and_claim_queues", "job_finish_and_claim_limited"]
)
def test_each_results_statement_is_its_base_but_the_finished_cte(base: str) -> None:
    """The _results variants cannot drift from the statements they stand in for."""
    plain, with_results = getattr(Q, base), getattr(Q, base + "_results")

    def statement(text: str) -> str:  # without the comment lines above it
        return text[text.index("WITH finished AS (") :]

    assert FINISHED.sub("", statement(plain)) == FINISHED.sub("", statement(with_results))
    plain_cte, results_cte = FINISHED.search(plain), FINISHED.search(with_results)
    assert plain_cte is not None and results_cte is not None
    assert "result" not in plain_cte.group()
    assert "result = (%(results)b::text[])[array_position(%(done)b::uuid[], id)]::jsonb" in (
        results_cte.group()
    )
