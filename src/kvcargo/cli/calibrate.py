"""``kvcargo calibrate``: fit the calibrated models to your measurements (see kvcargo/calibrate.py)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from kvcargo.cli.options import field_options
from kvcargo.report.text import table


@click.command("calibrate")
@click.option("--steps", type=click.Path(dir_okay=False), default=None,
              help="step times: CSV with model,device,tp,phase,batch,tokens,time_s; or per-request "
                   "model,device,tp,prompt,output,ttft_s,tpot_s[,batch]; or Splitwise's perf_model.csv")
@click.option("--send-recv", type=click.Path(dir_okay=False), default=None,
              help="a send/recv curve (Vidur's send_recv.csv layout) measured on --link")
@click.option("--link", default=None, help="catalog link the --send-recv curve measures")
@click.option("--within-node", is_flag=True, help="use the curve's rows within one node (devices_per_node 2)")
@click.option("--import-aiconfigurator", "import_system", default=None,
              help="convert this aiconfigurator-core system's kernel tables (needs pyarrow and the package)")
@click.option("--device", default=None, help="catalog device the imported tables measure")
@click.option("--tables", type=click.Path(dir_okay=False), default=None, help="the .npz to write the tables to")
@click.option("--aiconfigurator-data", "data_root", type=click.Path(file_okay=False), default=None,
              help="systems/data of an unpacked aiconfigurator-core wheel [default: the installed package's]")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="write the catalog overlay here [default: print it]")
@field_options("catalog")
@click.option("--json", "as_json", is_flag=True, help="print the fit report as JSON")
def command(steps: str | None, send_recv: str | None, link: str | None, within_node: bool,
            import_system: str | None, device: str | None, tables: str | None, data_root: str | None,
            out: str | None, catalog: tuple[str, ...], as_json: bool) -> None:
    """Fit the framework constants (prefill kernel and all-reduce scales, host floor and large-step
    factor per device, decode overhead per TP degree) and link efficiency to your measurements, or
    import another system's kernel tables from aiconfigurator-core; write a catalog TOML overlay
    for --catalog and report the fit error."""
    from kvcargo.calibrate import calibrate

    text, reports = calibrate(steps, send_recv, link, within_node, catalog, import_system, device, tables,
                              data_root)
    if out is not None:
        Path(out).write_text(text, encoding="utf-8")
    if as_json:
        click.echo(json.dumps({"overlay": out, "fit": [vars(r) for r in reports]}, indent=2))
        return
    if out is None:
        click.echo(text)
    rows = [[r.what, f"{r.rows:,}", f"{r.median:.1%}" if r.rows else "—", f"{r.p90:.1%}" if r.rows else "—"]
            for r in reports]
    if rows:
        click.echo(table(["fit", "rows", "median |error|", "p90 |error|"], rows, "lrrr"), err=out is None)
