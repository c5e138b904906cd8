"""``kvcargo simulate``: one run of the discrete-event simulator."""

from __future__ import annotations

import json
import math
from typing import Any

import click

from kvcargo.cli.options import config_from, sim_options
from kvcargo.outputs import check_output


def jsonable(x: Any) -> Any:
    """NaN and infinities as null (strict JSON)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x


@click.command("simulate")
@sim_options
@click.option("--json", "as_json", is_flag=True, help="print {config, summary} as JSON (SI units)")
@click.option("--requests-csv", type=click.Path(dir_okay=False, writable=True),
              help="write one row per request (timestamps in seconds)")
@click.option("--trace", "trace_file", type=click.Path(dir_okay=False, writable=True),
              help="write a Chrome trace-event JSON (open it in Perfetto)")
@click.option("--summary-only", is_flag=True,
              help="print only the summary as JSON and keep nothing per request beyond arrays of floats")
def command(as_json: bool, requests_csv: str | None, trace_file: str | None, summary_only: bool,
            **params: Any) -> None:
    """Simulate prefill pool → KV link → decode pool (or the colocated baseline)."""
    from kvcargo.report.simulation import render
    from kvcargo.simulation import simulate

    if summary_only and (requests_csv or trace_file):
        raise click.UsageError("--summary-only keeps no per-request records: drop --requests-csv/--trace")
    for flag, path, suffixes in (("--requests-csv", requests_csv, (".csv",)), ("--trace", trace_file, (".json",))):
        if path:
            check_output(path, flag, suffixes)
    config = config_from(params)
    result = simulate(config)
    if requests_csv:
        result.write_requests_csv(requests_csv)
    if trace_file:
        from kvcargo.report.perfetto import write_trace

        write_trace(result, trace_file)
    if summary_only:
        click.echo(json.dumps(jsonable({"summary": result.summary})))
    elif as_json:
        click.echo(json.dumps(jsonable(result.to_dict()), indent=2))
    else:
        click.echo(render(config.model_dump(), result.summary))
