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

from kvcargo.catalog import Codec, Link, Model
from kvcargo.cost import Pool, prefill_step, require_fit, shape
from kvcargo.errors import KvcargoError

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
    ``endpoint``: an extra elementwise pass on the prefill GPU before sending.
    """

    codec: Codec
    at: Placement = "transit"
    keep: float | None = None

    def __post_init__(self) -> None:
        if self.at not in ("transit", "endpoint"):
            raise KvcargoError(f"unknown placement {self.at!r}; valid choices: endpoint, transit")
        if self.keep is not None:
            if not self.codec.keep_adjustable:
                raise KvcargoError(f"--kv-keep applies only to freq-keep-k, not {self.codec.key!r}")
            if not 0 < self.keep <= 1:
                raise KvcargoError(f"--kv-keep must be in (0, 1], got {self.keep:g}")

    @property
    def ratio(self) -> float:
        """Bytes in / bytes on the wire."""
        return 1.0 / self.keep if self.keep is not None else self.codec.ratio

    @property
    def is_identity(self) -> bool:
        """A codec that changes nothing (``none``): at the endpoint it is no stage at all."""
        return self.ratio == 1.0 and self.codec.ops_per_value == 0 and not self.codec.fft


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
    """Seconds a link channel is held."""
    wire_bytes: np.ndarray
    link_j: np.ndarray
    transit_j: np.ndarray
    transit_bound: np.ndarray
    """True where the in-transit stage's compute, not the wire, set the duration."""


def transfers(link: Link, compression: Compression | None, nbytes: np.ndarray, kv_value_bytes: float) -> Transfers:
    """Link time, wire bytes and energy of hand-offs of ``nbytes`` each (§4, §5)."""
    n = np.asarray(nbytes, dtype=np.float64)
    zeros = np.zeros_like(n)
    if compression is None:
        return Transfers(link.latency + n / link.bandwidth, n, n * 8 * link.pj_per_bit * 1e-12,
                         zeros, zeros.astype(bool))
    wire = n / compression.ratio
    link_j = wire * 8 * link.pj_per_bit * 1e-12
    t_wire = wire / link.bandwidth
    if compression.at == "endpoint":
        return Transfers(link.latency + t_wire, wire, link_j, zeros, zeros.astype(bool))
    t_ops = (compression.codec.ops_per_value * (n / kv_value_bytes)) / (TRANSIT_OPS_PER_BYTE * link.bandwidth)
    duration = link.latency + TRANSIT_LATENCY_S + np.maximum(t_wire, t_ops)
    return Transfers(duration, wire, link_j, n * 8 * TRANSIT_PJ_PER_BIT * 1e-12, t_ops > t_wire)


def endpoint_work(compression: Compression, nbytes: np.ndarray, prompt: np.ndarray,
                  kv_value_bytes: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-request (ops, bytes) of compressing on the prefill GPU: read the KV, write the copy."""
    n = np.asarray(nbytes, dtype=np.float64)
    per_value = compression.codec.ops_per_value + (
        fft_ops_per_value(prompt) if compression.codec.fft else 0.0)
    return per_value * (n / kv_value_bytes), n + n / compression.ratio


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
    wire_bytes: float
    ratio: float
    bandwidth: float
    latency_s: float
    transfer_s: float
    prefill_s: float
    exposed_s: float
    link_full_rps: float

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
              send: SendMode = "whole") -> HandoffResult:
    """Hand-off size, wire bytes, transfer, prefill, exposed time and link saturation rate."""
    if not isinstance(prompt, int) or isinstance(prompt, bool) or prompt <= 0:
        raise KvcargoError(f"prompt must be a positive whole number of tokens, got {prompt!r}")
    require_fit(model, pool, "prefill")
    s = shape(model)
    kv = s.handoff_bytes(prompt)
    ratio = compression.ratio if compression else 1.0
    wire = kv / ratio
    wire_s = wire / link.bandwidth
    prefill_s = prefill_step(model, pool, [prompt]).time
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
    )
