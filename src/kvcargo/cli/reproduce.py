"""``kvcargo reproduce``: every published figure beside kvcargo's value (see reproduce.py)."""

from __future__ import annotations

import json
import sys

import click


@click.command("reproduce")
@click.option("--group", "groups", multiple=True, help="only these groups (repeatable; see --list)")
@click.option("--list", "list_groups", is_flag=True, help="list the groups and exit")
@click.option("--json", "as_json", is_flag=True, help="print every check as JSON")
def command(groups: tuple[str, ...], list_groups: bool, as_json: bool) -> None:
    """Regenerate the chapter's figures and the reference's tables; exit 1 on any mismatch."""
    from kvcargo import reproduce

    if list_groups:
        for name, title in reproduce.groups().items():
            click.echo(f"{name:12} {title}")
        return
    checks = reproduce.run(groups or None)
    if as_json:
        click.echo(json.dumps([c.as_dict() for c in checks], indent=2))
    else:
        click.echo(reproduce.render(checks))
    if not all(c.ok for c in checks):
        sys.exit(1)
