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
ARRAYS = ("gemm_m", "gemm_n", "gemm_k", "gemm_ms", "ctx_cfg", "ctx_b", "ctx_s", "ctx_ms", "gen_cfg", "gen_b", "gen_s",
          "gen_ms", "ar_gpus", "ar_size", "ar_ms")
"""The arrays of a kernel-tables file (:func:`from_arrays`)."""
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
class KernelTables:
    """One system's measured kernel latencies (seconds)."""

    gemm_axes: tuple[np.ndarray, np.ndarray, np.ndarray]
    gemm_log: np.ndarray
    """log latency over (m, n, k)."""
    ctx_cfg: np.ndarray
    """(heads, kv_heads, head_dim) of each context-attention table."""
    ctx_axes: tuple[np.ndarray, np.ndarray]
    ctx_log: np.ndarray
    """log latency over (config, batch, prompt length)."""
    gen_cfg: np.ndarray
    gen_axes: tuple[np.ndarray, np.ndarray]
    gen_log: np.ndarray
    """log latency over (config, batch, KV length)."""
    ar_gpus: np.ndarray
    ar_size: np.ndarray
    ar_log: np.ndarray
    """log latency of the fastest all-reduce over (GPUs, message bytes)."""

    # ------------------------------------------------------------------ lookups (vectorised)

    def gemm(self, m: np.ndarray, n: float, k: float) -> np.ndarray:
        """Latency of an (m × k) · (k × n) bf16 GEMM for every m."""
        m = np.asarray(m, dtype=np.float64)
        im, wm = _segment(self.gemm_axes[0], m)
        i_n, wn = _segment(self.gemm_axes[1], np.array([n]))
        ik, wk = _segment(self.gemm_axes[2], np.array([k]))
        out = np.zeros_like(m)
        for dm, fm in ((0, 1 - wm), (1, wm)):
            for dn, fn in ((0, 1 - wn[0]), (1, wn[0])):
                for dk, fk in ((0, 1 - wk[0]), (1, wk[0])):
                    out += fm * fn * fk * self.gemm_log[im + dm, i_n[0] + dn, ik[0] + dk]
        return np.exp(out)

    def _attention(self, cfgs: np.ndarray, axes: tuple[np.ndarray, np.ndarray], table: np.ndarray,
                   heads: int, kv_heads: int, head_dim: int, b: np.ndarray, s: np.ndarray,
                   by_kv: bool) -> np.ndarray:
        b = np.asarray(b, dtype=np.float64)
        s = np.asarray(s, dtype=np.float64)
        ib, wb = _segment(axes[0], b)
        is_, ws = _segment(axes[1], s)

        def at(c: int) -> np.ndarray:
            z = table[c]
            v = ((1 - wb) * (1 - ws) * z[ib, is_] + wb * (1 - ws) * z[ib + 1, is_]
                 + (1 - wb) * ws * z[ib, is_ + 1] + wb * ws * z[ib + 1, is_ + 1])
            return np.exp(v)

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
        scale = kv_heads / kv if by_kv else 1.0
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
        return at(near) * (scale if by_kv else heads / h_near)

    def context_attention(self, heads: int, kv_heads: int, head_dim: int, batch: np.ndarray,
                          prompt: np.ndarray) -> np.ndarray:
        """One layer's attention over ``batch`` prompts of ``prompt`` tokens each (prefill)."""
        return self._attention(self.ctx_cfg, self.ctx_axes, self.ctx_log, heads, kv_heads, head_dim,
                               batch, prompt, by_kv=False)

    def generation_attention(self, heads: int, kv_heads: int, head_dim: int, batch: np.ndarray,
                             kv_len: np.ndarray) -> np.ndarray:
        """One layer's attention for ``batch`` new tokens over ``kv_len`` cached tokens each."""
        return self._attention(self.gen_cfg, self.gen_axes, self.gen_log, heads, kv_heads, head_dim,
                               batch, kv_len, by_kv=True)

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

    @property
    def peak_gemm_rate(self) -> float:
        """Median FLOP/s of the measured large GEMMs (m ≥ 4096): the sustained tensor rate."""
        m, n, k = self.gemm_axes
        big = m >= 4096
        flops = 2.0 * m[big, None, None] * n[None, :, None] * k[None, None, :]
        return float(np.median(flops / np.exp(self.gemm_log[big])))


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
    return from_arrays(raw)


def builtin_arrays(name: str) -> dict[str, np.ndarray]:
    """A built-in ``data/calibration/<name>.npz`` as arrays."""
    from importlib import resources  # only where the calibrated model is used

    source = resources.files("kvcargo.data").joinpath(f"calibration/{name}.npz")
    with resources.as_file(source) as p:
        return dict(np.load(p))


def from_arrays(raw: dict[str, np.ndarray]) -> KernelTables:
    """Tables from the converter's arrays (milliseconds, NaN where unmeasured)."""
    g_axes = (raw["gemm_m"].astype(np.float64), raw["gemm_n"].astype(np.float64), raw["gemm_k"].astype(np.float64))
    ctx_cfg, ctx = _keep_measured(raw["ctx_cfg"], raw["ctx_ms"])
    gen_cfg, gen = _keep_measured(raw["gen_cfg"], raw["gen_ms"])
    ctx_axes = (raw["ctx_b"].astype(np.float64), raw["ctx_s"].astype(np.float64))
    gen_axes = (raw["gen_b"].astype(np.float64), raw["gen_s"].astype(np.float64) + 1.0)  # step + the new token
    return KernelTables(
        gemm_axes=g_axes, gemm_log=_prepare(raw["gemm_ms"], list(g_axes), [1.0, 1.0, 1.0]),
        ctx_cfg=ctx_cfg, ctx_axes=ctx_axes, ctx_log=_prepare(ctx, [None, *ctx_axes], [0, 1.0, 2.0]),
        gen_cfg=gen_cfg, gen_axes=gen_axes, gen_log=_prepare(gen, [None, *gen_axes], [0, 1.0, 1.0]),
        ar_gpus=raw["ar_gpus"], ar_size=raw["ar_size"] * AR_VALUE_BYTES,
        ar_log=_prepare(raw["ar_ms"], [None, raw["ar_size"]], [0, 1.0]),
    )
