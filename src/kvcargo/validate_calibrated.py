"""The calibrated models against measurements they were not fitted to (``kvcargo validate --group calibrated``).

Each row is an error statistic — median and 90th percentile of ``|kvcargo / measured − 1|`` —
beside its target, with honest labels of what was and was not used to fit:

* kernel tables: the GEMM columns and attention head configurations the converter held out of
  the interpolated tables (``heldout_<device>.npz``, exact measured latencies), kernel by kernel
  and as whole steps of the models whose shapes they are (the reference step is assembled from
  every measured kernel, the held-out cells put back);
* Splitwise end to end (``perf_model_fit.csv``), per phase and TP degree: in-sample (the
  built-in constants are fitted to every Llama-2-70B row), then refitted without what is scored —
  each configuration in turn, the steps above 1,024 prompt tokens (or mean context 600), batch 8;
  for the large-step term (only the batch-8 prompts lie past its knee), batch 8 of one device
  with the term fitted on the other, and one TP degree's batch 8 — and BLOOM-176B, a model no
  constant is fitted to;
* Vidur's send/recv curves (the ib-ndr and nvlink4 constants are fitted to them: in-sample).

Data that is not shipped (the Splitwise and Vidur CSVs) is looked for under ``shared/data/calibration``
(or ``$KVCARGO_CALIBRATION_DIR``); without it those rows are skipped and say why.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import numpy as np

from kvcargo.kernel_tables import BUILTIN, load, suffix

GROUP = "calibrated"
DATA_DIRS = ("shared/data/calibration", "../shared/data/calibration", "data/calibration")
KERNEL_TARGET = (0.05, 0.15)
"""Held-out measured-table shapes: median and p90 targets."""
SPLITWISE_TARGET = {"decode": 0.15, "prefill": 0.20}
"""Splitwise end to end: median targets (token time, prompt time)."""
LINK_TARGET = 0.10
"""Send/recv curves: median target."""


def data_dir() -> Path | None:
    for c in (os.environ.get("KVCARGO_CALIBRATION_DIR"), *DATA_DIRS):
        if c and Path(c).is_dir():
            return Path(c)
    return None


def _stats(errors: np.ndarray) -> tuple[float, float]:
    a = np.abs(errors)
    return float(np.median(a)), float(np.percentile(a, 90))


def _row(what: str, source: str, errors: np.ndarray, median_target: float, p90_target: float | None,
         note: str = ""):  # type: ignore[no-untyped-def]
    from kvcargo.validate import Result

    med, p90 = _stats(errors)
    target = f"median ≤ {median_target:.0%}" + (f", p90 ≤ {p90_target:.0%}" if p90_target else "")
    shown = f"median {med:.1%}, p90 {p90:.1%} (n={len(errors):,})"
    ok = med <= median_target and (p90_target is None or p90 <= p90_target)
    return Result(GROUP, what, source, target, shown, med, None, "ok" if ok else "gap", note)


def _skipped(what: str, source: str, why: str):  # type: ignore[no-untyped-def]
    from kvcargo.validate import Result

    return Result(GROUP, what, source, "—", "—", None, None, "skipped", why)


FORMAT_LABELS = {"bf16": ("GEMMs", "attention"), "fp8": ("fp8 (W8A8) GEMMs", "attention over an fp8 KV cache")}
"""Row labels per number format: GEMMs by compute format, attention by KV-cache format."""


def kernel_rows() -> list:
    """Interpolation error on the held-out kernel measurements, per device, kernel and format."""
    out = []
    src = "aiconfigurator-core (NVIDIA, Apache-2.0): silicon-measured vLLM kernels held out of kvcargo's tables"
    for dev in BUILTIN:
        t = load(dev)
        source = resources.files("kvcargo.data").joinpath(f"calibration/heldout_{dev}.npz")
        with resources.as_file(source) as p:
            held = dict(np.load(p))
        for fmt in t.gemms:
            x = suffix(fmt)
            g = held["gemm" + x]
            pred = np.empty(len(g))
            for n, k in {(n, k) for n, k in g[:, 1:3].tolist()}:  # one vectorised lookup per (n, k)
                sel = (g[:, 1] == n) & (g[:, 2] == k)
                pred[sel] = t.gemms[fmt](g[sel, 0], n, k)
            out.append(_row(f"{dev}: {FORMAT_LABELS[fmt][0]} at unseen n or k (2560, 3584, 5120, 10240)", src,
                            pred / (g[:, 3] * 1e-3) - 1, *KERNEL_TARGET))
        for fmt in t.contexts:
            x = suffix(fmt)
            kinds: list[tuple[str, str, Callable, float]] = [
                ("ctx", "context", t.contexts[fmt], 0.0), ("gen", "generation", t.generations[fmt], 1.0)]
            for key, label, fn, shift in kinds:
                r = held[key + x]
                pred = np.array([fn(int(h), int(kv), int(d), np.array([b]), np.array([s + shift]))[0]
                                 for h, kv, d, b, s, _ in r])
                out.append(_row(f"{dev}: {label} {FORMAT_LABELS[fmt][1]}, unseen head configurations", src,
                                pred / (r[:, 5] * 1e-3) - 1, *KERNEL_TARGET,
                                note="held out: (heads, KV heads, head size) = (40, 8, 128), "
                                "(28, 4, 128), (20, 4, 128), (12, 2, 128)"))
    return out


SPLITWISE_MODELS = "calibration/splitwise_models.toml"
"""Catalog overlay with BLOOM-176B's shape, for scoring the constants on a model they never saw."""
PHASE_NAMES = {"prefill": "prompt time", "decode": "token time"}


def _shape(r) -> tuple:  # type: ignore[no-untyped-def]
    """A measured configuration apart from the hardware: what one cross-validation fold holds out."""
    return (r.phase, r.batch, r.tokens)


def _errors(test: list, table: dict, files: tuple[str, ...]) -> np.ndarray:
    from kvcargo.calibration_fit import predict

    return np.array([predict(r, table, files) / r.measured_s - 1 for r in test])


def splitwise_rows(root: Path | None) -> list:
    """Splitwise end to end, per phase and TP degree (both devices): in-sample, then six held-out
    designs — leave one configuration out, extrapolate to the larger steps, extrapolate to batch 8,
    the large-step term carried to the other device and to a held-out TP degree (prompt times),
    and a model the constants never saw (BLOOM-176B at TP 8)."""
    from dataclasses import replace

    from kvcargo.calibration_fit import fit, read_splitwise

    src = "Splitwise (Patel et al., ISCA'24), Mutinifni/splitwise-sim perf_model.csv (MIT)"
    path = root / "splitwise" / "perf_model_fit.csv" if root else None
    if path is None or not path.is_file():
        return [_skipped("Splitwise end to end", src, "splitwise/perf_model_fit.csv not found "
                         "(set KVCARGO_CALIBRATION_DIR)")]
    with resources.as_file(resources.files("kvcargo.data").joinpath(SPLITWISE_MODELS)) as overlay:
        files = (str(overlay),)
        measured = read_splitwise(path)
        llama = [r for r in measured if r.model == "llama2-70b"]
        bloom = [r for r in measured if r.model == "bloom-176b"]
        full = fit(llama, files)
        errors: dict[str, dict[tuple[str, int], list[float]]] = {
            k: {} for k in ("in", "logo", "tokens", "batch", "device", "tp")}

        def score(design: str, test: list, table: dict) -> None:
            for r, e in zip(test, _errors(test, table, files)):
                errors[design].setdefault((r.phase, r.tp), []).append(float(e))

        score("in", llama, full)
        for shape in sorted({_shape(r) for r in llama}):
            score("logo", [r for r in llama if _shape(r) == shape], fit([r for r in llama if _shape(r) != shape], files))

        def large_tokens(r) -> bool:  # type: ignore[no-untyped-def]
            return r.batch * r.tokens > 1024 if r.phase == "prefill" else r.tokens > 600

        for design, held in (("tokens", large_tokens), ("batch", lambda r: r.batch >= 8)):
            score(design, [r for r in llama if held(r)], fit([r for r in llama if not held(r)], files))
        for other, dev in (("h100", "a100"), ("a100", "h100")):  # no batch 1–4 step lies past the knee
            own = fit([r for r in llama if r.device == dev and r.batch < 8], files)
            large = full[(other, 8)].large_step
            score("device", [r for r in llama if r.device == dev and r.batch >= 8 and r.phase == "prefill"],
                  {key: replace(f, large_step=large) for key, f in own.items()})
        for tp in (2, 4, 8):
            held = [r.tp == tp and r.batch >= 8 and r.phase == "prefill" for r in llama]
            train = [r for r, h in zip(llama, held) if not h]
            score("tp", [r for r, h in zip(llama, held) if h], fit(train, files))
        out = _bloom_rows(bloom, full, files, src)
    labels = {
        "in": ("fit rows, in-sample", "every Llama-2-70B row fits the constants"),
        "logo": ("leave one configuration out",
                 "refitted without one (batch, prompt, output) configuration on both devices, scored on it; "
                 "every configuration in turn"),
        "tokens": ("larger steps held out",
                   "fitted on steps of ≤ 1,024 prompt tokens (prefill) or mean context ≤ 600 (decode), "
                   "scored on the larger ones (2,048–4,096 prompt tokens; outputs of 512–1,024)"),
        "batch": ("batch 8 held out", "fitted on batches 1–4 (no step past the large-step knee: its term is 0), "
                  "scored on batch 8"),
        "device": ("batch 8 of the other device",
                   "large_step fitted on the other device's rows, every other constant on this device's "
                   "batches 1–4; scored on this device's batch 8 (both ways)"),
        "tp": ("one TP degree's batch 8 held out",
               "refitted without one TP degree's batch-8 prompt times on both devices (large_step from the "
               "other degrees, ∝ log2(TP/2)), scored on them; every degree in turn"),
    }
    rows = []
    for design, (what, note) in labels.items():
        for phase in ("prefill", "decode"):
            for tp in (2, 4, 8):
                e = errors[design].get((phase, tp))
                if e:
                    rows.append(_row(f"Llama-2-70B TP{tp}, H100+A100: {PHASE_NAMES[phase]}, {what}", src,
                                     np.array(e), SPLITWISE_TARGET[phase], None, note=note))
    return rows + out


def _bloom_rows(bloom: list, table: dict, files: tuple[str, ...], src: str) -> list:
    """BLOOM-176B at TP 8: constants fitted to Llama-2-70B alone (the host floor scales with layers)."""
    e = _errors(bloom, table, files)
    return [_row(f"BLOOM-176B TP8, H100+A100: {PHASE_NAMES[phase]}, model held out", src,
                 e[[r.phase == phase for r in bloom]], SPLITWISE_TARGET[phase], None,
                 note="constants fitted to Llama-2-70B only; BLOOM's shape from its config (multi-head "
                 "attention, GELU MLP) through the same kernel tables")
            for phase in ("prefill", "decode") if any(r.phase == phase for r in bloom)]


def link_rows(root: Path | None) -> list:
    """The measured link model against Vidur's send/recv medians (2 KiB … 64 MiB)."""
    from kvcargo.linkmodel import message_s, read_send_recv
    from kvcargo.validate import _link

    src = "Vidur (microsoft/vidur @ 7d475133) NCCL send/recv medians (MIT)"
    cases = (("ib-ndr", "h100_dgx", True), ("nvlink4", "h100_pairwise_nvlink", False), ("ib-hdr", "a100_dgx", True))
    out = []
    for key, system, across in cases:
        path = root / "vidur-network" / system / "send_recv.csv" if root else None
        what = f"{key}: send/recv {system}, {'across nodes' if across else 'within a node'}"
        if path is None or not path.is_file():
            out.append(_skipped(what, src, f"vidur-network/{system}/send_recv.csv not found"))
            continue
        link = _link(key)
        n, t = read_send_recv(path, across)
        out.append(_row(what, src, message_s(link, n) / t - 1, LINK_TARGET, None,
                        note="in-sample: the link's message_overhead_s and efficiency are fitted to this curve"))
    return out


def measured_value(check: dict) -> float:
    """kvcargo's value for a published link figure under ``--link-model measured`` (and, for the
    layer-wise checks, ``--cost-model calibrated`` prefill times)."""
    from kvcargo.catalog import Link
    from kvcargo.cost import shape
    from kvcargo.linkmodel import layerwise_exposed, transfer_s
    from kvcargo.steps import step
    from kvcargo.validate import _link, _model

    if check["kind"] == "layerwise_exposed":
        model = _model(check["model"])
        t_p = step(model.key, check["device"], check["devices"], "prefill", 1, check["prompt"], "calibrated",
                   "last")["time_s"]
        return layerwise_exposed(_link(check["link"]), shape(model).handoff_bytes(check["prompt"]), t_p,
                                 model.layers)
    fields = {k: check[k] for k in ("message_overhead_s", "efficiency", "channel_cap") if k in check}
    link = Link(key="check", name="check", bandwidth=check["bandwidth"], latency=check["latency"], **fields)
    return check["bytes"] / float(transfer_s(link, check["bytes"], check["channels"]))


def results() -> list:
    """Every calibrated row."""
    root = data_dir()
    return kernel_rows() + step_rows() + splitwise_rows(root) + link_rows(root)


# ------------------------------------------------------------- step level, held-out models

HELD_MODELS = (("qwen2.5-7b", (1, 2, 4)), ("qwen2.5-32b", (1, 2, 4, 8)), ("gemma2-9b", (1, 2, 4)))
"""Models whose dimensions (d_model 3584 or 5120) and per-device head configurations the tables
held out, at the TP degrees scored."""
PREFILL_SHAPES = ((1, 128), (1, 512), (1, 2048), (1, 8192), (4, 512), (8, 2048))
DECODE_SHAPES = ((1, 512), (8, 512), (8, 4096), (64, 1024), (256, 2048))


def merged_arrays(dev: str) -> dict[str, np.ndarray]:
    """The converter's arrays with the held-out measurements put back: every measured cell, in
    every format."""
    from kvcargo.kernel_tables import FORMATS, builtin_arrays

    raw, held = builtin_arrays(dev), builtin_arrays(f"heldout_{dev}")
    out = dict(raw)
    for x in (suffix(f) for f in FORMATS if "gemm" + suffix(f) in held):
        g = held["gemm" + x]
        axes = [raw[f"gemm{x}_m"], np.union1d(raw[f"gemm{x}_n"], g[:, 1]), np.union1d(raw[f"gemm{x}_k"], g[:, 2])]
        z = np.full([len(a) for a in axes], np.nan, dtype=np.float64)
        i_n, i_k = np.searchsorted(axes[1], raw[f"gemm{x}_n"]), np.searchsorted(axes[2], raw[f"gemm{x}_k"])
        z[:, i_n[:, None], i_k[None, :]] = raw[f"gemm{x}_ms"]
        z[np.searchsorted(axes[0], g[:, 0]), np.searchsorted(axes[1], g[:, 1]),
          np.searchsorted(axes[2], g[:, 2])] = g[:, 3]
        out.update({f"gemm{x}_n": axes[1], f"gemm{x}_k": axes[2], f"gemm{x}_ms": z})
    for key in (kind + suffix(f) for f in FORMATS for kind in ("ctx", "gen") if kind + suffix(f) in held):
        r = held[key]
        cfgs = [tuple(c) for c in raw[f"{key}_cfg"].tolist()]
        extra = sorted({tuple(int(v) for v in row[:3]) for row in r.tolist()} - set(cfgs))
        all_cfg = cfgs + extra
        zz = np.full((len(all_cfg), *raw[f"{key}_ms"].shape[1:]), np.nan)
        zz[: len(cfgs)] = raw[f"{key}_ms"]
        index = {c: i for i, c in enumerate(all_cfg)}
        for h, kv, d, b, s, ms in r.tolist():
            zz[index[(int(h), int(kv), int(d))], np.searchsorted(raw[f"{key}_b"], b),
               np.searchsorted(raw[f"{key}_s"], s)] = ms
        out[f"{key}_cfg"], out[f"{key}_ms"] = np.array(all_cfg, dtype=np.int64), zz
    return out


def step_rows() -> list:
    """Kernel step times of held-out models, per device and format (bf16; W8A8 with an fp8 KV
    cache where measured): the shipped (thinned) tables against the same step assembled from
    every measured cell."""
    from kvcargo import catalog
    from kvcargo.calibrated import CalibratedPool
    from kvcargo.kernel_tables import from_arrays

    src = "aiconfigurator-core (NVIDIA, Apache-2.0): steps of held-out models from measured kernels"
    cat = catalog.builtin()
    out = []
    for dev in BUILTIN:
        full, thin = from_arrays(merged_arrays(dev)), load(dev)
        for fmt in (f for f in thin.gemms if f in thin.contexts):
            errors = []
            for key, tps in HELD_MODELS:
                model = cat.model(key)
                if model.head_dim not in thin.contexts[fmt].cfg[:, 2]:
                    continue  # the device has no measured kernels of this head size (A100: 128 only)
                for tp in tps:
                    pools = [CalibratedPool(model, cat.device(dev), tp, t, fmt, fmt) for t in (thin, full)]
                    for b, s in PREFILL_SHAPES:
                        x, bb = np.array([float(b * s)]), np.array([float(b)])
                        t = [p.layer_tokens_s(x) + p.logits_s(bb) + p.context_s(bb, np.array([float(s)]))
                             for p in pools]
                        errors.append(float(t[0][0] / t[1][0] - 1))
                    for b, c in DECODE_SHAPES:
                        bb = np.array([float(b)])
                        t = [p.layer_tokens_s(bb) + p.logits_s(bb) + p.generation_s(bb, np.array([c + 1.0]))
                             for p in pools]
                        errors.append(float(t[0][0] / t[1][0] - 1))
            what = "step times" if fmt == "bf16" else "W8A8 fp8 step times, fp8 KV cache,"
            out.append(_row(f"{dev}: {what} of Qwen2.5-7B/32B, Gemma-2-9B at TP 1-8 (held-out shapes)", src,
                            np.array(errors), *KERNEL_TARGET,
                            note="the same step from every measured kernel (held-out cells put back) is the reference"))
    return out
