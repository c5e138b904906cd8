"""``kvcargo sweep``: a grid of simulations, one row per run, on every core or on a cluster."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from typing import Any

import click

from kvcargo.cli.options import given_params, sim_options
from kvcargo.outputs import atomic_path
from kvcargo.report.data import jsonable
from kvcargo.report.text import count


def backend_options(fn: Callable) -> Callable:
    """``--backend``, ``--workers``, ``--address`` and ``--progress/--no-progress``."""
    fn = click.option("--progress/--no-progress", default=None,
                      help="progress bar with ETA on stderr [default: when stderr is a terminal]")(fn)
    fn = click.option("--address", metavar="ADDR",
                      help="cluster to use: Ray address (else RAY_ADDRESS) or Dask scheduler "
                           "(else DASK_SCHEDULER_ADDRESS); default: start a local one")(fn)
    fn = click.option("--workers", type=int, metavar="N",
                      help="parallel workers [range: ≥ 1] [default: every core; 1 runs in this process]")(fn)
    fn = click.option("--backend", type=click.Choice(["local", "ray", "dask"]), default="local",
                      show_default=True, help="where the runs execute")(fn)
    return fn


def open_backend(backend: str, workers: int | None, address: str | None):
    from kvcargo.planner.backends import get_backend

    if address and backend == "local":
        from kvcargo.errors import KvcargoError

        raise KvcargoError("--address needs --backend ray or --backend dask")
    return get_backend(backend, workers, address)


def show_progress(flag: bool | None) -> bool:
    return sys.stderr.isatty() if flag is None else flag


def given_values(params: dict[str, Any]) -> dict[str, Any]:
    """The simulate flags that were given, each validated on its own (combinations are per run)."""
    from kvcargo.planner.grid import coerce

    return {k: v if k == "catalog" else coerce(k, v, "options") for k, v in given_params(params).items()}


@click.command("sweep")
@click.argument("sweep_file", required=False, type=click.Path(dir_okay=False))
@sim_options
@click.option("--vary", multiple=True, metavar="NAME=V1,V2,...",
              help="an axis of the grid: a simulate flag and its values (repeatable); "
                   "START:STOP:STEP for a range, 'default' for the flag's default")
@click.option("--out", "-o", type=click.Path(dir_okay=False), metavar="FILE.csv",
              help="write one row per run here (and FILE.parquet with pyarrow); rows already "
                   "in it are skipped")
@click.option("--fresh", is_flag=True, help="ignore (and overwrite) the rows already in --out")
@click.option("--retry-failed", is_flag=True, help="run again the rows of --out that failed")
@backend_options
@click.option("--plot", type=click.Path(dir_okay=False), metavar="FILE",
              help="latency, SLO attainment and link busy vs rate: .png (matplotlib) or .html (plotly)")
@click.option("--x", "x_axis", metavar="NAME", help="x axis of --plot [default: rate if varied, else the first axis]")
@click.option("--json", "as_json", is_flag=True, help="print the rows as JSON (SI units)")
def command(sweep_file: str | None, vary: tuple[str, ...], out: str | None, fresh: bool, retry_failed: bool,
            backend: str, workers: int | None, address: str | None, progress: bool | None,
            plot: str | None, x_axis: str | None, as_json: bool, **params: Any) -> None:
    """Simulate every combination of the --vary values (or a TOML sweep file).

    \b
    kvcargo sweep --vary rate=8,10,12,14 --vary link=ib-ndr,eth-25g --vary kv-compress=none,fp8
    kvcargo sweep sweep.toml --out results.csv --plot results.png
    """
    from kvcargo.planner import grid as grid_mod
    from kvcargo.planner.sweep import run_sweep

    if (fresh or retry_failed) and not out:
        raise click.UsageError(f"--{'fresh' if fresh else 'retry-failed'} acts on the rows of --out: give --out FILE.csv")
    check_outputs(out, plot)
    grid = grid_mod.build(given_values(params), vary, sweep_file)
    check_catalog_keys(grid)
    x, by = plot_axes(grid.varied, x_axis)
    with open_backend(backend, workers, address) as be:
        if not as_json:
            click.echo(f"sweep: {count(len(grid), 'run')} ({' x '.join(n.replace('_', '-') for n in grid.varied)}) "
                       f"on {describe_backend(be)}", err=True)
        result = run_sweep(grid, be, out, resume=not fresh, retry_failed=retry_failed,
                           progress=show_progress(progress))
    if plot:
        from kvcargo.report.plots import sweep_figure

        with atomic_path(plot) as tmp:
            sweep_figure(result.grid_rows, tmp, x, by)
    if as_json:
        click.echo(json.dumps(jsonable(result.grid_rows), indent=2))
        return
    click.echo(render(result))
    where = []
    if result.csv_path:
        where.append(str(result.csv_path))
    if result.parquet_path:
        where.append(str(result.parquet_path))
    if plot:
        where.append(plot)
    tail = f"{count(result.ran, 'run')} in {result.wall_s:.1f} s"
    if result.skipped:
        tail += f", {result.skipped} already done"
    if result.failed:
        tail += f", {result.failed} failed"
    if result.kept:
        tail += f"; kept {count(result.kept, 'row')} of other sweeps"
    if where:
        tail += "; wrote " + ", ".join(where)
    click.echo(tail)


def check_outputs(out: str | None, plot: str | None) -> None:
    """Refuse unwritable outputs before any run: --out (its CSV and Parquet files) and --plot."""
    from kvcargo.outputs import check_output
    from kvcargo.planner.sweep import output_paths
    from kvcargo.report.plots import check_plot

    if out:
        check_output(out, "--out", (".csv", ".parquet"))
        for path in output_paths(out):
            check_output(path, "--out")
    if plot:
        check_plot(plot)


CATALOG_AXES = {"model": "model", "device": "device", "prefill_device": "device", "decode_device": "device",
                "link": "link", "kv_compress": "codec"}
"""Axes whose values are catalog keys, and the kind each names."""


def check_catalog_keys(grid) -> None:
    """Refuse an axis value that names nothing in the catalog before any run (a typo is not a
    failed run)."""
    from kvcargo import catalog as catalog_mod

    cat = catalog_mod.load(grid.base.get("catalog", ()))
    for name, values in grid.axes:
        kind = CATALOG_AXES.get(name)
        for value in values if kind else ():
            if value is not None:
                getattr(cat, kind)(value)


def describe_backend(be) -> str:
    return f"{be.name} backend, {be.workers} worker{'s' if be.workers != 1 else ''}"


def plot_axes(varied: list[str], x_axis: str | None) -> tuple[str, list[str]]:
    """(x, series keys): rate when it is varied, else the first axis; the others make the series."""
    from kvcargo.planner.grid import field_name

    x = field_name(x_axis, "--x") if x_axis else ("rate" if "rate" in varied else varied[0])
    return x, [v for v in varied if v != x]


def render(result) -> str:
    """The results table: the varied values, then the headline metrics (or the error)."""
    from kvcargo.report.text import ms, pct, table

    varied = result.grid.varied
    errors = any(r.get("status") != "ok" for r in result.grid_rows)
    headers = [v.replace("_", "-") for v in varied] + [
        "TTFT p99 ms", "TPOT p99 ms", "SLO met", "goodput/s", "link busy", "J/token"] + (["error"] if errors else [])
    rows = []
    for r in result.grid_rows:
        cells = [_show(r.get(v)) for v in varied]
        if r.get("status") == "ok":
            cells += [ms(_f(r.get("ttft_p99"))), ms(_f(r.get("tpot_p99"))), pct(_f(r.get("slo_attainment"))),
                      _fmt(r.get("goodput_rps"), "{:.2f}"), pct(_f(r.get("link_busy"))),
                      _fmt(r.get("j_per_token"), "{:.3f}")] + ([""] if errors else [])
        else:
            cells += ["—"] * 6 + [str(r.get("error", ""))[:120]]
        rows.append(cells)
    return table(headers, rows, "l" * len(varied) + "r" * 6 + "l" * errors)


def _f(v: Any) -> float:
    return math.nan if v is None else float(v)


def _fmt(v: Any, spec: str) -> str:
    x = _f(v)
    return "—" if math.isnan(x) else spec.format(x)


def _show(v: Any) -> str:
    if v is None:
        return "default"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)
