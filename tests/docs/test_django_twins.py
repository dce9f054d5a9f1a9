"""The Django how-to lists every Django twin of brooq's migrations that the example
project ships, with the brooq migrations each applies, and together they cover brooq's
migrations/ without a gap; its example pins the last brooq migration."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "how-to" / "frameworks.md"
TWINS = ROOT / "examples" / "django" / "shop" / "migrations"
ROW = re.compile(r"^\| `(\d{4}_\w+\.py)` \| (\d+)(?:\u2013(\d+))? \|", re.MULTILINE)
PINNED = re.compile(r"^FIRST, LAST = (\d+), (\d+)", re.MULTILINE)


def listed() -> dict[str, tuple[int, int]]:
    return {
        name: (int(first), int(last or first))
        for name, first, last in ROW.findall(PAGE.read_text(encoding="utf-8"))
    }


def shipped() -> dict[str, tuple[int, int]]:
    found = {}
    for path in sorted(TWINS.glob("[0-9]*.py")):
        text = path.read_text(encoding="utf-8")
        if "brooq.migrate.script_parts" not in text:
            continue  # the shop's own models
        pinned = PINNED.search(text)
        assert pinned, f"{path.name} runs brooq's migrations without FIRST, LAST pinned"
        found[path.name] = (int(pinned.group(1)), int(pinned.group(2)))
    return found


def brooq_versions() -> list[int]:
    return sorted(int(p.name[:4]) for p in (ROOT / "migrations").glob("[0-9][0-9][0-9][0-9]_*.sql"))


def test_the_page_lists_every_twin_with_its_migrations() -> None:
    assert listed() == shipped()


def test_the_twins_cover_every_brooq_migration_in_order() -> None:
    covered = [v for first, last in sorted(shipped().values()) for v in range(first, last + 1)]
    assert covered == brooq_versions()


def test_the_page_example_pins_the_last_migration() -> None:
    example = re.search(r"^FIRST, LAST = 1, (\d+)", PAGE.read_text(encoding="utf-8"), re.M)
    assert example is not None
    assert int(example.group(1)) == brooq_versions()[-1]
