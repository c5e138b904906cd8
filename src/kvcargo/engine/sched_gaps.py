"""Token gaps of the scheduled engine, from its runs and its step log.

The engine records, per request, *runs* of tokens on consecutive logged steps of one instance
(:mod:`.sched_loop`): a run's first token carries its gap (NaN for a request's first token),
every later token's gap is the instance's step-to-step gap, the same float as the token's own
``now − last_token``. So a million requests need a few numbers each, not one per token.
"""

from __future__ import annotations

import numpy as np

from kvcargo._jit import kernel
from kvcargo.engine.sched_state import RUN_INST, RUN_M, RUN_ORD, RUN_R
from kvcargo.engine.steplog import step_positions


@kernel
def per_request(ends, log_inst, n_inst, runi, runf, n_req):
    """Every request's token gaps in token order, flat, and each request's offsets into them."""
    order, start = step_positions(log_inst, n_inst)
    count = np.zeros(n_req + 1, dtype=np.int64)
    for k in range(runi.shape[0]):
        extra = 0 if np.isnan(runf[k]) else 1
        count[runi[k, RUN_R] + 1] += extra + runi[k, RUN_M] - 1
    offsets = np.cumsum(count)
    values = np.empty(offsets[n_req])
    fill = offsets[:n_req].copy()
    for k in range(runi.shape[0]):
        r = runi[k, RUN_R]
        if not np.isnan(runf[k]):
            values[fill[r]] = runf[k]
            fill[r] += 1
        base = start[runi[k, RUN_INST]] + runi[k, RUN_ORD]
        for t in range(1, runi[k, RUN_M]):
            values[fill[r]] = ends[order[base + t]] - ends[order[base + t - 1]]
            fill[r] += 1
    return values, offsets


@kernel
def _weighted(ends, log_inst, n_inst, runi, runf, selected):
    """The gaps of the selected requests as (values, multiplicities): each run's own gap, then
    every logged step's gap weighted by the selected runs that continue through it."""
    order, start = step_positions(log_inst, n_inst)
    n_steps = order.shape[0]
    n_runs = runi.shape[0]
    values = np.empty(n_runs + n_steps)
    weights = np.zeros(n_runs + n_steps, dtype=np.int64)
    delta = np.zeros(n_steps + 1, dtype=np.int64)
    for k in range(n_runs):
        values[k] = 0.0
        if not selected[runi[k, RUN_R]]:
            continue
        if not np.isnan(runf[k]):
            values[k] = runf[k]
            weights[k] = 1
        if runi[k, RUN_M] > 1:
            base = start[runi[k, RUN_INST]] + runi[k, RUN_ORD]
            delta[base + 1] += 1
            delta[base + runi[k, RUN_M]] -= 1
    level = 0
    inst = 0
    for q in range(n_steps):
        level += delta[q]
        while q >= start[inst + 1]:
            inst += 1
        if q > start[inst]:
            values[n_runs + q] = ends[order[q]] - ends[order[q - 1]]
            weights[n_runs + q] = level
        else:
            values[n_runs + q] = 0.0
    return values, weights


def weighted(ends: np.ndarray, log_inst: np.ndarray, n_inst: int, runi: np.ndarray, runf: np.ndarray,
             requests: np.ndarray, n_req: int) -> tuple[np.ndarray, np.ndarray]:
    """The token gaps of ``requests`` as (values, multiplicities)."""
    selected = np.zeros(n_req, dtype=np.bool_)
    selected[requests] = True
    return _weighted(ends, log_inst, n_inst, runi, runf, selected)
