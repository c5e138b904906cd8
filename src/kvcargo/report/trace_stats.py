"""``kvcargo trace-stats``' plain-text report, with its arrival-rate sparkline."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from kvcargo.report.text import table

SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: Iterable[float]) -> str:
    """Values as a row of block characters scaled to the largest (▁ for zero)."""
    v = np.asarray(list(values), dtype=np.float64)
    if not len(v):
        return ""
    hi = v.max()
    if hi <= 0:
        return SPARK[0] * len(v)
    return "".join(SPARK[min(len(SPARK) - 1, int(x / hi * (len(SPARK) - 1) + 0.5))] for x in v)


def render(st: dict[str, Any]) -> str:
    """The plain-text report of :func:`~kvcargo.workload.stats.trace_stats`."""

    def num(x: float, digits: int = 1) -> str:
        return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{digits}f}"

    tl = st["timeline"]
    lines = [
        st["source"],
        f"requests      {st['requests']:,}",
        f"duration      {num(st['duration_s'])} s (first to last arrival)",
        f"mean rate     {num(st['mean_rate'], 2)} req/s; busiest {tl['bucket_s']:g} s {num(tl['peak_rate'], 2)} req/s, "
        f"quietest {num(tl['min_rate'], 2)} req/s",
        f"burstiness    CV of inter-arrival times {num(st['interarrival_cv'], 2)} (Poisson: 1)",
        "",
    ]
    rows = [[name, num(d["mean"]), f"{d['median']:,.0f}", f"{d['p99']:,.0f}", f"{d['min']:,}", f"{d['max']:,}"]
            for name, d in (("prompt (tokens)", st["prompt"]), ("output (tokens)", st["output"]))]
    lines.append(table(["", "mean", "median", "p99", "min", "max"], rows, "lrrrrr"))
    lines.append("")
    b = st["blocks"]
    if b:
        lines.append(f"prompt blocks {b['total']:,} of {b['block_tokens']} tokens, {b['unique']:,} distinct: "
                     f"{100 * b['reused_share']:.1f}% reused (id seen in an earlier request)")
    else:
        lines.append("prompt blocks — (the trace has no block hashes)")
    lines.append(f"arrivals per {tl['bucket_s']:g} s  {sparkline(tl['rate'])}")
    h = st.get("handoff")
    if h:
        lines += ["", f"KV hand-off demand ({h['model']}, {h['kv_bytes_per_token']:,} B per token, by arrival time)",
                  f"  mean {h['mean_bytes_per_s'] / 1e9:,.2f} GB/s, busiest {h['bucket_s']:g} s "
                  f"{h['peak_bytes_per_s'] / 1e9:,.2f} GB/s; {h['mean_bytes_per_request'] / 1e9:,.2f} GB per request"]
        if h["links"]:
            rows = [[r["name"], f"{r['bandwidth'] / 1e9:g} GB/s", f"{100 * r['mean_load']:,.1f}%",
                     f"{100 * r['peak_load']:,.1f}%", "yes" if r["carries_peak"] else "no"] for r in h["links"]]
            lines.append(table(["link", "bandwidth", "mean load", "busiest load", "carries it"], rows, "lrrrl"))
            best = h["smallest_sufficient_link"]
            lines.append(f"smallest catalog link that carries the busiest {h['bucket_s']:g} s: {best or 'none'}")
    return "\n".join(lines)
