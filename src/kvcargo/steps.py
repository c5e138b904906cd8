"""The cost of one step (``kvcargo step``): what the engine charges, for users and for checks.

Prefill: ``batch`` prompts of ``length`` tokens in one step; decode: ``batch`` sequences with
``length`` tokens of context each. Both cost models go through the engine's own kernels, so the
numbers are exactly what a simulation charges for that step.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from kvcargo import catalog as catalog_mod
from kvcargo.calibrated import (
    CS_COMM_SCALE,
    CS_DECODE_OVERHEAD,
    CS_DECODE_SCALE,
    CS_LARGE_STEP,
    CS_PREFILL_FLOOR,
    CS_PREFILL_SCALE,
    calibrated_pool,
    calibrated_step,
    tabulate,
)
from kvcargo.catalog import Model
from kvcargo.cost import (
    LmHead,
    Pool,
    decode_step,
    decode_work,
    model_coefficients,
    prefill_step,
    prefill_work,
    require_fit,
)
from kvcargo.errors import KvcargoError
from kvcargo.formats import (
    BYTES_PER_VALUE,
    calibrated_error,
    compute_error,
    is_default,
    require_units,
    with_formats,
)
from kvcargo.limits import check_ranges, check_step

Phase = Literal["prefill", "decode"]


def step(model: str, device: str, devices: int, phase: Phase, batch: int, length: int,
         cost_model: str = "roofline", lm_head: LmHead = "all", catalog: tuple[str, ...] = (),
         weight_format: str = "bf16", kv_format: str = "bf16", compute_format: str = "bf16") -> dict[str, Any]:
    """Time (s), energy (J) and what went into one step (SI units), in these number formats (as
    ``simulate``'s ``--weight-format/--kv-format/--compute-format``)."""
    if phase not in ("prefill", "decode"):
        raise KvcargoError(f"unknown phase {phase!r}; valid choices: decode, prefill")
    if cost_model not in ("roofline", "calibrated"):
        raise KvcargoError(f"unknown cost model {cost_model!r}; valid choices: calibrated, roofline")
    for name, v in (("batch", batch), ("prompt" if phase == "prefill" else "context", length)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise KvcargoError(f"--{name} must be a whole number >= 1, got {v!r}")
    check_ranges({"devices_per_instance": devices})
    formats = {"weight_format": weight_format, "kv_format": kv_format, "compute_format": compute_format}
    for flag, f in formats.items():
        if f not in BYTES_PER_VALUE:
            raise KvcargoError(f"unknown --{flag.replace('_', '-')} {f!r}; valid choices: {', '.join(BYTES_PER_VALUE)}")
    error = compute_error(weight_format, compute_format)
    if error is None and cost_model == "calibrated":
        error = calibrated_error(weight_format, kv_format, compute_format)
    if error:
        raise KvcargoError(error)
    cat = catalog_mod.load(catalog)
    m = cat.model(model)
    default = is_default(weight_format, kv_format, compute_format)
    if not default:
        m = with_formats(m, weight_format, kv_format)
    check_step(m.key, model_coefficients(m)[0], phase, batch, length)
    dev = cat.device(device)
    require_units(dev, compute_format, phase, cost_model)
    pool = Pool(dev, devices, precision=compute_format)
    require_fit(m, pool, phase)
    out: dict[str, Any] = {"model": m.key, "device": pool.device.key, "devices_per_instance": devices,
                           "cost_model": cost_model, "phase": phase, "batch": batch}
    out["prompt" if phase == "prefill" else "context"] = length
    if not default:
        out.update(formats)
    out.update(step_cost(m, pool, phase, batch, length, cost_model, lm_head))
    out["power_w"] = pool.idle_w + out["energy_j"] / out["time_s"]
    return out


def step_cost(model: Model, pool: Pool, phase: Phase, batch: int, length: int, cost_model: str = "roofline",
              lm_head: LmHead = "all") -> dict[str, Any]:
    """Time, energies, FLOPs and bytes of one step under a cost model (catalog objects)."""
    from kvcargo import stepcost

    family = stepcost.step_class(model) != stepcost.ATTENTION
    if cost_model == "calibrated":
        if family:
            raise KvcargoError(f"--cost-model calibrated is measured for attention models without CED only, "
                               f"not {model.key!r}")
        return _calibrated(model, pool, phase, batch, length, lm_head)
    if family:  # FFT mixers, causal encoder-decoders, optical engines: their step classes
        s = (stepcost.prefill_step(model, pool, [length] * batch, lm_head) if phase == "prefill"
             else stepcost.decode_step(model, pool, batch, batch * length, lm_head=lm_head))
    elif phase == "prefill":
        s = prefill_step(model, pool, [length] * batch, lm_head)
    else:
        s = decode_step(model, pool, batch, length)
    return {"time_s": s.time, "energy_j": s.energy_j, "compute_j": s.compute_j, "memory_j": s.memory_j,
            "flops": s.flops, "bytes": s.bytes, "bound": s.bound}


def _calibrated(model: Model, pool: Pool, phase: Phase, batch: int, length: int, lm_head: LmHead) -> dict[str, Any]:
    """The calibrated step through the engine's lookup, with the measured parts beside it."""
    ct, cs = tabulate(model, pool, lm_head)
    mi, mf = model_coefficients(model, lm_head)
    hf = pool.coefficients()
    cp = calibrated_pool(model, pool)
    b = np.array([float(batch)])
    if phase == "prefill":
        tokens, quad = batch * length, batch * length * (length + 1)
        flops, nbytes = prefill_work(mi, mf, tokens, quad, batch)
        t, e_c, e_m = calibrated_step(ct, cs, hf, True, float(tokens), float(batch), float(quad), 0.0,
                                      float(flops), nbytes)
        framework = {"framework_scale": float(cs[CS_PREFILL_SCALE]),
                     "framework_floor": float(cs[CS_PREFILL_FLOOR]),
                     "framework_large_step_scale": float(cs[CS_LARGE_STEP])}  # large_step · log2(TP/2)
        attention = cp.context_s(b, np.array([float(length)]))[0]
        logits = cp.logits_s(b if lm_head == "last" else b * length)[0]
        m = b * length
    else:
        flops, nbytes = decode_work(mi, mf, batch, batch * length)
        t, e_c, e_m = calibrated_step(ct, cs, hf, False, float(batch), float(batch), 0.0, float(batch * length),
                                      float(flops), nbytes)
        framework = {"framework_scale": float(cs[CS_DECODE_SCALE]), "framework_overhead": float(cs[CS_DECODE_OVERHEAD])}
        attention = cp.generation_s(b, np.array([length + 1.0]))[0]
        logits = cp.logits_s(b)[0]
        m = b
    t, e_c, e_m = float(t), float(e_c), float(e_m)  # plain floats (JSON), whichever engine ran the lookup
    return {"time_s": t, "energy_j": e_c + e_m, "compute_j": e_c, "memory_j": e_m, "flops": int(flops),
            "bytes": float(nbytes), "tensor_parallel": cp.tp,
            "parts_s": {"layers": float(cp.layer_compute_s(m)[0]), "all_reduce": float(cp.layer_reduce_s(m)[0]),
                        "attention": float(attention), "logits": float(logits),
                        "framework_comm_scale": float(cs[CS_COMM_SCALE]), **framework}}
