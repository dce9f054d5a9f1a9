"""Every SQL statement of brooq lives in queries.sql, named ``-- name: table_verb``.

The file is parsed once; ``Q.job_get`` is the text of the statement named job_get.

Owns: loading queries.sql and handing out its statements by name.
Must never: build or alter SQL text (a statement is used as written; parameters are
bound by psycopg), or hold a statement that is defined twice.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from typing_extensions import LiteralString
else:
    LiteralString = str

_NAME = re.compile(r"^-- name: ([a-z_]+)\s*$", re.MULTILINE)


def parse(text: str) -> dict[str, LiteralString]:
    parts = _NAME.split(text)
    queries: dict[str, LiteralString] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = cast(LiteralString, body.strip())
    return queries


class _Queries:
    def __init__(self, queries: dict[str, LiteralString]) -> None:
        self._queries = queries

    def __getattr__(self, name: str) -> LiteralString:
        try:
            return self._queries[name]
        except KeyError:
            raise AttributeError(f"no query named {name!r} in queries.sql") from None

    def names(self) -> list[str]:
        return sorted(self._queries)


Q = _Queries(parse((Path(__file__).parent / "queries.sql").read_text(encoding="utf-8")))
