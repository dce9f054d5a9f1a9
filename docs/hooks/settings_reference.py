"""MkDocs hook: the settings reference, generated from brooq's settings code at build time.

reference/settings.md holds the marker ``<!-- generated: settings -->``; this hook puts in
its place one table row per field of ``brooq.settings.Settings`` (its environment variable
from ``ENVIRONMENT``, its ``brooq-master`` flag from the click command, its kind, its
default) with the meaning from hooks/settings.yml, then the variables read outside the
settings object (the DSNs, the admin token, the master's logging flags). The build fails
(strict mode counts a hook's error as fatal) when the code and settings.yml disagree, so
the page cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click
import yaml

MARKER = "<!-- generated: settings -->"
HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def _duration(seconds: float) -> str:
    if seconds == 0:
        return "0s"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{round(seconds * 1000)}ms"


def _kind(name: str, settings_mod: Any) -> str:
    kinds = (
        ("_DURATIONS", "duration"),
        ("_INTEGERS", "integer"),
        ("_STRINGS", "text"),
        ("_QUEUE_LISTS", "queue list"),
        ("_HOST_LISTS", "host list"),
        ("_SCHEMAS", "schema name"),
    )
    for attr, label in kinds:
        if name in getattr(settings_mod, attr, ()):
            return label
    raise ValueError(f"settings reference: {name} has no kind in brooq.settings")


def _default(value: Any, kind: str) -> str:
    if kind == "duration":
        return _duration(float(value))
    if value in ((), None, ""):
        return "—"
    if isinstance(value, int):
        return f"{value:,}".replace(",", "\u202f") if value >= 10_000 else str(value)
    return str(value)


def _master_flags() -> dict[str, Any]:
    """The brooq-master command's options by parameter name."""
    from brooq.master_cli import command

    return {p.name: p for p in command.params if p.name}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def settings_table() -> str:
    from brooq import settings as settings_mod

    meanings = yaml.safe_load((HERE / "settings.yml").read_text())
    described = meanings["settings"]
    fields = [f for f in dataclasses.fields(settings_mod.Settings)]
    names = {f.name for f in fields}
    problems = [f"{n}: no meaning in docs/hooks/settings.yml" for n in names - set(described)]
    problems += [
        f"{n}: in docs/hooks/settings.yml but not a setting" for n in set(described) - names
    ]
    variables = {name: var for var, name in settings_mod.ENVIRONMENT.items()}
    problems += [f"{n}: no environment variable" for n in names - set(variables)]
    if problems:
        raise ValueError("settings reference out of date:\n  " + "\n  ".join(sorted(problems)))
    flags = _master_flags()
    rows = [
        "| setting | default | meaning |",
        "|---|---|---|",
    ]
    for f in fields:
        kind = _kind(f.name, settings_mod)
        entry = described[f.name]
        default = entry.get("default") or _default(f.default, kind)
        flag = flags.get(f.name)
        names = [f"`{variables[f.name]}`"]
        if flag is not None:
            names.append(" ".join(f"`{o}`" for o in flag.opts))
        names.append(f"`Queue({f.name}=)`")
        rows.append(
            f"| {'<br>'.join(names)} | {_cell(default)}<br>*{kind}* | {_cell(entry['meaning'])} |"
        )
    return "\n".join(rows)


def others_table() -> str:
    meanings = yaml.safe_load((HERE / "settings.yml").read_text())
    source = "\n".join(p.read_text() for p in (ROOT / "brooq").rglob("*.py"))
    flags = _master_flags()
    rows = [
        "| setting | default | meaning |",
        "|---|---|---|",
    ]
    problems = []
    for entry in meanings["others"]:
        var = entry["variable"]
        if f'"{var}"' not in source and f"'{var}'" not in source:
            problems.append(f"{var}: brooq's code no longer reads it")
        flag = entry.get("flag")
        if flag and not any(flag in p.opts for p in flags.values()):
            problems.append(f"{var}: brooq-master has no flag {flag}")
        names = [f"`{var}`"] + ([f"`{flag}`"] if flag else [])
        rows.append(
            f"| {'<br>'.join(names)} | {_cell(entry['default'])} "
            f"| {_cell(entry['meaning'])} Also: {_cell(entry['also'])}. |"
        )
    # The master's own flags that read a variable of their own (logging, metrics).
    for param in flags.values():
        envvar = getattr(param, "envvar", None)
        if not envvar:
            continue
        # click 8.3 marks "no default" with a sentinel of its own (click.core.UNSET).
        unset = param.default in (None, "") or param.default is getattr(click.core, "UNSET", None)
        default = "—" if unset else f"`{param.default}`"
        flag_text = " ".join(f"`{o}`" for o in param.opts)
        rows.append(f"| `{envvar}`<br>{flag_text} | {default} | {_cell(param.help or '')} |")
    if problems:
        raise ValueError("settings reference out of date:\n  " + "\n  ".join(problems))
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    generated = settings_table() + "\n\nRead outside the settings object:\n\n" + others_table()
    return markdown.replace(MARKER, generated)
