"""The serving levers and sessions with parallel layouts and number formats (levers-parallel §1–§3
inside the scheduled engine's instances).

The strongest check is levers-serving §0.1: with default scheduling rules
(``--max-num-batched-tokens 8192`` alone), one decode instance and memory to spare, the scheduled
engine's run is the plain engine's bit for bit — here with each of the companion's lever check
layouts and formats, so the compiled reference engine's layout pricing (kvcargo.engine.pricing)
and the scheduled engines' (SimPy and the array loop) agree on every timestamp, every instance
total and every summary number. Real combinations (chunked prefill, paged swap, prefix caching,
sessions) then hold the per-request invariants, and the two scheduled engines agree exactly.
"""

from __future__ import annotations

import json
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcargo import SimConfig, catalog, simulate
from kvcargo.config import resolve
from kvcargo.cost import (
    MF_KV_TOK,
    MF_ROW,
    MF_W_STR,
    decode_parts,
    mixed_parts,
    model_coefficients,
    prefill_parts,
    roofline,
)
from kvcargo.engine import sched_run
from kvcargo.engine.pricing import scheduled_pass
from kvcargo.parallel import parallel_step

SEVENTY = {"model": "llama3-70b", "devices_per_instance": 4}
EIGHT = {"model": "llama3-8b", "devices_per_instance": 1}
MIXTRAL = {"model": "mixtral-8x7b", "devices_per_instance": 2}
LAYOUTS = {  # levers-parallel §12's check runs (their rates), on kvcargo's generator
    "tp4_70b": SEVENTY | {"tp": 4},
    "tp2_pp2_mb3_70b_nvlink3": SEVENTY | {"tp": 2, "pp": 2, "microbatches": 3, "scale_up_link": "nvlink3",
                                          "rate": 3.0},
    # on H200: the H100 prefill pair holds 8,835 tokens of KV, too few for memory to spare
    "pool_parallel_70b_h200": SEVENTY | {"device": "h200", "prefill_devices_per_instance": 2, "prefill_tp": 2,
                                         "decode_pp": 4, "rate": 2.0},
    "w8a8_kv8_70b": SEVENTY | {"weight_format": "fp8", "compute_format": "fp8", "kv_format": "fp8", "rate": 5.0},
    "a100_int4_weightonly_8b": EIGHT | {"device": "a100", "weight_format": "int4", "rate": 6.0},
    "mixtral_plain": MIXTRAL | {"rate": 4.0},
    "mixtral_tp2_ep2_imb13": MIXTRAL | {"tp": 2, "ep": 2, "expert_imbalance": 1.3, "rate": 3.0},
    "mixtral_tp2_ep1": MIXTRAL | {"tp": 2, "rate": 4.0},
}
ORACLE_CASES = [(name, mode) for name in LAYOUTS for mode in ("disagg", "colocated")
                if not (mode == "colocated" and "prefill_tp" in LAYOUTS[name])]


@contextmanager
def simpy_engine():
    """Runs within go through the SimPy model rather than the array loop."""
    handles = sched_run.handles
    sched_run.handles = lambda res: False
    try:
        yield
    finally:
        sched_run.handles = handles


def _both_engines(c: SimConfig):  # type: ignore[no-untyped-def]
    """``c`` run by the array loop, then by the SimPy model."""
    assert sched_run.handles(resolve(c))
    arrays = simulate(c)
    with simpy_engine():
        return arrays, simulate(c)


def _same_run(a, b) -> None:  # type: ignore[no-untyped-def]
    """Every request's timestamps, every instance total and every summary number of ``a`` are
    ``b``'s (``b`` may add keys: the scheduler block)."""
    ra, rb = a.requests(), b.requests()
    for k in ra:
        np.testing.assert_array_equal(ra[k], rb[k], err_msg=k)
    np.testing.assert_array_equal(a.output.stats, b.output.stats)
    np.testing.assert_array_equal(a.output.lever_stats, b.output.lever_stats)
    sa, sb = a.summary, b.summary  # the per-instance rows included
    assert json.dumps(sa, default=float) == json.dumps({k: sb.get(k, "missing") for k in sa}, default=float)


@pytest.mark.parametrize("name,mode", ORACLE_CASES)
def test_default_scheduling_with_levers_is_the_plain_engine(name: str, mode: str) -> None:
    """levers-serving §0.1 with a layout or formats: both scheduled engines equal the plain one."""
    base = SimConfig(mode=mode, requests=300, **LAYOUTS[name])
    plain = simulate(base)
    arrays, simpy = _both_engines(base.replace(max_num_batched_tokens=8192))
    _same_run(plain, arrays)
    _same_run(plain, simpy)
    s = arrays.summary
    assert s["completed"] == 300 and s["rejected"] == 0
    assert "token_budget" in s and "token_budget" not in plain.summary
    if resolve(base).levers.has_layout:
        assert s["energy_scale_up_j"] > 0 and all(s[f"comm_s_{r}"] > 0 for r in (
            ("colocated",) if mode == "colocated" else ("prefill", "decode")))


@pytest.mark.parametrize("name", ["tp4_70b", "tp2_pp2_mb3_70b_nvlink3", "w8a8_kv8_70b", "pool_parallel_70b_h100"])
def test_the_reference_instances_of_closed_loop_sessions_price_layouts_as_the_plain_engine(name: str) -> None:
    """Closed-loop sessions without a scheduling lever run the SimPy model's reference instances;
    given an open-loop workload they are the plain engine, layout and formats included, to the
    last bit (prefill memory plays no part in the reference, so H100 prefill pairs do here)."""
    from kvcargo.engine.cluster import run
    from kvcargo.engine.scheduled import run_scheduled

    kw = LAYOUTS.get(name) or SEVENTY | {"prefill_devices_per_instance": 2, "prefill_tp": 2, "decode_pp": 4,
                                         "rate": 2.0}
    res = resolve(SimConfig(requests=300, **kw))
    a, b = run(res), run_scheduled(res)
    for f in ("prefill_start", "first_token", "kv_start", "kv_ready", "decode_start", "finish", "status"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    np.testing.assert_array_equal(a.stats, b.stats)
    np.testing.assert_array_equal(a.lever_stats, b.lever_stats)


def test_capacities_are_the_layouts_and_formats() -> None:
    """A pool's units are floor(KVcap / u) of its layout-aware capacity (levers-serving §1,
    levers-parallel §2.3 and §3.4's values: 70B on 4×H100, tp 1 × pp 4 → 435,463 tokens; fp8
    weights and KV → 1,327,194; 2×H100 at tp 2 for the prefill pool → 8,835)."""
    paged = SimConfig(requests=20, kv_policy="paged", decode_pp=4, prefill_devices_per_instance=2, prefill_tp=2,
                      **SEVENTY)
    paged = simulate(paged).summary
    assert (paged["kv_capacity_units"], paged["prefill_kv_capacity_units"]) == (435_463 // 16, 8_835 // 16)
    fp8 = SimConfig(requests=20, kv_policy="pow2", weight_format="fp8", compute_format="fp8", kv_format="fp8",
                    **SEVENTY)
    fp8 = simulate(fp8).summary
    assert (fp8["kv_capacity_units"], fp8["prefill_kv_capacity_units"]) == (1_327_194, 1_327_194)


# ------------------------------------------------------------------ real combinations

COMBINATIONS = {
    "chunked_tp4_colocated": SEVENTY | {"mode": "colocated", "tp": 4, "batch_policy": "chunked",
                                        "max_num_batched_tokens": 512, "rate": 6.0},
    "chunked_tp2_pp2_disagg": SEVENTY | {"tp": 2, "pp": 2, "batch_policy": "chunked", "max_num_batched_tokens": 1024,
                                         "prefill": 2, "rate": 5.0},
    "paged_swap_pp4_colocated": SEVENTY | {"mode": "colocated", "pp": 4, "kv_policy": "paged", "preemption": "swap",
                                           "instances": 1, "prompt": 4096, "output": 2000, "rate": 8.0},
    "paged_recompute_pool_layouts": SEVENTY | {"device": "h200", "prefill_devices_per_instance": 2, "prefill_tp": 2,
                                               "decode_tp": 2, "decode_pp": 2, "kv_policy": "paged",
                                               "batch_policy": "decode-priority", "decode": 2, "rate": 4.0},
    "sessions_tp4_pow2": SEVENTY | {"mode": "colocated", "tp": 4, "kv_policy": "pow2", "turns": 3, "think": 0.5,
                                    "rate": 2.0, "instances": 2},
    "mixtral_chunked_tp2_ep2": MIXTRAL | {"tp": 2, "ep": 2, "expert_imbalance": 1.2, "batch_policy": "chunked",
                                          "max_num_batched_tokens": 512, "rate": 6.0},
    "mixtral_paged_colocated": MIXTRAL | {"mode": "colocated", "kv_policy": "paged", "instances": 1,
                                          "prompt": 4096, "output": 1000, "rate": 8.0},
    "w4a4_fp4_b200_chunked": EIGHT | {"device": "b200", "weight_format": "fp4", "compute_format": "fp4",
                                      "kv_format": "int4", "batch_policy": "chunked",
                                      "max_num_batched_tokens": 256, "rate": 12.0},
}
SIMPY_ONLY = {  # prefix caching and closed-loop sessions without a scheduling lever
    "prefix_caching_fp8_tp4": SEVENTY | {"mode": "colocated", "tp": 4, "weight_format": "fp8", "kv_format": "fp8",
                                         "prefix_caching": True, "turns": 3, "system_prompts": 2, "system_len": 700,
                                         "rate": 3.0},
    "prefix_caching_int8_disagg_pp": SEVENTY | {"pp": 2, "tp": 2, "weight_format": "int8", "prefix_caching": True,
                                                "kv_policy": "paged", "workload": "coding-agent", "rate": 1.0},
    "sessions_plain_tp4_disagg": SEVENTY | {"tp": 4, "turns": 3, "think": 0.2, "rate": 2.0},
    "sessions_plain_tp2_pp2_colocated": SEVENTY | {"mode": "colocated", "tp": 2, "pp": 2, "kv_format": "fp8",
                                                   "turns": 4, "rate": 2.0},
    "chat_preset_pool_layouts": SEVENTY | {"device": "h200", "prefill_devices_per_instance": 2, "prefill_tp": 2,
                                           "decode_pp": 4, "workload": "chat", "rate": 2.0},
}


def _check_invariants(r, c: SimConfig) -> None:  # type: ignore[no-untyped-def]
    """Every request settles once; its stamps are ordered; it got its output, one gap per token."""
    q, s = r.requests(), r.summary
    assert s["completed"] + s["rejected"] == len(q["arrival"]) and s["completed"] > 0
    done = ~q["rejected"]
    stamps = ["arrival", "prefill_start", "first_token"]
    if c.mode == "disagg":
        stamps += ["kv_start", "kv_ready"]
    for a, b in zip(stamps, stamps[1:] + ["finish"]):
        assert np.all(q[a][done] <= q[b][done]), (a, b)
    multi = done & (q["output_len"] > 1)
    assert np.all(q["decode_start"][multi] <= q["finish"][multi])
    out = r.output
    gaps = np.diff(out.itl_offsets)
    np.testing.assert_array_equal(gaps[done], q["output_len"][done] - 1)  # tokens out = output
    assert np.all(out.itl_values >= 0)
    lev = resolve(c).levers
    if lev.has_layout:
        assert s["energy_scale_up_j"] > 0 and s["share_scale_up"] > 0
        roles = ("colocated",) if c.mode == "colocated" else ("prefill", "decode")
        for role in roles:
            pool = lev.decode if role != "prefill" else lev.prefill
            split = pool.layout is not None and pool.layout.tp * pool.layout.pp > 1
            assert (s[f"comm_s_{role}"] > 0) == split
            assert 0 <= s[f"comm_frac_{role}"] < 1


@pytest.mark.parametrize("name", COMBINATIONS)
def test_levers_with_layouts_hold_and_both_engines_agree(name: str) -> None:
    c = SimConfig(requests=120, seed=2, **COMBINATIONS[name])
    a, b = _both_engines(c)
    _check_invariants(a, c)
    _same_run(a, b)
    assert json.dumps(a.summary, default=float) == json.dumps(b.summary, default=float)
    oa, ob = a.output, b.output
    assert oa.itl_offsets.tolist() == ob.itl_offsets.tolist() and oa.itl_values.tolist() == ob.itl_values.tolist()
    assert oa.spans == ob.spans
    np.testing.assert_array_equal(oa.steps, ob.steps)
    if c.kv_policy == "paged" and name.startswith("paged_swap"):
        assert a.summary["preemptions"] > 0 and a.summary["swap_J"] > 0


@pytest.mark.parametrize("name", SIMPY_ONLY)
def test_prefix_caching_and_sessions_with_levers_hold(name: str) -> None:
    c = SimConfig(requests=100, seed=4, **SIMPY_ONLY[name])
    r = simulate(c)
    _check_invariants(r, c)
    assert r.summary == simulate(c).summary  # deterministic
    if c.prefix_caching:
        assert r.summary["prefix_hit_tokens"] > 0


def test_prefix_hits_shorten_a_layouts_prefill() -> None:
    """Prefix caching under tp 4: hits skip prefill work, so fewer prompt tokens are computed
    than without the cache, on the same sessions."""
    kw = SEVENTY | {"mode": "colocated", "tp": 4, "turns": 3, "system_prompts": 2, "system_len": 700, "rate": 3.0,
                    "requests": 60, "kv_policy": "paged"}
    with_cache = simulate(SimConfig(prefix_caching=True, **kw)).summary
    without = simulate(SimConfig(**kw)).summary
    assert with_cache["computed_prefill_tokens"] < without["computed_prefill_tokens"]


# ------------------------------------------------------------------ the pricing seam


@settings(max_examples=60, deadline=None)
@given(batch=st.integers(0, 300), context=st.integers(0, 400_000), chunks=st.lists(
    st.tuples(st.integers(0, 6000), st.integers(1, 4000), st.booleans()), max_size=6),
       model=st.sampled_from(["llama3-8b", "llama3-70b", "opt-13b"]), last=st.booleans())
def test_mixed_parts_split_the_reference_bytes(batch, context, chunks, model, last) -> None:  # type: ignore[no-untyped-def]
    """W + O is the mixed step's byte total of levers-serving §2.5 to the last bit; with no
    chunks it is a decode step, with only whole prompts a prefill step, part for part."""
    mi, mf = model_coefficients(catalog.load().model(model), "last" if last else "all")
    c_sum = sum(c for _, c, _ in chunks)
    attn = sum(c * (2 * p0 + c + 1) for p0, c, _ in chunks)
    kv = sum(p0 + c for p0, c, _ in chunks)
    n_last = sum(1 for *_, end in chunks if end)
    flops, w, o, tokens = mixed_parts(mi, mf, batch, context, c_sum, attn, kv, n_last)
    assert tokens == batch + c_sum
    assert w + o == mf[MF_W_STR] + tokens * mf[MF_ROW] + (context + batch + kv) * mf[MF_KV_TOK]
    assert mixed_parts(mi, mf, batch, context, 0, 0, 0, 0)[:3] == decode_parts(mi, mf, batch, context)
    prompts = [c for _, c, _ in chunks]
    quad = sum(s * (s + 1) for s in prompts)
    assert (mixed_parts(mi, mf, 0, 0, c_sum, quad, c_sum, len(prompts))[:3]
            == prefill_parts(mi, mf, c_sum, quad, len(prompts)))


def test_scheduled_pass_is_the_roofline_or_the_layouts_slots() -> None:
    res = resolve(SimConfig(tp=2, pp=2, **SEVENTY))
    lf, hs = res.levers.layout_arrays(res.model, res.prefill_pool, res.decode_pool)
    hf = res.decode_pool.coefficients()
    flops, w, o = 123_456_789_012_345, 70e9, 3.5e9
    dt, nbytes, e_c, e_m, comm, su = scheduled_pass(hf, hs[1], np.zeros_like(lf[1]), flops, w, o, 640)
    assert (dt, nbytes, e_c, e_m, comm, su) == (*roofline(hf, flops, w + o)[:1], w + o,
                                               *roofline(hf, flops, w + o)[1:], 0.0, 0.0)
    t, c_j, m_j, b, comm_t, su_j = parallel_step(hs[1], lf[1], flops, w, o, 640)
    assert scheduled_pass(hf, hs[1], lf[1], flops, w, o, 640) == (t, b, c_j, m_j, comm_t, su_j)
    assert comm_t > 0 and su_j > 0


@pytest.mark.parametrize("kw,needle", [
    ({"kv_policy": "paged", "speculative": "mtp"}, "drop --speculative"),
    ({"turns": 2, "speculative": "llama3.2-1b"}, "drop --speculative"),
])
def test_drafts_stay_refused(kw: dict, needle: str) -> None:
    """The scheduled engine's instances take layouts and formats, not a speculative draft (one
    line naming the flag to drop)."""
    with pytest.raises(ValueError, match=needle) as err:
        SimConfig(requests=10, **{"model": "llama3-8b"} | kw)
    assert "modelled without a speculative draft" in str(err.value)


@pytest.mark.parametrize("model", ["mistral-7b-swa", "deepseek-v3"])
def test_sliding_window_and_mla_models_stay_refused(model: str) -> None:
    """kvcargo's own sliding-window and MLA models are not the companion's: its scheduled engine
    has no rule for them."""
    from kvcargo.errors import KvcargoError

    c = SimConfig(requests=10, model=model, devices_per_instance=8 if model == "deepseek-v3" else 1,
                  device="h200", kv_policy="paged")
    with pytest.raises(KvcargoError, match=f"modelled for full-attention models .*; {model} is not one"):
        simulate(c)
