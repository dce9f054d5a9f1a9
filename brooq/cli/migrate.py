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
@click.pass_context
def migrate_up(ctx: click.Context, target: int | None) -> None:
    """Apply every migration not yet applied."""
    applied = migrate_mod.up(direct_dsn(ctx), target, schema=schema(ctx))
    for m in applied:
        click.echo(f"applied {m.version:04d}_{m.name}")
    if not applied:
        click.echo("nothing to apply: the schema is up to date")


@migrate.command("down")
@click.option("--steps", default=1, show_default=True, type=click.IntRange(min=1))
@click.pass_context
def migrate_down(ctx: click.Context, steps: int) -> None:
    """Revert the last applied migration (or --steps of them)."""
    undone = migrate_mod.down(direct_dsn(ctx), steps, schema=schema(ctx))
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
                }
                for s in statuses
            ]
        )
        return
    for s in statuses:
        when = s.applied_at.isoformat(timespec="seconds") if s.applied_at else "pending"
        click.echo(f"{s.version:04d}_{s.name:<30} {when}")


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
