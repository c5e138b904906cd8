"""``kvcargo validate``: kvcargo beside numbers measured on real systems (see kvcargo/validate.py)."""

from __future__ import annotations

import json
import sys

import click


@click.command("validate")
@click.option("--group", "groups", multiple=True, help="only these groups (repeatable; see --list)")
@click.option("--list", "list_groups", is_flag=True, help="list the groups and exit")
@click.option("--trace-dir", type=click.Path(file_okay=False), default=None,
              help="directory with the trace files [default: $KVCARGO_TRACE_DIR, else the built-in traces]")
@click.option("--json", "as_json", is_flag=True, help="print every check as JSON (SI units)")
def command(groups: tuple[str, ...], list_groups: bool, trace_dir: str | None, as_json: bool) -> None:
    """Published vs kvcargo with the relative difference: KV sizes, MoE parameter counts,
    Splitwise's layer-wise transfer overhead, Mooncake's transfer-engine bandwidth, trace
    statistics. Gaps between kvcargo's illustrative model and a measurement are reported, not
    failed; exit 1 only when a value kvcargo should reproduce does not match."""
    from kvcargo import validate
    from kvcargo.report.data import jsonable

    if list_groups:
        for name, title in validate.groups().items():
            click.echo(f"{name:10} {title}")
        return
    results = validate.run(groups or None, trace_dir)
    if as_json:
        click.echo(json.dumps(jsonable([r.as_dict() for r in results]), indent=2))
    else:
        click.echo(validate.render(results))
    if any(r.status == "FAIL" for r in results):
        sys.exit(1)
