"""Fitting the calibrated model's free constants to end-to-end step measurements.

The kernel tables fix what the GPU does; a serving framework adds what it does around them. Per
device and phase the calibrated step time is (:mod:`kvcargo.calibrated`)

* prefill: ``max(layers · prefill_host_s_per_layer, prefill_scale · compute + comm_scale · comm
  + large_step · past_knee)`` — the GPU runs the step's GEMMs, attention and elementwise kernels
  (``compute``) ``prefill_scale`` times slower than the measured ones (older kernels, less fusion)
  and its all-reduces (``comm``) ``comm_scale`` times slower than the fastest measured all-reduce,
  while the host prepares and launches the step layer by layer asynchronously: a short prompt
  cannot finish before the host has launched it, a long one is GPU-bound. Splitwise's prompt
  times show exactly that: flat at 48–58 ms (DGX-H100) and 64–67 ms (DGX-A100) for prompts up to
  256 tokens at every TP degree, then linear in the prompt tokens — up to :data:`kvcargo.calibrated.KNEE_TOKENS`
  per step; past it they grow faster at TP 4 and 8 (a step of 4,096 tokens costs 2.8× one of
  2,048 on the H100 at TP8), for reasons the kernel tables cannot show. ``past_knee`` charges
  that: the measured compute kernels × ``max(0, m − knee) / m`` (m prompt tokens in the step) ×
  ``max(0, log2(TP / 2))`` — nothing at TP ≤ 2 or at ``m ≤ knee``, linear in the tokens past it;
* decode: ``decode_scale · compute + comm_scale · comm + decode_overhead_s`` per TP degree — the
  per-step framework cost (scheduling, sampling, host-device synchronisation on the new token)
  does not overlap the step, and grows with the TP degree (one more process to synchronise).

Both are fitted on the *relative* error, so short and long steps weigh alike: prefill by a grid
search over the three constants of each device (shared by every TP degree) with ``large_step`` in
closed form at every grid point (least squares over the steps past the knee, clamped at 0; 0
when no step lies past the knee at TP > 2: a framework without the 2023 stack's jump need not
have one), decode by least
squares with the kernels at their own speed (scale 1), the device's ``comm_scale``, and one
overhead per TP degree.

The built-in constants (``data/calibration/framework.toml``) were fitted to Splitwise's end-to-end
measurements of Llama-2-70B on DGX-H100 and DGX-A100 (Patel et al., ISCA'24; MIT), with
``kvcargo calibrate --steps ../shared/data/calibration/splitwise/perf_model_fit.csv``; a device or
TP degree they do not cover is interpolated (or extrapolated) linearly in log2(TP) from the
fitted degrees of the same device (H200 and B200 borrow the H100's), overheads clamped at zero;
a device with none runs unscaled with no overhead.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from kvcargo import measured_csv
from kvcargo.calibrated import past_knee, tp_factor
from kvcargo.errors import KvcargoError, clip, shown

FRAMEWORK_FALLBACK = {"h200": "h100", "b200": "h100"}
"""Devices without fitted framework constants borrow another's."""
HARDWARE_KEYS = {"a100-80gb": "a100", "h100-80gb": "h100"}
"""Splitwise's hardware names → kvcargo device keys (power-capped runs are not step-time data)."""


@dataclass(frozen=True)
class Framework:
    """Fitted constants of one (device, TP) (see the module doc for the step-time formulas)."""

    prefill_scale: float = 1.0
    prefill_host_s_per_layer: float = 0.0
    comm_scale: float = 1.0
    decode_scale: float = 1.0
    decode_overhead_s: float = 0.0
    large_step: float = 0.0
    """Prefill past the knee: the factor on the compute kernels past it per doubling of TP above 2
    (:attr:`KernelTime.past_knee`); 0 in an overlay written before it existed."""

    def prefill_s(self, kernels: KernelTime, layers: int) -> float:
        """A prefill step of measured ``kernels`` on a model of ``layers`` layers."""
        gpu = (self.prefill_scale * kernels.compute + self.comm_scale * kernels.comm
               + self.large_step * kernels.past_knee)
        return max(layers * self.prefill_host_s_per_layer, gpu)

    def decode_s(self, kernels: KernelTime) -> float:
        return self.decode_scale * kernels.compute + self.comm_scale * kernels.comm + self.decode_overhead_s


@dataclass(frozen=True)
class KernelTime:
    """A step's measured kernel seconds: the all-reduces apart from everything else."""

    compute: float
    comm: float
    past_knee: float = 0.0
    """Prefill: ``compute · past_knee(m) · tp_factor(TP)``, what ``large_step`` multiplies."""


@dataclass(frozen=True)
class StepRow:
    """One measured step: B prompts of P tokens (prefill) or B sequences at a context (decode)."""

    model: str
    device: str
    tp: int
    phase: str
    batch: int
    tokens: float
    """Prefill: prompt length; decode: mean context per sequence."""
    measured_s: float


@cache
def builtin_constants() -> dict[tuple[str, int], Framework]:
    import tomllib  # only where the calibrated model is used
    from importlib import resources

    text = resources.files("kvcargo.data").joinpath("calibration/framework.toml").read_text(encoding="utf-8")
    return parse_constants(tomllib.loads(text))


def parse_constants(doc: dict) -> dict[tuple[str, int], Framework]:
    """``[device.tpN] prefill_scale = …`` tables → constants by (device, TP)."""
    out = {}
    for device, per_tp in doc.items():
        for tp_key, fields in per_tp.items():
            if not tp_key.startswith("tp") or not tp_key[2:].isdigit() or int(tp_key[2:]) < 1:
                raise KvcargoError(f"framework constants [{device}.{tp_key}]: expected a table named tpN (N >= 1)")
            known = set(Framework.__dataclass_fields__)
            if set(fields) - known:
                raise KvcargoError(f"framework constants [{device}.{tp_key}]: unknown "
                                   f"{', '.join(sorted(set(fields) - known))}; valid: {', '.join(sorted(known))}")
            for k, v in fields.items():
                if not (math.isfinite(v) and (v > 0 if k.endswith("scale") else v >= 0)):
                    what = ("> 0 (a slowdown factor)" if k.endswith("scale")
                            else ">= 0 (a factor)" if k == "large_step" else ">= 0 (seconds)")
                    raise KvcargoError(f"framework constants [{device}.{tp_key}]: {k} must be a finite number "
                                       f"{what}, got {v!r}")
            out[(device, int(tp_key[2:]))] = Framework(**fields)
    return out


def framework(device: str, tp: int, table: dict[tuple[str, int], Framework] | None = None) -> Framework:
    """The constants of ``device`` at ``tp``: fitted, or linear in log2(TP) between (beyond: from)
    the two nearest fitted degrees, overheads clamped at 0 (see the module doc)."""
    table = builtin_constants() if table is None else table
    for dev in (device, FRAMEWORK_FALLBACK.get(device)):
        tps = sorted(t for d, t in table if d == dev)
        if tp in tps:
            return table[(dev, tp)]
        if len(tps) == 1:
            return table[(dev, tps[0])]
        if tps:
            i = min(max(bisect.bisect(tps, tp), 1), len(tps) - 1)
            pair = tps[i - 1:i + 1]
            a, b = table[(dev, pair[0])], table[(dev, pair[1])]
            w = (np.log2(tp) - np.log2(pair[0])) / (np.log2(pair[1]) - np.log2(pair[0]))
            mix = {k: (1 - w) * getattr(a, k) + w * getattr(b, k) for k in a.__dict__}
            return Framework(**{k: max(0.0, float(v)) for k, v in mix.items()})
    return Framework()


SPLITWISE_COLUMNS = ("model", "hardware", "tensor_parallel", "batch_size", "prompt_size", "token_size",
                     "prompt_time", "token_time")


def read_splitwise(path: str | Path) -> list[StepRow]:
    """Splitwise's ``perf_model.csv`` rows as prefill and decode steps (medians of the repeats)."""
    return _splitwise(path, *measured_csv.read(path))


def _splitwise(path: str | Path, header: list[str], lines: list[measured_csv.Row]) -> list[StepRow]:
    missing = [c for c in SPLITWISE_COLUMNS if c not in header]
    if missing:
        raise KvcargoError(f"{path}: not a Splitwise perf_model CSV (missing columns {', '.join(missing)})")
    groups: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    seen = set()
    for i, r in lines:
        seen.add(r["hardware"])
        dev = HARDWARE_KEYS.get(r["hardware"] or "")
        if dev is None:
            continue
        key = (r["model"], dev, *(measured_csv.count(path, i, r, c) for c in SPLITWISE_COLUMNS[2:6]))
        groups[key].append(tuple(measured_csv.positive(path, i, r, c) * 1e-3 for c in SPLITWISE_COLUMNS[6:]))
    if not groups:
        raise KvcargoError(f"{path}: no rows of hardware {', '.join(HARDWARE_KEYS)} "
                           f"(found {clip(', '.join(sorted(map(str, seen)))) or 'none'})")
    rows = []
    for (model, dev, tp, b, p, t), v in sorted(groups.items()):
        pt, tt = np.median([a for a, _ in v]), np.median([c for _, c in v])
        rows.append(StepRow(model, dev, tp, "prefill", b, p, float(pt)))
        rows.append(StepRow(model, dev, tp, "decode", b, p + t / 2, float(tt)))
    return rows


REQUEST_COLUMNS = ("model", "device", "tp", "prompt", "output", "ttft_s", "tpot_s")


def read_requests(path: str | Path) -> list[StepRow]:
    """Per-request TTFT/TPOT of a benchmark run (``model,device,tp,prompt,output,ttft_s,tpot_s``,
    optional ``batch``: the concurrency the run held) as steps: TTFT is one prefill of the prompt,
    TPOT one decode step at the mid-output context. Valid for runs without queueing (one request
    at a time, or a fixed concurrency below the server's limits)."""
    return _requests(path, *measured_csv.read(path))


def _requests(path: str | Path, header: list[str], lines: list[measured_csv.Row]) -> list[StepRow]:
    missing = [c for c in REQUEST_COLUMNS if c not in header]
    if missing:
        raise KvcargoError(f"{path}: missing columns {', '.join(missing)}")
    rows = []
    for i, r in lines:
        tp, p, o = (measured_csv.count(path, i, r, c) for c in ("tp", "prompt", "output"))
        b = measured_csv.count(path, i, r, "batch") if r.get("batch") else 1
        ttft, tpot = (measured_csv.positive(path, i, r, c) for c in ("ttft_s", "tpot_s"))
        rows.append(StepRow(r["model"] or "", r["device"] or "", tp, "prefill", 1, p, ttft))
        if o > 1:
            rows.append(StepRow(r["model"] or "", r["device"] or "", tp, "decode", b, p + o / 2, tpot))
    return rows


STEP_COLUMNS = ("model", "device", "tp", "phase", "batch", "tokens", "time_s")


def read_steps(path: str | Path) -> list[StepRow]:
    """A CSV of step times: ``model,device,tp,phase,batch,tokens,time_s`` (a header row),
    per-request TTFT/TPOT (:func:`read_requests`) or Splitwise's ``perf_model.csv`` layout."""
    header, lines = measured_csv.read(path)
    if "prompt_time" in header:
        return _splitwise(path, header, lines)
    if "ttft_s" in header:
        return _requests(path, header, lines)
    missing = [c for c in STEP_COLUMNS if c not in header]
    if missing:
        raise KvcargoError(f"{path}: missing columns {', '.join(missing)} (need {', '.join(STEP_COLUMNS)}, "
                           "or a Splitwise perf_model CSV)")
    rows = []
    for i, r in lines:
        if r["phase"] not in ("prefill", "decode"):
            raise KvcargoError(f"{path}, line {i}: phase must be prefill or decode, got {shown(r['phase'])}")
        tokens = measured_csv.positive(path, i, r, "tokens")
        if tokens < 1:
            raise KvcargoError(f"{path}, line {i}: tokens must be >= 1, got {shown(r['tokens'])}")
        rows.append(StepRow(r["model"] or "", r["device"] or "", measured_csv.count(path, i, r, "tp"), r["phase"],
                            measured_csv.count(path, i, r, "batch"), tokens,
                            measured_csv.positive(path, i, r, "time_s")))
    return rows


@cache
def kernel_time(row: StepRow, catalog_files: tuple[str, ...] = ()) -> KernelTime:
    """The calibrated model's kernel times for a measured step (no framework constants; the LM
    head over the last prompt token, as serving frameworks compute it)."""
    from kvcargo import catalog
    from kvcargo.calibrated import calibrated_pool
    from kvcargo.cost import Pool

    cat = catalog.load(catalog_files)
    model, device = cat.model(row.model), cat.device(row.device)
    cp = calibrated_pool(model, Pool(device, row.tp))
    b = np.array([float(row.batch)])
    if row.phase == "prefill":
        m = b * row.tokens
        t = cp.layer_compute_s(m) + cp.logits_s(b) + cp.context_s(b, np.array([row.tokens]))
        compute = float(t[0])
        return KernelTime(compute, float(cp.layer_reduce_s(m)[0]),
                          compute * past_knee(float(m[0])) * tp_factor(row.tp))
    m = b
    t = cp.layer_compute_s(m) + cp.logits_s(b) + cp.generation_s(b, np.array([row.tokens + 1.0]))
    return KernelTime(float(t[0]), float(cp.layer_reduce_s(m)[0]))


def fit_decode(tps: np.ndarray, kernels: np.ndarray, measured: np.ndarray) -> dict[int, float]:
    """One overhead per TP degree minimising Σ((k + overhead_tp)/y − 1)², each ≥ 0."""
    out = {}
    for t in sorted(set(tps.tolist())):
        sel = tps == t
        w = 1.0 / measured[sel]
        out[t] = max(0.0, float(np.sum(w * (1.0 - kernels[sel] * w)) / np.sum(w * w)))
    return out


def fit_prefill(compute: np.ndarray, comm: np.ndarray, layers: np.ndarray, measured: np.ndarray,
                past: np.ndarray | None = None) -> tuple[float, float, float, float]:
    """``(scale, comm_scale, host seconds per layer, large_step)`` minimising
    Σ(max(layers·h, scale·compute + comm_scale·comm + large_step·past)/y − 1)²: a grid search, then
    a finer grid around the best point (the objective is not smooth in h); ``large_step`` in closed
    form at each (scale, comm_scale) — least squares over the rows with ``past`` > 0 (far above the
    host floor), clamped at 0 — and 0 without such rows."""
    past = np.zeros_like(compute) if past is None else past
    sel = past > 0

    def search(scales: np.ndarray, comms: np.ndarray, hosts: np.ndarray) -> tuple[float, float, float, float]:
        gpu = scales[:, None, None] * compute + comms[None, :, None] * comm  # (scale, comm, row)
        large = np.zeros(gpu.shape[:2])
        if sel.any():
            a, g = past[sel] / measured[sel], gpu[..., sel] / measured[sel]
            large = np.maximum(0.0, ((1.0 - g) * a).sum(axis=2) / (a * a).sum())
            gpu = gpu + large[..., None] * past
        best = (np.inf, 0.0, 0.0, 0.0, 0.0)
        for h in hosts:
            err = ((np.maximum(gpu, h * layers) / measured - 1.0) ** 2).sum(axis=2)
            i, j = np.unravel_index(np.argmin(err), err.shape)
            if err[i, j] < best[0]:
                best = (float(err[i, j]), float(scales[i]), float(comms[j]), float(h), float(large[i, j]))
        return best[1:]

    h_max = float((measured / layers).max())
    coarse = np.geomspace(0.25, 8.0, 61)  # 6% steps
    s, c, h, _ = search(coarse, coarse if comm.any() else np.ones(1), np.linspace(0.0, h_max, 61))
    fine = np.linspace(0.94, 1.06, 25)
    return search(s * fine, c * fine if comm.any() else np.ones(1),
                  np.linspace(max(0.0, h - h_max / 60), h + h_max / 60, 21))


def fit(rows: list[StepRow], catalog_files: tuple[str, ...] = ()) -> dict[tuple[str, int], Framework]:
    """Fitted constants per (device, TP) from measured steps (module doc): the prefill scales, host
    time and large-step factor per device, shared by all its TP degrees; then the decode overhead
    per TP degree with the device's all-reduce scale. A TP degree measured in one phase only takes the other phase's
    constants as :func:`framework` would give them (shared, or interpolated between the measured
    degrees), not neutral ones, which would drag the interpolation to other degrees; a device
    without prefill rows keeps scales of 1, one without decode rows no overhead."""
    from kvcargo import catalog

    cat = catalog.load(catalog_files)
    by: dict[tuple[str, str], list[tuple[int, KernelTime, int, float]]] = defaultdict(list)
    for r in rows:
        by[(r.device, r.phase)].append((r.tp, kernel_time(r, catalog_files), cat.model(r.model).layers, r.measured_s))
    degrees: dict[str, set[int]] = defaultdict(set)
    for r in rows:
        degrees[r.device].add(r.tp)
    fields: dict[tuple[str, int], dict[str, float]] = {(d, t): {} for d, ts in degrees.items() for t in ts}
    comm_scale: dict[str, float] = {}
    for (dev, phase), pts in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1] != "prefill")):
        tps = np.array([p[0] for p in pts], dtype=np.int64)
        compute = np.array([p[1].compute for p in pts])
        comm = np.array([p[1].comm for p in pts])
        layers = np.array([p[2] for p in pts], dtype=np.float64)
        y = np.array([p[3] for p in pts])
        if phase == "prefill":
            past = np.array([p[1].past_knee for p in pts])
            scale, comm_scale[dev], host, large = fit_prefill(compute, comm, layers, y, past)
            for tp in degrees[dev]:
                fields[(dev, tp)].update(prefill_scale=scale, prefill_host_s_per_layer=host, large_step=large)
        else:
            c = comm_scale.get(dev, 1.0)
            fitted = {(dev, tp): Framework(decode_overhead_s=o) for tp, o in fit_decode(tps, compute + c * comm, y).items()}
            for tp in degrees[dev]:
                fields[(dev, tp)].update(decode_scale=1.0,
                                         decode_overhead_s=framework(dev, tp, fitted).decode_overhead_s)
    for (dev, _tp), f in fields.items():
        f["comm_scale"] = comm_scale.get(dev, 1.0)
    return {key: Framework(**f) for key, f in sorted(fields.items())}


def predict(row: StepRow, table: dict[tuple[str, int], Framework] | None = None,
            catalog_files: tuple[str, ...] = ()) -> float:
    """The calibrated step time of a measured step under fitted constants."""
    from kvcargo import catalog

    f = framework(row.device, row.tp, table)
    k = kernel_time(row, catalog_files)
    if row.phase == "prefill":
        return f.prefill_s(k, catalog.load(catalog_files).model(row.model).layers)
    return f.decode_s(k)


def to_toml(table: dict[tuple[str, int], Framework]) -> str:
    """Constants as the TOML ``framework.toml`` holds (and a catalog overlay's ``[framework]``)."""
    lines = []
    for (dev, tp), f in sorted(table.items()):
        lines.append(f"[{dev}.tp{tp}]")
        lines += [f"{k} = {v!r}" for k, v in f.__dict__.items()]
        lines.append("")
    return "\n".join(lines)
