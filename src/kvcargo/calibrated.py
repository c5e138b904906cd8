"""The calibrated step-cost model (``--cost-model calibrated``): measured kernels, not a roofline.

A step of a dense transformer on ``t`` tensor-parallel devices costs, per layer, its GEMMs at
``m`` tokens (QKV, output, gate+up, down, each split t ways), two all-reduces of ``m·d`` bf16
values, the elementwise kernels (norms, RoPE, residuals, SiLU·mul: bytes at the measured
bandwidth, never below the shortest measured kernel) and the attention kernel (context attention
over the prompts in prefill, generation attention over the cached tokens in decode); then the
logits GEMM. A serving framework adds its own cost, fitted to end-to-end data per device
(:mod:`kvcargo.calibration_fit`): its kernels' slowdown against the measured ones, a host-side
floor under every prefill step (the host launches a step layer by layer while the GPU runs it),
its all-reduces' slowdown against the measured ones, a further slowdown of its kernels on the
prompt tokens of a step past a knee at TP > 2 (the large-step term), and a per-step decode
overhead per TP degree. Kernel latencies come from :mod:`kvcargo.kernel_tables`.

Number formats: with W8A8 fp8 weights and compute the layers' GEMMs come from the measured fp8
table, with an fp8 KV cache the attention from the fp8-KV tables; the LM head, the elementwise
kernels and the all-reduces stay bf16, and the framework constants (fitted on a bf16 stack)
apply unchanged. Bytes and FLOPs are the model's in its storage formats.

For the engine the model is tabulated once per run and pool (:func:`tabulate`): log-seconds on a
log-spaced grid of tokens (1-D tables) or of (batch, tokens per sequence) (attention), which
:func:`calibrated_step` reads with a bilinear lookup — a few flops per step. The large-step term's
kink at the knee is not tabulated: the step's looked-up compute is multiplied by the exact
fraction of its tokens past the knee.

Energy: FLOPs and bytes at the catalog's pJ per FLOP and per byte, the FLOP energy scaled by
``flop_eff / (measured rate / peak)``. The reference's coefficients put a compute-bound step at
``flop_eff`` of peak just under the device's dynamic power budget; at the measured (faster) rate
the same scaling keeps that step at the same power instead of throttling every prefill. A power
cap below TDP stretches a step whose power would exceed the budget to ``energy / budget``.
The framework constants lengthen a step without adding energy (its FLOPs and bytes are the same):
the kernel scales and the large-step term as the host floor and the decode overhead do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kvcargo._jit import kernel
from kvcargo.catalog import Device, Model
from kvcargo.cost import HF_J_BYTE, HF_J_FLOP, HF_PDYN, LmHead, Pool
from kvcargo.errors import KvcargoError
from kvcargo.formats import BYTES_PER_VALUE

if TYPE_CHECKING:  # the measured tables and the fitted constants load when a calibrated run asks for
    # them: every simulation imports this module for the engine's table lookups
    from kvcargo.calibration_fit import Framework
    from kvcargo.kernel_tables import KernelTables

PER_OCTAVE = 8
"""Grid points per doubling of the tabulated axes."""
OCTAVES = 22
"""The tables cover 1 … 2^22 tokens (beyond: the last segment is extrapolated)."""
N_GRID = PER_OCTAVE * OCTAVES + 1
T_TOKENS, T_REDUCE, T_LOGITS, T_CONTEXT, T_GENERATION = range(5)
N_TABLES = 5
"""The tabulated parts: per-token layer work without its all-reduces, the all-reduces, the logits
GEMM, context and generation attention."""
# Scalars of a calibrated pool (``Params.cs``): the fitted framework constants (the prefill floor
# in seconds: layers × host time per layer; the large-step factor at the pool's TP degree), the
# FLOP-energy scale, whether the LM head runs on the last prompt token only.
(CS_PREFILL_SCALE, CS_PREFILL_FLOOR, CS_DECODE_SCALE, CS_DECODE_OVERHEAD, CS_COMM_SCALE, CS_PJ_SCALE,
 CS_LM_LAST, CS_LARGE_STEP) = range(8)
N_SCALARS = 8
ELEMENTWISE_KERNELS = 6
"""Elementwise kernels per layer: two RMSNorms, RoPE, two residual adds, SiLU·mul."""
TINY_S = 1e-300
"""Stands for 0 s in a log table (a single device has no all-reduce)."""
MEASURED_BYTES = {f: BYTES_PER_VALUE[f] for f in ("bf16", "fp8")}
"""The number formats with measured kernels (GEMMs: the compute format, with weights in the same
format; attention: the KV cache's) and their bytes per value."""
MEASURED_BW_FRACTION = 0.8
"""Fraction of HBM bandwidth an elementwise kernel reaches (the reference's bw_eff; not measured)."""


def grid() -> np.ndarray:
    """The tabulated axis: 2^(i/PER_OCTAVE) for i = 0 … N_GRID−1."""
    return 2.0 ** (np.arange(N_GRID) / PER_OCTAVE)


@dataclass(frozen=True)
class CalibratedPool:
    """The measured costs of one instance: a model on ``tp`` tensor-parallel devices."""

    model: Model
    device: Device
    tp: int
    tables: KernelTables
    compute: str = "bf16"
    """The layers' GEMM format: bf16, or fp8 (W8A8)."""
    kv: str = "bf16"
    """The KV cache's format, which picks the attention kernels: bf16 or fp8."""

    def __post_init__(self) -> None:
        t, key = self.tables, self.device.key
        if self.compute not in t.gemms:
            raise KvcargoError(f"the {key} kernel tables have no measured {self.compute} GEMMs (measured: "
                               f"{', '.join(t.gemms)}): use --compute-format {' or '.join(t.gemms)}, or "
                               "--cost-model roofline", field="compute_format")
        if self.kv not in t.contexts or self.kv not in t.generations:
            have = [f for f in t.contexts if f in t.generations]
            raise KvcargoError(f"the {key} kernel tables have no measured attention over {self.kv} KV caches "
                               f"(measured: {', '.join(have)}): use --kv-format {' or '.join(have)}, or "
                               "--cost-model roofline", field="kv_format")
        ctx, gen = t.contexts[self.kv], t.generations[self.kv]
        measured = sorted(set(ctx.cfg[:, 2].tolist()) & set(gen.cfg[:, 2].tolist()))
        if self.head_dim not in measured:
            raise KvcargoError(f"no measured attention kernels for head size {self.head_dim} ({self.model.key}) "
                               f"in the {self.device.key} tables; measured: {', '.join(map(str, measured))} "
                               "(--cost-model calibrated needs them: use --cost-model roofline or another device)",
                               field="model")

    @property
    def heads(self) -> int:
        """Query heads of the busiest device (a TP degree that does not divide them rounds up)."""
        return max(1, -(-self.model.heads // self.tp))

    @property
    def kv_heads(self) -> int:
        """KV heads per device (a device keeps at least one)."""
        return max(1, -(-self.model.kv_heads // self.tp))

    @property
    def head_dim(self) -> int:
        return self.model.head_dim

    def layer_tokens_s(self, m: np.ndarray) -> np.ndarray:
        """Every layer's work proportional to the tokens of the step, at ``m`` tokens."""
        return self.layer_compute_s(m) + self.layer_reduce_s(m)

    def layer_compute_s(self, m: np.ndarray) -> np.ndarray:
        """Every layer's GEMMs (in the compute format; W8A8's measured GEMMs include vLLM's
        dynamic per-token quantisation of their input) and elementwise kernels (bf16
        activations) at ``m`` tokens."""
        md, t, g = self.model, self.tp, self.tables
        d, hd = md.d_model, self.head_dim
        q, kv = self.heads * hd, self.kv_heads * hd
        ff = -(-md.d_ff // t)
        gemm = g.gemms[self.compute]
        gemms = gemm(m, q + 2 * kv, d) + gemm(m, d, q) + gemm(m, 2 * ff, d) + gemm(m, d, ff)
        elem_bytes = 2.0 * np.asarray(m, dtype=np.float64) * (10 * d + 3 * ff + 2 * (q + kv))
        floor = ELEMENTWISE_KERNELS * self.shortest_kernel_s
        elem = np.maximum(elem_bytes / (self.device.hbm_bw * MEASURED_BW_FRACTION), floor)
        return md.layers * (gemms + elem)

    def layer_reduce_s(self, m: np.ndarray) -> np.ndarray:
        """Every layer's two all-reduces of ``m·d`` bf16 values (0 on one device)."""
        return self.model.layers * 2 * self.tables.all_reduce(self.tp, np.asarray(m, dtype=np.float64) * self.model.d_model * 2)

    @property
    def shortest_kernel_s(self) -> float:
        return float(np.exp(self.tables.gemms["bf16"].log.min()))

    def logits_s(self, m: np.ndarray) -> np.ndarray:
        """The LM head over ``m`` tokens (vocabulary split t ways), in bf16 in every format (FP8
        checkpoints leave it unquantised)."""
        return self.tables.gemms["bf16"](m, -(-self.model.vocab // self.tp), self.model.d_model)

    @property
    def windowed_layers(self) -> int:
        """Layers with sliding-window attention (0 without a window)."""
        m = self.model
        if m.sliding_window is None:
            return 0
        return m.layers if m.window_layers is None else m.window_layers

    def context_s(self, batch: np.ndarray, prompt: np.ndarray) -> np.ndarray:
        """Every layer's prefill attention; a windowed layer attends to at most ``window`` tokens,
        charged as the full kernel scaled by ``min(s, window) / s``."""
        full = self.tables.contexts[self.kv](self.heads, self.kv_heads, self.head_dim, batch, prompt)
        w = self.windowed_layers
        if not w:
            return self.model.layers * full
        p = np.asarray(prompt, dtype=np.float64)
        windowed = full * np.minimum(p, self.model.sliding_window) / p
        return (self.model.layers - w) * full + w * windowed

    def generation_s(self, batch: np.ndarray, kv_len: np.ndarray) -> np.ndarray:
        """Every layer's decode attention; a windowed layer reads at most ``window`` cached tokens."""
        g = self.tables.generations[self.kv]
        full = g(self.heads, self.kv_heads, self.head_dim, batch, kv_len)
        w = self.windowed_layers
        if not w:
            return self.model.layers * full
        capped = g(self.heads, self.kv_heads, self.head_dim, batch,
                   np.minimum(np.asarray(kv_len, dtype=np.float64), self.model.sliding_window))
        return (self.model.layers - w) * full + w * capped


def formats_of(model: Model, pool: Pool) -> tuple[str, str]:
    """The measured (GEMM, KV-cache) formats that price ``model`` on ``pool``: dense MHA/GQA
    models with bf16 weights, or fp8 weights and compute (W8A8), and a bf16 or fp8 KV cache (a
    one-byte KV cache is fp8: the configuration refuses int8's, see
    :func:`kvcargo.formats.calibrated_error`). Say so for anything else."""
    if model.experts:
        raise KvcargoError(f"--cost-model calibrated covers dense models; {model.key} is a mixture of "
                           "experts (use --cost-model roofline)")
    if model.kv_layout == "mla":
        raise KvcargoError(f"--cost-model calibrated has no measured MLA kernels; {model.key} uses MLA "
                           "(use --cost-model roofline)")
    compute = pool.precision
    if compute not in MEASURED_BYTES or model.weight_bytes != MEASURED_BYTES[compute]:
        raise KvcargoError(f"--cost-model calibrated has measured bf16 and fp8 (W8A8) GEMMs only; {model.key} keeps "
                           f"{model.weight_bytes:g}-byte weights with {compute} compute (valid: bf16, or "
                           "--weight-format fp8 --compute-format fp8; else --cost-model roofline)")
    kv = {b: f for f, b in MEASURED_BYTES.items()}.get(model.kv_bytes)
    if kv is None:
        raise KvcargoError(f"--cost-model calibrated has measured attention over bf16 and fp8 KV caches only; "
                           f"{model.key} keeps {model.kv_bytes:g}-byte KV (valid --kv-format: bf16, fp8; else "
                           "--cost-model roofline)")
    return compute, kv


def calibrated_pool(model: Model, pool: Pool) -> CalibratedPool:
    """The measured costs of ``model`` on one instance of ``pool`` (tensor parallel over all its
    devices) in the model's storage formats and the pool's compute format."""
    compute, kv = formats_of(model, pool)
    from kvcargo.kernel_tables import load

    return CalibratedPool(model, pool.device, pool.n, load(pool.device.key, pool.device.kernel_tables), compute, kv)


def framework_of(pool: Pool) -> Framework:
    """The fitted framework constants of an instance: the device's own (a catalog overlay written
    by ``kvcargo calibrate``), else the built-in ones."""
    from kvcargo.calibration_fit import framework, parse_constants

    own = parse_constants({pool.device.key: pool.device.framework}) if pool.device.framework else None
    return framework(pool.device.key, pool.n, own)


def pj_scale(pool: Pool, tables: KernelTables) -> float:
    """FLOP-energy scale that keeps a compute-bound step at the reference's power (module doc):
    the measured rate of the pool's compute format against its peak (the bf16 peak times the
    device's native speed-up, as the pool's energy per FLOP is divided by it)."""
    measured = tables.rate(pool.precision) / (pool.device.peak_flops * pool.speedup)
    return pool.device.flop_eff / measured


TABLE_CACHE_SIZE = 64
"""Tabulated pools kept per process (a planner search simulates the same pools hundreds of times)."""
_tables: dict[tuple[str, str, int, str, str], tuple[np.ndarray, np.ndarray]] = {}


def tabulate(model: Model, pool: Pool, lm_head: LmHead = "all") -> tuple[np.ndarray, np.ndarray]:
    """The engine's tables for one pool: log-seconds ``(N_TABLES, N_GRID, N_GRID)`` and the
    scalars (read-only; the same arrays for the same model in its storage formats, device, device
    count, compute format and LM head)."""
    key = (model.model_dump_json(), pool.device.model_dump_json(), pool.n, pool.precision, lm_head)
    if key not in _tables:
        if len(_tables) >= TABLE_CACHE_SIZE:
            _tables.pop(next(iter(_tables)))
        _tables[key] = _tabulate(model, pool, lm_head)
    return _tables[key]


def _tabulate(model: Model, pool: Pool, lm_head: LmHead) -> tuple[np.ndarray, np.ndarray]:
    cp = calibrated_pool(model, pool)
    x = grid()
    ct = np.zeros((N_TABLES, N_GRID, N_GRID))
    ct[T_TOKENS, :, :] = np.log(cp.layer_compute_s(x))[:, None]
    ct[T_REDUCE, :, :] = np.log(np.maximum(cp.layer_reduce_s(x), TINY_S))[:, None]
    ct[T_LOGITS, :, :] = np.log(cp.logits_s(x))[:, None]
    b, s = np.meshgrid(x, x, indexing="ij")
    ct[T_CONTEXT] = np.log(cp.context_s(b.ravel(), s.ravel())).reshape(b.shape)
    ct[T_GENERATION] = np.log(cp.generation_s(b.ravel(), s.ravel())).reshape(b.shape)
    fw = framework_of(pool)
    cs = np.zeros(N_SCALARS)
    cs[CS_COMM_SCALE] = fw.comm_scale
    cs[CS_PREFILL_SCALE] = fw.prefill_scale
    cs[CS_PREFILL_FLOOR] = model.layers * fw.prefill_host_s_per_layer
    cs[CS_DECODE_SCALE] = fw.decode_scale
    cs[CS_DECODE_OVERHEAD] = fw.decode_overhead_s
    cs[CS_PJ_SCALE] = pj_scale(pool, cp.tables)
    cs[CS_LM_LAST] = 1.0 if lm_head == "last" else 0.0
    cs[CS_LARGE_STEP] = fw.large_step * tp_factor(pool.n)
    ct.setflags(write=False)
    cs.setflags(write=False)
    return ct, cs


KNEE_TOKENS = 2048.0
"""Prompt tokens per step past which the large-step term charges: the largest step at which every
Splitwise prompt time is still linear in tokens (H100 TP8: 1,024 → 2,048 tokens ×1.72, 2,048 →
4,096 ×2.80). The term's form and knee are chosen in docs/accuracy.md."""


@kernel(inline=True)
def past_knee(tokens: float) -> float:
    """The fraction of a prefill step's ``tokens`` past the knee: ``max(0, m − knee) / m``."""
    return max(0.0, tokens - KNEE_TOKENS) / tokens


def tp_factor(tp: int) -> float:
    """How the large-step term grows with the TP degree: ``max(0, log2(TP / 2))`` (0 at TP ≤ 2)."""
    return max(0.0, math.log2(tp / 2.0))


# ------------------------------------------------------------------ the engine's lookup kernels


@kernel(inline=True)
def table_at(ct: np.ndarray, table: int, x: float, y: float) -> float:
    """Seconds from a tabulated part at (x, y) (y = 1 for the 1-D parts): bilinear in log space."""
    fx = math.log2(max(x, 1.0)) * PER_OCTAVE
    ix = min(int(fx), N_GRID - 2)
    wx = fx - ix
    fy = math.log2(max(y, 1.0)) * PER_OCTAVE
    iy = min(int(fy), N_GRID - 2)
    wy = fy - iy
    v = ((1.0 - wx) * (1.0 - wy) * ct[table, ix, iy] + wx * (1.0 - wy) * ct[table, ix + 1, iy]
         + (1.0 - wx) * wy * ct[table, ix, iy + 1] + wx * wy * ct[table, ix + 1, iy + 1])
    return math.exp(v)


@kernel(inline=True)
def calibrated_mixed_step(ct: np.ndarray, cs: np.ndarray, hf: np.ndarray, rows: float, context: float,
                          chunk_tokens: float, chunk_attn: float, chunks: float, last: float, flops: float,
                          nbytes: float) -> tuple[float, float, float]:
    """Time (framework included), compute and memory energy of a step of ``rows`` decode rows
    (contexts summing to ``context``) and ``chunks`` prompt chunks of ``chunk_tokens`` in all,
    Σ c·(2·p0 + c + 1) = ``chunk_attn`` over the p0 tokens before each chunk, ``last`` of them
    ending their prompt (the arguments of :func:`kvcargo.cost.mixed_parts`).

    The GEMMs and all-reduces run over every token of the step; the LM head over the decode rows
    and the prompt tokens (``--lm-head last``: the chunks that end a prompt; none when no row needs
    a token); attention is the chunks' context attention (charged as ``chunks`` prompts of the
    length whose s(s+1) is the mean of ``chunk_attn``: the same query-key pairs) plus the rows'
    generation attention. A step with
    prompt tokens carries the prefill framework (kernel scale, host floor, the large-step term on
    the compute kernels' share of the tokens past the knee), and its decode rows the per-step
    decode overhead (sampling and synchronising on their new tokens), so adding a chunk to a
    decode step never makes it cheaper; a step of decode rows only carries the decode scale and
    overhead. Whole prompts alone or decode rows alone are the plain prefill and decode steps, bit
    for bit.
    """
    tokens = rows + chunk_tokens
    if chunks > 0.0:
        q = chunk_attn / chunks
        s = (math.sqrt(1.0 + 4.0 * q) - 1.0) / 2.0
        logits = rows + (last if cs[CS_LM_LAST] != 0.0 else chunk_tokens)
        compute = table_at(ct, T_TOKENS, tokens, 1.0)
        if logits > 0.0:
            compute = compute + table_at(ct, T_LOGITS, logits, 1.0)
        compute = compute + table_at(ct, T_CONTEXT, chunks, s)
        if rows > 0.0:
            compute = compute + table_at(ct, T_GENERATION, rows, context / rows + 1.0)
        past = past_knee(tokens)
        t = max(cs[CS_PREFILL_FLOOR],
                cs[CS_PREFILL_SCALE] * compute + cs[CS_COMM_SCALE] * table_at(ct, T_REDUCE, tokens, 1.0)
                + cs[CS_LARGE_STEP] * past * compute)
        overhead = cs[CS_DECODE_OVERHEAD] if rows > 0.0 else 0.0
    else:
        t = (cs[CS_DECODE_SCALE] * (table_at(ct, T_TOKENS, tokens, 1.0) + table_at(ct, T_LOGITS, tokens, 1.0)
                                    + table_at(ct, T_GENERATION, rows, context / rows + 1.0))
             + cs[CS_COMM_SCALE] * table_at(ct, T_REDUCE, tokens, 1.0))
        overhead = cs[CS_DECODE_OVERHEAD]
    e_c = flops * hf[HF_J_FLOP] * cs[CS_PJ_SCALE]
    e_m = nbytes * hf[HF_J_BYTE]
    if (e_c + e_m) / t > hf[HF_PDYN]:
        t = (e_c + e_m) / hf[HF_PDYN]
    return t + overhead, e_c, e_m


@kernel(inline=True)
def calibrated_step(ct: np.ndarray, cs: np.ndarray, hf: np.ndarray, prefill: bool, tokens: float,
                    seqs: float, quad: float, context: float, flops: float,
                    nbytes: float) -> tuple[float, float, float]:
    """Time (framework included), compute and memory energy of one step under the calibrated model.

    Prefill: ``tokens`` over ``seqs`` whole prompts with Σ s(s+1) = ``quad``. Decode: ``seqs``
    sequences (= tokens) whose contexts sum to ``context``. (:func:`calibrated_mixed_step`.)
    """
    if prefill:
        return calibrated_mixed_step(ct, cs, hf, 0.0, 0.0, tokens, quad, seqs, seqs, flops, nbytes)
    return calibrated_mixed_step(ct, cs, hf, seqs, context, 0.0, 0.0, 0.0, 0.0, flops, nbytes)
