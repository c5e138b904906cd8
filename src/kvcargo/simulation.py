"""The Python API of the simulator: ``simulate(config) -> SimResult``.

>>> from kvcargo import SimConfig, simulate
>>> r = simulate(SimConfig(link="eth-25g"))
>>> round(r.summary["tpot_p99"] * 1e3, 1)
11.6
"""

from __future__ import annotations

import math
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kvcargo.ced import replay_on_decode
from kvcargo.config import SimConfig, resolve
from kvcargo.engine.cluster import EngineOutput, run
from kvcargo.engine.state import REJECTED
from kvcargo.errors import KvcargoError
from kvcargo.limits import MAX_CLOCK_S
from kvcargo.metrics import summarize
from kvcargo.outputs import atomic_path
from kvcargo.workload import Workload

if TYPE_CHECKING:
    from kvcargo.summary import Summary

REQUEST_COLUMNS = ("rid", "arrival", "prompt_len", "output_len", "prefill_start", "first_token",
                   "kv_start", "kv_ready", "decode_start", "finish")


class SimResult:
    """One run: per-request records, per-instance totals and the summary."""

    def __init__(self, output: EngineOutput) -> None:
        self.output = output

    @property
    def config(self) -> SimConfig:
        return self.output.resolved.config

    @cached_property
    def summary(self) -> dict[str, Any]:
        """Every metric of the run (SI units); see the README for the keys."""
        return summarize(self.output)

    @cached_property
    def grouped(self) -> Summary:
        """The summary grouped by what it measures (latency, SLO, link, energy, instances, cost)."""
        from kvcargo.summary import Summary

        return Summary.of(self.summary)

    def requests(self) -> dict[str, np.ndarray]:
        """Per-request columns (NaN where a stage does not apply or the request was rejected)."""
        o = self.output
        return {
            "rid": np.arange(len(o.arrival)),
            "arrival": o.arrival, "prompt_len": o.prompt, "output_len": o.output,
            "prefill_start": o.prefill_start, "first_token": o.first_token,
            "kv_start": o.kv_start, "kv_ready": o.kv_ready,
            "decode_start": o.decode_start, "finish": o.finish,
            "rejected": o.status == REJECTED,
        } | ({"prefill_done": o.prefill_done} if replay_on_decode(o.resolved.model) else {})

    def to_dict(self) -> dict[str, Any]:
        """Plain data: the configuration and the summary."""
        return {"config": self.config.values(), "summary": self.summary}

    def write_requests_csv(self, path: str | Path) -> None:
        """One row per request; empty cells where a stage does not apply; floats as ``repr``. When
        the first token comes from the decode side, a last column ``prefill_done``."""
        import csv

        cols = self.requests()
        names = REQUEST_COLUMNS + (("prefill_done",) if "prefill_done" in cols else ())
        with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(names)
            data = [cols[c].tolist() for c in names]
            for row in zip(*data):
                w.writerow(["" if isinstance(v, float) and math.isnan(v) else repr(v) if isinstance(v, float) else v
                            for v in row])


def simulate(config: SimConfig | None = None, workload: Workload | str | None = None, *, summary_only: bool = False,
             **overrides: Any) -> SimResult:
    """Run one simulation. ``overrides`` are configuration fields (``rate=12, link="eth-25g"``);
    ``workload`` is a request stream, or the name of a preset (the ``--workload`` field).
    ``summary_only`` (``--summary-only``): the engine keeps of its step log only what the summary
    reads and, where it can, holds only a window of the requests (engine/window.py): the same
    summary, bit for bit, in less memory; the result's step log (and then its per-request
    records) are empty."""
    if isinstance(workload, str):
        overrides["workload"], workload = workload, None
    if config is None:
        config = SimConfig.build(**overrides)
    elif overrides:
        config = config.replace(**overrides)
    out = run(resolve(config, workload), fold_steps=summary_only)
    if not out.horizon <= MAX_CLOCK_S:  # (NaN too)
        raise KvcargoError(f"the simulated clock reached {out.horizon:.3g} s, beyond {MAX_CLOCK_S:g} s (about 32 "
                           "years), where float64 seconds no longer resolve step times: a step, transfer or think "
                           "time is far longer than the model represents")
    return SimResult(out)
