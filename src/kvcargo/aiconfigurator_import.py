"""Import aiconfigurator-core's silicon-measured kernel tables as kvcargo's compact tables.

Needs pyarrow and an installed (or unpacked) ``aiconfigurator-core`` wheel (NVIDIA, Apache-2.0,
https://pypi.org/project/aiconfigurator-core/) — only here: the calibrated cost model reads the
result with numpy alone. ``kvcargo calibrate --import-aiconfigurator SYSTEM --device KEY --tables
FILE.npz`` converts one system for a catalog device; ``scripts/convert_aiconfigurator.py``
rebuilds the built-in tables.

Per system the output ``.npz`` holds the vLLM tables:

* ``gemm_m/n/k`` and ``gemm_ms[m, n, k]``: GEMM latency (ms), the default bf16 kernel;
* ``ctx_cfg[c] = (heads, kv_heads, head_dim)``, ``ctx_b``, ``ctx_s`` and ``ctx_ms[c, b, s]``:
  context (prefill) attention by batch and prompt length, bf16 KV cache;
* ``gen_cfg``, ``gen_b``, ``gen_s`` and ``gen_ms[c, b, s]``: generation attention by batch and KV length;
* where the system measured them (H100, H200, B200; not the A100, which has no FP8 units), the
  same arrays with ``_fp8`` after the kind (``gemm_fp8_m`` … ``gen_fp8_ms``): the W8A8 GEMM (FP8
  weights and activations, per-tensor scales: vLLM's CUTLASS scaled-mm, not the block-scaled
  kernels) and the attention kernels over an FP8 KV cache (queries and arithmetic in bf16);
* ``ar_gpus``, ``ar_size`` and ``ar_ms[g, s]``: the fastest measured all-reduce (vLLM's custom
  all-reduce under CUDA graphs, or NCCL) by GPU count and message size in bf16 values, as
  aiconfigurator records it (:data:`kvcargo.kernel_tables.AR_VALUE_BYTES` converts on loading).

Built-in tables hold out GEMM columns whose n or k is in ``HELD_N_K`` and the attention head
configurations in ``HELD_HEADS`` (in every format), written as exact measured rows to
``heldout_<device>.npz`` (``kvcargo validate --group calibrated`` scores the interpolation on
them). Missing cells are NaN.
"""

from __future__ import annotations

import argparse
import glob
import os
from collections import defaultdict

import numpy as np

from kvcargo.errors import KvcargoError
from kvcargo.kernel_tables import suffix

SYSTEMS = {"h100_sxm": "h100", "h200_sxm": "h200", "a100_sxm": "a100", "b200_sxm": "b200"}
"""aiconfigurator system → kvcargo device key."""
HELD_N_K = (2560, 3584, 5120, 10240)
"""GEMM dimensions the interpolation never sees (Qwen2.5-7B's d = 3584, Qwen2.5-32B's 5120, ...)."""
HELD_HEADS = ((40, 8, 128), (28, 4, 128), (20, 4, 128), (12, 2, 128))
"""Attention configurations the interpolation never sees (Qwen2.5-32B at TP 1, Qwen2.5-7B ...)."""
DTYPES = {"bf16": "bfloat16", "fp8": "fp8"}
"""kvcargo's number format → aiconfigurator's ``gemm_dtype`` / ``kv_cache_dtype``."""
OUT = os.path.join(os.path.dirname(__file__), "data", "calibration")


def newest(root: str, pattern: str) -> str | None:
    """The newest vLLM version's file matching ``pattern`` (``gemm/vllm/*/gemm_perf.parquet``)."""
    files = glob.glob(os.path.join(root, pattern))
    key = lambda f: [int(p) if p.isdigit() else 0 for p in f.split(os.sep)[-2].replace("rc", ".").split(".")]
    return max(files, key=key) if files else None


def rows(path: str) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise KvcargoError("importing aiconfigurator tables needs pyarrow (pip install pyarrow)") from None
    return pq.read_table(path).to_pylist()


def grid(points: dict[tuple, list[float]], axes: list[list[int]]) -> np.ndarray:
    """Median of the repeats at each grid point; NaN where nothing was measured."""
    out = np.full([len(a) for a in axes], np.nan, dtype=np.float32)
    index = [{v: i for i, v in enumerate(a)} for a in axes]
    for key, values in points.items():
        out[tuple(index[d][v] for d, v in enumerate(key))] = float(np.median(values))
    return out


def main_kernel(table: list[dict]) -> str:
    """The kernel implementation with the most measurements (one per table, not a mix)."""
    counts: dict[str, int] = defaultdict(int)
    for r in table:
        counts[r["kernel_source"]] += 1
    return max(counts, key=counts.get)


def gemm(table: list[dict], fmt: str, held_n_k: tuple[int, ...]) -> tuple[dict, dict]:
    table = [r for r in table if r["gemm_dtype"] == DTYPES[fmt]]
    if not table:
        return {}, {}
    prefix = "gemm" + suffix(fmt)
    kernel = main_kernel(table)
    kept, held = defaultdict(list), defaultdict(list)
    for r in table:
        if r["kernel_source"] == kernel:
            target = held if r["n"] in held_n_k or r["k"] in held_n_k else kept
            target[(r["m"], r["n"], r["k"])].append(r["latency"])
    axes = [sorted({k[d] for k in kept}) for d in range(3)]
    held_rows = np.array([[*k, np.median(v)] for k, v in sorted(held.items())], dtype=np.float64).reshape(-1, 4)
    return ({f"{prefix}_m": axes[0], f"{prefix}_n": axes[1], f"{prefix}_k": axes[2], f"{prefix}_ms": grid(kept, axes)},
            {prefix: held_rows})


def attention(table: list[dict], fmt: str, size_col: str, kind: str,
              held_heads: tuple[tuple[int, int, int], ...]) -> tuple[dict, dict]:
    table = [r for r in table if r["kv_cache_dtype"] == DTYPES[fmt] and r.get("window_size", 0) == 0]
    if not table:
        return {}, {}
    prefix = kind + suffix(fmt)
    kernel = main_kernel(table)
    kept, held = defaultdict(list), defaultdict(list)
    for r in table:
        if r["kernel_source"] != kernel:
            continue
        cfg = (r["num_heads"], r["num_key_value_heads"], r["head_dim"])
        (held if cfg in held_heads else kept)[(cfg, r["batch_size"], r[size_col])].append(r["latency"])
    cfgs = sorted({k[0] for k in kept})
    axes = [cfgs, sorted({k[1] for k in kept}), sorted({k[2] for k in kept})]
    held_rows = np.array([[*k[0], k[1], k[2], np.median(v)] for k, v in sorted(held.items())],
                         dtype=np.float64).reshape(-1, 6)
    return ({f"{prefix}_cfg": np.array(cfgs, dtype=np.int64), f"{prefix}_b": axes[1], f"{prefix}_s": axes[2],
             f"{prefix}_ms": grid(kept, axes)}, {prefix: held_rows})


def all_reduce(root: str) -> dict:
    best: dict[tuple, float] = {}
    sources = [(newest(root, "comm/vllm/*/custom_allreduce_perf.parquet"), "bfloat16"),
               (newest(root, "comm/nccl/*/nccl_perf.parquet"), "half")]
    for path, dtype in sources:
        if path is None:
            continue
        for r in rows(path):
            if r["op_name"] != "all_reduce" or r.get("allreduce_dtype", r.get("nccl_dtype")) != dtype:
                continue
            if r.get("backend", "graph").endswith("eager"):
                continue
            key = (r["num_gpus"], r["message_size"])
            best[key] = min(best.get(key, np.inf), r["latency"])
    axes = [sorted({k[0] for k in best}), sorted({k[1] for k in best})]
    return {"ar_gpus": axes[0], "ar_size": axes[1], "ar_ms": grid({k: [v] for k, v in best.items()}, axes)}


def tables(data_root: str, system: str, hold_out: bool) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The compact tables of one system (and, with ``hold_out``, the held-out rows)."""
    root = os.path.join(data_root, system)
    if newest(root, "gemm/vllm/*/gemm_perf.parquet") is None:
        known = sorted(d for d in os.listdir(data_root) if newest(os.path.join(data_root, d), "gemm/vllm/*/*.parquet"))
        raise KvcargoError(f"aiconfigurator system {system!r} has no vLLM GEMM table; systems with one: "
                           f"{', '.join(known)}")
    held_n_k, held_heads = (HELD_N_K, HELD_HEADS) if hold_out else ((), ())
    out: dict = {}
    held: dict = {}
    gemms = rows(newest(root, "gemm/vllm/*/gemm_perf.parquet"))
    attn = [(rows(newest(root, f"attention/vllm/*/{phase}_attention_perf.parquet")), col, kind)
            for phase, col, kind in (("context", "isl", "ctx"), ("generation", "step", "gen"))]
    for fmt in DTYPES:
        parts = [gemm(gemms, fmt, held_n_k)] + [attention(t, fmt, col, kind, held_heads) for t, col, kind in attn]
        for t, h in parts:
            out.update(t)
            held.update(h)
    out.update(all_reduce(root))
    return {k: np.asarray(v) for k, v in out.items()}, held


def installed_data_root() -> str:
    """``systems/data`` of the installed aiconfigurator-core."""
    import importlib.util

    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        raise KvcargoError("aiconfigurator-core is not installed (pip install aiconfigurator-core)")
    return os.path.join(list(spec.submodule_search_locations)[0], "systems", "data")


def import_system(system: str, out_path: str, data_root: str | None = None) -> None:
    """Write one system's tables (nothing held out) to ``out_path``."""
    arrays, _ = tables(data_root or installed_data_root(), system, hold_out=False)
    np.savez_compressed(out_path, **arrays)


def rebuild_builtin(data_root: str, systems: list[str]) -> None:
    """Rewrite the built-in tables and their held-out rows."""
    os.makedirs(OUT, exist_ok=True)
    for system in systems:
        arrays, held = tables(data_root, system, hold_out=True)
        device = SYSTEMS[system]
        np.savez_compressed(os.path.join(OUT, f"{device}.npz"), **arrays)
        np.savez_compressed(os.path.join(OUT, f"heldout_{device}.npz"), **held)
        print(device, {k: v.shape for k, v in arrays.items() if v.ndim > 1}, {k: v.shape for k, v in held.items()})


def main() -> None:
    ap = argparse.ArgumentParser(description="Rebuild kvcargo's built-in kernel tables from aiconfigurator-core")
    ap.add_argument("data_root", help="aiconfigurator_core/systems/data of an unpacked wheel")
    ap.add_argument("--systems", nargs="*", default=list(SYSTEMS))
    args = ap.parse_args()
    rebuild_builtin(args.data_root, args.systems)
