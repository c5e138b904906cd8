"""Tensor, pipeline and expert parallelism inside an instance (levers-parallel §2).

By default an instance of n devices is one ideal device (reference-semantics §2.1). With a
*layout* (tp × pp GPUs, expert parallelism ep, micro-batches) a forward pass is priced as the
companion simulator prices it:

* one *slot* — one micro-batch on one pipeline stage — is the full roofline of a "stage device"
  of tp GPUs (no step overhead) over the FLOPs ``F/(mb·pp)`` and bytes ``W/pp + O/(mb·pp)``
  (W: weights and embedding rows, O: KV traffic);
* each slot adds Megatron-style ring all-reduces after attention and after the MLP
  (Shoeybi et al., 2019, arXiv:1909.08053; ring cost 2(tp−1)/tp of the activations plus
  2(tp−1) latencies), or an all-to-all in place of the MLP's all-reduce with expert
  parallelism (GShard, Lepikhin et al., 2020, arXiv:2006.16668), and one activation hop per
  pipeline boundary;
* GPipe's schedule (Huang et al., 2019, arXiv:1811.06965): ``mb + pp − 1`` slots, no overlap
  between consecutive steps.

Activations on the scale-up link are BF16 whatever the storage formats. Pure functions: the
kernel :func:`parallel_step` reads a packed coefficient array and knows nothing about events.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcargo._jit import kernel
from kvcargo.catalog import Device, Link, Model
from kvcargo.cost import (
    HBM_USABLE,
    HF_OVERHEAD,
    STEP_OVERHEAD_S,
    LmHead,
    Pool,
    decode_parts,
    model_coefficients,
    prefill_parts,
    roofline,
    shape,
)
from kvcargo.errors import KvcargoError

_roofline = kernel(roofline, inline=True)
"""The roofline as :func:`parallel_step` calls it (compiled with it when numba is available)."""

ACTIVATION_BYTES = 2.0
"""Bytes per activation value exchanged between GPUs (BF16)."""

# Packed layout coefficients (float64; small integers are exact). LF_ON = 0: no layout.
(LF_ON, LF_TP, LF_PP, LF_EP, LF_MB, LF_IMBALANCE, LF_MOE_EP, LF_EXPERT_FLOPS, LF_STAGE_LAYERS, LF_D,
 LF_TOPK, LF_BW, LF_LATENCY, LF_PJ_BIT, LF_OVERHEAD) = range(15)
LF_SIZE = 15


@dataclass(frozen=True)
class Layout:
    """How an instance's GPUs split a model: tp × pp GPUs, ep, micro-batches, the scale-up link."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    microbatches: int | None = None
    """Micro-batches per step (None: pp)."""
    imbalance: float = 1.0
    """Busiest GPU's routed-expert work over the mean (MoE with ep > 1)."""
    link: Link | None = None
    """Scale-up link (None: the device's own)."""

    def check(self, model: Model, pool: Pool, role: str) -> None:
        """The companion's layout rules, with the pool named (levers-parallel §10)."""
        where = f"{role} pool"
        if self.tp * self.pp != pool.n:
            raise KvcargoError(f"{where}: parallel tp={self.tp} x pp={self.pp} needs {self.tp * self.pp} devices "
                               f"per instance (got {pool.n})", field="devices_per_instance", pool=role)
        if self.ep not in (1, self.tp):
            raise KvcargoError(f"{where}: ep must be 1 (experts split by TP) or equal to tp={self.tp} "
                               f"(whole experts per GPU), got {self.ep}", field="ep")
        if self.ep > 1 and not model.experts:
            raise KvcargoError(f"{where}: expert parallelism needs a mixture-of-experts model ({model.name} is dense)",
                               field="ep")
        if model.layers % self.pp:
            raise KvcargoError(f"{where}: {model.name} has {model.layers} layers: not divisible into {self.pp} stages",
                               field="pp", pool=role)
        if self.pp > 1 and model.dense_layers:
            raise KvcargoError(f"{where}: pipeline stages of a model with leading dense layers are not modelled",
                               field="pp", pool=role)


def stage_pool(pool: Pool, tp: int) -> Pool:
    """The device one slot runs on: tp GPUs of the pool's kind, same cap, DVFS and format."""
    return Pool(pool.device, tp, pool.power_cap_w, pool.dvfs, pool.precision)


def stage_coefficients(pool: Pool, tp: int) -> np.ndarray:
    """Roofline coefficients of the stage device, without the per-step overhead."""
    hf = stage_pool(pool, tp).coefficients().copy()
    hf[HF_OVERHEAD] = 0.0
    hf.setflags(write=False)
    return hf


def layout_coefficients(layout: Layout | None, model: Model, link: Link | None) -> np.ndarray:
    """Pack a layout (or none: all zeros) into the array :func:`parallel_step` reads."""
    lf = np.zeros(LF_SIZE, dtype=np.float64)
    if layout is not None:
        assert link is not None
        moe_ep = bool(model.experts) and layout.ep > 1
        lf[LF_ON] = 1.0
        lf[LF_TP], lf[LF_PP], lf[LF_EP] = layout.tp, layout.pp, layout.ep
        lf[LF_MB] = 0 if layout.microbatches is None else layout.microbatches
        lf[LF_MOE_EP] = 1.0 if moe_ep else 0.0
        lf[LF_IMBALANCE] = layout.imbalance if moe_ep else 1.0
        # E_f(T)/T = 2.0·L·k·(3·d·d_ff): routed-expert FLOPs per token, left to right
        lf[LF_EXPERT_FLOPS] = 2.0 * model.layers * model.top_k * (3 * model.d_model * model.d_ff)
        lf[LF_STAGE_LAYERS] = model.layers // layout.pp
        lf[LF_D] = model.d_model
        lf[LF_TOPK] = model.top_k
        lf[LF_BW], lf[LF_LATENCY], lf[LF_PJ_BIT] = link.bandwidth, link.latency, link.pj_per_bit
    lf[LF_OVERHEAD] = STEP_OVERHEAD_S
    lf.setflags(write=False)
    return lf


def parallel_step(hs: np.ndarray, lf: np.ndarray, flops: int, w: float, o: float,
                  tokens: int) -> tuple[float, float, float, float, float, float]:
    """One forward pass with a layout (levers-parallel §2.2, exact evaluation order).

    ``hs``: stage-device coefficients; ``flops``: the pass's FLOPs; ``w``: weight traffic (weights
    and embedding rows); ``o``: the rest (KV); ``tokens``: tokens in the pass. Returns (step time
    with overhead, compute J, memory J, bytes counted, communication time, scale-up J).
    """
    tp, pp, ep = lf[LF_TP], lf[LF_PP], lf[LF_EP]
    mb = pp if lf[LF_MB] == 0.0 else lf[LF_MB]
    mb = min(mb, max(1.0, float(tokens)))
    moe_ep = lf[LF_MOE_EP] != 0.0
    f_eff = flops + 0.0
    if moe_ep and lf[LF_IMBALANCE] != 1.0:
        f_eff = flops + lf[LF_EXPERT_FLOPS] * tokens * (lf[LF_IMBALANCE] - 1.0)
    slots = mb * pp
    t, e_c, e_m = _roofline(hs, f_eff / slots, w / pp + o / slots)
    if f_eff != flops:
        e_c = e_c * (flops / f_eff)
    per_mb = tokens / mb
    act = per_mb * lf[LF_D] * 2.0
    layers = lf[LF_STAGE_LAYERS]
    bw, lat = lf[LF_BW], lf[LF_LATENCY]
    c_t = 0.0
    c_b = 0.0
    if tp > 1.0:
        n_ar = layers if moe_ep else 2.0 * layers
        c_t += n_ar * (((2.0 * (tp - 1.0)) / tp * act) / bw + (2.0 * (tp - 1.0)) * lat)
        c_b += n_ar * 2.0 * (tp - 1.0) * act
    if moe_ep:
        a2a = (2.0 * per_mb) * lf[LF_TOPK] * lf[LF_D] * 2.0 * (ep - 1.0) / ep
        c_t += layers * (a2a / bw + (2.0 * (ep - 1.0)) * lat)
        c_b += layers * a2a
    hop = act / bw + lat if pp > 1.0 else 0.0
    n_slots = mb + pp - 1.0
    comm_t = n_slots * (c_t + hop)
    comm_b = slots * c_b + (mb * (pp - 1.0)) * act
    time = (n_slots * t + comm_t) + lf[LF_OVERHEAD]
    return time, slots * e_c, slots * e_m, mb * w + o, comm_t, comm_b * 8.0 * lf[LF_PJ_BIT] * 1e-12


def stage_capacity(model: Model, device: Device, tp: int, pp: int, role: str,
                   extra_resident: float = 0.0, extra_per_token: float = 0.0) -> int:
    """KV tokens of an instance checked GPU by GPU, stage by stage (levers-parallel §2.3).

    Stage s holds L/pp layers (every expert), the embedding on the first stage and the LM head on
    the last; ``extra_resident`` bytes (a speculative draft) sit on every stage and
    ``extra_per_token`` bytes join the unit (the draft's KV per token).
    """
    s = shape(model)
    vd = model.vocab * model.d_model
    room = device.capacity * HBM_USABLE
    per_token = s.kv_per_token * (tp if model.kv_layout == "mla" else 1)
    unit = per_token / pp + extra_per_token
    layer_params = (s.p_total - 2 * vd) // model.layers
    best = None
    for stage in range(pp):
        params = (model.layers // pp) * layer_params + (vd if stage == 0 else 0) + (vd if stage == pp - 1 else 0)
        if pp == 1:
            params = s.p_total
        resident = params * model.weight_bytes + extra_resident
        if resident / tp > room:
            raise KvcargoError(
                f"{role} pool: {model.name} does not fit: {resident / tp / 1e9:.1f} GB of weights per GPU in "
                f"stage {stage} of {tp} x {pp} {device.key} ({room / 1e9:.1f} GB usable)",
                field="devices_per_instance", pool=role)
        tokens = int((room * tp - resident) // unit)
        best = tokens if best is None else min(best, tokens)
    assert best is not None
    return best



def prefill_time(model: Model, pool: Pool, layout: Layout, link: Link, prompts: list[int],
                 lm_head: LmHead = "all") -> float:
    """Seconds of one prefill step over whole prompts with a layout (planner bounds, reports)."""
    mi, mf = model_coefficients(model, lm_head)
    tokens = sum(prompts)
    flops, w, o = prefill_parts(mi, mf, tokens, sum(s * (s + 1) for s in prompts), len(prompts))
    return float(parallel_step(stage_coefficients(pool, layout.tp), layout_coefficients(layout, model, link),
                               flops, w, o, tokens)[0])


def decode_time(model: Model, pool: Pool, layout: Layout, link: Link, batch: int, context_per_seq: int) -> float:
    """Seconds of one decode step of ``batch`` sequences of ``context_per_seq`` tokens with a layout."""
    mi, mf = model_coefficients(model)
    flops, w, o = decode_parts(mi, mf, batch, batch * context_per_seq)
    return float(parallel_step(stage_coefficients(pool, layout.tp), layout_coefficients(layout, model, link),
                               flops, w, o, batch)[0])
