"""``kvcargo plan``: the best prefill:decode split, devices and link for a workload and a budget."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from kvcargo.cli.options import field_options
from kvcargo.cli.sweep import backend_options, describe_backend, open_backend, show_progress
from kvcargo.config import SimConfig
from kvcargo.report.data import jsonable
from kvcargo.report.text import count


@click.command("plan")
@field_options(*(f for f in SimConfig.model_fields if f != "tp"))  # plan's own --tp lists devices per instance
@click.option("--gpus", type=int, metavar="N", help="budget: at most N devices in all [range: ≥ 1]")
@click.option("--usd", type=float, metavar="DOLLARS", help="budget: at most this much (catalog price_usd per device) [range: > 0]")
@click.option("--power-w", type=float, metavar="WATTS",
              help="budget: provisioned power (per-device cap, else TDP), all devices [range: > 0]")
@click.option("--cost", type=click.Choice(["gpus", "usd", "power"]),
              help="x axis of the Pareto front [default: the budget's kind]")
@click.option("--devices", metavar="LIST", help="devices to try in each pool, e.g. h100,a100 [default: --device]")
@click.option("--tp", metavar="LIST",
              help="devices per instance to try, e.g. 1,2,4 [default: the smallest that fits and its double]")
@click.option("--links", metavar="LIST", help="KV links to try, e.g. ib-ndr,eth-100g [default: --link]")
@click.option("--formats", metavar="LIST", help="weight and KV storage formats to try, e.g. bf16,fp8")
@click.option("--splits", is_flag=True,
              help="also try every tp x pp split of each instance's devices (with its communication)")
@click.option("--max-instances", type=int, default=32, show_default=True,
              help="most instances per pool [range: ≥ 1; at most 50,000 candidates in all]")
@click.option("--with-colocated", is_flag=True, help="also try colocated clusters of the same devices")
@click.option("--target", type=float, default=0.9, show_default=True,
              help="share of requests that must meet both SLOs [range: > 0, ≤ 1]")
@click.option("--rtol", type=float, default=0.02, show_default=True, help="relative tolerance of each search [range: 1e-06 to < 1]")
@click.option("--steady/--no-steady", default=True, show_default=True,
              help="search again with more requests where a run was shorter than 3 request lifetimes")
@backend_options
@click.option("--plot", type=click.Path(dir_okay=False), metavar="FILE",
              help="the Pareto front: .png (matplotlib) or .html (plotly)")
@click.option("--all", "show_all", is_flag=True, help="list every simulated candidate, not only the front")
@click.option("--json", "as_json", is_flag=True, help="print the plan as JSON")
def command(gpus: int | None, usd: float | None, power_w: float | None, cost: str | None, devices: str | None,
            tp: str | None, links: str | None, formats: str | None, splits: bool, max_instances: int, with_colocated: bool, target: float, rtol: float,
            steady: bool, backend: str, workers: int | None, address: str | None, progress: bool | None, plot: str | None,
            show_all: bool, as_json: bool, **params: Any) -> None:
    """Search prefill:decode splits, devices per instance, devices and links within a budget;
    print the Pareto front of capacity (req/s inside the SLOs) vs cost and the best configuration.

    Simulate flags set the workload, the SLOs and anything held fixed (--prefill 2 fixes the
    prefill pool); --rate is the load to serve: the best plan is then the cheapest that sustains it.

    \b
    kvcargo plan --gpus 16
    kvcargo plan --model llama3-70b --usd 1500000 --devices h100,a100 --rate 12
    """
    from kvcargo.cli.options import config_from, given_params
    from kvcargo.planner import plan as plan_mod

    if plot:
        from kvcargo.report.plots import check_plot

        check_plot(plot)
    given = set(given_params(params))
    target_rate = params.get("rate")
    if target_rate is not None:
        from kvcargo.limits import RANGES

        RANGES["rate"].check("--rate", target_rate)
    base = config_from({k: v for k, v in params.items() if k != "rate"})
    budget = plan_mod.Budget(gpus, usd, power_w)
    space = plan_mod.build_space(
        base, given, budget, devices=plan_mod.parse_list(devices, str, "--devices"),
        tp=plan_mod.parse_list(tp, int, "--tp"), links=plan_mod.parse_list(links, str, "--links"),
        max_instances=max_instances, with_colocated=with_colocated,
        formats=plan_mod.parse_list(formats, str, "--formats"), splits=splits)
    bar = None
    with open_backend(backend, workers, address) as be:
        if show_progress(progress):
            from tqdm import tqdm

            bar = tqdm(unit="cand", desc="plan", file=sys.stderr, dynamic_ncols=True)

        def tick(done: int, total: int) -> None:
            if bar is not None:
                bar.total = total
                bar.n = done
                bar.refresh()

        try:
            result = plan_mod.plan(base, budget, space, target_rate=target_rate, target=target, rtol=rtol,
                                   cost=cost, backend=be, progress=tick, steady=steady)
        finally:
            if bar is not None:
                bar.close()
        result.backend = describe_backend(be)
    if plot:
        from kvcargo.outputs import atomic_path
        from kvcargo.report.plots import pareto_figure

        with atomic_path(plot) as tmp:
            pareto_figure([c.row() for c in result.candidates], tmp, result.cost,
                          result.best.label if result.best else None, target_rate)
    if as_json:
        click.echo(json.dumps(jsonable(result.as_dict()), indent=2))
    else:
        click.echo(render(result, space, show_all))


def render(r, space, show_all: bool = False) -> str:
    from kvcargo.report.text import table

    c = r.base
    slo = f"TTFT {c.ttft_slo:g} s / TPOT {c.tpot_slo * 1e3:g} ms for {100 * r.target:g}% of requests"
    load = f"trace {c.workload_file}" if c.workload_file else f"prompt {c.prompt:g} / output {c.output:g} tokens"
    lines = [f"Plan for {c.model}: {load}, {slo}"]
    if r.target_rate is not None:
        lines.append(f"Load to serve: {r.target_rate:g} req/s")
    devs = sorted(set(space.prefill_devices) | set(space.decode_devices))
    tps = sorted({n for v in (*space.tp.values(), *space.decode_tp.values()) for n in v})
    lines.append(f"Budget: {r.budget.describe()}. Searched: devices {', '.join(devs)}; devices per instance "
                 f"{', '.join(map(str, tps))}; links {', '.join(space.links)}"
                 + ("; colocated too" if space.colocated and space.disagg else ""))
    k = r.counts
    pruned = k["below_target"] + k["dominated"]
    lines.append(f"{count(k['candidates'], 'candidate')} within the budget: {k['do_not_fit']} do not fit, {pruned} "
                 f"pruned by analytic bounds, {k['simulated']} simulated ({count(r.simulations, 'simulation')}, "
                 f"{r.wall_s:.1f} s, "
                 f"{r.backend})" + (f", {k['failed']} failed" if k["failed"] else ""))
    lines.append("")
    from kvcargo.planner.plan import COST_LABEL

    cost_head = COST_LABEL[r.cost]
    shown = [x for x in r.candidates if x.capacity is not None] if show_all else r.front
    shown = sorted(shown, key=lambda x: (x.cost(r.cost), -(x.capacity or 0), x.label))
    rows = []
    for x in shown:
        per_gpu = x.capacity / x.gpus
        rows.append([("* " if x is r.best else "  ") + x.label, x.gpus, f"{x.usd:,.0f}" if x.usd else "—",
                     f"{x.power_w:,.0f}", f"{x.capacity:.2f}", f"{per_gpu:.2f}",
                     f"{x.capacity / x.usd * 1e3:.3f}" if x.usd else "—",
                     f"{x.bound:.2f} {x.bound_by}"] + (["front" if x.front else ""] if show_all else []))
    title = "Simulated candidates" if show_all else f"Pareto front: capacity vs {cost_head}"
    lines.append(f"{title} (capacity = req/s inside the SLOs)")
    lines.append(table(["configuration", "GPUs", "$", "W", "req/s", "per GPU", "per $1k", "analytic bound"]
                       + ([""] if show_all else []), rows, "lrrrrrrll"))
    lines.append("")
    if r.best is not None:
        b = r.best
        why = (f"the cheapest that sustains {r.target_rate:g} req/s" if r.target_rate is not None
               else "the highest capacity within the budget")
        lines.append(f"Best ({why}): {b.label}: {b.capacity:.2f} req/s on {count(b.gpus, 'GPU')}"
                     + (f", ${b.usd:,.0f}" if b.usd else "") + f", {b.power_w:,.0f} W")
        for cmd in r.commands().values():
            lines.append(f"  {cmd}")
    if r.most_efficient is not None and r.most_efficient is not r.best:
        e = r.most_efficient
        lines.append(f"Most efficient per {cost_head}: {e.label}: {e.capacity:.2f} req/s on {count(e.gpus, 'GPU')}"
                     + (f", ${e.usd:,.0f}" if e.usd else ""))
    for note in r.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)
