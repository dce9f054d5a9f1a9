"""Every example of the README, the tutorial and the how-to guides runs (conftest.py says how
each kind of block is treated), on a database of the page's own."""

from __future__ import annotations

import re
import unittest
from typing import Any

import pytest
from sybil import Document, Example, Region, Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer, FencedCodeBlockLexer

import brooq
from tests.docs.conftest import PAGES, ROOT, PageRun

# Languages a tested page may give a fenced block; the ones that run are python and sh.
KNOWN_LANGUAGES = {"python", "sh", "text", "yaml", "ini", "sql", "json", "toml", "http", "promql"}
REFUSED = {"bash", "shell", "console", "py", "shell-session"}
SKIP = re.compile(r"<!--\s*skip:\s*(\w+)(.*?)-->", re.S)
FILE_BLOCK = re.compile(r'^python\s+title="([A-Za-z0-9_./-]+\.py)"$')


def _run_page(example: Example) -> PageRun:
    run: PageRun = example.namespace["__page_run__"]
    return run


def _sh(example: Example) -> str | None:
    return _run_page(example).run(str(example.parsed))


def _file(example: Example) -> None:
    name, source = example.parsed
    path = _run_page(example).workdir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)


def _background(example: Example) -> None:
    _run_page(example).background_next = True


def file_blocks(document: Document) -> Any:
    lexer = FencedCodeBlockLexer(
        language=r".+", mapping={"language": "arguments", "source": "source"}
    )
    for region in lexer(document):
        match = FILE_BLOCK.match(str(region.lexemes["arguments"]).strip())
        if match:
            yield Region(
                region.start, region.end, (match.group(1), str(region.lexemes["source"])), _file
            )


def background_directives(document: Document) -> Any:
    for lexed in DirectiveInHTMLCommentLexer("sh", arguments="background")(document):
        yield Region(lexed.start, lexed.end, None, _background)


SYBIL = Sybil(
    parsers=[
        PythonCodeBlockParser(),
        CodeBlockParser(language="sh", evaluator=_sh),
        file_blocks,
        background_directives,
        SkipParser(),
    ],
)


@pytest.mark.parametrize("page", PAGES)
def test_page_examples_run(page: str, page_run: PageRun) -> None:
    document = SYBIL.parse(ROOT / page)
    document.namespace["__page_run__"] = page_run
    skipped: list[str] = []
    try:
        for example in document:
            try:
                example.evaluate()
            except unittest.SkipTest as exc:
                skipped.append(f"line {example.line}: {exc}")
    finally:
        for value in list(document.namespace.values()):
            if isinstance(value, brooq.Queue):
                value.close()
    for line in skipped:
        print(f"skipped {page} {line}")


@pytest.mark.parametrize("page", PAGES)
def test_page_blocks_are_run_or_skipped_with_a_reason(page: str) -> None:
    text = (ROOT / page).read_text()
    problems = []
    for match in SKIP.finditer(text):
        action, reason = match.group(1), match.group(2).strip()
        if action != "next" or not re.fullmatch(r'"[^"]{8,}"', reason):
            problems.append(f'{match.group(0)!r}: write <!-- skip: next "the reason" -->')
    inside = False
    for match in re.finditer(r"^ {0,4}(```+|~~~+)([^\n`]*)$", text, re.M):
        info = match.group(2).strip()
        inside = not inside
        if not inside:
            continue  # a closing fence
        if not info:
            problems.append("a block without a language: sh for commands, text for output")
            continue
        language = info.split()[0]
        if language in REFUSED:
            problems.append(f"a ```{language} block: label commands sh (they run), output text")
        elif language not in KNOWN_LANGUAGES:
            problems.append(f"a ```{language} block: not a language the page tests know")
    assert not problems, f"{page}:\n  " + "\n  ".join(problems)


def test_the_pages_are_the_site_s() -> None:
    """Every page listed exists, and every how-to page of the site is listed."""
    for page in PAGES:
        assert (ROOT / page).is_file(), page
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in PAGES:
        if page.startswith("docs/"):
            assert page.removeprefix("docs/") in nav, f"{page} is not in mkdocs.yml's nav"
