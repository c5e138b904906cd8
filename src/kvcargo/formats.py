"""Number formats of weights, KV cache and matmul inputs (levers-parallel §3).

A narrower storage format shrinks every byte count of a model (resident and streamed weights,
embedding rows, KV per token, hand-off, capacity); a narrower *compute* format (W8A8, W4A4) also
multiplies the FLOP rate by the device's native low-precision rate and divides the energy per
FLOP by it. Block scales are included in the bytes per value: int4 as in AWQ/GPTQ groups of 128
weights with a 16-bit scale (Lin et al., 2024, arXiv:2306.00978), fp4 as the OCP Microscaling
format's blocks of 32 E2M1 values with an 8-bit shared exponent (OCP MX v1.0, 2023). Accuracy is
not modelled; activations exchanged between GPUs stay BF16.
"""

from __future__ import annotations

from kvcargo.catalog import Device, Model
from kvcargo.errors import KvcargoError

BYTES_PER_VALUE: dict[str, float] = {
    "bf16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5 + 2 / 128,
    "fp4": 0.5 + 1 / 32,
}
"""Storage bytes per value, block scales included (per-tensor/channel scales neglected)."""


def is_default(weight: str, kv: str, compute: str) -> bool:
    """Whether every format is BF16 (the reference: nothing changes)."""
    return weight == kv == compute == "bf16"


def with_formats(model: Model, weight: str, kv: str) -> Model:
    """The model with its weights and KV cache stored in these formats."""
    return model.model_copy(update={"weight_bytes": BYTES_PER_VALUE[weight], "kv_bytes": BYTES_PER_VALUE[kv]})


def require_units(device: Device, compute: str, role: str, cost_model: str = "roofline") -> None:
    """A non-BF16 compute format needs native units of that format on the pool's device."""
    if compute != "bf16" and compute not in device.lowp_speedup:
        hint = (f"--cost-model calibrated measures no weight-only GEMMs: here use bf16 weights, or "
                f"--cost-model roofline with --compute-format bf16 for weight-only {compute}"
                if cost_model == "calibrated" else f"use compute_format='bf16' for weight-only {compute}")
        raise KvcargoError(f"{role} pool: {device.name} has no {compute} units ({hint})", field="compute_format")


def compute_error(weight: str, compute: str) -> str | None:
    """Why a compute format does not go with these weights (None: it does)."""
    if compute in ("bf16", weight):
        return None
    return ("--compute-format must be bf16 (weight-only) or the weight format itself (W8A8, W4A4); "
            f"got {compute} with --weight-format {weight}")


def calibrated_error(weight: str, kv: str, compute: str) -> str | None:
    """Why ``--cost-model calibrated`` cannot price these formats (None: it can). Its tables
    measure bf16 and W8A8 fp8 GEMMs and attention over a bf16 or fp8 KV cache, nothing weight-only."""
    if weight != compute:
        return (f"--cost-model calibrated has no measured weight-only GEMMs (--weight-format {weight} with "
                f"--compute-format {compute}): use --weight-format fp8 --compute-format fp8 (W8A8), or --cost-model "
                "roofline")
    if compute not in ("bf16", "fp8"):
        return (f"--cost-model calibrated has measured bf16 and fp8 GEMMs only, not {compute}; valid "
                "--weight-format/--compute-format: bf16, fp8 (or --cost-model roofline)")
    if kv not in ("bf16", "fp8"):
        return (f"--cost-model calibrated has measured attention over bf16 and fp8 KV caches only, not {kv}; "
                "valid --kv-format: bf16, fp8 (or --cost-model roofline)")
    return None
