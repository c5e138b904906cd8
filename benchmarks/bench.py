"""kvcargo's speed and memory, measured (run: ``.venv/bin/python benchmarks/bench.py``).

1. The same 20,000-request stream (spec §8.1: Llama-3-8B, 1 H100 prefill + 1 H100 decode,
   InfiniBand, 8 req/s, prompts 2048 ± cv 0.5, outputs 256 ± cv 0.5, seed 1) through kvcargo
   and the test suite's SimPy oracle, in this process; the request timestamps must be identical.
2. A 1,000,000-request run (8 prefill + 5 decode H100 instances, InfiniBand, 100 req/s) as a
   whole ``kvcargo simulate ... --json`` process: wall time and peak memory (and with
   ``--summary-only``).
3. The same 20,000 requests with numba disabled (the plain-Python path), for scale.
4. A capacity bisection of the §8.1 configuration (when the planner is installed).
5. The same 20,000 requests under ``--cost-model calibrated --link-model measured`` against the
   default roofline, in this process (best of 3, tabulation included; the target is at most 2×).
Prints measured numbers and ratios; nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

ONE_MILLION = ["--model", "llama3-8b", "--prefill", "8", "--decode", "5", "--link", "ib-ndr", "--rate", "100",
               "--requests", "1000000", "--seed", "1"]


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def timed_child(args: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall seconds and peak resident memory (MB) of one child process."""
    t = time.perf_counter()
    child = subprocess.Popen(args, stdout=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - t
    if status:
        raise SystemExit(f"{' '.join(args)} failed")
    return wall, usage.ru_maxrss / 1024


def best_of(k: int, fn: Callable[[], T]) -> tuple[float, T]:
    """The fastest of k runs (timeit's convention: slower runs measure the machine's noise)."""
    best, value = math.inf, None
    for _ in range(k):
        t = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t)
    return best, value  # type: ignore[return-value]


def versus_oracle(n: int) -> None:
    """The same stream through both: the simulation alone (request records out, as the oracle
    produces) and with kvcargo's full summary on top."""
    from oracle import run_oracle

    from kvcargo import simulate
    from kvcargo.config import SimConfig, resolve
    from kvcargo.engine.cluster import run

    _ = simulate(requests=200).summary  # load the compiled engine once (numba's on-disk cache)
    config = SimConfig.build(requests=n)
    res = resolve(config)
    t_run, out = best_of(5, lambda: run(resolve(config)))
    t_all, _ = best_of(5, lambda: simulate(config).summary)
    t_or, ora = best_of(2, lambda: run_oracle(res.workload, model=res.model, prefill_pool=res.prefill_pool,
                                              decode_pool=res.decode_pool, link=res.link))
    same = all(np.array_equal(getattr(out, c), getattr(ora, c), equal_nan=True)
               for c in ("prefill_start", "first_token", "kv_start", "kv_ready", "decode_start", "finish"))
    print(f"{n:,} requests (spec §8.1), identical timestamps: {same}; best of 5 runs (oracle: of 2)\n"
          f"  oracle (SimPy) {t_or:.2f} s; kvcargo simulation {t_run * 1e3:.0f} ms → {t_or / t_run:.0f}x; "
          f"with the full summary {t_all * 1e3:.0f} ms → {t_or / t_all:.0f}x")


def calibrated_vs_roofline(n: int) -> None:
    from kvcargo import SimConfig, simulate

    roof = SimConfig(requests=n)
    cal = roof.replace(cost_model="calibrated", link_model="measured")
    simulate(roof)  # compiled engine loaded
    simulate(cal)
    t_roof, _ = best_of(3, lambda: simulate(roof).summary)
    t_cal, _ = best_of(3, lambda: simulate(cal).summary)
    print(f"{n:,} requests, calibrated + measured vs roofline: {t_cal:.3f} s vs {t_roof:.3f} s "
          f"({t_cal / t_roof:.2f}×)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=20_000, help="size of the oracle comparison")
    ap.add_argument("--skip-million", action="store_true")
    args = ap.parse_args()
    print(f"machine: {machine()}")
    # Whole-process figures first: a child's peak memory counts its parent's at the fork, so the
    # parent must still be small (before the oracle and the engine are loaded here).
    exe = [sys.executable, "-m", "kvcargo", "simulate"]
    if not args.skip_million:
        wall, peak = timed_child(exe + ONE_MILLION + ["--json"])
        print(f"1,000,000 requests, `kvcargo simulate ... --json`: {wall:.1f} s wall, {peak:,.0f} MB peak")
        wall, peak = timed_child(exe + ONE_MILLION + ["--summary-only"])
        print(f"1,000,000 requests, `--summary-only`: {wall:.1f} s wall, {peak:,.0f} MB peak")
    env = {**os.environ, "KVCARGO_JIT": "0"}
    wall, peak = timed_child(exe + ["--requests", str(args.requests), "--json"], env)
    print(f"{args.requests:,} requests, plain Python (KVCARGO_JIT=0), whole process: {wall:.1f} s, {peak:,.0f} MB")
    versus_oracle(args.requests)
    from kvcargo.config import SimConfig
    from kvcargo.planner.capacity import search

    search(SimConfig.build())  # the compiled engine is loaded
    t = time.perf_counter()
    result = search(SimConfig.build())
    print(f"capacity bisection (spec §8.1 configuration): {time.perf_counter() - t:.3f} s, "
          f"{result.simulations} simulations → {result.rate:.2f} req/s")
    calibrated_vs_roofline(args.requests)


if __name__ == "__main__":
    main()
