"""Wire a resolved configuration into the engine, run it, and return the raw records.

This is the only engine module that touches catalog objects: it asks the cost model and the
hand-off physics for coefficient arrays and per-request transfer figures, so the event handlers
only ever see numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcargo.config import Resolved
from kvcargo.cost import model_coefficients, shape
from kvcargo.engine import _jit
from kvcargo.engine.loop import run_events
from kvcargo.engine.state import (
    F_LINK_BUSY,
    F_LINK_J,
    F_NOW,
    F_TRANSIT_J,
    I_LINK_FREE,
    I_NSTEPS,
    I_XFERS,
    P_BUDGET,
    P_CHANNELS,
    P_COLOCATED,
    P_ENDPOINT,
    P_KVCAP,
    P_MAXBATCH,
    P_NDECODE,
    P_NPREFILL,
    Params,
    State,
    new_state,
)
from kvcargo.handoff import Transfers, endpoint_work, transfers


@dataclass(frozen=True)
class EngineOutput:
    """What one run produced: per-request timestamps, per-instance totals, the step log."""

    resolved: Resolved
    state: State
    params: Params
    steps: np.ndarray
    """Decode steps in the order they ended: columns start, end."""
    step_inst: np.ndarray
    """Per logged step: instance index (within the decode or colocated pool) and batch size."""
    horizon: float
    transfers: int
    link_busy_s: float
    link_j: float
    transit_j: float
    transit_bound: np.ndarray
    wire_bytes: np.ndarray
    """Per request: bytes its hand-off puts on the wire (0 in colocated mode)."""


def build_params(res: Resolved) -> tuple[Params, Transfers]:
    """Coefficient arrays and per-request hand-off figures for the engine."""
    w = res.workload
    prompt = np.ascontiguousarray(w.prompt, dtype=np.int64)
    output = np.ascontiguousarray(w.output, dtype=np.int64)
    n = len(prompt)
    mi, mf = model_coefficients(res.model, res.config.lm_head)
    kv_bytes = prompt * shape(res.model).kv_per_token
    zeros = np.zeros(n)
    endpoint = False
    ep_ops = ep_bytes = zeros
    if res.colocated:
        xfer = transfers(res.link, None, zeros, res.model.kv_bytes)
    else:
        xfer = transfers(res.link, res.compression, kv_bytes, res.model.kv_bytes)
        if res.compression is not None and res.compression.at == "endpoint":
            endpoint = True
            ep_ops, ep_bytes = endpoint_work(res.compression, kv_bytes, prompt, res.model.kv_bytes)
    ints = np.zeros(8, dtype=np.int64)
    ints[P_NPREFILL] = res.n_prefill
    ints[P_NDECODE] = res.n_decode
    ints[P_COLOCATED] = int(res.colocated)
    ints[P_BUDGET] = res.config.token_budget
    ints[P_MAXBATCH] = res.config.max_batch
    ints[P_KVCAP] = res.kv_capacity
    ints[P_ENDPOINT] = int(endpoint)
    ints[P_CHANNELS] = res.channels
    params = Params(
        arrival=np.ascontiguousarray(w.arrival, dtype=np.float64), prompt=prompt, output=output,
        quad=prompt * (prompt + 1), xfer_time=np.ascontiguousarray(xfer.duration, dtype=np.float64),
        xfer_j=np.ascontiguousarray(xfer.link_j, dtype=np.float64),
        transit_j=np.ascontiguousarray(xfer.transit_j, dtype=np.float64),
        ep_ops=np.ascontiguousarray(ep_ops, dtype=np.float64),
        ep_bytes=np.ascontiguousarray(ep_bytes, dtype=np.float64),
        mi=mi, mf=mf, hf_prefill=res.prefill_pool.coefficients(), hf_decode=res.decode_pool.coefficients(),
        ints=ints,
    )
    return params, xfer


def run(res: Resolved) -> EngineOutput:
    """Simulate a resolved configuration."""
    params, xfer = build_params(res)
    n = len(params.arrival)
    n_slots = max(res.n_prefill, res.n_decode) if res.colocated else res.n_prefill
    st = new_state(n, n_slots, res.n_decode, res.n_prefill + res.n_decode)
    st.i[I_LINK_FREE] = res.channels
    guess = max(1024, int(params.output.sum() // 8))
    logf = [np.empty((guess, 2))]
    logi = [np.empty((guess, 2), dtype=np.int64)]
    if _jit.ENABLED:
        from numba.typed import List

        logf, logi = List(logf), List(logi)
    run_events(st, params, logf, logi)
    k = int(st.i[I_NSTEPS])
    return EngineOutput(
        resolved=res, state=st, params=params,
        steps=logf[0][:k].copy(), step_inst=logi[0][:k].copy(),
        horizon=float(st.f[F_NOW]), transfers=int(st.i[I_XFERS]),
        link_busy_s=float(st.f[F_LINK_BUSY]), link_j=float(st.f[F_LINK_J]),
        transit_j=float(st.f[F_TRANSIT_J]), transit_bound=xfer.transit_bound,
        wire_bytes=xfer.wire_bytes,
    )
