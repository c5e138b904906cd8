"""``kvcargo capacity``: the analytic ceilings and the highest sustainable rate of a configuration."""

from __future__ import annotations

import json
import math
from typing import Any

import click

from kvcargo.cli.options import config_from, sim_options
from kvcargo.report.data import jsonable
from kvcargo.report.text import count


@click.command("capacity")
@sim_options
@click.option("--target", type=float, default=0.9, show_default=True,
              help="share of requests that must meet both SLOs [range: > 0, ≤ 1]")
@click.option("--rtol", type=float, default=0.02, show_default=True,
              help="stop bisecting when hi - lo <= rtol * hi [range: 1e-06 to < 1]")
@click.option("--no-search", is_flag=True, help="the analytic ceilings only (no simulation)")
@click.option("--plot", type=click.Path(dir_okay=False), metavar="FILE",
              help="SLO attainment of every probe vs rate: .png (matplotlib) or .html (plotly)")
@click.option("--json", "as_json", is_flag=True, help="print the ceilings and the search as JSON (req/s, s)")
def command(target: float, rtol: float, no_search: bool, plot: str | None, as_json: bool, **params: Any) -> None:
    """Per-resource ceilings (prefill, decode, link, colocated) and the highest rate at which at
    least --target of requests meet both SLOs (bracket and bisect; every probe a simulation of
    the configuration at that rate)."""
    from kvcargo.errors import KvcargoError
    from kvcargo.planner.capacity import capacity, check_target

    if params.get("rate") is not None:
        raise KvcargoError("capacity searches the arrival rate: drop --rate")
    check_target(target, rtol)
    if plot:
        from kvcargo.report.plots import check_plot

        check_plot(plot)
    config = config_from(params)
    data = capacity(config, target, rtol, do_search=not no_search)
    if plot:
        from kvcargo.outputs import atomic_path
        from kvcargo.report.plots import capacity_figure

        with atomic_path(plot) as tmp:
            capacity_figure(data, tmp)
    if as_json:
        click.echo(json.dumps(jsonable(data), indent=2))
    else:
        click.echo(render(data))


def render(data: dict[str, Any]) -> str:
    from kvcargo.report.simulation import describe_config
    from kvcargo.report.text import seconds, table

    c, k = data["config"], data["ceilings"]
    lines = [describe_config(c, with_rate=False),  # the rate is what is searched
             f"Mean prompt {k['prompt']:,.0f} tokens, mean output {k['output']:,.0f} tokens", ""]
    rows = []
    if k["mode"] == "disagg":
        p_inst = f"× {k['prefill_instances']}" if k["prefill_instances"] > 1 else ""
        d_inst = f"× {k['decode_instances']}" if k["decode_instances"] > 1 else ""
        rows.append(["prefill", _r(k["prefill"]),
                     f"{k['prefill_batch']} prompt{'s' if k['prefill_batch'] != 1 else ''} per "
                     f"{seconds(k['prefill_step_s'])} step {p_inst}".rstrip()])
        rows.append(["decode", _r(k["decode"]),
                     f"batch {k['decode_batch']} at {k['decode_context']:,} tokens, {seconds(k['decode_step_s'])} "
                     f"per step {d_inst}".rstrip()])
        link_note = (f"{seconds(k['transfer_s'])} per hand-off, {k['channels']} channel"
                     f"{'s' if k['channels'] != 1 else ''}")
        rows.append(["KV link", _r(k["link"]), link_note])
        rows.append(["colocated", _r(k["colocated"]),
                     f"the same {k['colocated_instances']} instances doing both (--mode colocated)"])
    else:
        rows.append(["prefill only", _r(k["prefill"]), f"{k['prefill_batch']} prompts per "
                     f"{seconds(k['prefill_step_s'])} step × {k['prefill_instances']}"])
        rows.append(["decode only", _r(k["decode"]), f"batch {k['decode_batch']}, "
                     f"{seconds(k['decode_step_s'])} per step × {k['decode_instances']}"])
        rows.append(["colocated", _r(k["colocated"]), "N / (1/prefill + 1/decode)"])
    rows.append(["bound", _r(k["bound"]), f"{k['bound_by']} (the lowest ceiling)"])
    lines.append("Analytic ceilings (req/s)")
    lines.append(table(["resource", "req/s", "from"], rows, "lrl"))
    s = data.get("search")
    if s:
        lines.append("")
        slo = f"TTFT ≤ {c['ttft_slo']:g} s and TPOT ≤ {c['tpot_slo'] * 1e3:g} ms"
        if s["feasible"]:
            lines.append(f"Highest sustainable rate: {s['rate']:.2f} req/s "
                         f"(≥ {100 * s['target']:g}% of requests with {slo})")
        else:
            lines.append(f"No sustainable rate: below {s['hi']:.3g} req/s still fewer than "
                         f"{100 * s['target']:g}% of requests meet {slo}")
        lines.append(f"found in {count(s['simulations'], 'simulation')} of {count(c['requests'], 'request')} "
                     f"(seed {c['seed']}, stop at hi - lo ≤ {s['rtol']:g}·hi):")
        probe_rows = [[i + 1, f"{p['rate']:.4g}", f"{100 * p['slo_attainment']:.1f}%" if not math.isnan(p['slo_attainment'])
                       else "—", "yes" if p["ok"] else "no"] for i, p in enumerate(s["probes"])]
        lines.append(table(["probe", "req/s", "SLO met", "≥ target"], probe_rows, "rrrl"))
        if not s["steady"]:
            lines.append(f"note: at {s['rate']:.3g} req/s the {c['requests']} requests arrive within "
                         f"{s['lifetimes']:.1f} request lifetimes: the run measures a transient; "
                         "raise --requests for a steady-state answer")
    return "\n".join(lines)


def _r(x: float) -> str:
    return "—" if x is None or math.isinf(x) else f"{x:.2f}"
