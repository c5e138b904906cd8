"""Speculative decoding (levers-parallel §6): a draft proposes γ tokens, the target verifies them
in one pass, and a seeded acceptance process decides how many it keeps.

Leviathan et al., 2023 (arXiv:2211.17192) give the expected tokens per verify pass for an
acceptance rate α, ``(1 − α^(γ+1))/(1 − α)``; the draft is either a small model of the same
vocabulary or a multi-token-prediction head of one extra layer (Gloeckle et al., 2024,
arXiv:2404.19737; DeepSeek-V3's MTP module). Each request draws from its own mulberry32 stream,
seeded from ``--spec-seed`` and its id, so the order of rows in a step never changes a draw.
Pure functions: the kernels read packed coefficients and know nothing about events.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcargo._jit import kernel
from kvcargo.catalog import Catalog, Link, Model
from kvcargo.cost import (
    MF_KV_TOK,
    MI_TWO_LD,
    MI_TWO_PMM,
    Pool,
    decode_parts,
    model_coefficients,
    prefill_work,
    roofline,
    shape,
    weight_traffic,
)
from kvcargo.errors import KvcargoError
from kvcargo.parallel import Layout, layout_coefficients, parallel_step, stage_coefficients

MTP = "mtp"
"""The draft key of a multi-token-prediction head (one extra layer of the target)."""
DEFAULT_GAMMA = 3
DEFAULT_ALPHA = 0.7
DEFAULT_SEED = 0
SEED_STRIDE = 2654435761
"""Knuth's multiplicative hash constant: request r's stream starts at (seed + r·stride) mod 2^32."""
MASK32 = 0xFFFFFFFF


@dataclass(frozen=True)
class Draft:
    """The draft model as it runs (its own shape, the target's formats) and what it keeps resident."""

    model: Model
    resident_bytes: float
    """Bytes it adds to every instance: one layer for MTP (embedding and LM head shared), the whole
    model otherwise."""
    gamma: int
    alpha: float
    seed: int

    @property
    def kv_per_token(self) -> int:
        return shape(self.model).kv_per_token

    @property
    def closed_form(self) -> float:
        """Expected tokens per verify pass: ``(1 − α^(γ+1))/(1 − α)``, γ + 1 when α ≥ 1 (α^(γ+1)
        by binary exponentiation, as the companion)."""
        if self.alpha >= 1.0:
            return float(self.gamma + 1)
        r, x, n = 1.0, self.alpha, self.gamma + 1
        while n:
            if n & 1:
                r *= x
            x *= x
            n >>= 1
        return (1.0 - r) / (1.0 - self.alpha)


def make_draft(target: Model, key: str, cat: Catalog, gamma: int | None, alpha: float | None,
               seed: int | None) -> Draft:
    """The draft for ``--speculative KEY``: ``mtp`` or a catalog model with the target's vocabulary,
    stored in the target's formats."""
    fmt = {"weight_bytes": target.weight_bytes, "kv_bytes": target.kv_bytes}
    if key == MTP:
        model = target.model_copy(update={"key": MTP, "name": f"{target.name} MTP", "layers": 1,
                                          "dense_layers": 0, "window_layers": None})
        s = shape(model)
        resident = (s.p_total - 2 * model.vocab * model.d_model) * model.weight_bytes
    else:
        if key not in cat.models:
            raise KvcargoError(f"unknown draft {key!r}; valid choices: {MTP}, " + ", ".join(sorted(cat.models)))
        model = cat.model(key).model_copy(update=fmt)
        if model.vocab != target.vocab:
            raise KvcargoError(f"draft {key} has a {model.vocab}-token vocabulary, the target {target.vocab}: "
                               "speculative decoding needs the same one", field="speculative")
        resident = shape(model).w_res
    return Draft(model, resident, DEFAULT_GAMMA if gamma is None else gamma,
                 DEFAULT_ALPHA if alpha is None else alpha, DEFAULT_SEED if seed is None else seed)


def draft_prefill_time(draft: Model, pool: Pool, prompts: list[int]) -> float:
    """Seconds the draft's prefill of whole prompts adds to the target's (no step overhead)."""
    mi, mf = model_coefficients(draft)
    flops, nbytes = prefill_work(mi, mf, sum(prompts), sum(s * (s + 1) for s in prompts), len(prompts))
    return float(roofline(stage_coefficients(pool, pool.n), flops, nbytes)[0])


def speculative_step_time(model: Model, pool: Pool, draft: Draft, batch: int, context_per_seq: int,
                          layout: Layout | None = None, link: Link | None = None) -> float:
    """Seconds of one speculative decode step (a verify pass, then γ draft passes) over ``batch``
    rows of ``context_per_seq`` tokens each (planner bounds)."""
    mi, mf = model_coefficients(model)
    context = batch * context_per_seq
    flops, w, o, tokens = verify_parts(mi, mf, batch, context, draft.gamma)
    if layout is None:
        t = float(roofline(pool.coefficients(), flops, w + o)[0])
    else:
        t = float(parallel_step(stage_coefficients(pool, layout.tp), layout_coefficients(layout, model, link),
                                flops, w, o, tokens)[0])
    mid, mfd = model_coefficients(draft.model)
    hd = stage_coefficients(pool, pool.n)
    for j in range(draft.gamma):
        f_d, w_d, o_d = decode_parts(mid, mfd, batch, context + j * batch)
        t += float(roofline(hd, f_d, w_d + o_d)[0])
    return t


@kernel(inline=True)
def verify_parts(mi: np.ndarray, mf: np.ndarray, batch: int, context: int,
                 gamma: int) -> tuple[int, float, float, int]:
    """FLOPs, weight traffic, KV bytes and tokens of a verify pass over ``batch`` rows whose
    contexts sum to ``context``: each row attends causally to its γ + 1 new positions."""
    c = gamma + 1
    tokens = batch * c
    flops = mi[MI_TWO_PMM] * batch * c + mi[MI_TWO_LD] * c * (2 * context + batch * (c + 1))
    return flops, weight_traffic(mi, mf, tokens), (context + tokens) * mf[MF_KV_TOK], tokens


@kernel(inline=True)
def _mul32(a: int, b: int) -> int:
    """a·b mod 2^32 without leaving 64-bit integers (Math.imul)."""
    return (a * (b & 0xFFFF) + (((a * (b >> 16)) & 0xFFFF) << 16)) & MASK32


@kernel(inline=True)
def seed_state(seed: int, rid: int) -> int:
    """A request's first generator state: (seed + rid·2654435761) mod 2^32 (non-negative)."""
    return (seed % (MASK32 + 1) + _mul32(rid & MASK32, SEED_STRIDE)) & MASK32


@kernel(inline=True)
def mulberry32(a: int) -> tuple[int, float]:
    """One mulberry32 draw (Tommy Ettinger's generator): the new state and a uniform in [0, 1)."""
    a = (a + 0x6D2B79F5) & MASK32
    t = _mul32(a ^ (a >> 15), a | 1)
    t = ((t + _mul32(t ^ (t >> 7), t | 61)) & MASK32) ^ t
    return a, ((t ^ (t >> 14)) & MASK32) / 4294967296.0


@kernel(inline=True)
def accepted(state: int, gamma: int, alpha: float) -> tuple[int, int]:
    """Draft tokens accepted in one verify pass: draw until a rejection (u ≥ α) or γ acceptances.
    Returns the new state and the accepted count."""
    k = 0
    while k < gamma:
        state, u = mulberry32(state)
        if u >= alpha:
            break
        k += 1
    return state, k
