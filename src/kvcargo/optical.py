"""The optical Fourier-transform engine of ``optical-fft`` devices (levers-mixers §3.3, §3.6).

A 4f system computes a Fourier transform in one pass of light; the DACs and ADCs around it,
the mask that holds the filter spectra and its rewrite rate set what it costs. Only the
transforms and spectral products of an FFT-mixing prefill run on it; everything else runs on
the digital part. Figures are the catalog's (:class:`kvcargo.catalog.TransformEngine`).
"""

from __future__ import annotations

import math

from kvcargo.catalog import Device, TransformEngine

REQUIRED_ENOB = 11
"""Bits a BF16 activation needs; each missing bit costs a factor 4 in passes."""


def passes(engine: TransformEngine) -> int:
    """Passes per forward pass: 4^max(0, 11 − ENOB), doubled with intensity detection."""
    k = 4 ** max(0, REQUIRED_ENOB - engine.enob)
    return 2 * k if engine.detection == "intensity" else k


def pj_per_pair(engine: TransformEngine) -> float:
    """Energy of one DAC + ADC sample pair, pJ: (FOM_dac · 2^ENOB) · 1e−3 + (FOM_adc · 2^ENOB) · 1e−3."""
    steps = 2.0 ** engine.enob
    return (engine.dac_fj_per_step * steps) * 1e-3 + (engine.adc_fj_per_step * steps) * 1e-3


def static_w(engine: TransformEngine, n: int) -> float:
    """Laser and tuning power of an instance of ``n`` devices (burnt for the whole run)."""
    return (engine.laser_w + engine.tuning_w) * n


def die_areas(device: Device) -> list[float]:
    """mm² of each die of one device: the digital die (plus the converters of an engine) and,
    with an engine, the photonic die. Empty when the catalog gives no area."""
    if device.die_mm2 is None:
        return []
    e = device.ft_engine
    if e is None:
        return [device.die_mm2]
    channels = math.ceil(e.samples_per_s / e.channel_samples_per_s)
    return [device.die_mm2 + channels * (e.dac_mm2 + e.adc_mm2), e.photonic_mm2]


def with_overrides(device: Device, enob: int | None = None, static: float | None = None,
                   mask_rate: float | None = None, samples_per_s: float | None = None,
                   detection: str | None = None, overlap: bool = False) -> Device:
    """The device with the ``--ft-*`` settings applied to its engine (unchanged without one)."""
    e = device.ft_engine
    if e is None:
        return device
    changes: dict[str, object] = {}
    if enob is not None:
        changes["enob"] = enob
    if static is not None:
        changes["laser_w"] = changes["tuning_w"] = static / 2
    if mask_rate is not None:
        changes["mask_rate_hz"] = mask_rate
    if samples_per_s is not None:
        changes["samples_per_s"] = samples_per_s
    if detection is not None:
        changes["detection"] = detection
    if overlap:
        changes["overlap"] = True
    if not changes:
        return device
    return device.model_copy(update={"ft_engine": e.model_copy(update=changes)})
