"""``kvcargo simulate``: one run of the discrete-event simulator."""

from __future__ import annotations

import json
from typing import Any

import click

from kvcargo.cli.compare import GreedyFloats, compare_configs, ignored_flags, sweep_rates
from kvcargo.cli.options import config_from, say, sim_options
from kvcargo.outputs import check_output
from kvcargo.report.data import jsonable


@click.command("simulate")
@sim_options
@click.option("--json", "as_json", is_flag=True, help="print {config, summary} as JSON (SI units)")
@click.option("--requests-csv", type=click.Path(dir_okay=False, writable=True),
              help="write one row per request (timestamps in seconds)")
@click.option("--trace", "trace_file", type=click.Path(dir_okay=False, writable=True),
              help="write a Chrome trace-event JSON (open it in Perfetto)")
@click.option("--summary-only", is_flag=True,
              help="print only the summary as JSON, holding only a window of the requests")
@click.option("--compare", is_flag=True,
              help="run the colocated baseline on the same GPUs, then the disaggregated cluster")
@click.option("--sweep-rate", "sweep_rate", cls=GreedyFloats, type=float, multiple=True,
              help="run at each of these rates (--sweep-rate 1 2 4) and print one row per run")
def command(as_json: bool, requests_csv: str | None, trace_file: str | None, summary_only: bool,
            compare: bool, sweep_rate: tuple[float, ...], **params: Any) -> None:
    """Simulate prefill pool → KV link → decode pool (or the colocated baseline)."""
    from kvcargo.report.simulation import render
    from kvcargo.simulation import simulate

    if summary_only and (requests_csv or trace_file):
        raise click.UsageError("--summary-only keeps no per-request records: drop --requests-csv/--trace")
    for flag, path, suffixes in (("--requests-csv", requests_csv, (".csv",)), ("--trace", trace_file, (".json",))):
        if path:
            check_output(path, flag, suffixes)
    if (compare or sweep_rate) and (requests_csv or trace_file or summary_only):
        raise click.UsageError("--compare and --sweep-rate make several runs: drop --requests-csv/--trace/"
                               "--summary-only")
    say(ignored_flags(params, compare, sweep_rate, as_json))
    config = config_from({k: v for k, v in params.items() if not (compare and k == "mode")})
    if sweep_rate:
        click.echo(sweep_rates(config, sweep_rate, compare))
        return
    if compare:
        results = [simulate(c) for c in compare_configs(config)]
        if as_json:
            click.echo(json.dumps(jsonable([r.to_dict() for r in results]), indent=2))
        else:
            click.echo("\n\n".join(render(r.config.values(), r.summary) for r in results))
        return
    result = simulate(config, summary_only=summary_only)
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
        click.echo(render(result.config.values(), result.summary))  # a preset's SLOs, as scored
