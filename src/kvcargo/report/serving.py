"""Text of the serving levers: the scheduler block of a report and the companion's rate sweep."""

from __future__ import annotations

from typing import Any

from kvcargo.report.text import fixed, pct

SWEEP_HEADER = (f"{'mode':<10} {'rate':>6} {'TTFT p99':>9} {'TPOT p99':>9} {'goodput':>8} {'SLO%':>6}  "
                "hot-spot (stage -> resource)")
"""Header of ``simulate --sweep-rate`` (the companion's layout, character for character)."""


def sweep_row(mode: str, rate: float, s: dict[str, Any]) -> str:
    """One row of ``--sweep-rate``: mode, rate, TTFT p99 and TPOT p99 (ms), goodput, SLO %."""
    return (f"{mode:<10} {rate:6.1f} {s['ttft_p99'] * 1e3:8.0f}m {s['tpot_p99'] * 1e3:8.1f}m "
            f"{s['goodput_rps']:8.2f} {s['slo_attainment'] * 100:6.1f}  {s['hotspot_stage']} -> {s['hotspot']}")


def scheduler_lines(s: dict[str, Any]) -> list[str]:
    """The report's "Scheduling and KV memory" section (empty without a serving lever)."""
    if "token_budget" not in s:
        return []
    unit = "tokens" if s["kv_unit_tokens"] == 1 else f"blocks of {s['kv_unit_tokens']} tokens"
    out = ["", "Scheduling and KV memory",
           f"  token budget {s['token_budget']:,} per step; KV capacity {s['kv_capacity_units']:,} {unit}"
           + (f" (prefill instances {s['prefill_kv_capacity_units']:,})" if "prefill_kv_capacity_units" in s else ""),
           f"  mean running {fixed(s['mean_running'], '.2f')} rows; KV in use by tokens {pct(s['kv_token_frac'])} of the "
           f"allocated; prefill tokens computed {s['computed_prefill_tokens']:,}"]
    if "preemptions" in s:
        out.append(f"  preemptions {s['preemptions']:,}; tokens recomputed {s['recompute_tokens']:,}")
    if "swap_J" in s:
        out.append(f"  swapped out {s['swap_out_GB']:.3f} GB, in {s['swap_in_GB']:.3f} GB over the host link: "
                   f"{s['swap_seconds']:.3f} s, {s['swap_J']:.3f} J ({pct(s['share_swap'], 3)} of the energy)")
    if "prefix_prompt_tokens" in s:
        out.append(f"  prefix cache: {pct(s['prefix_hit_rate'])} of {s['prefix_prompt_tokens']:,} prompt tokens hit; "
                   f"{s['prefix_evicted_tokens']:,} evicted, {s['prefix_cached_tokens_end']:,} cached at the end")
    return out
