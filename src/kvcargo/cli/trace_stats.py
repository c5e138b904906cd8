"""``kvcargo trace-stats``: what a request trace holds (see kvcargo.workload.stats)."""

from __future__ import annotations

import json
from typing import Any

import click

from kvcargo.cli.options import config_from, field_options


@click.command("trace-stats")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="print the statistics as JSON (SI units)")
@click.option("--bucket", type=float, default=None, help="width of the arrival-rate timeline, s (at least 1e-6, at most a million buckets) [default: auto]")
@click.option("--model", default=None, help="also show the KV hand-off bandwidth for this model (kvcargo catalog models)")
@field_options("catalog", "arrival_col", "prompt_col", "output_col", "time_unit", "time_scale", "rate", "limit",
               "window")
def command(file: str, as_json: bool, bucket: float | None, model: str | None, **params: Any) -> None:
    """Requests, duration, length percentiles, arrival-rate timeline, burstiness and prefix reuse
    of a trace (Mooncake JSONL, Azure 2023 CSV, kvcargo CSV, JSON rows or a mapped CSV/JSONL)."""
    from kvcargo import catalog as catalog_mod
    from kvcargo.config import load_workload
    from kvcargo.report.data import jsonable
    from kvcargo.report.trace_stats import render
    from kvcargo.workload.stats import trace_stats

    config = config_from({**params, "workload_file": file})
    w = load_workload(config)
    m, links = None, ()
    if model is not None:
        cat = catalog_mod.load(config.catalog)
        m, links = cat.model(model), list(cat.links.values())
    st = trace_stats(w, bucket, m, links)
    if as_json:
        click.echo(json.dumps(jsonable(st), indent=2))
    else:
        click.echo(render(st))
