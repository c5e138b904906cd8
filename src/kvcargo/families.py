"""A run's model family levers resolved: CED overrides on the model, ``--ft-*`` on the devices,
and the combinations kvcargo refuses (levers-mixers §6).

Unlike the companion simulator, which silently ignores a lever the configuration does not use
(``--ft-*`` without a transform engine, ``--fft-efficiency`` on an attention model,
``--ced-replay`` without encoder layers), kvcargo refuses it with one line saying what it needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvcargo import ced, mixers, optical
from kvcargo.catalog import Device, Model
from kvcargo.errors import KvcargoError
from kvcargo.levers import PARALLEL_LEVERS

if TYPE_CHECKING:
    from kvcargo.config import Resolved, SimConfig

ENGINE_FLAGS = ("ft_enob", "ft_static_w", "ft_mask_rate", "ft_samples_per_s", "ft_detection", "ft_overlap")
ENGINE_STEP_FLAGS = ("ft_enob", "ft_mask_rate", "ft_detection", "ft_overlap")
"""The engine flags that change steps (the others change its static power and area)."""


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _given(config: SimConfig, names: tuple[str, ...]) -> list[str]:
    return [n for n in names if getattr(config, n) not in (None, False)]


def effective_model(model: Model, config: SimConfig) -> Model:
    """The catalog model with ``--ced-encoder-layers``, ``--ced-replay``, ``--ced-replay-on``
    applied (each overrides the model's value only when given), validated."""
    changes = {k: getattr(config, k) for k in ("ced_encoder_layers", "ced_replay", "ced_replay_on")
               if getattr(config, k) is not None}
    m = model.model_copy(update=changes) if changes else model
    E = m.ced_encoder_layers
    if not E:
        extra = [n for n in ("ced_replay", "ced_replay_on") if getattr(config, n) is not None]
        if extra:
            raise KvcargoError(f"{_flag(extra[0])} applies only to a causal encoder-decoder "
                               "(a *-ced model or --ced-encoder-layers > 0)")
        return m
    if mixers.is_fft_mixing(m):
        raise KvcargoError(f"--ced-encoder-layers: CED is modelled for attention models only, not {m.key!r}")
    if m.experts:
        raise KvcargoError(f"--ced-encoder-layers: {m.key!r} is a mixture of experts, modelled without CED only")
    if E >= m.layers:
        raise KvcargoError(f"--ced-encoder-layers {E}: the encoder must leave at least one decoder layer "
                           f"({m.key!r} has {m.layers})")
    return m


def effective_device(device: Device, config: SimConfig) -> Device:
    """The device with the ``--ft-*`` overrides applied to its transform engine, if it has one."""
    c = config
    return optical.with_overrides(device, c.ft_enob, c.ft_static_w, c.ft_mask_rate, c.ft_samples_per_s,
                                  c.ft_detection, c.ft_overlap)


def prefill_resident_bytes(model: Model) -> float | None:
    """Weights a prefill instance holds when it is not the whole model (CED, replay on decode)."""
    return ced.encoder_resident_bytes(model) if ced.replay_on_decode(model) else None


def family_levers(res: Resolved) -> bool:
    """Whether the run uses a model family or device of this module (a step class beyond the
    transformer, or a transform engine in a pool)."""
    return (mixers.is_fft_mixing(res.model) or ced.is_ced(res.model)
            or any(p.device.ft_engine for p in (res.prefill_pool, res.decode_pool)))


def check_levers(res: Resolved) -> None:
    """Refuse lever combinations that are not modelled or that the run would ignore."""
    c, m = res.config, res.model
    fft, is_ced = mixers.is_fft_mixing(m), ced.is_ced(m)
    if c.fft_efficiency is not None and not fft:
        raise KvcargoError(f"--fft-efficiency applies only to FFT-mixing models (hyena, hybrid), not {m.key!r}")
    engines = [p.device.ft_engine for p in (res.prefill_pool, res.decode_pool)]
    given = _given(c, ENGINE_FLAGS)
    if given and not any(engines):
        raise KvcargoError(f"{_flag(given[0])} needs a device with an optical transform engine in use "
                           "(optical-fft, optical-fft-small)")
    given = _given(c, ENGINE_STEP_FLAGS)
    if given and not fft:
        raise KvcargoError(f"{_flag(given[0])} changes only FFT-mixing steps (hyena, hybrid models), not {m.key!r}")
    if (fft or is_ced) and c.cost_model != "roofline":
        kind = "an FFT-mixing model" if fft else "a causal encoder-decoder (CED)"
        raise KvcargoError(f"--cost-model {c.cost_model} is measured for attention models without CED only; "
                           f"{m.key!r} runs here as {kind} (use --cost-model roofline)")
    parallel = [n for n in PARALLEL_LEVERS if getattr(c, n) != type(c).model_fields[n].default]
    if parallel and (fft or is_ced or any(engines)):
        raise KvcargoError(f"{_flag(parallel[0])} is modelled for attention models on electronic devices only, "
                           f"not {m.key!r} or an optical transform engine")
    if (c.scheduled or c.turns > 1 or c.workload is not None) and (fft or is_ced or any(engines)):
        raise KvcargoError(f"the serving levers and sessions are modelled for attention models on electronic devices "
                           f"only, not {m.key!r} or an optical transform engine",
                           field="model" if fft or is_ced else "device")
    if ced.replay_on_decode(m) and res.colocated:
        raise KvcargoError("--ced-replay-on decode splits prefill across the two pools: it needs --mode disagg")
    if fft or is_ced:
        changed = c.handoff_features
        if changed:
            raise KvcargoError(f"{_flag(changed[0])} is modelled for attention models without CED only, "
                               f"not {m.key!r}")
