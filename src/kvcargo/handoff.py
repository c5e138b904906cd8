"""The hand-off physics: bytes, compression, transfer time and energy of moving a KV cache.

Two users share these formulas:

* the calculator (:func:`calculate`), the chapter's closed forms for one prompt — hand-off bytes
  S, wire bytes S/ρ, transfer ℓ + S/(ρB), the time left exposed after prefill (whole or
  layer-wise) and the rate ρB/S at which hand-offs alone fill the link;
* the simulator, which asks :func:`transfers` for every request's link time, wire bytes and
  energy, and :func:`endpoint_work` for the GPU work of compressing at the endpoint
  (reference-semantics §4–§5). Both work elementwise on numpy arrays.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

from kvcargo.catalog import Catalog, Codec, Link, Model
from kvcargo.cost import Pool, model_coefficients, prefill_step, require_fit, shape
from kvcargo.errors import KvcargoError
from kvcargo.formats import is_default, require_units, with_formats
from kvcargo.limits import check_ranges, max_step_tokens, step_token_error
from kvcargo.speculative import draft_prefill_time, make_draft

Placement = Literal["transit", "endpoint"]
SendMode = Literal["whole", "layerwise"]

TRANSIT_OPS_PER_BYTE = 1.6
"""In-transit compute budget: operations per byte the link carries (§5)."""
TRANSIT_PJ_PER_BIT = 1.0
"""In-transit stage energy per *input* bit."""
TRANSIT_LATENCY_S = 1e-6
"""Latency the in-transit stage adds to every transfer."""


@dataclass(frozen=True)
class Compression:
    """A compression stage on the hand-off: a codec and where it runs.

    ``transit``: in the link (budget tied to line rate, 1 µs, 1 pJ per input bit, no GPU cost).
    ``endpoint``: an extra elementwise pass on the prefill GPU before sending. Either way a codec
    with a decode cost charges it to the decode instance's first step of the request.
    """

    codec: Codec
    at: Placement = "transit"
    keep: float | None = None
    """freq-keep-k: fraction of coefficients kept (ratio 1/keep)."""
    given_ratio: float | None = None
    """The ``ratio`` codec: the wire ratio the user measured."""
    ops_per_byte: float = TRANSIT_OPS_PER_BYTE
    """In transit: the stage's compute budget, operations per line byte."""
    pj_per_bit: float = TRANSIT_PJ_PER_BIT
    """In transit: the stage's energy per input bit."""

    def __post_init__(self) -> None:
        if not self.ops_per_byte > 0:
            raise KvcargoError(f"--transit-ops-per-byte must be > 0, got {self.ops_per_byte:g}")
        if self.at not in ("transit", "endpoint"):
            raise KvcargoError(f"unknown placement {self.at!r}; valid choices: endpoint, transit")
        if self.keep is not None:
            if not self.codec.keep_adjustable:
                raise KvcargoError(f"--kv-keep applies only to freq-keep-k, not {self.codec.key!r}")
            if not 0 < self.keep <= 1:
                raise KvcargoError(f"--kv-keep must be in (0, 1], got {self.keep:g}")
        if self.given_ratio is not None:
            if self.codec.kind != "ratio":
                raise KvcargoError(f"--kv-ratio applies only to a 'ratio' codec, not {self.codec.key!r}")
            if not self.given_ratio >= 1:
                raise KvcargoError(f"--kv-ratio must be >= 1, got {self.given_ratio:g}")

    @property
    def ratio(self) -> float:
        """Bytes in / bytes on the wire (for KIVI: of the quantised part; see :meth:`wire_bytes`)."""
        if self.keep is not None:
            return 1.0 / self.keep
        if self.given_ratio is not None:
            return self.given_ratio
        if self.codec.kind == "kivi":
            c = self.codec
            return 16 / (c.bits + 32 / c.group)
        return self.codec.ratio

    @property
    def is_identity(self) -> bool:
        """A codec that changes nothing (``none``): at the endpoint it is no stage at all."""
        return (self.codec.kind == "fixed" and self.ratio == 1.0 and self.codec.ops_per_value == 0
                and self.codec.decode_ops_per_value == 0 and not self.codec.fft)

    def wire_bytes(self, nbytes: np.ndarray, prompt: np.ndarray, kv_value_bytes: float) -> np.ndarray:
        """Bytes on the wire for hand-offs of ``nbytes`` (prompts of ``prompt`` tokens).

        KIVI keeps the most recent ``residual`` tokens in full precision and quantises the rest
        to ``bits`` bits per value plus an FP16 scale and zero point per group of ``group``.
        """
        n = np.asarray(nbytes, dtype=np.float64)
        if self.codec.kind != "kivi":
            return n / self.ratio
        c = self.codec
        p = np.asarray(prompt, dtype=np.float64)
        recent = np.minimum(p, c.residual) / p
        return n * ((1 - recent) * (c.bits + 32 / c.group) / (8 * kv_value_bytes) + recent)

    def decode_work(self, nbytes: np.ndarray, wire: np.ndarray, kv_value_bytes: float) -> tuple[np.ndarray, np.ndarray]:
        """(ops, bytes) of decompressing on the decode GPU: read the wire copy, write BF16."""
        n = np.asarray(nbytes, dtype=np.float64)
        return self.codec.decode_ops_per_value * (n / kv_value_bytes), wire + n


def fft_ops_per_value(prompt: np.ndarray) -> np.ndarray:
    """FFT work along the tokens per value: 2·R(n)/n, R(n) = 2.5·n·log2(n), n = next 2^k ≥ s."""
    prompt = np.asarray(prompt, dtype=np.int64)
    log2n = np.array([max(0, int(s - 1).bit_length()) for s in prompt.tolist()], dtype=np.int64)
    n = (np.int64(1) << log2n).astype(np.float64)
    return 2 * (2.5 * n * log2n) / n


@dataclass(frozen=True)
class Transfers:
    """Per-request link figures (arrays aligned with the requests)."""

    duration: np.ndarray
    """Seconds a whole hand-off holds a link channel."""
    wire_bytes: np.ndarray
    link_j: np.ndarray
    transit_j: np.ndarray
    transit_bound: np.ndarray
    """True where the in-transit stage's compute, not the wire, set the duration."""
    slice_time: np.ndarray
    """Layer-wise streaming: seconds each of the ``groups`` slices holds a channel."""
    last_extra: np.ndarray
    """Layer-wise streaming: latency the last slice adds (the link's, and the stage's)."""


def transfers(link: Link, compression: Compression | None, nbytes: np.ndarray, kv_value_bytes: float,
              prompt: np.ndarray | None = None, groups: int = 1) -> Transfers:
    """Link time, wire bytes and energy of hand-offs of ``nbytes`` each (§4, §5).

    Whole: ``latency + bytes/bandwidth`` (in transit also 1 µs + the larger of wire and compute
    time). Sliced in ``groups``: each slice takes its share of the wire (or compute) time and the
    latencies are paid once, by the last slice.
    """
    n = np.asarray(nbytes, dtype=np.float64)
    zeros = np.zeros_like(n)
    latency = link.latency
    wire = n if compression is None else compression.wire_bytes(n, n if prompt is None else prompt, kv_value_bytes)
    t_wire = wire / link.bandwidth
    if compression is None or compression.at == "endpoint":
        t_ops, transit_j = zeros, zeros
        duration = link.latency + t_wire
    else:
        t_ops = (compression.codec.ops_per_value * (n / kv_value_bytes)) / (compression.ops_per_byte * link.bandwidth)
        duration = link.latency + TRANSIT_LATENCY_S + np.maximum(t_wire, t_ops)
        transit_j = n * 8 * compression.pj_per_bit * 1e-12
        latency = link.latency + TRANSIT_LATENCY_S
    slice_time = np.maximum(t_wire, t_ops) / groups
    return Transfers(duration, wire, wire * 8 * link.pj_per_bit * 1e-12, transit_j, t_ops > t_wire,
                     slice_time, latency + zeros)


def endpoint_work(compression: Compression, nbytes: np.ndarray, prompt: np.ndarray,
                  kv_value_bytes: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-request (ops, bytes) of compressing on the prefill GPU: read the KV, write the copy."""
    n = np.asarray(nbytes, dtype=np.float64)
    per_value = compression.codec.ops_per_value + (
        fft_ops_per_value(prompt) if compression.codec.fft else 0.0)
    return per_value * (n / kv_value_bytes), n + compression.wire_bytes(n, prompt, kv_value_bytes)


# ---------------------------------------------------------------------------- the calculator


@dataclass(frozen=True)
class HandoffResult:
    """The chapter's panel for one prompt (SI units: bytes, seconds, requests per second)."""

    model: str
    prompt_tokens: int
    link: str
    codec: str
    send: str
    device: str
    devices_per_instance: int
    kv_bytes_per_token: int
    kv_bytes: int
    """What crosses: the prompt's KV in its storage format (and a speculative draft's)."""
    wire_bytes: float
    ratio: float
    bandwidth: float
    latency_s: float
    transfer_s: float
    prefill_s: float
    exposed_s: float
    link_full_rps: float
    draft_kv_bytes_per_token: int = 0
    """A speculative draft's KV per token: its prompt KV crosses with the target's."""

    def as_dict(self) -> dict:
        return asdict(self)


def exposed_after_prefill(latency: float, wire_s: float, prefill_s: float, layers: int, send: SendMode) -> float:
    """Transfer time still left when the prefill ends.

    Whole: the whole transfer. Layer-wise (each of L layers takes T_p/L and its slice T'x/L):
    ``ℓ + max(T'x/L, T'x − (L−1)/L·T_p)``.
    """
    if send == "whole":
        return latency + wire_s
    if send != "layerwise":
        raise KvcargoError(f"unknown send mode {send!r}; valid choices: layerwise, whole")
    return latency + max(wire_s / layers, wire_s - (prefill_s * (layers - 1)) / layers)


def calculate(model: Model, prompt: int, link: Link, pool: Pool, compression: Compression | None = None,
              send: SendMode = "whole", draft: Model | None = None) -> HandoffResult:
    """Hand-off size, wire bytes, transfer, prefill, exposed time and link saturation rate.

    With a speculative ``draft``, its prompt KV crosses too and its prefill follows the target's."""
    if not isinstance(prompt, int) or isinstance(prompt, bool) or prompt <= 0:
        raise KvcargoError(f"prompt must be a positive whole number of tokens, got {prompt!r}")
    limit = max_step_tokens(model_coefficients(model)[0])
    if prompt > limit:
        raise step_token_error(model.key, "--prompt", prompt, limit)
    require_fit(model, pool, "prefill")
    s = shape(model)
    draft_kv = shape(draft).kv_per_token if draft is not None else 0
    kv = s.handoff_bytes(prompt) + prompt * draft_kv
    ratio = compression.ratio if compression else 1.0
    wire = kv / ratio
    if compression is not None and compression.codec.kind == "kivi":  # the ratio depends on the prompt
        wire = float(compression.wire_bytes(np.array([kv]), np.array([prompt]), model.kv_bytes)[0])
        ratio = kv / wire
    wire_s = wire / link.bandwidth
    prefill_s = prefill_step(model, pool, [prompt]).time
    if draft is not None:
        prefill_s += draft_prefill_time(draft, pool, [prompt])
    return HandoffResult(
        model=model.key,
        prompt_tokens=prompt,
        link=link.key,
        codec=compression.codec.key if compression else "none",
        send=send,
        device=pool.device.key,
        devices_per_instance=pool.n,
        kv_bytes_per_token=s.kv_per_token,
        kv_bytes=kv,
        wire_bytes=wire,
        ratio=ratio,
        bandwidth=link.bandwidth,
        latency_s=link.latency,
        transfer_s=link.latency + wire_s,
        prefill_s=prefill_s,
        exposed_s=exposed_after_prefill(link.latency, wire_s, prefill_s, model.layers, send),
        link_full_rps=link.bandwidth * ratio / kv if kv else math.inf,
        draft_kv_bytes_per_token=draft_kv,
    )


def calculate_keys(cat: Catalog, model: str, prompt: int, link: str, kv_compress: str | None = None,
                   kv_keep: float | None = None, kv_ratio: float | None = None, send: SendMode = "whole",
                   device: str = "h100", devices_per_instance: int = 1, weight_format: str | None = None,
                   kv_format: str | None = None, compute_format: str | None = None,
                   speculative: str | None = None) -> tuple[HandoffResult, Model, Link, Pool]:
    """The calculator from catalog keys (what the CLI and the web API take): the result and the
    model (in its storage formats), link and prefill pool it was computed for. Unset formats
    are BF16."""
    if kv_compress is None and (kv_keep is not None or kv_ratio is not None):
        raise KvcargoError(f"--kv-{'keep' if kv_keep is not None else 'ratio'} needs a codec: add --kv-compress "
                           f"{'freq-keep-k' if kv_keep is not None else 'ratio'}")
    check_ranges({"kv_keep": kv_keep, "kv_ratio": kv_ratio, "devices_per_instance": devices_per_instance})
    weight_format, kv_format, compute_format = (f or "bf16" for f in (weight_format, kv_format, compute_format))
    if compute_format not in ("bf16", weight_format):
        raise KvcargoError("--compute-format must be bf16 (weight-only) or the weight format itself")
    if kv_format != "bf16" and kv_compress:
        raise KvcargoError("KV hand-off compression assumes a BF16 KV cache: drop --kv-format or --kv-compress")
    m, ln = cat.model(model), cat.link(link)
    if not is_default(weight_format, kv_format, compute_format):
        m = with_formats(m, weight_format, kv_format)
    dev = cat.device(device)
    require_units(dev, compute_format, "prefill")
    pool = Pool(dev, devices_per_instance, precision=compute_format)
    codec = Compression(cat.codec(kv_compress), "transit", kv_keep, kv_ratio) if kv_compress else None
    draft = make_draft(m, speculative, cat, None, None, None).model if speculative else None
    return calculate(m, prompt, ln, pool, codec, send, draft), m, ln, pool
