"""Report lines of the parallelism, number-format, speculative-decoding and PPA levers."""

from __future__ import annotations

from typing import Any

from kvcargo.report.text import pct, seconds

ROLES = ("prefill", "decode", "colocated")


def lever_config(c: dict[str, Any]) -> str:
    """What the levers change, for the run's one-line description ('' when none is given)."""
    parts = []
    layout = [f"{k} {c[k]}" for k in ("tp", "pp", "ep", "microbatches") if c.get(k) is not None]
    layout += [f"{k.replace('_', '-')} {c[k]}" for k in ("prefill_tp", "prefill_pp", "decode_tp", "decode_pp")
               if c.get(k) is not None]
    if layout:
        parts.append(", ".join(layout))
    formats = [f"{k.removesuffix('_format')} {c[k]}" for k in ("weight_format", "kv_format", "compute_format")
               if c.get(k, "bf16") != "bf16"]
    if formats:
        parts.append("formats " + ", ".join(formats))
    if c.get("speculative"):
        parts.append(f"speculative {c['speculative']}")
    return "; ".join(parts)


def lever_lines(s: dict[str, Any]) -> list[str]:
    """Scale-up communication per pool and the draft's figures (none without these levers)."""
    out = []
    comm = [f"{role} {seconds(s[f'comm_s_{role}'])} ({pct(s[f'comm_frac_{role}'])} of busy)"
            for role in ROLES if f"comm_s_{role}" in s]
    if comm:
        out.append("  scale-up communication: " + ", ".join(comm)
                   + f"; scale-up energy {s['energy_scale_up_j']:,.1f} J ({pct(s['share_scale_up'], 2)})")
    if "spec_verify_rows" in s:
        out.append(f"  speculative: {s['spec_tokens_per_verify']:.3f} tokens per verify pass "
                   f"(closed form {s['spec_closed_form']:.3f}) over {s['spec_verify_rows']:,} rows; "
                   f"draft {pct(s['spec_draft_time_frac'])} of decode busy time")
    if "ppa_total_mm2" in s:
        out.append(f"  silicon area {s['ppa_total_mm2']:,.0f} mm²: {s['ppa_perf_per_mm2']:.4f} tok/s per mm²")
    caps = [f"{role} {s[f'kv_cap_{role}']:,}" for role in ROLES if f"kv_cap_{role}" in s]
    if out:
        out.insert(0, "  KV capacity per instance (tokens): " + ", ".join(caps))
        out.insert(0, "Parallelism and levers")
        out.insert(0, "")
    return out
