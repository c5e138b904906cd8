"""The cost model: how long a step takes and how much energy it uses (reference-semantics §1–§3).

Pure functions over catalog objects; nothing here knows about events, queues or time passing.
Two layers, one implementation:

* readable functions over catalog objects (:func:`shape`, :func:`pool`, :func:`prefill_step`,
  :func:`decode_step`, :func:`kv_capacity`) for the calculator, the planner and the docs;
* leaf *kernels* over packed coefficient arrays (:func:`prefill_work`, :func:`decode_work`,
  :func:`roofline`, :func:`elementwise_pass`) that the event engine calls in its hot loop and may
  compile with numba. The readable functions call the same kernels, on the same coefficients
  packed in tuples (:func:`coefficient_values`, :meth:`Pool.coefficient_values`), so both agree
  bit for bit and the calculator never imports numpy (a third of its start-up).

Floating-point operations follow the reference order (every check value of §3 is reproduced
exactly); FLOP counts are exact integers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Literal

from kvcargo._jit import kernel
from kvcargo.catalog import Device, Model
from kvcargo.elementwise import is_array
from kvcargo.errors import KvcargoError

if TYPE_CHECKING:
    import numpy as np

STEP_OVERHEAD_S = 0.5e-3
"""Fixed scheduler/launch overhead added to every prefill and decode step (no energy)."""
HBM_USABLE = 0.9
"""Fraction of HBM usable for weights and KV cache."""
DVFS_MIN_CLOCK = 0.4
"""Lowest compute-clock fraction DVFS or a power cap may choose."""

LmHead = Literal["all", "last"]


# --------------------------------------------------------------------------- model shape (§1.2)


@dataclass(frozen=True)
class Shape:
    """Derived parameter and byte counts of a model (reference-semantics §1.2)."""

    model: Model
    p_layer: int
    """Parameters one token touches per layer (active experts only for a mixture of experts)."""
    p_layers: int
    p_total: int
    """Resident parameters: every layer, every expert, embedding and LM head."""
    p_mm: int
    """Matmul parameters per token: layers + LM head (the embedding is a lookup)."""
    w_res: float
    """Resident weight bytes (memory capacity only)."""
    w_str: float
    """Weight bytes streamed per forward pass (dense models; see :func:`prefill_work`)."""
    row_bytes: float
    """One embedding row, read per token."""
    kv_per_token: int
    """KV-cache bytes per token (every layer's keys and values; for sliding-window layers the
    bytes of a token inside the window: decode memory and reads use this uncapped figure)."""
    window: int | None = None
    """Sliding window of the windowed layers (tokens); ``None``: full attention everywhere."""
    window_kv_per_token: int = 0
    """The part of ``kv_per_token`` held by the windowed layers (capped at ``window`` tokens)."""
    state_bytes: int = 0
    """A constant per-sequence state (distilled Hyena decode, :mod:`kvcargo.mixers`): it is the
    whole hand-off and the unit of decode admission and capacity. 0: none."""

    def handoff_bytes(self, prompt_tokens: int | np.ndarray) -> int | np.ndarray:
        """Bytes handed from prefill to decode for a prompt (a whole number or an integer array):
        ``s · KV_tok``; with sliding-window layers, those layers hand off ``min(s, window)``
        tokens each; a constant state whatever the prompt."""
        if self.state_bytes:
            if is_array(prompt_tokens):
                import numpy as np

                return np.full_like(prompt_tokens, self.state_bytes)
            return self.state_bytes
        if self.window is None:
            return prompt_tokens * self.kv_per_token
        full = self.kv_per_token - self.window_kv_per_token
        if is_array(prompt_tokens):
            import numpy as np

            kept = np.minimum(prompt_tokens, self.window)
        else:
            kept = min(prompt_tokens, self.window)
        return prompt_tokens * full + kept * self.window_kv_per_token

    @property
    def p_active(self) -> int:
        """Parameters a token activates: its layers (active experts only), embedding, LM head."""
        return self.p_layers + 2 * self.model.vocab * self.model.d_model

    def kv_per_token_per_device(self, n: int) -> int:
        """KV bytes per token on each of ``n`` tensor-parallel devices: K/V heads are split
        (a device keeps at least one head), an MLA latent is not split (every device keeps it)."""
        m = self.model
        if m.kv_layout == "mla" or n <= 1:
            return self.kv_per_token
        heads = -(-m.kv_heads // n)
        return int(2 * m.layers * heads * m.head_dim * m.kv_bytes)


def attention_params(model: Model) -> int:
    """Parameters of one attention block (no norms, no biases).

    MHA/GQA (§1.2): ``2d² + 2d·kv`` (q and o are d×d); a model whose catalog entry gives an
    explicit ``head_dim`` with ``heads·head_dim ≠ d`` (Gemma) uses ``2d·heads·head_dim``
    instead. MLA: the low-rank query (or a full one), the KV down-projection to the latent and
    the RoPE key, the latent's up-projection to keys and values, and the output projection.
    """
    d, h = model.d_model, model.heads
    if model.kv_layout == "mla":
        qk = model.qk_nope_dim + model.qk_rope_dim
        q = d * model.q_lora_rank + model.q_lora_rank * h * qk if model.q_lora_rank else d * h * qk
        kv = d * (model.kv_lora_rank + model.qk_rope_dim) + model.kv_lora_rank * h * (model.qk_nope_dim
                                                                                      + model.v_head_dim)
        return q + kv + h * model.v_head_dim * d
    q_width = d
    if "head_dim" in model.model_fields_set and h * model.head_dim != d:
        q_width = h * model.head_dim
    return 2 * d * q_width + 2 * d * model.kv_heads * model.head_dim


@cache
def shape(model: Model) -> Shape:
    """Parameter counts and KV bytes per token of a model."""
    if model.mixer != "attention":
        return _mixing_shape(model)
    d = model.d_model
    attn = attention_params(model)
    mlp = 3 * d * model.d_ff
    if model.experts:
        router = d * model.experts
        p_layer = attn + router + (model.top_k + model.shared_experts) * mlp
        p_layer_all = attn + router + (model.experts + model.shared_experts) * mlp
    else:
        p_layer = p_layer_all = attn + mlp
    p_layers = model.layers * p_layer
    p_total = model.layers * p_layer_all + 2 * model.vocab * d
    if model.dense_layers:  # leading dense layers of a mixture of experts (DeepSeek-V3)
        dense = attn + 3 * d * (model.d_ff_dense or (model.top_k + model.shared_experts) * model.d_ff)
        p_layers += model.dense_layers * (dense - p_layer)
        p_total += model.dense_layers * (dense - p_layer_all)
    p_mm = p_layers + model.vocab * d
    if model.kv_layout == "mla":  # one latent per layer and token, no separate K and V
        kv_layer = (model.kv_lora_rank + model.qk_rope_dim) * model.kv_bytes
        kv_tok = model.layers * kv_layer
    else:
        kv_layer = 2 * model.kv_heads * model.head_dim * model.kv_bytes
        kv_tok = 2 * model.layers * model.kv_heads * model.head_dim * model.kv_bytes
    if kv_tok != int(kv_tok) or kv_layer != int(kv_layer):
        raise KvcargoError(f"model {model.key!r}: KV bytes per token must be a whole number")
    window, window_kv = None, 0
    if model.sliding_window is not None:
        window = model.sliding_window
        n_win = model.layers if model.window_layers is None else model.window_layers
        window_kv = n_win * int(kv_layer)
    return Shape(
        model=model,
        p_layer=p_layer,
        p_layers=p_layers,
        p_total=p_total,
        p_mm=p_mm,
        w_res=p_total * model.weight_bytes,
        w_str=p_mm * model.weight_bytes,
        row_bytes=d * model.weight_bytes,
        kv_per_token=int(kv_tok),
        window=window,
        window_kv_per_token=window_kv,
    )


def _mixing_shape(model: Model) -> Shape:
    """An FFT-mixing model's counts (levers-mixers §1.2–§1.3): attention and Hyena layers."""
    from kvcargo.mixers import mixing

    mx = mixing(model)
    p_layers = mx.attention_layers * mx.p_att + mx.hyena_layers * mx.p_hy
    p_total = p_layers + 2 * model.vocab * model.d_model
    p_mm = p_layers + model.vocab * model.d_model
    return Shape(model=model, p_layer=mx.p_hy, p_layers=p_layers, p_total=p_total, p_mm=p_mm,
                 w_res=p_total * model.weight_bytes, w_str=p_mm * model.weight_bytes,
                 row_bytes=model.d_model * model.weight_bytes, kv_per_token=mx.kv_per_token,
                 state_bytes=mx.state_bytes)


# ---------------------------------------------------------------- packed coefficients (kernels)

# Integer model coefficients (exact FLOP arithmetic).
MI_TWO_PMM, MI_TWO_PLAYERS, MI_TWO_VD, MI_TWO_LD, MI_FOUR_LD, MI_LM_LAST, MI_EXPERTS = range(7)
# Float model coefficients. A mixture of experts reads its dense part plus the experts its T tokens
# touch, E·(1 − (1 − k/E)^T) per layer under uniform top-k routing (an extension: the reference
# does not simulate MoE models). Kernels stay leaf functions so numba can compile them.
# MoE (levers-parallel §4): MF_W_DENSE is the fixed params of an expert layer (attention, router,
# shared experts), MF_W_EXPERT one expert's, MF_TOPK_FRAC q = 1 − k/E, MF_MOE_LAYERS the expert
# layers and MF_W_REST the other matmul params (LM head, leading dense layers).
MF_W_STR, MF_ROW, MF_KV_TOK, MF_W_DENSE, MF_W_EXPERT, MF_TOPK_FRAC, MF_EXPERT_SLOTS, MF_MOE_LAYERS, MF_W_REST, \
    MF_WB = range(10)
# Float pool (instance) coefficients. HF_J_FLOP and HF_J_BYTE are the joules per FLOP and per
# byte, formed once per instance (§2.3: the order decides the last bit of every step energy).
(HF_RF, HF_RB, HF_J_FLOP, HF_J_BYTE, HF_PDYN, HF_DVFS, HF_SMIN, HF_OVERHEAD,
 HF_IDLE, HF_PEAK_FLOPS, HF_PEAK_BW) = range(11)


@cache
def coefficient_values(model: Model, lm_head: LmHead = "all") -> tuple[tuple[int, ...], tuple[float, ...]]:
    """A model's (integer, float) kernel coefficients as tuples, each float as its float64 slot
    holds it: what :func:`model_coefficients` packs, and what the readable functions pass the
    kernels (a tuple indexes as the array does)."""
    s = shape(model)
    L, d = model.layers, model.d_model
    mi = [0] * 7
    mi[MI_TWO_PMM] = 2 * s.p_mm
    mi[MI_TWO_PLAYERS] = 2 * s.p_layers
    mi[MI_TWO_VD] = 2 * model.vocab * d
    mi[MI_TWO_LD] = 2 * L * d
    mi[MI_FOUR_LD] = 4 * L * d
    mi[MI_LM_LAST] = 1 if lm_head == "last" else 0
    mi[MI_EXPERTS] = model.experts
    mf = [0.0] * 10
    mf[MF_W_STR] = float(s.w_str)
    mf[MF_ROW] = float(s.row_bytes)
    mf[MF_KV_TOK] = float(s.kv_per_token)
    if model.experts:
        mlp = 3 * d * model.d_ff
        moe_layers = L - model.dense_layers
        mf[MF_W_EXPERT] = float(mlp)
        mf[MF_W_DENSE] = float(attention_params(model) + d * model.experts + model.shared_experts * mlp)
        mf[MF_TOPK_FRAC] = 1.0 - model.top_k / model.experts
        mf[MF_EXPERT_SLOTS] = float(model.experts)
        mf[MF_MOE_LAYERS] = float(moe_layers)
        mf[MF_W_REST] = float(s.p_mm - moe_layers * (mf[MF_W_DENSE] + model.top_k * mlp))
        mf[MF_WB] = float(model.weight_bytes)
    return tuple(mi), tuple(mf)


@cache
def model_coefficients(model: Model, lm_head: LmHead = "all") -> tuple[np.ndarray, np.ndarray]:
    """Pack a model into the (int64, float64) read-only arrays the engine's kernels read."""
    import numpy as np

    mi_values, mf_values = coefficient_values(model, lm_head)
    mi, mf = np.array(mi_values, dtype=np.int64), np.array(mf_values, dtype=np.float64)
    mi.setflags(write=False)
    mf.setflags(write=False)
    return mi, mf


@kernel(inline=True)
def weight_traffic(mi: np.ndarray, mf: np.ndarray, tokens: int) -> float:
    """``W_read(T)``: the weights one forward pass over ``tokens`` tokens streams, plus one
    embedding row per token. A mixture of experts reads its fixed part and the experts its tokens
    touch, ``τ(T) = E·(1 − q^T)`` per layer under uniform top-k routing, q = 1 − k/E, with q^T by
    binary exponentiation (levers-parallel §4): ``(L·(f + τ·X) + rest)·b_w + T·row``."""
    if mi[MI_EXPERTS]:
        r, x, n = 1.0, mf[MF_TOPK_FRAC], tokens
        while n > 0:
            if n & 1:
                r = r * x
            x = x * x
            n >>= 1
        tau = mf[MF_EXPERT_SLOTS] * (1.0 - r)
        weights = (mf[MF_MOE_LAYERS] * (mf[MF_W_DENSE] + tau * mf[MF_W_EXPERT]) + mf[MF_W_REST]) * mf[MF_WB]
        return weights + tokens * mf[MF_ROW]
    return mf[MF_W_STR] + tokens * mf[MF_ROW]


@kernel(inline=True)
def prefill_parts(mi: np.ndarray, mf: np.ndarray, tokens: int, quad: int, n: int) -> tuple[int, float, float]:
    """FLOPs, weight traffic and KV bytes of one prefill step over ``n`` whole prompts (§1.3).

    ``tokens`` = Σ s_i and ``quad`` = Σ s_i·(s_i + 1) (the causal-attention term). Bytes: the
    weights streamed once, one embedding row per token (:func:`weight_traffic`), the KV written.
    """
    if mi[MI_LM_LAST]:
        flops = mi[MI_TWO_PLAYERS] * tokens + mi[MI_TWO_VD] * n + mi[MI_TWO_LD] * quad
    else:
        flops = mi[MI_TWO_PMM] * tokens + mi[MI_TWO_LD] * quad
    return flops, weight_traffic(mi, mf, tokens), tokens * mf[MF_KV_TOK]


def prefill_work(mi: np.ndarray, mf: np.ndarray, tokens: int, quad: int, n: int) -> tuple[int, float]:
    """FLOPs and bytes of one prefill step (:func:`prefill_parts`, bytes summed)."""
    flops, w, o = prefill_parts(mi, mf, tokens, quad, n)
    return flops, w + o


@kernel(inline=True)
def decode_parts(mi: np.ndarray, mf: np.ndarray, batch: int, context: int) -> tuple[int, float, float]:
    """FLOPs, weight traffic and KV bytes of one decode step: ``batch`` sequences whose contexts
    sum to ``context`` (§1.4, including the reference's self-attention term). KV: all cached KV
    read plus the new tokens' KV."""
    flops = mi[MI_TWO_PMM] * batch + mi[MI_FOUR_LD] * (context + batch)
    return flops, weight_traffic(mi, mf, batch), (context + batch) * mf[MF_KV_TOK]


def decode_work(mi: np.ndarray, mf: np.ndarray, batch: int, context: int) -> tuple[int, float]:
    """FLOPs and bytes of one decode step (:func:`decode_parts`, bytes summed)."""
    flops, w, o = decode_parts(mi, mf, batch, context)
    return flops, w + o


@kernel(inline=True)
def mixed_parts(mi: np.ndarray, mf: np.ndarray, batch: int, context: int, chunk_tokens: int, chunk_attn: int,
                chunk_kv: int, n_last: int) -> tuple[int, float, float, int]:
    """FLOPs, weight traffic, KV bytes and tokens of a step mixing ``batch`` decode rows (contexts
    summing to ``context``) with prompt chunks (levers-serving §2.5): ``chunk_tokens`` = Σ c_k,
    ``chunk_attn`` = Σ c_k·(2·p0_k + c_k + 1) (causal attention over the p0_k positions before
    each chunk and itself), ``chunk_kv`` = Σ (p0_k + c_k) (KV read and written), ``n_last``
    chunks end a prompt. The step's bytes are weight traffic + KV bytes (a parallel layout
    prices the two apart, levers-parallel §2.2).

    With no chunks this is :func:`decode_parts`; with no decode rows and every p0 = 0 it is
    :func:`prefill_parts`.
    """
    if mi[MI_LM_LAST]:
        lm = mi[MI_TWO_PLAYERS] * chunk_tokens + mi[MI_TWO_VD] * n_last
    else:
        lm = mi[MI_TWO_PMM] * chunk_tokens
    flops = mi[MI_TWO_PMM] * batch + mi[MI_FOUR_LD] * (context + batch) + lm + mi[MI_TWO_LD] * chunk_attn
    tokens = batch + chunk_tokens
    return flops, weight_traffic(mi, mf, tokens), (context + batch + chunk_kv) * mf[MF_KV_TOK], tokens


def roofline(hf: np.ndarray, flops: float, nbytes: float) -> tuple[float, float, float]:
    """Step time (overhead included), compute energy and memory energy (§3, exact).

    Compute and memory overlap perfectly; a power budget (TDP or a lower cap) throttles the
    compute clock, and DVFS lowers it on memory-bound steps down to the minimum clock. When the
    budget binds and the memory-side bound does not apply, the clock is the real root of
    s³ + p·s + q = 0 (Cardano, sign-preserving cube roots).
    """
    t_c = flops / hf[HF_RF]
    t_m = nbytes / hf[HF_RB]
    e_c = flops * hf[HF_J_FLOP]
    e_m = nbytes * hf[HF_J_BYTE]
    s = 1.0
    if hf[HF_DVFS] != 0.0 and t_c < t_m:
        s = max(hf[HF_SMIN], t_c / t_m)
    p_dyn = hf[HF_PDYN]
    if e_c > 0.0 and (e_c * s * s + e_m) / max(t_c / s, t_m) > p_dyn:
        x = (p_dyn * t_m - e_m) / e_c
        if x > 0.0 and math.sqrt(x) * t_m >= t_c:
            s = min(s, math.sqrt(x))
        else:
            p, q = e_m / e_c, -p_dyn * t_c / e_c
            r = math.sqrt(q * q / 4.0 + p * p * p / 27.0)
            u, v = -q / 2.0 + r, -q / 2.0 - r
            s = math.copysign(abs(u) ** (1.0 / 3.0), u) + math.copysign(abs(v) ** (1.0 / 3.0), v)
        s = max(s, hf[HF_SMIN])
    t = max(t_c / s, t_m)
    e_c = e_c * s * s
    if (e_c + e_m) / t > p_dyn:
        t = (e_c + e_m) / p_dyn
    return t + hf[HF_OVERHEAD], e_c, e_m


def elementwise_pass(hf: np.ndarray, ops: float, nbytes: float) -> tuple[float, float, float]:
    """Time, compute energy and memory energy of an extra elementwise pass (compressing KV on
    the GPU, §5): ``max(ops/R_F, bytes/R_B)``, no overhead, no cap, no DVFS; energies
    ``ops·j_F`` and ``bytes·j_B``."""
    t = max(ops / hf[HF_RF], nbytes / hf[HF_RB])
    return t, ops * hf[HF_J_FLOP], nbytes * hf[HF_J_BYTE]


# ------------------------------------------------------------------------ pools (§2.1, §2.2)


@dataclass(frozen=True)
class Pool:
    """The hardware of one instance: ``n`` devices of one kind treated as one big device."""

    device: Device
    n: int = 1
    power_cap_w: float | None = None
    dvfs: bool = False
    precision: str = "bf16"

    def __post_init__(self) -> None:
        if self.n < 1:
            raise KvcargoError(f"devices per instance must be >= 1, got {self.n}")
        if self.precision != "bf16" and self.precision not in self.device.lowp_speedup:
            valid = ["bf16", *self.device.lowp_speedup]
            raise KvcargoError(
                f"device {self.device.key!r} has no native {self.precision!r} rate; "
                f"valid choices: {', '.join(valid)}"
            )
        if self.power_cap_w is not None and self.power_cap_w <= self.device.idle_w:
            raise KvcargoError(
                f"power cap {self.power_cap_w:g} W is not above the static power of "
                f"{self.device.key} ({self.device.idle_w:g} W per device)"
            )

    @property
    def speedup(self) -> float:
        return 1.0 if self.precision == "bf16" else self.device.lowp_speedup[self.precision]

    @property
    def flop_rate(self) -> float:
        """Achievable FLOP/s: ``((peak · efficiency) · n) · speed-up``, left to right (§2.1)."""
        d = self.device
        return d.peak_flops * d.flop_eff * self.n * self.speedup

    @property
    def byte_rate(self) -> float:
        """Achievable HBM bytes/s: ``(bandwidth · efficiency) · n``, left to right (§2.1)."""
        return self.device.hbm_bw * self.device.bw_eff * self.n

    @property
    def joules_per_flop(self) -> float:
        """``(pJ/FLOP · 1e−12) / speed-up``, formed before any step multiplies it (§2.3)."""
        return self.device.pj_per_flop * 1e-12 / self.speedup

    @property
    def joules_per_byte(self) -> float:
        """``pJ/byte · 1e−12`` (§2.3)."""
        return self.device.pj_per_byte * 1e-12

    @property
    def memory(self) -> float:
        return self.device.capacity * self.n

    @property
    def idle_w(self) -> float:
        """Static power of the instance, charged for the whole run."""
        return self.device.idle_w * self.n

    @property
    def cap_w(self) -> float:
        """Per-device power limit: the cap if below TDP, else TDP."""
        cap = self.device.tdp_w
        return cap if self.power_cap_w is None else min(self.power_cap_w, cap)

    @property
    def dynamic_budget_w(self) -> float:
        return (self.cap_w - self.device.idle_w) * self.n

    def coefficients(self) -> np.ndarray:
        """Pack into the read-only float64 array :func:`roofline` reads in the engine."""
        import numpy as np

        hf = np.array(self.coefficient_values(), dtype=np.float64)
        hf.setflags(write=False)
        return hf

    def coefficient_values(self) -> tuple[float, ...]:
        """The coefficients :meth:`coefficients` packs, as a tuple of floats (what the readable
        functions pass :func:`roofline`)."""
        hf = [0.0] * 11
        hf[HF_RF] = self.flop_rate
        hf[HF_RB] = self.byte_rate
        hf[HF_J_FLOP] = self.joules_per_flop
        hf[HF_J_BYTE] = self.joules_per_byte
        hf[HF_PDYN] = self.dynamic_budget_w
        hf[HF_DVFS] = 1.0 if self.dvfs else 0.0
        hf[HF_SMIN] = DVFS_MIN_CLOCK
        hf[HF_OVERHEAD] = STEP_OVERHEAD_S
        hf[HF_IDLE] = self.idle_w
        hf[HF_PEAK_FLOPS] = self.device.peak_flops * self.n
        hf[HF_PEAK_BW] = self.device.hbm_bw * self.n
        return tuple(float(v) for v in hf)


def kv_capacity(model: Model, pool: Pool, w_res: float | None = None) -> int:
    """KV tokens that fit in one instance after the weights: ``floor((cap·n·0.9 − W_res)/KV_tok)``
    (§2.2). An MLA latent is not split by tensor parallelism: each of the n devices keeps it, so
    a token costs ``n·KV_tok`` there. A model with a constant state counts whole sequences.
    ``w_res``: resident weight bytes when the instance holds only part of the model.

    Returns a non-positive number when the model does not fit (see :func:`require_fit`).
    """
    s = shape(model)
    free = pool.device.capacity * pool.n * HBM_USABLE - (s.w_res if w_res is None else w_res)
    if free <= 0:
        return 0
    per_token = s.kv_per_token * pool.n if model.kv_layout == "mla" else s.kv_per_token
    return math.floor(free / (s.state_bytes or per_token))


def require_fit(model: Model, pool: Pool, role: str, w_res: float | None = None) -> int:
    """KV capacity of an instance, or a clear error when the model does not fit it."""
    cap = kv_capacity(model, pool, w_res)
    if cap <= 0:
        need = (shape(model).w_res if w_res is None else w_res) / (pool.device.capacity * HBM_USABLE)
        raise KvcargoError(
            f"{model.name} does not fit the {role} pool ({pool.n}x {pool.device.key}, "
            f"{pool.memory / 1e9:g} GB): its weights need at least {math.ceil(need)} devices "
            "per instance", field="devices_per_instance", pool=role)
    return cap


# ------------------------------------------------------------------ readable step costs (§3)


@dataclass(frozen=True)
class StepCost:
    """One step: FLOPs, bytes, time (overhead included), energies and what bound it."""

    flops: int
    bytes: float
    time: float
    compute_j: float
    memory_j: float
    bound: str

    @property
    def energy_j(self) -> float:
        return self.compute_j + self.memory_j


def step_bound(pool: Pool, flops: float, nbytes: float, t: float) -> str:
    """What bound a step of time ``t`` (overhead included): power, compute or memory."""
    t_c, t_m = flops / pool.flop_rate, nbytes / pool.byte_rate
    if t - STEP_OVERHEAD_S > max(t_c, t_m) * (1 + 1e-9):
        return "power"
    return "compute" if t_c >= t_m else "memory"


def _step(pool: Pool, flops: int, nbytes: float) -> StepCost:
    t, e_c, e_m = roofline(pool.coefficient_values(), flops, nbytes)
    return StepCost(int(flops), float(nbytes), float(t), float(e_c), float(e_m), step_bound(pool, flops, nbytes, t))


def prefill_step(model: Model, pool: Pool, prompts: list[int], lm_head: LmHead = "all") -> StepCost:
    """Cost of one prefill step over whole prompts."""
    mi, mf = coefficient_values(model, lm_head)
    tokens = sum(prompts)
    quad = sum(s * (s + 1) for s in prompts)
    flops, nbytes = prefill_work(mi, mf, tokens, quad, len(prompts))
    return _step(pool, flops, nbytes)


def decode_step(model: Model, pool: Pool, batch: int, context_per_seq: int) -> StepCost:
    """Cost of one decode step: ``batch`` sequences of ``context_per_seq`` cached tokens each."""
    mi, mf = coefficient_values(model)
    flops, nbytes = decode_work(mi, mf, batch, batch * context_per_seq)
    return _step(pool, flops, nbytes)


def power_w(pool: Pool, step: StepCost) -> float:
    """Average power of the instance over one step: static + dynamic energy / step time."""
    return pool.idle_w + step.energy_j / step.time


# ----------------------------------------------------------------- silicon cost (PPA, §7)

WAFER_DIAMETER_MM = 300.0
WAFER_COST_USD = 10_000.0
DEFECTS_PER_CM2 = 0.1


def silicon_cost_usd(device: Device) -> float | None:
    """Illustrative $ per good die: dies per 300 mm wafer and Murphy's yield model.

    ``None`` when the catalog gives no die area for the device.
    """
    from kvcargo.optical import die_areas

    areas = die_areas(device)
    if not areas:
        return None
    total = 0.0
    for area in areas:  # a device with an optical engine also has a photonic die
        total += _die_cost_usd(area)
    return total


def _die_cost_usd(area: float) -> float:
    r = WAFER_DIAMETER_MM / 2
    dies = math.floor(math.pi * r * r / area - math.pi * WAFER_DIAMETER_MM / math.sqrt(2 * area))
    if dies < 1:
        raise KvcargoError(f"a die of {area:,.3g} mm² does not fit a {WAFER_DIAMETER_MM:g} mm wafer, so it has no "
                           "silicon cost (an optical engine's --ft-samples-per-s sets its converters' area)")
    x = area / 100 * DEFECTS_PER_CM2
    t = -math.expm1(-x) / x  # not (1 − e^−x)/x, which differs in the last bit (§7)
    return WAFER_COST_USD / (dies * (t * t))
