"""Hand-off transfers and codecs restated from the reference spec (reference-semantics §4–§5).

Per request, from the catalog's link and codec entries only: transfer duration, bytes on the
wire, link and in-transit energy, whether the in-transit stage's compute bound it, and the
endpoint pass's (ops, bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

TRANSIT_OPS_PER_BYTE = 1.6
TRANSIT_PJ_PER_BIT = 1.0
TRANSIT_LATENCY_S = 1e-6


@dataclass(frozen=True)
class Codec:
    """A reference codec where it runs: ratio (``--kv-keep f`` makes it 1/f), ops per value, FFT."""

    ratio: float
    ops_per_value: float
    fft: bool
    at: str

    @property
    def is_identity(self) -> bool:
        """Preset "none": at the endpoint it does nothing (§5)."""
        return self.ratio == 1.0 and self.ops_per_value == 0 and not self.fft


def codec(entry, at: str, keep: float | None = None) -> Codec:  # type: ignore[no-untyped-def]
    """A codec from its catalog entry (the reference's fixed-ratio presets)."""
    return Codec(1.0 / keep if keep is not None else entry.ratio, entry.ops_per_value, entry.fft, at)


@dataclass(frozen=True)
class Transfer:
    duration: float
    wire_bytes: float
    link_j: float
    transit_j: float
    transit_bound: bool


def transfer(link, c: Codec | None, nbytes: int, kv_value_bytes: float) -> Transfer:  # type: ignore[no-untyped-def]
    """§4/§5: one whole hand-off of ``nbytes`` as one message."""
    n = float(nbytes)
    wire = n if c is None else n / c.ratio
    t_wire = wire / link.bandwidth
    link_j = wire * 8 * link.pj_per_bit * 1e-12
    if c is None or c.at == "endpoint":
        return Transfer(link.latency + t_wire, wire, link_j, 0.0, False)
    t_ops = (c.ops_per_value * (n / kv_value_bytes)) / (TRANSIT_OPS_PER_BYTE * link.bandwidth)
    duration = link.latency + TRANSIT_LATENCY_S + max(t_wire, t_ops)
    return Transfer(duration, wire, link_j, n * 8 * TRANSIT_PJ_PER_BIT * 1e-12, t_ops > t_wire)


def endpoint_work(c: Codec, nbytes: int, prompt: int, kv_value_bytes: float) -> tuple[float, float]:
    """§5: (ops, bytes) of compressing one request's KV on the prefill GPU."""
    n = float(nbytes)
    per_value = c.ops_per_value
    if c.fft:  # 2·R(m)/m, R(m) = 2.5·m·log2(m), m the smallest power of two ≥ the prompt
        log2m = (prompt - 1).bit_length()
        m = 2.0 ** log2m
        per_value = per_value + 2 * (2.5 * m * log2m) / m
    return per_value * (n / kv_value_bytes), n + n / c.ratio
