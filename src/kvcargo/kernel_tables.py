"""Silicon-measured kernel latencies (GEMM, attention, all-reduce) and interpolation between them.

The tables are aiconfigurator-core's vLLM measurements (NVIDIA, Apache-2.0; see NOTICE), converted
by ``scripts/convert_aiconfigurator.py`` into ``data/calibration/<device>.npz`` (numpy only at
run time). Between measured points latencies are interpolated log-linearly in every dimension
(exact for power laws such as ``latency ∝ m`` at large sizes); beyond the grid the edge segment is
extrapolated. Cells the source never measured are filled from the nearest measured neighbour
scaled by the work ratio. Everything here is in seconds and bytes.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from kvcargo.errors import KvcargoError, clip

BUILTIN = ("a100", "b200", "h100", "h200")
"""Devices whose measured tables ship with kvcargo."""
FORMATS = ("bf16", "fp8")
"""Number formats the converter writes tables for (GEMMs: the compute format; attention: the KV cache's)."""
ARRAYS = ("gemm_m", "gemm_n", "gemm_k", "gemm_ms", "ctx_cfg", "ctx_b", "ctx_s", "ctx_ms", "gen_cfg", "gen_b", "gen_s",
          "gen_ms", "ar_gpus", "ar_size", "ar_ms")
"""The arrays every kernel-tables file holds (bf16; :func:`from_arrays`)."""


def suffix(fmt: str) -> str:
    """What follows an array's kind in a tables file: nothing for bf16 (``gemm_ms``), ``_fp8``
    for fp8 (``gemm_fp8_ms``; the held-out rows: ``gemm_fp8``)."""
    return "" if fmt == "bf16" else f"_{fmt}"


AR_VALUE_BYTES = 2
"""aiconfigurator records an all-reduce's message size in bf16 values, not bytes (its 1 Gi-value
all-reduce over 8 H100s takes 4.0 ms: 470 GB/s of NCCL bus bandwidth, NVLink 4's ceiling; read
as bytes it would be half that). The tables are converted to bytes on loading."""


def _segment(axis: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Left index and weight of ``x`` on a sorted axis, linear in log space (edges extrapolate)."""
    la = np.log(axis)
    lx = np.log(np.maximum(x, 1e-30))
    i = np.clip(np.searchsorted(la, lx, side="right") - 1, 0, len(axis) - 2)
    return i, (lx - la[i]) / (la[i + 1] - la[i])


def _fill_along(z: np.ndarray, axis: np.ndarray, dim: int, power: float) -> None:
    """Fill NaN cells of ``z`` along ``dim`` from the nearest measured cell below (scaled by
    ``(x/x')**power``) or, failing that, above (unscaled: smaller sizes are launch-bound)."""
    zm = np.moveaxis(z, dim, -1)
    for idx in np.ndindex(zm.shape[:-1]):
        line = zm[idx]
        known = np.flatnonzero(~np.isnan(line))
        if len(known) == 0 or len(known) == len(line):
            continue
        for j in np.flatnonzero(np.isnan(line)):
            below = known[known < j]
            if len(below):
                b = below[-1]
                line[j] = line[b] * (axis[j] / axis[b]) ** power
            else:
                line[j] = line[known[known > j][0]]


@dataclass(frozen=True)
class Gemm:
    """Measured GEMM latencies of one number format: log seconds over (m, n, k)."""

    axes: tuple[np.ndarray, np.ndarray, np.ndarray]
    log: np.ndarray

    def __call__(self, m: np.ndarray, n: float, k: float) -> np.ndarray:
        """Latency of an (m × k) · (k × n) GEMM for every m."""
        m = np.asarray(m, dtype=np.float64)
        im, wm = _segment(self.axes[0], m)
        i_n, wn = _segment(self.axes[1], np.array([n]))
        ik, wk = _segment(self.axes[2], np.array([k]))
        out = np.zeros_like(m)
        for dm, fm in ((0, 1 - wm), (1, wm)):
            for dn, fn in ((0, 1 - wn[0]), (1, wn[0])):
                for dk, fk in ((0, 1 - wk[0]), (1, wk[0])):
                    out += fm * fn * fk * self.log[im + dm, i_n[0] + dn, ik[0] + dk]
        return np.exp(out)

    @property
    def peak_rate(self) -> float:
        """Median FLOP/s of the measured large GEMMs (m ≥ 4096): the sustained tensor rate."""
        m, n, k = self.axes
        big = m >= 4096
        flops = 2.0 * m[big, None, None] * n[None, :, None] * k[None, None, :]
        return float(np.median(flops / np.exp(self.log[big])))


@dataclass(frozen=True)
class Attention:
    """Measured attention latencies over one KV-cache format: log seconds over (head
    configuration, batch, tokens per sequence)."""

    cfg: np.ndarray
    """(heads, kv_heads, head_dim) of each table."""
    axes: tuple[np.ndarray, np.ndarray]
    log: np.ndarray
    by_kv: bool
    """Scale a KV-head count between measured ones by the KV heads (generation: the kernel reads
    the cache), not the query heads (context: the kernel's work)."""

    def __call__(self, heads: int, kv_heads: int, head_dim: int, b: np.ndarray, s: np.ndarray) -> np.ndarray:
        """One layer's attention over ``b`` sequences of ``s`` tokens each (context: the prompt;
        generation: the cached tokens and the new one), for these per-device heads."""
        b = np.asarray(b, dtype=np.float64)
        s = np.asarray(s, dtype=np.float64)
        ib, wb = _segment(self.axes[0], b)
        is_, ws = _segment(self.axes[1], s)

        def at(c: int) -> np.ndarray:
            z = self.log[c]
            v = ((1 - wb) * (1 - ws) * z[ib, is_] + wb * (1 - ws) * z[ib + 1, is_]
                 + (1 - wb) * ws * z[ib, is_ + 1] + wb * ws * z[ib + 1, is_ + 1])
            return np.exp(v)

        cfgs = self.cfg
        same_hd = cfgs[:, 2] == head_dim
        if not same_hd.any():
            raise KvcargoError(f"no measured attention kernels for head size {head_dim}; measured: "
                               f"{', '.join(str(h) for h in sorted(set(cfgs[:, 2].tolist())))}", field="model")
        # The nearest measured KV-head count, then query heads bracketing ours (linear in heads).
        kvs = np.unique(cfgs[same_hd, 1])
        kv = kvs[np.argmin(np.abs(np.log(kvs / kv_heads)))]
        rows = np.flatnonzero(same_hd & (cfgs[:, 1] == kv))
        hs = cfgs[rows, 0]
        order = np.argsort(hs)
        rows, hs = rows[order], hs[order]
        scale = kv_heads / kv if self.by_kv else 1.0
        exact = np.flatnonzero(hs == heads)
        if len(exact):
            return at(rows[exact[0]]) * scale
        lo, hi = hs[hs < heads], hs[hs > heads]
        if len(lo) and len(hi):
            a, c = rows[len(lo) - 1], rows[len(lo)]
            w = (heads - lo[-1]) / (hi[0] - lo[-1])
            return ((1 - w) * at(a) + w * at(c)) * scale
        near = rows[-1] if len(lo) else rows[0]
        h_near = cfgs[near, 0]
        return at(near) * (scale if self.by_kv else heads / h_near)


@dataclass(frozen=True)
class KernelTables:
    """One system's measured kernel latencies (seconds), per number format."""

    gemms: dict[str, Gemm]
    """GEMMs by compute format: ``bf16``, and ``fp8`` (W8A8) where measured."""
    contexts: dict[str, Attention]
    """Context (prefill) attention by KV-cache format: batch × prompt length."""
    generations: dict[str, Attention]
    """Generation (decode) attention by KV-cache format: batch × KV length (the new token included)."""
    ar_gpus: np.ndarray
    ar_size: np.ndarray
    ar_log: np.ndarray
    """log latency of the fastest all-reduce over (GPUs, message bytes)."""

    def rate(self, fmt: str) -> float:
        """Sustained FLOP/s of ``fmt``'s GEMMs: bf16's :attr:`Gemm.peak_rate`, times (another
        format) the median speed-up of its GEMMs over bf16's where both are compute-bound (m, n,
        k ≥ 4096). Not the format's own median over every large-m GEMM: W8A8's includes the
        dynamic quantisation of the input, which dominates its thin GEMMs (n or k of 32–512)."""
        bf16 = self.gemms["bf16"]
        if fmt == "bf16":
            return bf16.peak_rate
        m, n, k = (a[a >= 4096] for a in bf16.axes)
        ratios = [bf16(m, nn, kk) / self.gemms[fmt](m, nn, kk) for nn in n for kk in k]
        return bf16.peak_rate * float(np.median(np.concatenate(ratios)))

    def all_reduce(self, gpus: int, nbytes: np.ndarray) -> np.ndarray:
        """Latency of an all-reduce of ``nbytes`` over ``gpus`` devices (0 for one device)."""
        nbytes = np.asarray(nbytes, dtype=np.float64)
        if gpus <= 1:
            return np.zeros_like(nbytes)
        ig, wg = _segment(self.ar_gpus.astype(np.float64), np.array([float(gpus)]))
        i, w = _segment(self.ar_size.astype(np.float64), nbytes)
        v = 0.0
        for dg, fg in ((0, 1 - wg[0]), (1, wg[0])):
            row = self.ar_log[ig[0] + dg]
            v = v + fg * ((1 - w) * row[i] + w * row[i + 1])
        return np.exp(v)


def _prepare(z: np.ndarray, axes: list[np.ndarray], powers: list[float]) -> np.ndarray:
    """Milliseconds with NaN holes → log seconds, holes filled (see :func:`_fill_along`)."""
    z = z.astype(np.float64) * 1e-3
    for _ in range(2):
        for dim, (axis, p) in enumerate(zip(axes, powers)):
            if axis is not None:
                _fill_along(z, axis.astype(np.float64), dim, p)
    return np.log(z)


def _keep_measured(cfg: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keep = ~np.all(np.isnan(z), axis=(1, 2))
    return cfg[keep], z[keep]


@cache
def load(device: str, path: str | None = None) -> KernelTables:
    """The tables of ``device`` (a built-in set, or an ``.npz`` file written by the converter)."""
    if path is None:
        if device not in BUILTIN:
            raise KvcargoError(f"the calibrated cost model has measured kernel tables for {', '.join(BUILTIN)}, "
                               f"not {device!r} (give the device a kernel_tables file in a --catalog overlay)",
                               field="device")
        raw = builtin_arrays(device)
    else:
        if not Path(path).is_file():
            raise KvcargoError(f"device {device!r}: kernel_tables file {path} not found")
        try:
            npz = np.load(path)
            raw = dict(npz) if isinstance(npz, np.lib.npyio.NpzFile) else {}
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise KvcargoError(f"device {device!r}: kernel_tables file {path} is not a .npz of arrays ({clip(str(exc))})") from None
        missing = [k for k in ARRAYS if k not in raw]
        if missing:
            raise KvcargoError(f"device {device!r}: kernel_tables file {path} lacks {', '.join(missing)} (write it "
                               "with kvcargo calibrate --import-aiconfigurator)")
        if error := malformed(raw):
            raise KvcargoError(f"device {device!r}: kernel_tables file {path}: {error} (write it with kvcargo "
                               "calibrate --import-aiconfigurator)")
    return from_arrays(raw)


def malformed(raw: dict[str, np.ndarray]) -> str | None:
    """What is wrong with a user's tables file, or None: each table's axes are increasing positive
    numbers, its values match them in shape and hold a measured (positive) cell, and a format's
    arrays come complete or not at all."""
    groups = [("ar", ("gpus", "size"), "ar_ms", False)]
    for fmt in FORMATS:
        x = suffix(fmt)
        groups += [(f"gemm{x}", ("m", "n", "k"), f"gemm{x}_ms", False),
                   (f"ctx{x}", ("b", "s"), f"ctx{x}_ms", True), (f"gen{x}", ("b", "s"), f"gen{x}_ms", True)]
    for kind, axes, values, by_cfg in groups:
        names = [f"{kind}_{a}" for a in axes] + [values] + ([f"{kind}_cfg"] if by_cfg else [])
        have = [n for n in names if n in raw]
        if not have:
            continue
        if len(have) < len(names):
            return f"{', '.join(n for n in names if n not in raw)} missing beside {', '.join(have)}"
        shape = [len(raw[f"{kind}_cfg"])] if by_cfg else []
        for a in axes:
            v = np.asarray(raw[f"{kind}_{a}"])
            if v.ndim != 1 or len(v) < 2 or not np.all(np.isfinite(v)) or v.min() <= 0 or np.any(np.diff(v) <= 0):
                return f"{kind}_{a} must list at least two increasing positive numbers"
            shape.append(len(v))
        z = np.asarray(raw[values], dtype=np.float64)
        if z.shape != tuple(shape):
            return f"{values} has shape {z.shape}, its axes say {tuple(shape)}"
        if by_cfg and np.asarray(raw[f"{kind}_cfg"]).shape[1:] != (3,):
            return f"{kind}_cfg must hold (heads, kv_heads, head_dim) rows"
        if not np.any(np.isfinite(z) & (z > 0)) or np.any(np.isfinite(z) & (z <= 0)):
            return f"{values} must hold positive milliseconds (NaN where unmeasured), at least one measured"
    return None


def builtin_arrays(name: str) -> dict[str, np.ndarray]:
    """A built-in ``data/calibration/<name>.npz`` as arrays."""
    from importlib import resources  # only where the calibrated model is used

    source = resources.files("kvcargo.data").joinpath(f"calibration/{name}.npz")
    with resources.as_file(source) as p:
        return dict(np.load(p))


def from_arrays(raw: dict[str, np.ndarray]) -> KernelTables:
    """Tables from the converter's arrays (milliseconds, NaN where unmeasured); a format whose
    arrays are absent (``gemm_fp8_*`` … in tables written before FP8 was converted) is left out."""
    gemms, contexts, generations = {}, {}, {}
    for fmt in FORMATS:
        x = suffix(fmt)
        if all(f"gemm{x}_{a}" in raw for a in ("m", "n", "k", "ms")):
            axes = tuple(raw[f"gemm{x}_{a}"].astype(np.float64) for a in ("m", "n", "k"))
            gemms[fmt] = Gemm(axes, _prepare(raw[f"gemm{x}_ms"], list(axes), [1.0, 1.0, 1.0]))
        for kind, out, shift, power, by_kv in (("ctx", contexts, 0.0, 2.0, False), ("gen", generations, 1.0, 1.0, True)):
            if all(f"{kind}{x}_{a}" in raw for a in ("cfg", "b", "s", "ms")):
                cfg, z = _keep_measured(raw[f"{kind}{x}_cfg"], raw[f"{kind}{x}_ms"])
                # generation: the step's KV length and the new token
                axes = (raw[f"{kind}{x}_b"].astype(np.float64), raw[f"{kind}{x}_s"].astype(np.float64) + shift)
                out[fmt] = Attention(cfg, axes, _prepare(z, [None, *axes], [0, 1.0, power]), by_kv)
    return KernelTables(
        gemms=gemms, contexts=contexts, generations=generations,
        ar_gpus=raw["ar_gpus"], ar_size=raw["ar_size"] * AR_VALUE_BYTES,
        ar_log=_prepare(raw["ar_ms"], [None, raw["ar_size"]], [0, 1.0]),
    )
