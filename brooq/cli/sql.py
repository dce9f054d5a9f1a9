"""`brooq sql list|show`: brooq's SQL statements, and each one as it runs.

``list`` names every statement of brooq/sql (brooq.sql.catalog): its file, which says
who runs it, its template and flags when it is a template's variant, and the first
sentence of its leading comment. ``show NAME`` prints a statement's text exactly as the
process running it holds it: the template expanded, brooq's relations qualified by
--schema or QUEUE_SCHEMA (the text of ``getattr(queries(schema), NAME)``, which is what a
worker, a master or a Queue passes to psycopg). No database is opened.
``reference_page`` is docs/reference/sql.md (``brooq sql list --markdown``).

Owns: the sql commands, their text, JSON and Markdown, choosing a template's variant by
its flags, and the text as psycopg sends it (``as_sent``).
Must never: connect to a database, or print a statement other than the loader's text.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, NamedTuple

import click

import brooq.sql as sql_dir
from brooq.cli.common import cli, emit_json, schema, table
from brooq.sql import Statement, catalog, queries

# A psycopg placeholder, or a doubled % (the only % a statement with placeholders holds).
_PLACEHOLDER = re.compile(r"%%|%\(([A-Za-z_][A-Za-z0-9_]*)\)[sbt]")
_WORD_UNDERSCORE = re.compile(r"(?<![\w`])_")
_SENTENCE = re.compile(r"^(.+?[.!?])(?:\s|$)")
DESCRIPTION_WIDTH = 100


class Entry(NamedTuple):
    """A statement as ``brooq sql list`` shows it."""

    statement: Statement
    comment: str  # its leading comment, on one line

    @property
    def owner(self) -> str:
        return self.statement.file.removesuffix(".sql")

    @property
    def description(self) -> str:
        return one_line(self.comment)

    def to_dict(self) -> dict[str, Any]:
        s = self.statement
        return {
            "name": s.name,
            "file": f"brooq/sql/{s.file}",
            "owner": self.owner,
            "template": s.template,
            "flags": sorted(s.flags),
            "description": self.description,
        }


def file_comment(file: str) -> str:
    """The comment a file of brooq/sql starts with (who runs its statements)."""
    return leading_comment((Path(sql_dir.__file__).parent / file).read_text(encoding="utf-8"))


def leading_comment(text: str) -> str:
    """The comment lines a statement's text starts with, joined into one line."""
    words: list[str] = []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        words.append(line[2:].strip())
    return " ".join(w for w in words if w).replace("%%", "%")


def one_line(comment: str) -> str:
    """The first sentence of ``comment``, cut at a word near DESCRIPTION_WIDTH."""
    found = _SENTENCE.match(comment)
    first = found.group(1) if found else comment
    if len(first) <= DESCRIPTION_WIDTH:
        return first
    return first[: DESCRIPTION_WIDTH - 1].rsplit(" ", 1)[0].rstrip(",;:(") + "…"


def entries() -> list[Entry]:
    """Every statement of brooq/sql, file by file as written."""
    raw = queries(None)
    return [Entry(s, leading_comment(getattr(raw, s.name))) for s in catalog()]


def templates() -> dict[str, list[Statement]]:
    """Each template's variants, in the order declared."""
    found: dict[str, list[Statement]] = {}
    for s in catalog():
        if s.template is not None:
            found.setdefault(s.template, []).append(s)
    return found


def sent_text(text: str) -> str:
    """``text`` as psycopg sends it when the statement runs with its parameters: each
    named placeholder a numbered one ($1 for the first name, the same number each time
    the name recurs) and ``%%`` a single %. A statement with no placeholder runs without
    parameters and is sent as written."""
    if not any(m.group(1) for m in _PLACEHOLDER.finditer(text)):
        return text
    numbers: dict[str, int] = {}

    def number(found: re.Match[str]) -> str:
        name = found.group(1)
        if name is None:
            return "%"
        return f"${numbers.setdefault(name, len(numbers) + 1)}"

    return _PLACEHOLDER.sub(number, text)


def _near(word: str, candidates: list[str]) -> str:
    """The near matches of ``word`` among ``candidates`` (those holding it first) as the
    end of an error ("; near matches: a, b"); "" when there are none."""
    holding = [c for c in candidates if word and word in c]
    close = difflib.get_close_matches(word, candidates, n=5, cutoff=0.6)
    near = list(dict.fromkeys(holding + close))[:6]
    return f"; near matches: {', '.join(near)}" if near else ""


def _flags_text(flags: frozenset[str] | list[str]) -> str:
    return ", ".join(sorted(flags)) or "(no flag)"


def chosen(name: str, flags: list[str], all_variants: bool) -> list[Statement]:
    """The statements ``brooq sql show`` prints. ``name`` is a statement or a template;
    with flags or ``all_variants`` a variant's name stands for its template. A template
    alone is its variant with no flag (the claim's: what a child working one queue with no
    limits sends). click.UsageError (exit
    2, one line) for an unknown name or flag, or flags no variant has together."""
    by_name = {s.name: s for s in catalog()}
    variants = templates()
    if name not in by_name and name not in variants:
        # A template stands for its variants among the near matches.
        names = {s.template or s.name for s in by_name.values()}
        near = _near(name, sorted(names)) or _near(name, sorted(by_name))
        raise click.UsageError(f"no statement or template named {name!r}{near}")
    statement = by_name.get(name)
    template = name if name in variants else statement.template if statement else None
    if not flags and not all_variants and statement is not None:
        return [statement]
    if template is None:
        raise click.UsageError(f"{name} is not a template: it has no flags nor variants")
    found = variants[template]
    if all_variants:
        if flags:
            raise click.UsageError("--flag and --all-variants do not go together")
        return found
    known = sorted(frozenset().union(*(s.flags for s in found)))
    wanted = frozenset(f.strip() for given in flags for f in given.split(",") if f.strip())
    unknown = sorted(wanted - set(known))
    if unknown:
        raise click.UsageError(
            f"template {template} has no flag {unknown[0]!r}; its flags: {', '.join(known)}"
        )
    for s in found:
        if s.flags == wanted:
            return [s]
    holding = [s for s in found if wanted <= s.flags] or found
    shapes = "; ".join(f"{s.name} ({_flags_text(s.flags)})" for s in holding)
    raise click.UsageError(
        f"no variant of {template} has exactly the flags {_flags_text(wanted)}; "
        f"{'the variants with them' if holding is not found else 'its variants'}: {shapes}"
    )


def reference_page() -> str:
    """docs/reference/sql.md: every statement and its owner, each template's flags
    against its variants."""
    all_entries = entries()
    out = [
        "# SQL statements",
        "",
        "Generated by `brooq sql list --markdown > docs/reference/sql.md` (a test fails when",
        "this page and brooq/sql disagree). Every statement brooq runs is named in a",
        "`brooq/sql/*.sql` file, grouped by who runs it; `brooq sql show NAME` prints one as",
        "it runs, its template expanded and brooq's relations qualified by `--schema` or",
        "`QUEUE_SCHEMA`, without a database (`--as-sent`: with psycopg's numbered",
        "placeholders, as the server receives it).",
        "",
        "A template is written once and expanded, when the files are loaded, into variants",
        "told apart by their flags; each variant is a statement of its own name.",
        "`brooq sql show TEMPLATE --flag F --flag G` prints the variant with exactly those",
        "flags, `--all-variants` every one, each headed by its flags.",
        "",
    ]
    for file in dict.fromkeys(e.statement.file for e in all_entries):
        rows = [e for e in all_entries if e.statement.file == file]
        owner = rows[0].owner
        out += [f"## {owner}", "", f"`brooq/sql/{file}`. {_cell(file_comment(file))}", ""]
        out += ["| statement | template: flags | what it does |", "|---|---|---|"]
        for e in rows:
            s = e.statement
            shape = f"`{s.template}`: {_flags_text(s.flags)}" if s.template else ""
            out.append(f"| `{s.name}` | {_cell(shape)} | {_cell(e.description)} |")
        out.append("")
    out += ["## Templates and their variants", ""]
    comments = {e.statement.name: e.comment for e in all_entries}
    for template, found in templates().items():
        known = sorted(frozenset().union(*(s.flags for s in found)))
        out += [
            f"### {template}",
            "",
            f"`brooq/sql/{found[0].file}`. {_cell(comments[found[0].name])}",
        ]
        out += ["", "| variant | " + " | ".join(known) + " |"]
        out.append("|---|" + "---|" * len(known))
        for s in found:
            marks = " | ".join("✓" if f in s.flags else "" for f in known)
            out.append(f"| `{s.name}` | {marks} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _cell(text: str) -> str:
    """``text`` inside a table's cell: its pipes escaped, and a word's leading
    underscore (``_logs``) kept from reading as emphasis."""
    return _WORD_UNDERSCORE.sub(r"\\_", text.replace("|", "\\|"))


@cli.group("sql")
def sql_group() -> None:
    """brooq's SQL statements: every one named, and each as it runs (no database)."""


@sql_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--markdown", is_flag=True, help="The reference page docs/reference/sql.md, as Markdown."
)
def list_command(as_json: bool, markdown: bool) -> None:
    """Every statement: its name, its file (who runs it), its template and flags when it
    is a template's variant, and the first sentence of its comment."""
    if markdown:
        click.echo(reference_page(), nl=False)
        return
    found = entries()
    if as_json:
        emit_json({"statements": [e.to_dict() for e in found]})
        return
    rows = [
        [
            e.statement.name,
            e.owner,
            f"{e.statement.template}: {_flags_text(e.statement.flags)}"
            if e.statement.template
            else "-",
            e.description or "-",
        ]
        for e in found
    ]
    for line in table(["NAME", "OWNER", "TEMPLATE: FLAGS", "DESCRIPTION"], rows, set()):
        click.echo(line)
    variants = sum(len(v) for v in templates().values())
    click.echo(
        f"\n{len(found)} statements, {variants} of them variants of {len(templates())} templates"
    )


@sql_group.command("show")
@click.argument("name")
@click.option(
    "--flag",
    "flags",
    multiple=True,
    metavar="FLAG",
    help="A template's flag (repeat, or comma separate): the variant with exactly these.",
)
@click.option("--all-variants", is_flag=True, help="Every variant of the template, headed.")
@click.option(
    "--as-sent",
    is_flag=True,
    help="As psycopg sends it: $1, $2... for the named placeholders, %% as %.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def show_command(
    ctx: click.Context,
    name: str,
    flags: tuple[str, ...],
    all_variants: bool,
    as_sent: bool,
    as_json: bool,
) -> None:
    """A statement as it runs: its template expanded, brooq's relations qualified by
    --schema or QUEUE_SCHEMA (unset: unqualified, as the search_path finds them).

    NAME is a statement or a template (`brooq sql list`); a template alone is its variant
    with no flag: for the claim, job_finish_and_claim, what a child working one queue with
    no limits sends. With --flag or --all-variants, a variant's name stands for its
    template. Placeholders are psycopg's (%(name)s; %(name)b is bound in binary) unless
    --as-sent. The three statements of migrate.sql holding {} are composed further by
    brooq.migrate (a schema's or an index's name) when it runs them."""
    found = chosen(name, list(flags), all_variants)
    held = queries(schema(ctx))
    texts = [getattr(held, s.name) for s in found]
    if as_sent:
        texts = [sent_text(t) for t in texts]
    if as_json:
        shown = [
            {
                "name": s.name,
                "file": f"brooq/sql/{s.file}",
                "template": s.template,
                "flags": sorted(s.flags),
                "schema": held.schema,
                "text": t,
            }
            for s, t in zip(found, texts, strict=True)
        ]
        emit_json({"statements": shown} if all_variants else shown[0])
        return
    if not all_variants:
        click.echo(texts[0])
        return
    for i, (s, t) in enumerate(zip(found, texts, strict=True)):
        if i:
            click.echo("")
        click.echo(f"-- ==== {s.name} (flags: {_flags_text(s.flags)}) ====")
        click.echo(t)


__all__ = ["Entry", "chosen", "entries", "file_comment", "reference_page", "sent_text", "templates"]
