"""``kvcargo handoff``: the chapter's calculator for one prompt (or every link)."""

from __future__ import annotations

import json
from typing import Any

import click

from kvcargo import catalog as catalog_mod
from kvcargo.cli.options import field_options
from kvcargo.handoff import calculate_config
from kvcargo.params import HandoffConfig
from kvcargo.report.handoff import link_table, panel


@click.command("handoff")
@field_options(*HandoffConfig.model_fields, model=HandoffConfig)
@click.option("--links", "all_links", is_flag=True, help="the link table: this hand-off over every link")
@click.option("--json", "as_json", is_flag=True, help="print JSON (seconds, bytes, req/s)")
def command(all_links: bool, as_json: bool, **params: Any) -> None:
    """Hand-off size, transfer time, time exposed after prefill and link saturation rate."""
    given = {k: v for k, v in params.items() if v not in (None, ())}
    if all_links and "link" in given:
        raise click.UsageError("--links shows every link: drop --link (or drop --links for one link)")
    # click has parsed every type; the ranges are checked where the values enter the calculation
    # (kvcargo.limits), which names each bound's reason
    config = HandoffConfig.model_construct(**given)
    cat = catalog_mod.load(config.catalog)
    keys = list(cat.links) if all_links else [config.link]
    runs = [calculate_config(config.model_copy(update={"link": key}), cat) for key in keys]
    results = [r for r, *_ in runs]
    if as_json:
        data = [r.as_dict() for r in results]
        click.echo(json.dumps(data if all_links else data[0], indent=2))
    elif all_links:
        click.echo(link_table(runs))
    else:
        r, m, ln, pool = runs[0]
        click.echo(panel(r, ln.name, m.name, pool))
