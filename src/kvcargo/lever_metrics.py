"""Summary figures of the parallelism, speculative-decoding and PPA levers (levers-parallel §2.4,
§6.7, §8): communication per pool, KV capacity per pool, draft statistics, silicon area."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvcargo.engine.cluster import EngineOutput

# Columns of EngineOutput.lever_stats.
COMM, SCALE_UP_J, DRAFT_T, VERIFY_ROWS, GAINED = range(5)


def lever_summary(out: EngineOutput, s: dict[str, Any]) -> dict[str, Any]:
    """Per-pool communication and capacity, the draft's figures, the area report (``--ppa``)."""
    res = out.resolved
    lev = res.levers
    roles = [("colocated", lev.decode, slice(0, res.n_decode))] if res.colocated else [
        ("prefill", lev.prefill, slice(0, res.n_prefill)),
        ("decode", lev.decode, slice(res.n_prefill, res.n_prefill + res.n_decode))]
    busy = out.stats[:, 0]
    r: dict[str, Any] = {}
    for role, pool, rows in roles:
        r[f"kv_cap_{role}"] = pool.kv_capacity
        if lev.has_layout:
            comm = sum(out.lever_stats[rows, COMM].tolist(), 0.0)
            busy_s = sum(busy[rows].tolist(), 0.0)
            r[f"comm_s_{role}"] = comm
            r[f"comm_frac_{role}"] = comm / busy_s if busy_s else 0.0
    if lev.draft is not None:
        rows_verified = int(out.lever_stats[:, VERIFY_ROWS].sum())
        decoding = slice(0, res.n_decode) if res.colocated else slice(res.n_prefill, None)
        decode_busy = sum(busy[decoding].tolist(), 0.0)
        r |= {
            "spec_verify_rows": rows_verified,
            "spec_tokens_per_verify": float(out.lever_stats[:, GAINED].sum()) / rows_verified
            if rows_verified else math.nan,
            "spec_closed_form": lev.draft.closed_form,
            # the companion divides every instance's draft time (the prefill pool's draft prefill
            # included) by the decoding instances' busy time only
            "spec_draft_time_frac": sum(out.lever_stats[:, DRAFT_T].tolist(), 0.0) / decode_busy
            if decode_busy else math.nan,
        }
    if res.config.ppa:
        r |= _area(out, s["output_tok_per_s"])
    return r


def _area(out: EngineOutput, tok_per_s: float) -> dict[str, float]:
    """Silicon area of the cluster (Σ instances·devices·die area) and output tok/s per mm²."""
    res = out.resolved
    pools = [(res.n_decode, res.decode_pool)] if res.colocated else [
        (res.n_prefill, res.prefill_pool), (res.n_decode, res.decode_pool)]
    total = 0.0
    for count, pool in pools:
        if pool.device.die_mm2 is None:
            return {"ppa_total_mm2": math.nan, "ppa_perf_per_mm2": math.nan}
        total += count * pool.n * pool.device.die_mm2
    return {"ppa_total_mm2": total, "ppa_perf_per_mm2": tok_per_s / total if total else math.nan}

