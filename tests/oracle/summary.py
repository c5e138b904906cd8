"""The run summary restated from the reference spec (reference-semantics §7), over the oracle's
per-request stamps and per-instance totals: statistics by the spec's percentile formula and
``statistics.fmean``, energy in the spec's grouping. Nothing from kvcargo's metrics code.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

NAN = math.nan
PERCENTILES = (50, 90, 99)
WARMUP = 0.1
STAGES = ("prefill_queue", "prefill", "kv_wait", "kv_transfer", "decode_queue", "decode")
OWNER = {"prefill_queue": "prefill", "prefill": "prefill", "kv_wait": "kv-link", "kv_transfer": "kv-link",
         "decode_queue": "decode", "decode": "decode"}


def percentile(x: list[float], p: int) -> float:
    """§7: ``k = ((n−1)·p)/100``, ``x[⌊k⌋] + (x[⌈k⌉] − x[⌊k⌋])·(k − ⌊k⌋)`` on the sorted sample."""
    if not x:
        return NAN
    x = sorted(x)
    k = ((len(x) - 1) * p) / 100
    lo, hi = math.floor(k), math.ceil(k)
    return x[lo] + (x[hi] - x[lo]) * (k - lo)


def mean(x: list[float]) -> float:
    return statistics.fmean(x) if x else NAN


def describe(x: list[float], prefix: str) -> dict[str, float]:
    """mean, p50, p90, p99 and max."""
    out = {f"{prefix}_mean": mean(x)}
    out |= {f"{prefix}_p{p}": percentile(x, p) for p in PERCENTILES}
    out[f"{prefix}_max"] = max(x) if x else NAN
    return out


def _gap(end: float, start: float) -> float:
    return 0.0 if math.isnan(end) or math.isnan(start) else end - start


def stages(r) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """§6.2 stage durations of one request (absent stages 0)."""
    landed = r.first_token if math.isnan(r.kv_ready) else r.kv_ready
    return {"prefill_queue": _gap(r.prefill_start, r.arrival), "prefill": _gap(r.first_token, r.prefill_start),
            "kv_wait": _gap(r.kv_start, r.first_token), "kv_transfer": _gap(r.kv_ready, r.kv_start),
            "decode_queue": _gap(r.decode_start, landed), "decode": _gap(r.finish, r.decode_start)}


def silicon_usd(die_mm2: float | None) -> float:
    """§7 PPA: dies per 300 mm wafer, Murphy yield with ``−expm1(−x)/x``, $10,000 per wafer."""
    if die_mm2 is None:
        return NAN
    a = die_mm2
    dies = math.floor(math.pi * 150.0 * 150.0 / a - math.pi * 300.0 / math.sqrt(2 * a))
    x = a / 100 * 0.1
    t = -math.expm1(-x) / x
    return 10_000.0 / (dies * (t * t))


def summarize(res, ttft_slo: float = 1.0, tpot_slo: float = 0.025) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """The §7 summary of an oracle run (keys as kvcargo names them)."""
    reqs, H = res.requests, res.horizon
    done = [r for r in reqs if not math.isnan(r.finish)]
    by_arrival = sorted(done, key=lambda r: r.arrival)  # stable: ties keep request order
    steady = by_arrival[math.floor(WARMUP * len(by_arrival)):]
    out_tokens = sum(r.output for r in done)
    s: dict[str, Any] = {"requests": len(reqs), "completed": len(done), "rejected": sum(r.rejected for r in reqs),
                         "horizon_s": H, "steady_requests": len(steady)}
    ttft = [r.first_token - r.arrival for r in steady]
    multi = [r for r in steady if r.output >= 2]
    tpot = [(r.finish - r.first_token) / (r.output - 1) for r in multi]
    s |= describe(ttft, "ttft") | describe(tpot, "tpot")
    s |= describe([g for r in steady for g in r.itls], "itl")
    s |= describe([r.finish - r.arrival for r in steady], "e2e")
    moved = [r for r in reqs if not math.isnan(r.kv_ready)]
    s |= describe([r.kv_ready - r.first_token for r in moved], "handoff")
    met = sum(1 for r in steady if r.first_token - r.arrival <= ttft_slo
              and (r.output < 2 or (r.finish - r.first_token) / (r.output - 1) <= tpot_slo))
    window = steady[-1].arrival - steady[0].arrival if len(steady) > 1 else 0.0
    s |= {"slo_met": met, "slo_attainment": met / len(steady) if steady else NAN,
          "goodput_rps": met / window if window > 0 else NAN, "output_tokens": out_tokens,
          "output_tok_per_s": out_tokens / H, "req_per_s": len(done) / H}
    means = {k: mean([stages(r)[k] for r in steady]) for k in STAGES}
    for k in STAGES:
        s[f"stage_{k}_s"] = means[k]
        s[f"share_{k}"] = means[k] / s["e2e_mean"]
    # §7 writes (mean kv_wait + mean kv_transfer) / mean E2E; §8.5's values are the sum of the
    # two shares (the base run's KV share differs in the last bit otherwise)
    s["kv_share_of_e2e"] = s["share_kv_wait"] + s["share_kv_transfer"]
    s |= _link(res, moved)
    s |= _energy(res, out_tokens)
    s["instances"] = _instances(res)
    s |= _hotspot(s, res.colocated)
    dollars = 0.0
    for inst in res.instances:
        dollars += inst.n * silicon_usd(inst.die_mm2)
    s["silicon_usd"] = dollars
    s["tok_per_s_per_kusd"] = 1000 * s["output_tok_per_s"] / dollars
    latency = [r.finish - r.arrival for r in done]
    s["littles_population"] = math.fsum(latency) / H
    s["littles_expected"] = s["req_per_s"] * mean(latency)
    return s


def _link(res, moved: list) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    H, n = res.horizon, res.n_transfers
    if res.colocated:
        return {"transfers": 0, "link_busy": 0.0, "link_bytes": 0.0, "link_gbps": 0.0, "link_mean_wait_s": 0.0,
                "link_j": 0.0, "transit_j": 0.0, "link_j_per_request": 0.0, "transit_bound_share": 0.0}
    wire = math.fsum(res.wire_bytes[r.i] for r in moved)
    return {
        "transfers": n, "link_busy": res.link_busy_s / (res.channels * H), "link_bytes": wire,
        "link_gbps": wire / H / 1e9,
        "link_mean_wait_s": math.fsum(r.kv_start - r.first_token for r in moved) / n if n else 0.0,
        "link_j": res.link_j, "transit_j": res.transit_j,
        "link_j_per_request": (res.link_j + res.transit_j) / max(1, n),
        "transit_bound_share": sum(res.transit_bound[r.i] for r in moved) / n if n else 0.0,
    }


def _energy(res, out_tokens: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """§7: running sums over instances in creation order, ``((static + compute) + memory) + link``
    (+ in-transit)."""
    H = res.horizon
    static = compute = memory = 0.0
    for inst in res.instances:
        static += inst.cost.idle_w * H
        compute += inst.compute_j
        memory += inst.memory_j
    total = static + compute + memory + res.link_j + res.transit_j
    return {
        "energy_j": total, "energy_static_j": static, "energy_compute_j": compute, "energy_memory_j": memory,
        "energy_link_j": res.link_j, "energy_transit_j": res.transit_j,
        "share_static": static / total, "share_compute": compute / total, "share_memory": memory / total,
        "share_link": res.link_j / total, "share_transit": res.transit_j / total,
        "j_per_token": total / out_tokens if out_tokens else NAN,
        "tokens_per_j": out_tokens / total, "avg_power_w": total / H,
    }


def _instances(res) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    H = res.horizon
    rows = []
    for inst in res.instances:
        c = inst.cost
        batches = inst.batches
        rows.append({
            "name": inst.name, "device": inst.device, "devices": inst.n, "steps": inst.steps,
            "busy": inst.busy / H, "mfu": inst.flops / (H * c.peak_flops * inst.n),
            "mbu": inst.nbytes / (H * c.peak_bw * inst.n),
            "mean_batch": (inst.served / inst.steps if inst.steps else 0.0) if inst.name.startswith("prefill")
            else (sum(batches) / len(batches) if batches else 0.0),
            "avg_power_w": c.idle_w + (inst.compute_j + inst.memory_j) / H,
        })
    return rows


def _hotspot(s: dict[str, Any], colocated: bool) -> dict[str, str]:
    """§7: the largest stage other than decode (first on ties), its owner, the busiest member."""
    stage = max((k for k in STAGES if k != "decode"), key=lambda k: s[f"stage_{k}_s"])
    owner = OWNER[stage]
    if colocated and owner != "kv-link":
        owner = "colocated"
    if owner == "kv-link":
        return {"hotspot_stage": stage, "hotspot_pool": owner, "hotspot": "kv-link"}
    members = [r for r in s["instances"] if r["name"].startswith(owner)]
    return {"hotspot_stage": stage, "hotspot_pool": owner, "hotspot": max(members, key=lambda r: r["busy"])["name"]}
