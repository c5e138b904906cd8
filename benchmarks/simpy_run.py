"""A companion-style SimPy run as a whole process, the yardstick of ``benchmarks/bench.py``.

``simpy_run.py simulate N``: the test suite's SimPy oracle (``tests/oracle``) on the default
scenario with ``N`` requests, then the TTFT and TPOT p99 printed, as a SimPy simulator's
``simulate`` would. ``simpy_run.py capacity``: the same bisection as ``kvcargo capacity`` (the
planner's search loop) with every probe simulated by the oracle.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from oracle import OracleResult, run_oracle  # noqa: E402

from kvcargo.config import SimConfig, resolve  # noqa: E402


def oracle_run(config: SimConfig) -> OracleResult:
    res = resolve(config)
    return run_oracle(res.workload, model=res.model, prefill_pool=res.prefill_pool, decode_pool=res.decode_pool,
                      link=res.link)


def latencies(config: SimConfig, o: OracleResult) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TTFT, TPOT and whether each is inside its SLO, over the steady requests (first 10% by
    arrival skipped)."""
    steady = np.argsort(o.arrival, kind="stable")[len(o.arrival) // 10:]
    ttft = (o.first_token - o.arrival)[steady]
    multi = o.output[steady] >= 2
    tpot = np.zeros(len(steady))
    tpot[multi] = ((o.finish - o.first_token)[steady] / np.maximum(o.output[steady] - 1, 1))[multi]
    met = (ttft <= config.ttft_slo) & (tpot <= config.tpot_slo) & ~o.rejected[steady]
    return ttft, tpot[multi], met


def probe(config: SimConfig) -> dict[str, Any]:
    _, _, met = latencies(config, oracle_run(config))
    return {"slo_attainment": float(met.mean())}


def main() -> None:
    what = sys.argv[1]
    if what == "simulate":
        config = SimConfig.build(requests=int(sys.argv[2]))
        ttft, tpot, _ = latencies(config, oracle_run(config))
        print(f"TTFT p99 {np.percentile(ttft, 99) * 1e3:.1f} ms, TPOT p99 {np.percentile(tpot, 99) * 1e3:.1f} ms")
    elif what == "capacity":
        from kvcargo.planner.capacity import search

        found = search(SimConfig.build(), probe=probe)
        print(f"capacity {found.rate:.2f} req/s in {len(found.probes)} simulations")
    else:
        raise SystemExit(f"unknown run {what!r}; valid: simulate N, capacity")


if __name__ == "__main__":
    main()
