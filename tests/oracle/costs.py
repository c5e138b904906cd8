"""Step costs restated from the reference spec alone (reference-semantics §1–§3).

Nothing here comes from kvcargo's cost model: model shapes, FLOPs and bytes, instance rates, the
roofline with its power cap and DVFS clock solve, and the step energies are written out again
from the spec's formulas, in the spec's floating-point order, over the catalog's raw numbers.
Plain Python floats and ints, one step at a time: slow and obvious on purpose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

STEP_OVERHEAD_S = 0.5e-3
"""§3.6: fixed overhead added to every prefill and decode step."""
S_MIN = 0.4
"""§2.3: lowest DVFS compute-clock fraction."""
HBM_USABLE = 0.9
"""§2.2: usable fraction of HBM."""


@dataclass(frozen=True)
class Shape:
    """§1.2 (and the mixture-of-experts weight traffic the catalog's Mixtral entry needs)."""

    layers: int
    d_model: int
    vocab: int
    p_layers: int
    """All layers' parameters a token touches (active experts only)."""
    p_mm: int
    w_res: float
    w_str: float
    row: float
    kv_tok: int
    experts: int
    top_k: int
    w_expert: float
    """Bytes of one expert's MLP over all layers."""


def shape(model) -> Shape:  # type: ignore[no-untyped-def]
    """Parameter counts of an attention model (catalog entry) by §1.2.

    Mixture of experts: a token touches the router and its top-k experts; the step reads the
    dense weights plus ``E·(1 − (1 − k/E)^T)`` experts per layer for T tokens under uniform routing.
    """
    d, L = model.d_model, model.layers
    kv = model.kv_heads * model.head_dim
    attn = 2 * d * d + 2 * d * kv
    mlp = 3 * d * model.d_ff
    experts, top_k = model.experts, model.top_k
    if experts:
        p_layer = attn + d * experts + top_k * mlp
        p_layer_all = attn + d * experts + experts * mlp
    else:
        p_layer = p_layer_all = attn + mlp
    p_layers = L * p_layer
    p_total = L * p_layer_all + 2 * model.vocab * d
    p_mm = p_layers + model.vocab * d
    kv_tok = 2 * L * model.kv_heads * model.head_dim * model.kv_bytes
    return Shape(layers=L, d_model=d, vocab=model.vocab, p_layers=p_layers, p_mm=p_mm,
                 w_res=p_total * model.weight_bytes, w_str=p_mm * model.weight_bytes,
                 row=d * model.weight_bytes, kv_tok=int(kv_tok), experts=experts, top_k=top_k,
                 w_expert=L * mlp * model.weight_bytes)


def _weights(s: Shape, tokens: int) -> float:
    """Weight bytes one forward pass over ``tokens`` tokens streams."""
    if not s.experts:
        return s.w_str
    dense = s.w_str - s.top_k * s.w_expert  # exact: whole numbers below 2^53
    touched = float(s.experts) * (1.0 - (1.0 - s.top_k / s.experts) ** tokens)
    return dense + touched * s.w_expert


def prefill_work(s: Shape, prompts: list[int], lm_head: str = "all") -> tuple[int, float]:
    """§1.3: FLOPs (exact int) and bytes of one prefill step over whole prompts."""
    T = sum(prompts)
    attention = sum(2 * s.layers * s.d_model * p * (p + 1) for p in prompts)
    if lm_head == "last":
        flops = 2 * s.p_layers * T + 2 * s.vocab * s.d_model * len(prompts) + attention
    else:
        flops = 2 * s.p_mm * T + attention
    return flops, _weights(s, T) + T * s.row + T * s.kv_tok


def decode_work(s: Shape, batch: int, context: int) -> tuple[int, float]:
    """§1.4: FLOPs and bytes of one decode step (``context`` = Σ c_j)."""
    flops = 2 * s.p_mm * batch + 4 * s.layers * s.d_model * (context + batch)
    return flops, _weights(s, batch) + batch * s.row + (context + batch) * s.kv_tok


@dataclass(frozen=True)
class Instance:
    """One instance's cost coefficients (§2.1, §2.3)."""

    r_f: float
    r_b: float
    j_f: float
    j_b: float
    p_dyn: float
    dvfs: bool
    idle_w: float
    """Static power of the instance, ``idle·n``."""
    peak_flops: float
    """Per device, raw (MFU and MBU are against raw peaks, §7)."""
    peak_bw: float
    memory: float


def instance(device, n: int, power_cap: float | None = None, dvfs: bool = False,  # type: ignore[no-untyped-def]
             speedup: float = 1.0) -> Instance:
    """``n`` devices of one kind as one big device: rates left to right, the energy coefficients
    formed once, the dynamic budget ``(min(cap, TDP) − idle)·n``."""
    cap = device.tdp_w if power_cap is None else min(power_cap, device.tdp_w)
    return Instance(
        r_f=device.peak_flops * device.flop_eff * n * speedup,
        r_b=device.hbm_bw * device.bw_eff * n,
        j_f=device.pj_per_flop * 1e-12 / speedup,
        j_b=device.pj_per_byte * 1e-12,
        p_dyn=(cap - device.idle_w) * n,
        dvfs=dvfs,
        idle_w=device.idle_w * n,
        peak_flops=device.peak_flops,
        peak_bw=device.hbm_bw,
        memory=device.capacity * n,
    )


def kv_capacity(s: Shape, inst: Instance) -> int:
    """§2.2: KV tokens an instance holds after its weights (≤ 0: the model does not fit)."""
    free = inst.memory * HBM_USABLE - s.w_res
    return math.floor(free / s.kv_tok) if free > 0 else 0


def _cbrt(x: float) -> float:
    return math.copysign(abs(x) ** (1.0 / 3.0), x)


def step(inst: Instance, flops: float, nbytes: float, overhead: float = STEP_OVERHEAD_S) -> tuple[float, float, float]:
    """§3: step time (``overhead`` included: a parallel slot or a draft pass has none), compute
    and memory energy."""
    t_c = flops / inst.r_f
    t_m = nbytes / inst.r_b
    e_c = flops * inst.j_f
    e_m = nbytes * inst.j_b
    s = max(S_MIN, t_c / t_m) if inst.dvfs and t_c < t_m else 1.0
    p = inst.p_dyn
    if (e_c * s * s + e_m) / max(t_c / s, t_m) > p:
        x = (p * t_m - e_m) / e_c
        if x > 0 and math.sqrt(x) * t_m >= t_c:
            s = min(s, math.sqrt(x))
        else:
            pp, q = e_m / e_c, -p * t_c / e_c
            r = math.sqrt(q * q / 4 + pp * pp * pp / 27)
            s = _cbrt(-q / 2 + r) + _cbrt(-q / 2 - r)
        s = max(s, S_MIN)
    t = max(t_c / s, t_m)
    e_c = e_c * s * s
    if (e_c + e_m) / t > p:
        t = (e_c + e_m) / p
    return t + overhead, e_c, e_m


def elementwise_pass(inst: Instance, ops: float, nbytes: float) -> tuple[float, float, float]:
    """§5 endpoint pass: ``max(ops/R_F, bytes/R_B)``, energies ``ops·j_F`` and ``bytes·j_B``."""
    return max(ops / inst.r_f, nbytes / inst.r_b), ops * inst.j_f, nbytes * inst.j_b
