"""The statement loader of brooq/sql: templates expanded into their variants, a name
defined twice refused, and the claim template's eight variants held to what each is for.
No database."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from brooq.sql import Q, expand, load, parse

TEMPLATE = """
-- variant: pick
-- variant: pick_many: many
-- variant: pick_many_locked: many, locked
-- always
SELECT id
--#if many
FROM unnest(%(ids)s) AS i(id)
--#if not locked
WHERE true
--#else
FOR UPDATE{if locked: OF i} SKIP LOCKED
--#end
--#else
FROM one
--#end
"""


def test_a_template_expands_into_its_variants() -> None:
    assert expand("pick", TEMPLATE) == {
        "pick": "-- always\nSELECT id\nFROM one",
        "pick_many": "-- always\nSELECT id\nFROM unnest(%(ids)s) AS i(id)\nWHERE true",
        "pick_many_locked": (
            "-- always\nSELECT id\nFROM unnest(%(ids)s) AS i(id)\nFOR UPDATE OF i SKIP LOCKED"
        ),
    }


def test_a_file_holds_statements_and_templates() -> None:
    text = f"-- name: one_get\nSELECT 1\n\n-- template: pick\n{TEMPLATE}\n"
    text += "-- name: two_get\nSELECT 2\n"
    names = ["one_get", "pick", "pick_many", "pick_many_locked", "two_get"]
    assert sorted(parse(text, "x.sql")) == names
    assert parse(text, "x.sql")["two_get"] == "SELECT 2"


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("SELECT 1", "declares no variant"),
        ("-- variant: a: x\n--#if y\nSELECT 1\n--#end", "tests 'y', a flag no variant has"),
        ("-- variant: a: x\n--#if x\nSELECT 1", "an --#if without its --#end"),
        ("-- variant: a: x\nSELECT 1\n--#end", "misplaced or malformed '--#end'"),
        ("-- variant: a: x\n--#elif x\nSELECT 1", "malformed '--#elif x'"),
        ("-- variant: a: x\nSELECT {if z: 1}", "tests 'z', a flag no variant has"),
    ],
)
def test_a_malformed_template_is_refused(body: str, error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        expand("t", body)


def test_a_directive_outside_a_template_is_refused() -> None:
    with pytest.raises(ValueError, match="statement 'a_get' holds a template directive"):
        parse("-- name: a_get\n--#if x\nSELECT 1\n--#end\n", "x.sql")


def test_a_name_defined_twice_is_refused_naming_both_files(tmp_path: Path) -> None:
    (tmp_path / "a.sql").write_text("-- name: job_get\nSELECT 1\n")
    (tmp_path / "b.sql").write_text("-- template: pick\n-- variant: job_get\nSELECT 2\n")
    with pytest.raises(ValueError, match=r"'job_get' is defined twice: in a\.sql and in b\.sql"):
        load(tmp_path)
    (tmp_path / "b.sql").write_text("-- name: job_get\nSELECT 1\n-- name: job_get\nSELECT 2\n")
    with pytest.raises(ValueError, match=r"b\.sql: query 'job_get' is defined twice"):
        load(tmp_path)


SQL_DIR = Path(__file__).parents[3] / "brooq" / "sql"
FINISHED = re.compile(r"WITH finished AS \(.*? FROM finished AS f \), ")
LOCK = re.compile(r"FOR NO KEY UPDATE (OF job )?SKIP LOCKED")
BASES = (
    "job_finish_and_claim",
    "job_finish_and_claim_queues",
    "job_finish_and_claim_limited",
    "job_finish_and_claim_coordinated",
    "job_finish_and_claim_floored",
)


def _sql(text: str) -> str:
    """The statement without its comments, its whitespace folded."""
    return " ".join(re.sub(r"--[^\n]*", "", text).split())


def test_the_claim_is_written_once() -> None:
    written = "".join(p.read_text() for p in sorted(SQL_DIR.glob("*.sql")))
    assert written.count("FOR NO KEY UPDATE{if queues: OF job} SKIP LOCKED") == 1
    assert "-- name: job_finish_and_claim" not in written


@pytest.mark.parametrize("base", BASES)
def test_each_results_variant_is_its_base_but_the_finished_cte(base: str) -> None:
    """The _results variants store what handlers returned (and the last progress of those
    that reported) and differ in nothing else."""
    plain, with_results = _sql(getattr(Q, base)), _sql(getattr(Q, base + "_results"))
    assert FINISHED.sub("", plain) == FINISHED.sub("", with_results)
    plain_cte, results_cte = FINISHED.search(plain), FINISHED.search(with_results)
    assert plain_cte is not None and results_cte is not None
    assert "%(results)b" not in plain_cte.group() and "f.result," in plain_cte.group()
    assert "(%(results)b::text[])[array_position(%(done)b::uuid[], f.id)]::jsonb" in (
        results_cte.group()
    )


@pytest.mark.parametrize("base", BASES)
def test_each_claim_variant_locks_once_and_reads_its_queues(base: str) -> None:
    statement = _sql(getattr(Q, base))
    locks = LOCK.findall(statement)
    one_queue = base == "job_finish_and_claim"
    assert locks == ["" if one_queue else "OF job "]
    assert ("%(queue)s" in statement, "%(queues)b" in statement) == (one_queue, not one_queue)
    limited = base.endswith("_limited")
    coordinated = base.endswith("_coordinated")
    assert ("{brooq_claim_limited}" in getattr(Q, base)) is False  # marks are rendered
    assert ("brooq_claim_limited(" in statement) == limited
    assert ("brooq_claim_batch(" in statement) == coordinated
    assert ("FROM limited UNION ALL" in statement) == (limited or coordinated)
    assert ("LIMIT least(%(limit)s - (SELECT count(*) FROM limited)" in statement) == limited
    assert ("LIMIT least(%(limit)s - (SELECT count(id) FROM limited)" in statement) == coordinated


def test_the_coordinated_variant_is_the_limited_one_with_its_own_function() -> None:
    """Only the function called and the count of what it claimed (its held-back answer
    has no id) differ."""
    limited, coordinated = (
        _sql(Q.job_finish_and_claim_limited),
        _sql(Q.job_finish_and_claim_coordinated),
    )
    call = re.compile(r"FROM brooq_claim_(limited|batch)\(.*?\) AS c \)")
    assert call.sub("CALL", limited).replace("count(*) FROM limited", "N") == call.sub(
        "CALL", coordinated
    ).replace("count(id) FROM limited", "N")


def test_the_queues_variant_is_the_limited_one_without_the_limited_topic() -> None:
    queues, limited = _sql(Q.job_finish_and_claim_queues), _sql(Q.job_finish_and_claim_limited)
    cte = re.search(r"limited AS MATERIALIZED \(.*?\) AS c \), ", limited)
    assert cte is not None
    head = "SELECT true, id, topic, payload, attempts, locked_by, locked_until, available_at, "
    without = (
        limited.replace(cte.group(), "")
        .replace(" AND cardinality(%(topics)b::text[]) > 0", "")
        .replace(" - (SELECT count(*) FROM limited)", "")
        .replace("FROM limited UNION ALL " + head + "queue, priority ", "")
    )
    # Without a limited topic, a claim of one job skips the fair-share count.
    skip = "CASE WHEN %(limit)s <= 1 THEN %(limit)s ELSE "
    assert queues.count(skip) == 1 and queues.count(") AS ready )) END ), claimed") == 1
    queues = queues.replace(skip, "").replace(
        ") AS ready )) END ), claimed", ") AS ready )) ), claimed"
    )
    assert without == queues


def test_the_floored_variant_is_the_queues_one_with_ranges_from_floors() -> None:
    """_floored reads each row of its arrays (a queue, its priorities lo..hi, a floor's
    position) as _queues reads a queue, and differs in nothing else."""
    queues, floored = _sql(Q.job_finish_and_claim_queues), _sql(Q.job_finish_and_claim_floored)
    unnest = (
        "unnest(%(queues)b::text[], %(lows)b::int2[], %(highs)b::int2[], "
        "%(floors)b::timestamptz[], %(floor_ids)b::uuid[]) AS q(name, lo, hi, floor, floor_id)"
    )
    ranges = (
        "AND job.priority <= q.hi AND job.priority >= q.lo "
        "AND (job.available_at, job.id) >= (q.floor, q.floor_id) "
    )
    assert floored.count(unnest) == 2 and floored.count(ranges) == 2
    plain = floored.replace(unnest, "unnest(%(queues)b::text[]) AS q(name)").replace(ranges, "")
    assert plain == queues
