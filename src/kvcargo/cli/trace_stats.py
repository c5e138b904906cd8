"""``kvcargo trace-stats``: what a request trace holds (see kvcargo.workload.stats)."""

from __future__ import annotations

import json

import click


@click.command("trace-stats")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="print the statistics as JSON (SI units)")
@click.option("--bucket", type=float, default=None, help="width of the arrival-rate timeline, s [default: auto]")
@click.option("--model", default=None, help="also show the KV hand-off bandwidth for this model (kvcargo catalog models)")
@click.option("--catalog", "catalog_files", multiple=True, type=click.Path(dir_okay=False),
              help="extra catalog TOML file (repeatable)")
@click.option("--arrival-col", default=None, help="column (CSV header or JSON key) with arrival times")
@click.option("--prompt-col", default=None, help="column with prompt lengths (tokens)")
@click.option("--output-col", default=None, help="column with output lengths (tokens)")
@click.option("--time-unit", type=click.Choice(["s", "ms", "us", "ns"]), default=None,
              help="unit of numeric arrival times [default: s; Mooncake: ms]")
@click.option("--time-scale", type=float, default=None, help="multiply arrival times (0.5: twice as fast)")
@click.option("--rate", type=float, default=None, help="rescale to this mean rate, req/s (burstiness kept)")
@click.option("--limit", type=int, default=None, help="only the first N requests (after --window)")
@click.option("--window", default=None, help="only requests arriving in START:END seconds")
def command(file: str, as_json: bool, bucket: float | None, model: str | None, catalog_files: tuple[str, ...],
            arrival_col: str | None, prompt_col: str | None, output_col: str | None, time_unit: str | None,
            time_scale: float | None, rate: float | None, limit: int | None, window: str | None) -> None:
    """Requests, duration, length percentiles, arrival-rate timeline, burstiness and prefix reuse
    of a trace (Mooncake JSONL, Azure 2023 CSV, kvcargo CSV, JSON rows or a mapped CSV/JSONL)."""
    from kvcargo import catalog as catalog_mod
    from kvcargo.cli.simulate import jsonable
    from kvcargo.workload.stats import render, trace_stats
    from kvcargo.workload.traces import read_trace, transform

    w = read_trace(file, arrival_col=arrival_col, prompt_col=prompt_col, output_col=output_col,
                   time_unit=time_unit)
    w = transform(w, time_scale=time_scale, rate=rate, limit=limit, window=window)
    m, links = None, ()
    if model is not None:
        cat = catalog_mod.load(catalog_files)
        m, links = cat.model(model), list(cat.links.values())
    st = trace_stats(w, bucket, m, links)
    if as_json:
        click.echo(json.dumps(jsonable(st), indent=2))
    else:
        click.echo(render(st))
