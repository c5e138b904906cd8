"""The hand-off physics: compression, transfer time and energy of moving KV caches over a link.

:func:`transfers` gives every hand-off's link time, wire bytes and energy at line rate, and
:func:`endpoint_work` the GPU work of compressing at the endpoint (reference-semantics §4–§5),
elementwise on numpy arrays (:func:`transfers` also on one hand-off's numbers, see
:mod:`kvcargo.elementwise`). A hand-off is timed through one function,
:func:`kvcargo.linkmodel.link_transfers` (the link-model seam, built on :func:`transfers`), by the
calculator, the planner's ceilings and the engine alike; the scheduled engine, which accepts only
line-rate links, calls :func:`transfers` itself, which is what the seam returns there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from kvcargo.catalog import Codec, Link
from kvcargo.elementwise import as_floats, maximum, minimum, zeros_like
from kvcargo.errors import KvcargoError

if TYPE_CHECKING:
    import numpy as np

Placement = Literal["transit", "endpoint"]
SendMode = Literal["whole", "layerwise"]

TRANSIT_OPS_PER_BYTE = 1.6
"""In-transit compute budget: operations per byte the link carries (§5)."""
TRANSIT_PJ_PER_BIT = 1.0
"""In-transit stage energy per *input* bit."""
TRANSIT_LATENCY_S = 1e-6
"""Latency the in-transit stage adds to every transfer."""


def parts_per_handoff(send: SendMode, layer_groups: int | None, layers: int) -> int:
    """Messages one hand-off is sent as: one whole, or one per layer group (every layer unless
    ``--layer-groups`` groups them) when streamed layer by layer."""
    return (layer_groups or layers) if send == "layerwise" else 1


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

    def wire_bytes(self, nbytes: np.ndarray | float, prompt: np.ndarray | float,
                   kv_value_bytes: float) -> np.ndarray | float:
        """Bytes on the wire for hand-offs of ``nbytes`` (prompts of ``prompt`` tokens).

        KIVI keeps the most recent ``residual`` tokens in full precision and quantises the rest
        to ``bits`` bits per value plus an FP16 scale and zero point per group of ``group``.
        """
        n = as_floats(nbytes)
        if self.codec.kind != "kivi":
            return n / self.ratio
        c = self.codec
        p = as_floats(prompt)
        recent = minimum(p, float(c.residual)) / p
        return n * ((1 - recent) * (c.bits + 32 / c.group) / (8 * kv_value_bytes) + recent)

    def decode_work(self, nbytes: np.ndarray, wire: np.ndarray, kv_value_bytes: float) -> tuple[np.ndarray, np.ndarray]:
        """(ops, bytes) of decompressing on the decode GPU: read the wire copy, write BF16."""
        n = as_floats(nbytes)
        return self.codec.decode_ops_per_value * (n / kv_value_bytes), wire + n


def fft_ops_per_value(prompt: np.ndarray) -> np.ndarray:
    """FFT work along the tokens per value: 2·R(n)/n, R(n) = 2.5·n·log2(n), n = next 2^k ≥ s."""
    import numpy as np

    prompt = np.asarray(prompt, dtype=np.int64)
    log2n = np.array([max(0, int(s - 1).bit_length()) for s in prompt.tolist()], dtype=np.int64)
    n = (np.int64(1) << log2n).astype(np.float64)
    return 2 * (2.5 * n * log2n) / n


@dataclass(frozen=True)
class Transfers:
    """Per-request link figures (arrays aligned with the requests; numbers for one hand-off)."""

    duration: np.ndarray | float
    """Seconds a whole hand-off holds a link channel."""
    wire_bytes: np.ndarray | float
    link_j: np.ndarray | float
    transit_j: np.ndarray | float
    transit_bound: np.ndarray | bool
    """True where the in-transit stage's compute, not the wire, set the duration."""
    slice_time: np.ndarray | float
    """Layer-wise streaming: seconds each of the ``groups`` slices holds a channel."""
    last_extra: np.ndarray | float
    """Layer-wise streaming: latency the last slice adds (the link's, and the stage's)."""


def transfers(link: Link, compression: Compression | None, nbytes: np.ndarray | float, kv_value_bytes: float,
              prompt: np.ndarray | float | None = None, groups: int = 1) -> Transfers:
    """Link time, wire bytes and energy of hand-offs of ``nbytes`` each (§4, §5): an array of
    them, or one hand-off's number (then every figure is a number).

    Whole: ``latency + bytes/bandwidth`` (in transit also 1 µs + the larger of wire and compute
    time). Sliced in ``groups``: each slice takes its share of the wire (or compute) time and the
    latencies are paid once, by the last slice.
    """
    n = as_floats(nbytes)
    zeros = zeros_like(n)
    latency = link.latency
    wire = n if compression is None else compression.wire_bytes(n, n if prompt is None else prompt, kv_value_bytes)
    t_wire = wire / link.bandwidth
    if compression is None or compression.at == "endpoint":
        t_ops, transit_j = zeros, zeros
        duration = link.latency + t_wire
    else:
        t_ops = (compression.codec.ops_per_value * (n / kv_value_bytes)) / (compression.ops_per_byte * link.bandwidth)
        duration = link.latency + TRANSIT_LATENCY_S + maximum(t_wire, t_ops)
        transit_j = n * 8 * compression.pj_per_bit * 1e-12
        latency = link.latency + TRANSIT_LATENCY_S
    slice_time = maximum(t_wire, t_ops) / groups
    return Transfers(duration, wire, wire * 8 * link.pj_per_bit * 1e-12, transit_j, t_ops > t_wire,
                     slice_time, latency + zeros)


def endpoint_work(compression: Compression, nbytes: np.ndarray, prompt: np.ndarray,
                  kv_value_bytes: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-request (ops, bytes) of compressing on the prefill GPU: read the KV, write the copy."""
    import numpy as np

    n = np.asarray(nbytes, dtype=np.float64)
    per_value = compression.codec.ops_per_value + (
        fft_ops_per_value(prompt) if compression.codec.fft else 0.0)
    return per_value * (n / kv_value_bytes), n + compression.wire_bytes(n, prompt, kv_value_bytes)
