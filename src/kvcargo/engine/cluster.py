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
from kvcargo.engine import state as S
from kvcargo.engine.loop import run_events
from kvcargo.engine.state import Params, by_reference, new_state, with_log_capacity
from kvcargo.handoff import Transfers, endpoint_work, transfers


@dataclass(frozen=True)
class EngineOutput:
    """What one run produced: per-request timestamps, per-instance totals, the step log.

    Timestamps are NaN where a stage did not happen (no hand-off, rejected request).
    """

    resolved: Resolved
    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    prefill_start: np.ndarray
    first_token: np.ndarray
    kv_start: np.ndarray
    kv_ready: np.ndarray
    decode_start: np.ndarray
    finish: np.ndarray
    status: np.ndarray
    """PENDING, DONE or REJECTED (see engine.state)."""
    prefill_inst: np.ndarray
    decode_inst: np.ndarray
    first_step: np.ndarray
    """Per request: ordinal of its first decode step on its decode instance."""
    stats: np.ndarray
    """Per instance (prefill first): busy s, FLOPs, bytes, compute J, memory J, steps."""
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
    """Per request: bytes its hand-off puts on the wire."""


def build_params(res: Resolved) -> tuple[Params, Transfers]:
    """Coefficient arrays and per-request hand-off figures for the engine."""
    w = res.workload
    prompt = np.ascontiguousarray(w.prompt, dtype=np.int64)
    n = len(prompt)
    kv_bytes = shape(res.model).handoff_bytes(prompt)
    rf = np.zeros((n, 6))
    rf[:, S.ARRIVAL_T] = w.arrival
    endpoint = False
    if res.colocated:
        xfer = transfers(res.link, None, np.zeros(n), res.model.kv_bytes)
    else:
        xfer = transfers(res.link, res.compression, kv_bytes, res.model.kv_bytes)
        rf[:, S.XFER_TIME] = xfer.duration
        rf[:, S.XFER_J] = xfer.link_j
        rf[:, S.TRANSIT_J] = xfer.transit_j
        if res.compression is not None and res.compression.at == "endpoint":
            endpoint = True
            rf[:, S.EP_OPS], rf[:, S.EP_BYTES] = endpoint_work(res.compression, kv_bytes, prompt, res.model.kv_bytes)
    ri = np.empty((n, 3), dtype=np.int64)
    ri[:, S.PROMPT] = prompt
    ri[:, S.OUTPUT] = w.output
    ri[:, S.QUAD] = prompt * (prompt + 1)
    ints = np.zeros(8, dtype=np.int64)
    ints[S.P_NPREFILL] = res.n_prefill
    ints[S.P_NDECODE] = res.n_decode
    ints[S.P_COLOCATED] = int(res.colocated)
    ints[S.P_BUDGET] = res.config.token_budget
    ints[S.P_MAXBATCH] = res.config.max_batch
    ints[S.P_KVCAP] = res.kv_capacity
    ints[S.P_ENDPOINT] = int(endpoint)
    ints[S.P_CHANNELS] = res.channels
    mi, mf = model_coefficients(res.model, res.config.lm_head)
    hf = np.stack([res.prefill_pool.coefficients(), res.decode_pool.coefficients()])
    return Params(rf=rf, ri=ri, mi=mi, mf=mf, hf=hf, ints=ints), xfer


def run(res: Resolved) -> EngineOutput:
    """Simulate a resolved configuration."""
    params, xfer = build_params(res)
    n = len(params.rf)
    n_slots = res.n_decode if res.colocated else res.n_prefill
    # A first guess at the number of decode steps (output tokens / 8); the engine pauses when
    # its log is full and resumes with a larger one.
    guess = max(1024, int(params.ri[:, S.OUTPUT].sum() // 8))
    st = new_state(n, n_slots, res.n_decode, res.n_prefill + res.n_decode, res.config.max_batch,
                   res.channels, guess)
    pr = by_reference(params)
    while run_events(by_reference(st), pr):
        st = with_log_capacity(st, 2 * len(st.logf))
    k = int(st.i[S.I_NSTEPS])
    t, r = st.t, st.r
    return EngineOutput(
        resolved=res, arrival=params.rf[:, S.ARRIVAL_T], prompt=params.ri[:, S.PROMPT],
        output=params.ri[:, S.OUTPUT],
        prefill_start=t[:, S.PREFILL_START], first_token=t[:, S.FIRST_TOKEN], kv_start=t[:, S.KV_START],
        kv_ready=t[:, S.KV_READY], decode_start=t[:, S.DECODE_START], finish=t[:, S.FINISH],
        status=r[:, S.STATUS], prefill_inst=r[:, S.PREFILL_INST], decode_inst=r[:, S.DECODE_INST],
        first_step=r[:, S.FIRST_STEP], stats=st.stats[:, : S.S_STEPS + 1],
        steps=st.logf[:k], step_inst=st.logi[:k],
        horizon=float(st.f[S.F_NOW]), transfers=int(st.i[S.I_XFERS]),
        link_busy_s=float(st.f[S.F_LINK_BUSY]), link_j=float(st.f[S.F_LINK_J]),
        transit_j=float(st.f[S.F_TRANSIT_J]), transit_bound=xfer.transit_bound, wire_bytes=xfer.wire_bytes,
    )
