"""The companion's parallel layouts and speculative decoding, restated from levers-parallel alone.

Forward passes split into weight traffic W and KV traffic O (§2.2), the mixture-of-experts weight
traffic with τ(T) by binary exponentiation (§4), GPipe slots with ring all-reduces, all-to-alls and
pipeline hops (§2.2), the verify pass and the draft passes (§6.3) and the mulberry32 acceptance
draws (§6.4). Nothing of kvcargo's cost model is used: only the catalog entries (model shapes,
devices, links) and the resolved capacities, whose check values are pinned elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import costs


def _binpow(x: float, n: int) -> float:
    r = 1.0
    while n:
        if n & 1:
            r = r * x
        x = x * x
        n >>= 1
    return r


def weight_traffic(m: Any, tokens: int) -> float:
    """W_read(T): weights streamed once plus one embedding row per token (§1.2, §4)."""
    d, L, bw = m.d_model, m.layers, m.weight_bytes
    attn = 2 * d * d + 2 * d * m.kv_heads * m.head_dim
    x = 3 * d * m.d_ff
    if not m.experts:
        return (L * (attn + x) + m.vocab * d) * bw + tokens * (d * bw)
    f = attn + d * m.experts
    tau = m.experts * (1.0 - _binpow(1.0 - m.top_k / m.experts, tokens))
    return (L * (f + tau * x) + m.vocab * d) * bw + tokens * (d * bw)


def kv_tok(m: Any) -> int:
    return int(2 * m.layers * m.kv_heads * m.head_dim * m.kv_bytes)


def p_mm(m: Any) -> int:
    d = m.d_model
    attn = 2 * d * d + 2 * d * m.kv_heads * m.head_dim
    per_layer = attn + (d * m.experts + m.top_k * 3 * d * m.d_ff if m.experts else 3 * d * m.d_ff)
    return m.layers * per_layer + m.vocab * d


def prefill_parts(m: Any, prompts: list[int], lm_head: str) -> tuple[int, float, float, int]:
    """§1.3 split: FLOPs, W, O and tokens of a prefill step over whole prompts."""
    T = sum(prompts)
    attention = sum(2 * m.layers * m.d_model * p * (p + 1) for p in prompts)
    if lm_head == "last":
        flops = 2 * (p_mm(m) - m.vocab * m.d_model) * T + 2 * m.vocab * m.d_model * len(prompts) + attention
    else:
        flops = 2 * p_mm(m) * T + attention
    return flops, weight_traffic(m, T), T * float(kv_tok(m)), T


def decode_parts(m: Any, batch: int, context: int) -> tuple[int, float, float, int]:
    """§1.4 split: FLOPs, W, O and tokens of a decode step (``context`` = Σ c_j)."""
    flops = 2 * p_mm(m) * batch + 4 * m.layers * m.d_model * (context + batch)
    return flops, weight_traffic(m, batch), (context + batch) * float(kv_tok(m)), batch


def verify_parts(m: Any, batch: int, context: int, gamma: int) -> tuple[int, float, float, int]:
    """§6.3: a verify pass of γ + 1 causal positions per row."""
    c = gamma + 1
    flops = 2 * p_mm(m) * batch * c + 2 * m.layers * m.d_model * c * (2 * context + batch * (c + 1))
    return flops, weight_traffic(m, batch * c), (context + batch * c) * float(kv_tok(m)), batch * c


@dataclass(frozen=True)
class Layout:
    """A pool's layout with its stage device (tp GPUs, no overhead) and scale-up link."""

    tp: int
    pp: int
    ep: int
    mb: int | None
    imbalance: float
    stage: costs.Instance
    bw: float
    latency: float
    pj_bit: float


def forward(model: Any, inst: costs.Instance, lay: Layout | None, flops: int, w: float, o: float,
            tokens: int) -> tuple[float, float, float, float]:
    """(time with overhead, bytes counted, compute J, memory J) of one target pass (§2.2)."""
    if lay is None:
        t, e_c, e_m = costs.step(inst, flops, w + o)
        return t, w + o, e_c, e_m
    tp, pp, ep = lay.tp, lay.pp, lay.ep
    mb = min(lay.mb if lay.mb is not None else pp, max(1, tokens))
    moe_ep = bool(model.experts) and ep > 1
    f_eff = flops
    if moe_ep and lay.imbalance != 1.0:
        f_eff = flops + 2.0 * model.layers * model.top_k * (3 * model.d_model * model.d_ff) * tokens * (lay.imbalance - 1)
    t_slot, e_c, e_m = costs.step(lay.stage, f_eff / (mb * pp), w / pp + o / (mb * pp), overhead=0.0)
    if f_eff != flops:
        e_c = e_c * (flops / f_eff)
    a = (tokens / mb) * model.d_model * 2.0
    layers = model.layers // pp
    c_t = 0.0
    if tp > 1:
        n_ar = layers if moe_ep else 2 * layers
        c_t += n_ar * (((2 * (tp - 1)) / tp * a) / lay.bw + (2 * (tp - 1)) * lay.latency)
    if moe_ep:
        a2a = 2 * (tokens / mb) * model.top_k * model.d_model * 2.0 * (ep - 1) / ep
        c_t += layers * (a2a / lay.bw + (2 * (ep - 1)) * lay.latency)
    hop = a / lay.bw + lay.latency if pp > 1 else 0.0
    slots = mb + pp - 1
    time = (slots * t_slot + slots * (c_t + hop)) + costs.STEP_OVERHEAD_S
    return time, mb * w + o, (mb * pp) * e_c, (mb * pp) * e_m


def mulberry32(a: int) -> tuple[int, float]:
    """One draw of Tommy Ettinger's mulberry32 (§6.4): the new state and a uniform in [0, 1)."""
    a = (a + 0x6D2B79F5) % 2**32
    t = ((a ^ (a >> 15)) * (a | 1)) % 2**32
    t = ((t + ((t ^ (t >> 7)) * (t | 61)) % 2**32) % 2**32) ^ t
    return a, ((t ^ (t >> 14)) % 2**32) / 2**32
