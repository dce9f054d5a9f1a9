"""`brooq migrate up|down|status|sql`: the schema as a deployment step.

Owns: the migrate commands' options and output; they run on the direct connection
(brooq.cli.common.direct_dsn): a transaction pooler would not keep the migrator's lock.
Must never: apply or revert anything itself (brooq.migrate does, under its advisory
lock), or be run by anything at start-up.
"""

from __future__ import annotations

import click

from brooq import migrate as migrate_mod
from brooq.cli.common import cli, direct_dsn, emit_json, schema


@cli.group()
def migrate() -> None:
    """Apply or revert the schema (a deployment step, never done at start-up)."""


@migrate.command("up")
@click.option("--to", "target", type=int, help="Stop at this version.")
@click.option(
    "--repair",
    is_flag=True,
    help="First run again the up part of every migration partly reverted or damaged "
    "(`brooq migrate status` names them).",
)
@click.pass_context
def migrate_up(ctx: click.Context, target: int | None, repair: bool) -> None:
    """Apply every migration not yet applied."""
    dsn, found = direct_dsn(ctx), schema(ctx)
    repaired = migrate_mod.repair(dsn, schema=found) if repair else []
    for m in repaired:
        click.echo(f"repaired {m.version:04d}_{m.name}")
    applied = migrate_mod.up(dsn, target, schema=found)
    for m in applied:
        click.echo(f"applied {m.version:04d}_{m.name}")
    if not applied and not repaired:
        click.echo("nothing to apply: the schema is up to date")


@migrate.command("down")
@click.option("--steps", default=1, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--to",
    "target",
    type=click.IntRange(min=0),
    help="Revert every migration above this version (instead of --steps).",
)
@click.pass_context
def migrate_down(ctx: click.Context, steps: int, target: int | None) -> None:
    """Revert the last applied migration (or --steps of them, or those above --to)."""
    undone = migrate_mod.down(direct_dsn(ctx), steps, schema=schema(ctx), to=target)
    for m in undone:
        click.echo(f"reverted {m.version:04d}_{m.name}")
    if not undone:
        click.echo("nothing to revert")


@migrate.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def migrate_status(ctx: click.Context, as_json: bool) -> None:
    """Show which migrations are applied."""
    statuses = migrate_mod.status(direct_dsn(ctx), schema=schema(ctx))
    if as_json:
        emit_json(
            [
                {
                    "version": s.version,
                    "name": s.name,
                    "applied_at": s.applied_at.isoformat() if s.applied_at else None,
                    "state": s.state,
                    "missing": list(s.missing),
                }
                for s in statuses
            ]
        )
    else:
        for s in statuses:
            when = s.applied_at.isoformat(timespec="seconds") if s.applied_at else "pending"
            label = {"applying": "partly applied", "reverting": "partly reverted"}
            shown = when if s.state in ("applied", "pending") else label.get(s.state, s.state)
            click.echo(f"{s.version:04d}_{s.name:<30} {shown}")
        for s in statuses:
            if s.advice:
                click.echo(f"\n{s.advice}")
    if any(s.advice for s in statuses):
        ctx.exit(1)  # the schema is not what is recorded, or a step stopped part-way


@migrate.command("sql")
@click.argument("direction", type=click.Choice(["up", "down"]), default="up")
@click.pass_context
def migrate_sql(ctx: click.Context, direction: str) -> None:
    """Print the migrations' SQL, for teams that apply schema with their own tool."""
    found = schema(ctx)
    click.echo(
        migrate_mod.script(direction, schema=found) if found else migrate_mod.script(direction),
        nl=False,
    )
