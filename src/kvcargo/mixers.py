"""FFT-mixing models: Hyena-2, the 1:3 attention/Hyena hybrid, block-circulant weights
(levers-mixers §1).

A Hyena layer replaces attention by N = 2 long convolutions evaluated with FFTs at prefill
(Poli et al. 2023, arXiv:2302.10866). What it hands to decode is either a per-token cache of
the convolution inputs (direct decode) or, distilled into a recurrence (Massaroli et al. 2023,
arXiv:2310.18780), a constant state per sequence. Block-circulant matrices (Ding et al. 2017,
arXiv:1708.08917) turn the weight products into FFTs too.

This module holds the closed forms: parameter counts, cache and state bytes, and the op ledger
of a step (dense, attention, transform, spectral, other FLOPs). Every count is an exact integer.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from kvcargo.catalog import Model

HYENA_ORDER = 2
"""N: long convolutions per Hyena layer (N + 1 input projections)."""
SHORT_CONV_TAPS = 3
"""Taps of the short depthwise convolution on the projections."""
HYBRID_PERIOD = 4
"""Hybrid: layer i is an attention layer iff i mod 4 = 0."""
DISTILLED_STATE = 16
"""Distilled decode: state values per channel and convolution."""
STATE_VALUE_BYTES = 4
"""A distilled state value is complex, 2 × 2 bytes."""


def is_fft_mixing(model: Model) -> bool:
    """Whether the model mixes tokens with FFT long convolutions (Hyena or hybrid)."""
    return model.mixer != "attention"


def fft_cost(f: int) -> int:
    """R(f) = 2.5 · f · log2(f), FLOPs of one complex FFT of power-of-two length f (exact)."""
    return 5 * f * (f.bit_length() - 1) // 2


def padded_length(prompt: int) -> int:
    """pow2(2s): the FFT length of a causal convolution over s tokens (no wrap-around)."""
    return 1 << max(0, (2 * prompt - 1).bit_length())


@dataclass(frozen=True)
class Ledger:
    """FLOPs of a step by class (levers-mixers §1.4)."""

    dense: int = 0
    attention: int = 0
    transform: int = 0
    spectral: int = 0
    other: int = 0

    def __add__(self, o: Ledger) -> Ledger:
        return Ledger(self.dense + o.dense, self.attention + o.attention, self.transform + o.transform,
                      self.spectral + o.spectral, self.other + o.other)

    def times(self, t: int) -> Ledger:
        return Ledger(self.dense * t, self.attention * t, self.transform * t, self.spectral * t, self.other * t)

    @property
    def optical(self) -> int:
        """What a transform engine can take: transforms and Fourier-domain products."""
        return self.transform + self.spectral

    @property
    def digital(self) -> int:
        return self.dense + self.attention + self.other

    @property
    def total(self) -> int:
        return self.digital + self.optical


@dataclass(frozen=True)
class Mixing:
    """Derived figures of an FFT-mixing model."""

    model: Model
    attention_layers: int
    hyena_layers: int
    p_att: int
    """Parameters of one attention layer (attention block + MLP)."""
    p_hy: int
    """Parameters of one Hyena layer (five weight matrices)."""
    kv_per_token: int
    """Cache bytes per token: attention K/V plus the Hyena layers' N cached inputs (direct)."""
    state_bytes: int
    """Distilled: the constant state of one sequence (0 for direct decode)."""
    per_token: Ledger
    """Prefill FLOPs per token, without the LM head and the per-prompt long convolutions."""
    decode_per_seq: Ledger
    """Decode FLOPs per sequence without the context term and the LM head."""
    decode_per_context: int
    """Decode FLOPs per cached token (+1 per sequence): attention and direct convolution."""
    conversions_per_token: int
    """Optical engine: sample pairs per prompt token and pass (levers-mixers §3.3)."""
    circulant_mask: int
    """Optical engine: mask values of the block-circulant weight spectra per forward pass."""

    @property
    def spectrum_values(self) -> int:
        """Complex filter-spectrum values per (f/2 + 1) of a padded length: L_hy · N · d."""
        return self.hyena_layers * HYENA_ORDER * self.model.d_model

    def prompt_ledger(self, prompt: int) -> Ledger:
        """The long convolutions of one prompt of s tokens: an FFT of each input and filter
        product per channel, the inverse FFT (f = pow2(2s))."""
        f = padded_length(prompt)
        per = self.spectrum_values
        return Ledger(transform=per * 2 * fft_cost(f), spectral=per * (f // 2 + 1) * 6)


def matrices(model: Model) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(rows, columns) of the weight matrices of a Hyena layer and of every layer's MLP."""
    d, ff = model.d_model, model.d_ff
    mlp = [(ff, d), (ff, d), (d, ff)]
    return [((HYENA_ORDER + 1) * d, d), (d, d), *mlp], mlp


def matmul(model: Model, m: int, c: int) -> Ledger:
    """FLOPs of a weight matrix (m, c) applied to one token: dense, or block-circulant with
    block k (FFT each input block, multiply by the block spectra, accumulate, inverse FFT)."""
    k = model.circulant_block
    if not k:
        return Ledger(dense=2 * m * c)
    bins = k // 2 + 1
    mb, cb = m // k, c // k
    return Ledger(transform=cb * fft_cost(k) + mb * fft_cost(k), spectral=mb * cb * bins * 6,
                  other=mb * (cb - 1) * bins * 2)


def weights(model: Model, mats: list[tuple[int, int]]) -> int:
    k = model.circulant_block
    return sum(m * c // k if k else m * c for m, c in mats)


@cache
def mixing(model: Model) -> Mixing:
    """Parameter counts, cache bytes and the per-token op ledger of an FFT-mixing model."""
    d, N = model.d_model, HYENA_ORDER
    kv = model.kv_heads * model.head_dim
    if model.mixer == "hybrid":
        n_att = sum(1 for i in range(model.layers) if i % HYBRID_PERIOD == 0)
    else:
        n_att = 0
    n_hy = model.layers - n_att
    hyena_mats, mlp = matrices(model)
    att_proj = 2 * d * d + 2 * d * kv
    p_att = att_proj + weights(model, mlp)
    p_hy = weights(model, hyena_mats)
    mlp_ops = sum((matmul(model, m, c) for m, c in mlp), Ledger())
    hy_ops = sum((matmul(model, m, c) for m, c in hyena_mats), Ledger())
    att_layer = Ledger(dense=2 * att_proj) + mlp_ops
    short_conv = Ledger(other=2 * SHORT_CONV_TAPS * (N + 1) * d + N * d)
    per_token = att_layer.times(n_att) + (hy_ops + short_conv).times(n_hy)
    distilled = model.hyena_decode == "distilled"
    recurrence = Ledger(other=N * d * 8 * DISTILLED_STATE) if distilled else Ledger()
    decode_per_seq = att_layer.times(n_att) + (hy_ops + recurrence).times(n_hy)
    decode_per_context = 4 * d * n_att + (0 if distilled else N * d * 2 * n_hy)
    cache_values = 2 * n_att * kv + (0 if distilled else n_hy * N * d)
    k = model.circulant_block
    cp = n_hy * (N * d + (sum(max(m, c) for m, c in hyena_mats) if k else 0))
    circ_mask = n_hy * sum((m // k) * (c // k) * (k // 2 + 1) for m, c in hyena_mats) if k else 0
    return Mixing(
        model=model, attention_layers=n_att, hyena_layers=n_hy, p_att=p_att, p_hy=p_hy,
        kv_per_token=int(cache_values * model.kv_bytes),
        state_bytes=n_hy * N * d * DISTILLED_STATE * STATE_VALUE_BYTES if distilled else 0,
        per_token=per_token, decode_per_seq=decode_per_seq, decode_per_context=decode_per_context,
        conversions_per_token=cp, circulant_mask=circ_mask,
    )


def prefill_ledger(model: Model, prompts: list[int], lm_head: str = "all") -> Ledger:
    """FLOPs of one prefill step over whole prompts, by class (levers-mixers §1.4)."""
    mx = mixing(model)
    T = sum(prompts)
    led = mx.per_token.times(T)
    led += Ledger(attention=2 * model.d_model * mx.attention_layers * sum(s * (s + 1) for s in prompts))
    for s in prompts:
        led += mx.prompt_ledger(s)
    heads = T if lm_head == "all" else len(prompts)
    return led + Ledger(dense=2 * model.vocab * model.d_model * heads)


def decode_ledger(model: Model, batch: int, context: int) -> Ledger:
    """FLOPs of one decode step: ``batch`` sequences whose cached contexts sum to ``context``."""
    mx = mixing(model)
    led = mx.decode_per_seq.times(batch) + Ledger(dense=2 * model.vocab * model.d_model * batch)
    ctx = mx.decode_per_context * (context + batch)
    if mx.attention_layers:
        att = 4 * model.d_model * mx.attention_layers * (context + batch)
        return led + Ledger(attention=att, other=ctx - att)
    return led + Ledger(other=ctx)


def spectra_sum(prompts: list[int]) -> int:
    """Σ (f/2 + 1) over the distinct padded lengths of a batch (filter spectra, mask values)."""
    return sum(f // 2 + 1 for f in {padded_length(s) for s in prompts})
