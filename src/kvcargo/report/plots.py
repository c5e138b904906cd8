"""Figures of the planner: latency and link busy vs rate, capacity probes, the Pareto front.

Every function takes plain rows (dicts, as the planner returns them) and a path; the suffix picks
the format: ``.png`` / ``.svg`` / ``.pdf`` with matplotlib (static), ``.html`` with plotly
(interactive, self-contained). Both libraries are imported only when a figure is drawn
(``pip install 'kvcargo[plot]'``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvcargo.errors import KvcargoError

STATIC = (".png", ".svg", ".pdf")
INTERACTIVE = (".html",)


def _kind(path: str | Path) -> str:
    suffix = Path(path).suffix.lower()
    if suffix in STATIC:
        return "static"
    if suffix in INTERACTIVE:
        return "html"
    raise KvcargoError(f"--plot {str(path)!r}: use a .png, .svg, .pdf (matplotlib) or .html (plotly) file")


def check_plot(path: str | Path, flag: str = "--plot") -> Path:
    """Refuse a plot path before any work: unwritable, an unknown format, or its library missing."""
    from kvcargo.outputs import check_output

    p = check_output(path, flag, STATIC + INTERACTIVE)
    _pyplot() if _kind(p) == "static" else _plotly()
    return p


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise KvcargoError("static plots need matplotlib: pip install 'kvcargo[plot]'") from None
    return plt


def _plotly():
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError:
        raise KvcargoError("interactive plots need plotly: pip install 'kvcargo[plot]'") from None
    return go, make_subplots


def _value_label(key: str, value: Any) -> str:
    """A run's value as a legend shows it: an unset field by what it means (``kv-compress=uncompressed``,
    as the page says: ``none`` is a codec of its own, with an in-transit stage)."""
    if value is None:
        return "uncompressed" if key == "kv_compress" else "default"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _num(v: Any) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return math.nan
    return x


# ----------------------------------------------------------------------- sweep: vs rate

PANELS = (
    ("ttft_p99", "TTFT p99 (ms)", 1e3, "ttft_slo"),
    ("tpot_p99", "TPOT p99 (ms)", 1e3, "tpot_slo"),
    ("slo_attainment", "SLO attainment (%)", 100.0, None),
    ("link_busy", "KV link busy (%)", 100.0, None),
)


def series_of(rows: Sequence[dict[str, Any]], x: str, by: Sequence[str]) -> dict[str, list[tuple[float, dict]]]:
    """Successful rows grouped by the values of ``by`` (one series per configuration), sorted by x."""
    out: dict[str, list[tuple[float, dict]]] = {}
    for r in rows:
        if r.get("status", "ok") != "ok":
            continue
        name = ", ".join(f"{k.replace('_', '-')}={_value_label(k, r.get(k))}" for k in by) or "runs"
        xv = _num(r.get(x))
        if x == "rate" and math.isnan(xv):
            xv = 8.0  # the generator's default rate
        out.setdefault(name, []).append((xv, r))
    for pts in out.values():
        pts.sort(key=lambda p: p[0])
    return out


def sweep_figure(rows: Sequence[dict[str, Any]], path: str | Path, x: str = "rate",
                 by: Sequence[str] = ()) -> Path:
    """Latency percentiles, SLO attainment and link busy vs ``x``, one line per configuration."""
    kind = _kind(path)
    groups = series_of(rows, x, by)
    if not groups:
        raise KvcargoError("nothing to plot: no run succeeded")
    xlabel = x.replace("_", "-") + (" (req/s)" if x == "rate" else "")
    slo = {key: _num(next(iter(groups.values()))[0][1].get(key)) for _, _, _, key in PANELS if key}
    if kind == "static":
        plt = _pyplot()
        fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), constrained_layout=True)
        for ax, (key, title, scale, slo_key) in zip(axes.flat, PANELS):
            for name, pts in groups.items():
                ax.plot([p[0] for p in pts], [_num(p[1].get(key)) * scale for p in pts], marker="o", ms=3,
                        label=name)
            if slo_key and math.isfinite(slo.get(slo_key, math.nan)):
                ax.axhline(slo[slo_key] * scale, color="grey", ls="--", lw=1, label="SLO")
            ax.set_title(title)
            ax.set_xlabel(xlabel)
            ax.grid(alpha=0.3)
            if scale == 100.0:  # a percentage: no axis beyond 0-100% (a flat 100% line is drawn at the top)
                lo, hi = ax.get_ylim()
                ax.set_ylim(max(lo, 0.0), min(hi, 101.0))
            if key in ("ttft_p99", "tpot_p99"):
                from matplotlib.ticker import LogFormatter

                ax.set_yscale("log")  # ticks as plain numbers (20, not 2×10¹), minor ones thinned as usual
                ax.yaxis.set_major_formatter(LogFormatter())
                ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))
        axes.flat[0].legend(fontsize=7)
        fig.suptitle("kvcargo sweep")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return Path(path)
    go, make_subplots = _plotly()
    fig = make_subplots(rows=2, cols=2, subplot_titles=[t for _, t, _, _ in PANELS])
    for i, (key, _title, scale, slo_key) in enumerate(PANELS):
        r, c = divmod(i, 2)
        for j, (name, pts) in enumerate(groups.items()):
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[_num(p[1].get(key)) * scale for p in pts],
                                     mode="lines+markers", name=name, legendgroup=name, showlegend=i == 0,
                                     line={"color": _color(j)}), row=r + 1, col=c + 1)
        if slo_key and math.isfinite(slo.get(slo_key, math.nan)):
            fig.add_hline(y=slo[slo_key] * scale, line_dash="dash", line_color="grey", row=r + 1, col=c + 1)
        fig.update_xaxes(title_text=xlabel, row=r + 1, col=c + 1)
        if key in ("ttft_p99", "tpot_p99"):
            fig.update_yaxes(type="log", row=r + 1, col=c + 1)
    fig.update_layout(title="kvcargo sweep", height=800)
    fig.write_html(str(path), include_plotlyjs=True, full_html=True)
    return Path(path)


def _save_axes(plt: Any, fig: Any, ax: Any, path: str | Path, xlabel: str, ylabel: str, title: str) -> Path:
    """Label, grid and legend a single-axes matplotlib figure, write it and close it."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def _color(i: int) -> str:
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf")
    return palette[i % len(palette)]


# --------------------------------------------------------------------- capacity probes


def capacity_figure(data: dict[str, Any], path: str | Path) -> Path:
    """SLO attainment of every probe vs rate, the target, the answer and the analytic ceilings."""
    kind = _kind(path)
    search = data.get("search") or {}
    probes = sorted(search.get("probes", []), key=lambda p: p["rate"])
    ceil = data["ceilings"]
    lines = [(k, ceil[k]) for k in ("prefill", "decode", "link", "colocated")
             if ceil.get(k) is not None and math.isfinite(ceil[k]) and ceil[k] > 0]
    target = search.get("target")
    answer = search.get("rate")
    if kind == "static":
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(8, 4.8), constrained_layout=True)
        ax.plot([p["rate"] for p in probes], [100 * p["slo_attainment"] for p in probes], "o-", label="probes")
        if target is not None:
            ax.axhline(100 * target, color="grey", ls="--", lw=1, label=f"target {100 * target:g}%")
        for i, (k, v) in enumerate(lines):
            ax.axvline(v, color=_color(i + 1), ls=":", lw=1.2, label=f"{k} ceiling {v:.3g}")
        if answer:
            ax.axvline(answer, color="black", lw=1.5, label=f"capacity {answer:.3g}")
        return _save_axes(plt, fig, ax, path, "rate (req/s)", "SLO attainment (%)", "kvcargo capacity")
    go, _ = _plotly()
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[p["rate"] for p in probes], y=[100 * p["slo_attainment"] for p in probes],
                             mode="lines+markers", name="probes"))
    if target is not None:
        fig.add_hline(y=100 * target, line_dash="dash", line_color="grey")
    for i, (k, v) in enumerate(lines):
        fig.add_vline(x=v, line_dash="dot", line_color=_color(i + 1), annotation_text=f"{k} {v:.3g}")
    if answer:
        fig.add_vline(x=answer, line_color="black", annotation_text=f"capacity {answer:.3g}")
    fig.update_layout(title="kvcargo capacity", xaxis_title="rate (req/s)", yaxis_title="SLO attainment (%)")
    fig.write_html(str(path), include_plotlyjs=True, full_html=True)
    return Path(path)


# ------------------------------------------------------------------------ Pareto front

def _dollars(x: float) -> str:
    """An axis tick in dollars: $800k, $1.5M (never matplotlib's bare "1e6" offset)."""
    if abs(x) >= 1e6:
        return f"${x / 1e6:g}M"
    return f"${x / 1e3:g}k" if abs(x) >= 1e3 else f"${x:g}"


COST_TITLE = {"gpus": "GPUs", "usd": "cost ($)", "power": "provisioned power (W)"}
COST_FIELD = {"gpus": "gpus", "usd": "usd", "power": "power_w"}


def pareto_figure(candidates: Sequence[dict[str, Any]], path: str | Path, cost: str = "gpus",
                  best: str | None = None, target_rate: float | None = None) -> Path:
    """Capacity vs cost of every simulated candidate; the front as a staircase; the best marked;
    the load to serve (``target_rate``) as a horizontal line."""
    kind = _kind(path)
    key = COST_FIELD[cost]
    pts = [c for c in candidates if c.get("capacity") is not None and c.get(key) is not None]
    if not pts:
        raise KvcargoError("nothing to plot: no candidate was simulated")
    front = sorted((c for c in pts if c.get("front")), key=lambda c: c[key])
    others = [c for c in pts if not c.get("front")]
    chosen = [c for c in pts if c["label"] == best]
    if kind == "static":
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(8.5, 5.2), constrained_layout=True)
        ax.scatter([c[key] for c in others], [c["capacity"] for c in others], s=14, color="#9aa5b1",
                   label="simulated")
        ax.step([c[key] for c in front], [c["capacity"] for c in front], where="post", color="#1f77b4")
        ax.scatter([c[key] for c in front], [c["capacity"] for c in front], s=28, color="#1f77b4",
                   label="Pareto front", zorder=3)
        for i, c in enumerate(front):  # alternate above/below so neighbours do not overlap
            ax.annotate(c["label"], (c[key], c["capacity"]), fontsize=6, xytext=(4, 6 if i % 2 else -10),
                        textcoords="offset points", annotation_clip=False)
        if chosen:
            c = chosen[0]
            ax.scatter([c[key]], [c["capacity"]], s=120, marker="*", color="#d62728", label="best", zorder=4)
        if target_rate is not None:
            ax.axhline(target_rate, color="grey", ls="--", lw=1, label=f"load to serve ({target_rate:g} req/s)")
        ax.margins(x=0.2, y=0.12)  # room for the labels of the last points
        if cost == "usd":
            from matplotlib.ticker import FuncFormatter

            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _dollars(x)))
        return _save_axes(plt, fig, ax, path, COST_TITLE[cost], "capacity (req/s inside the SLOs)",
                          "kvcargo plan: capacity vs cost")
    go, _ = _plotly()
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[c[key] for c in others], y=[c["capacity"] for c in others], mode="markers",
                             name="simulated", text=[c["label"] for c in others], marker={"color": "#9aa5b1"}))
    fig.add_trace(go.Scatter(x=[c[key] for c in front], y=[c["capacity"] for c in front], mode="lines+markers",
                             line_shape="hv", name="Pareto front", text=[c["label"] for c in front]))
    if chosen:
        c = chosen[0]
        fig.add_trace(go.Scatter(x=[c[key]], y=[c["capacity"]], mode="markers", name="best", text=[c["label"]],
                                 marker={"symbol": "star", "size": 16, "color": "#d62728"}))
    if target_rate is not None:
        fig.add_hline(y=target_rate, line_dash="dash", line_color="grey",
                      annotation_text=f"load to serve ({target_rate:g} req/s)")
    fig.update_layout(title="kvcargo plan: capacity vs cost", xaxis_title=COST_TITLE[cost],
                      yaxis_title="capacity (req/s inside the SLOs)")
    if cost == "usd":
        fig.update_xaxes(tickprefix="$", tickformat="~s")
    fig.write_html(str(path), include_plotlyjs=True, full_html=True)
    return Path(path)
