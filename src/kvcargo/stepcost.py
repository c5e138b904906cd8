"""Step-cost classes: the transformer of the reference, FFT-mixing models, causal encoder-decoders.

The event engine asks two kernels for a step's cost, :func:`prefill_cost` and
:func:`decode_cost`; they dispatch on the model's class (packed in ``xi``) and return time,
charged FLOPs and bytes, compute, memory and conversion energy, the FLOPs an optical engine
took, and whether the engine bound the step. The transformer class calls the reference
kernels of :mod:`kvcargo.cost` unchanged, so default runs are bit-identical.

Packing (:func:`model_extension`, :func:`engine_coefficients`) turns the closed forms of
:mod:`kvcargo.mixers`, :mod:`kvcargo.ced` and :mod:`kvcargo.optical` into exact integer
coefficients; per request the engine carries three more integers (:func:`request_terms`):
a FLOP term of the prompt alone, a replay length and the bit of its padded FFT length (the set
of distinct lengths of a batch is the OR of those bits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvcargo import ced, cost, mixers, optical
from kvcargo._jit import kernel
from kvcargo.catalog import Model
from kvcargo.cost import HF_OVERHEAD, LmHead, Pool, StepCost

if TYPE_CHECKING:
    import numpy as np

ATTENTION, FFT_MIXING, CED = 0, 1, 2

# ``xi``: exact integer coefficients of a model beyond the transformer's.
(XI_CLASS, XI_LM_LAST, XI_TWO_VD, XI_DIG_T, XI_OPT_T, XI_ATT_Q, XI_SPECTRUM, XI_CIRC_MASK, XI_CONV_T,
 XI_DEC_B, XI_DEC_C, XI_DEC_OPT_B, XI_TWO_PPROMPT, XI_ENC_Q, XI_REPLAY_T, XI_TWO_PLAYERS, XI_TWO_PMM,
 XI_FOUR_LD, XI_ENCODER_ONLY) = range(19)
# ``xf``: byte coefficients and the FFT efficiency of digital FFT work.
XF_W_STR, XF_ROW, XF_KV_TOK, XF_STATE, XF_W_ENC, XF_FFT_EFF = range(6)
# ``eo``: per pool (row 0 prefill, 1 decode), its optical transform engine (EO_ON = 0: none).
EO_ON, EO_PASSES, EO_SAMPLES, EO_MASK_VALUES, EO_MASK_RATE, EO_PJ_PAIR, EO_OVERLAP, EO_CONV_T = range(8)

_prefill_work = kernel(cost.prefill_work, inline=True)
_decode_work = kernel(cost.decode_work, inline=True)
_roofline = kernel(cost.roofline, inline=True)


def step_class(model: Model) -> int:
    if mixers.is_fft_mixing(model):
        return FFT_MIXING
    return CED if ced.is_ced(model) else ATTENTION


def model_extension(model: Model, lm_head: LmHead = "all", fft_efficiency: float | None = None,
                    encoder_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Pack a model's step class into the (int64, float64) arrays the kernels read.

    ``encoder_only``: the prefill pool runs only the encoder (CED with the replay on decode).
    """
    import numpy as np

    s = cost.shape(model)
    d, L = model.d_model, model.layers
    xi = np.zeros(19, dtype=np.int64)
    xf = np.zeros(6, dtype=np.float64)
    xi[XI_CLASS] = step_class(model)
    xi[XI_LM_LAST] = int(lm_head == "last")
    xi[XI_TWO_VD] = 2 * model.vocab * d
    xi[XI_TWO_PMM] = 2 * s.p_mm
    xi[XI_FOUR_LD] = 4 * L * d
    xi[XI_TWO_PLAYERS] = 2 * s.p_layers
    xf[XF_W_STR], xf[XF_ROW], xf[XF_KV_TOK] = s.w_str, s.row_bytes, float(s.kv_per_token)
    xf[XF_STATE] = float(s.state_bytes)
    xf[XF_FFT_EFF] = 1.0 if fft_efficiency is None else fft_efficiency
    if xi[XI_CLASS] == FFT_MIXING:
        mx = mixers.mixing(model)
        xi[XI_DIG_T], xi[XI_OPT_T] = mx.per_token.digital, mx.per_token.optical
        xi[XI_ATT_Q] = 2 * d * mx.attention_layers
        xi[XI_SPECTRUM], xi[XI_CIRC_MASK] = mx.spectrum_values, mx.circulant_mask
        xi[XI_CONV_T] = mx.conversions_per_token
        xi[XI_DEC_B] = mx.decode_per_seq.digital + 2 * model.vocab * d
        xi[XI_DEC_C] = mx.decode_per_context
        xi[XI_DEC_OPT_B] = mx.decode_per_seq.optical
    elif xi[XI_CLASS] == CED:
        sp = ced.split(model)
        xi[XI_TWO_PPROMPT] = 2 * sp.p_prompt
        xi[XI_ENC_Q] = 2 * sp.encoder * d
        xi[XI_REPLAY_T] = 2 * sp.decoder * sp.p_att
        xi[XI_ENCODER_ONLY] = int(encoder_only)
        xf[XF_W_ENC] = sp.p_prompt * model.weight_bytes  # encoder and K/V projections streamed
    xi.setflags(write=False)
    xf.setflags(write=False)
    return xi, xf


def engine_coefficients(pool: Pool, model: Model) -> np.ndarray:
    """A pool's transform engine packed for the kernels (all zero without one, or for a model
    that gives it nothing to do)."""
    import numpy as np

    eo = np.zeros(8, dtype=np.float64)
    e = pool.device.ft_engine
    if e is not None and mixers.is_fft_mixing(model):
        eo[EO_ON] = 1.0
        eo[EO_PASSES] = optical.passes(e)
        eo[EO_SAMPLES] = e.samples_per_s
        eo[EO_MASK_VALUES] = e.mask_values
        eo[EO_MASK_RATE] = e.mask_rate_hz
        eo[EO_PJ_PAIR] = optical.pj_per_pair(e)
        eo[EO_OVERLAP] = float(e.overlap)
        eo[EO_CONV_T] = mixers.mixing(model).conversions_per_token * optical.passes(e)
    eo.setflags(write=False)
    return eo


def request_terms(model: Model, prompt: np.ndarray) -> np.ndarray:
    """Per request (columns): the prompt's own FLOP term, its replay length, the bit of its padded
    FFT length. FFT-mixing: the long convolutions of the prompt; CED: the replay attention over
    the decoder layers (replay on prefill) or over every layer (replay in the decode step)."""
    import numpy as np

    out = np.zeros((len(prompt), 3), dtype=np.int64)
    cls = step_class(model)
    if cls == FFT_MIXING:
        mx = mixers.mixing(model)
        for i, s in enumerate(prompt.tolist()):
            out[i, 0] = mx.prompt_ledger(s).optical
            out[i, 2] = mixers.padded_length(s)
    elif cls == CED:
        layers = model.layers if ced.replay_on_decode(model) else ced.split(model).decoder
        w = np.minimum(prompt, model.ced_replay)
        out[:, 0] = [ced.replay_attention(layers, model.d_model, s, x) for s, x in zip(prompt.tolist(), w.tolist())]
        out[:, 1] = w
    return out


@kernel(inline=True)
def _effective(digital, optical_flops, x):
    """FLOPs of digital FFT work at a fraction x of the matmul rate (x = 1: the total)."""
    if x == 1.0:
        return float(digital + optical_flops)
    return digital + optical_flops / x


@kernel(inline=True)
def _spectra(mask):
    """Σ (f/2 + 1) over the distinct padded lengths whose bits are set in ``mask``."""
    count = 0
    m = mask
    while m:
        m &= m - 1
        count += 1
    return (mask >> 1) + count


@kernel(inline=True)
def _fft_prefill(xi, xf, hf, ehf, eo, tokens, quad, n, xflops, xmask):
    heads = n if xi[XI_LM_LAST] else tokens
    digital = xi[XI_DIG_T] * tokens + xi[XI_ATT_Q] * quad + xi[XI_TWO_VD] * heads
    opt = xi[XI_OPT_T] * tokens + xflops
    nbytes = xf[XF_W_STR] + tokens * xf[XF_ROW] + tokens * xf[XF_KV_TOK] + n * xf[XF_STATE]
    spectra = _spectra(xmask)
    if eo[EO_ON] == 0.0:
        nbytes = nbytes + 4 * xi[XI_SPECTRUM] * spectra
        flops = _effective(digital, opt, xf[XF_FFT_EFF])
        dt, e_c, e_m = _roofline(hf, flops, nbytes)
        return dt, flops, nbytes, e_c, e_m, 0.0, 0.0, False
    conv = eo[EO_CONV_T] * tokens  # sample pairs: exact below 2^53, no integer overflow at any ENOB
    mask_values = int(eo[EO_MASK_VALUES])
    rewrites = -(-(xi[XI_SPECTRUM] * spectra + xi[XI_CIRC_MASK]) // mask_values)
    t_opt = conv / eo[EO_SAMPLES] + rewrites / eo[EO_MASK_RATE]
    t_dig, e_c, e_m = _roofline(ehf, float(digital), nbytes)
    if eo[EO_OVERLAP] != 0.0:
        dt = max(t_dig, t_opt) + hf[HF_OVERHEAD]
    else:
        dt = (t_dig + t_opt) + hf[HF_OVERHEAD]
    e_o = (conv * eo[EO_PJ_PAIR]) * 1e-12
    return dt, float(digital), nbytes, e_c, e_m, e_o, float(opt), t_opt > t_dig


@kernel(inline=True)
def _ced_prefill(xi, xf, hf, tokens, quad, n, xflops, xtok):
    flops = xi[XI_TWO_PPROMPT] * tokens + xi[XI_ENC_Q] * quad
    kv = tokens * xf[XF_KV_TOK]
    if xi[XI_ENCODER_ONLY]:
        nbytes = xf[XF_W_ENC] + tokens * xf[XF_ROW] + kv
    else:
        flops += xi[XI_REPLAY_T] * xtok + xflops + xi[XI_TWO_VD] * (n if xi[XI_LM_LAST] else xtok)
        nbytes = xf[XF_W_STR] + tokens * xf[XF_ROW] + kv
    dt, e_c, e_m = _roofline(hf, float(flops), nbytes)
    return dt, float(flops), nbytes, e_c, e_m, 0.0, 0.0, False


@kernel(inline=True)
def prefill_cost(mi, mf, xi, xf, hf, ehf, eo, tokens, quad, n, xflops, xtok, xmask):
    """One prefill step over ``n`` prompts: ``tokens`` = Σ s, ``quad`` = Σ s(s+1), and the
    batch's sums of the per-request terms (``xmask``: their OR). Returns (time, FLOPs, bytes,
    compute J, memory J, conversion J, engine FLOPs, engine-bound)."""
    cls = xi[XI_CLASS]
    if cls == FFT_MIXING:
        return _fft_prefill(xi, xf, hf, ehf, eo, tokens, quad, n, xflops, xmask)
    if cls == CED:
        return _ced_prefill(xi, xf, hf, tokens, quad, n, xflops, xtok)
    flops, nbytes = _prefill_work(mi, mf, tokens, quad, n)
    dt, e_c, e_m = _roofline(hf, flops, nbytes)
    return dt, float(flops), nbytes, e_c, e_m, 0.0, 0.0, False


@kernel(inline=True)
def decode_cost(mi, mf, xi, xf, hf, batch, context, rn, rt, ra, rs):
    """One decode step: ``batch`` decode rows whose contexts sum to ``context``, plus ``rn`` CED
    replay rows (replay tokens ``rt``, their attention FLOPs ``ra``, prompt tokens ``rs``).
    Returns (time, FLOPs, bytes, compute J, memory J)."""
    cls = xi[XI_CLASS]
    if cls == FFT_MIXING:
        digital = xi[XI_DEC_B] * batch + xi[XI_DEC_C] * (context + batch)
        flops = _effective(digital, xi[XI_DEC_OPT_B] * batch, xf[XF_FFT_EFF])
        nbytes = xf[XF_W_STR] + batch * xf[XF_ROW] + (context + batch) * xf[XF_KV_TOK] + batch * xf[XF_STATE]
    elif cls == CED and rn > 0:
        flops = float(xi[XI_TWO_PMM] * batch + xi[XI_FOUR_LD] * (context + batch) + xi[XI_TWO_PLAYERS] * rt
                      + xi[XI_TWO_VD] * (rn if xi[XI_LM_LAST] else rt) + ra)
        nbytes = (xf[XF_W_STR] + (batch + rt) * xf[XF_ROW] + (context + batch) * xf[XF_KV_TOK]
                  + rs * xf[XF_KV_TOK])
    else:
        f, nbytes = _decode_work(mi, mf, batch, context)
        flops = float(f)
    dt, e_c, e_m = _roofline(hf, flops, nbytes)
    return dt, flops, nbytes, e_c, e_m


# ------------------------------------------------------------ readable steps (calculator, tests)


@dataclass(frozen=True)
class MixerStep(StepCost):
    """A step of any class; ``conversion_j`` and ``optical_flops`` are the engine's share."""

    conversion_j: float = 0.0
    optical_flops: float = 0.0

    @property
    def energy_j(self) -> float:
        return self.compute_j + self.memory_j + self.conversion_j


def _bound(pool: Pool, flops: float, nbytes: float, t: float, engine_bound: bool) -> str:
    return "optical" if engine_bound else cost.step_bound(pool, flops, nbytes, t)


def _no_overhead(pool: Pool) -> np.ndarray:
    hf = pool.coefficients().copy()
    hf[HF_OVERHEAD] = 0.0
    return hf


def prefill_step(model: Model, pool: Pool, prompts: list[int], lm_head: LmHead = "all",
                 fft_efficiency: float | None = None, encoder_only: bool = False) -> MixerStep:
    """Cost of one prefill step of any step class over whole prompts."""
    import numpy as np

    mi, mf = cost.model_coefficients(model, lm_head)
    xi, xf = model_extension(model, lm_head, fft_efficiency, encoder_only)
    p = np.asarray(prompts, dtype=np.int64)
    terms = request_terms(model, p)
    mask = 0
    for f in terms[:, 2].tolist():
        mask |= f
    tokens, quad = int(p.sum()), int((p * (p + 1)).sum())
    out = prefill_cost(mi, mf, xi, xf, pool.coefficients(), _no_overhead(pool), engine_coefficients(pool, model),
                       tokens, quad, len(prompts), int(terms[:, 0].sum()), int(terms[:, 1].sum()), mask)
    dt, flops, nbytes, e_c, e_m, e_o, opt, engine_bound = out
    t_digital = dt  # an engine step's digital part is judged on its own time
    if engine_coefficients(pool, model)[EO_ON]:
        t_digital = _roofline(_no_overhead(pool), flops, nbytes)[0] + cost.STEP_OVERHEAD_S
    return MixerStep(flops, float(nbytes), float(dt), float(e_c), float(e_m),
                     _bound(pool, flops, nbytes, t_digital, bool(engine_bound)), float(e_o), float(opt))


def decode_step(model: Model, pool: Pool, batch: int, context: int, replays: list[int] = (),
                fft_efficiency: float | None = None, lm_head: LmHead = "all") -> MixerStep:
    """Cost of one decode step (``context``: Σ cached tokens), with CED replay rows if given."""
    mi, mf = cost.model_coefficients(model)
    xi, xf = model_extension(model, lm_head, fft_efficiency)
    w = [ced.replay_length(model, s) for s in replays]
    ra = sum(ced.replay_attention(model.layers, model.d_model, s, x) for s, x in zip(replays, w))
    dt, flops, nbytes, e_c, e_m = decode_cost(mi, mf, xi, xf, pool.coefficients(), batch, context, len(w),
                                              sum(w), ra, sum(replays))
    return MixerStep(flops, float(nbytes), float(dt), float(e_c), float(e_m), _bound(pool, flops, nbytes, dt, False))
