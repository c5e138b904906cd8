"""The simulation state: plain arrays, one row per request or per instance.

No Python object per request or per token: the event handlers read and write these arrays, so
the same code runs as plain Python or compiled by numba. Queues are intrusive FIFO lists
threaded through ``qnext`` (a request sits in at most one queue at a time).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# Event kinds (the heap holds (time, seq, kind, index) tuples).
ARRIVAL, PREFILL_WAKE, PREFILL_DONE, GRANT, XFER_DONE, RELEASE, DECODE_WAKE, DECODE_DONE = range(8)

# Instance states.
IDLE, WAKING, BUSY = 0, 1, 2
# Request outcome.
PENDING, DONE, REJECTED = 0, 1, 2
# Scalar slots (``State.i``): event sequence, completed, rejected, stop flag, link channels free,
# link FIFO head and tail, transfers started, decode steps logged, arrival cursor.
I_SEQ, I_DONE, I_REJ, I_STOP, I_LINK_FREE, I_LQ_HEAD, I_LQ_TAIL, I_XFERS, I_NSTEPS, I_NEXT_ARR = range(10)
# Float slots (``State.f``): the clock, the arrival process's clock, link busy seconds, link
# joules, in-transit joules.
F_NOW, F_ARR_CLOCK, F_LINK_BUSY, F_LINK_J, F_TRANSIT_J = range(5)
# Per-instance statistics columns (``State.stats``).
S_BUSY, S_FLOPS, S_BYTES, S_EC, S_EM, S_STEPS = range(6)


class Params(NamedTuple):
    """Everything the engine reads but never writes: the workload, costs, limits."""

    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    quad: np.ndarray
    """prompt·(prompt + 1), the causal-attention term of a prefill."""
    xfer_time: np.ndarray
    """Seconds each request's hand-off holds a link channel."""
    xfer_j: np.ndarray
    transit_j: np.ndarray
    ep_ops: np.ndarray
    """Endpoint-compression work per request (zeros when not compressing on the GPU)."""
    ep_bytes: np.ndarray
    mi: np.ndarray
    mf: np.ndarray
    hf_prefill: np.ndarray
    hf_decode: np.ndarray
    ints: np.ndarray
    """[n_prefill, n_decode, colocated(0/1), token_budget, max_batch, kv_capacity, endpoint(0/1),
    channels]."""


P_NPREFILL, P_NDECODE, P_COLOCATED, P_BUDGET, P_MAXBATCH, P_KVCAP, P_ENDPOINT, P_CHANNELS = range(8)


class State(NamedTuple):
    """Everything the engine writes."""

    # per request
    prefill_start: np.ndarray
    first_token: np.ndarray
    kv_start: np.ndarray
    kv_ready: np.ndarray
    decode_start: np.ndarray
    finish: np.ndarray
    status: np.ndarray
    prefill_inst: np.ndarray
    decode_inst: np.ndarray
    first_step: np.ndarray
    """Ordinal (per decode instance) of the request's first decode step."""
    qnext: np.ndarray
    # prefill instances (colocated instances use the decode columns below)
    p_head: np.ndarray
    p_tail: np.ndarray
    p_tokens: np.ndarray
    p_state: np.ndarray
    p_batch: np.ndarray
    p_batch_n: np.ndarray
    # decode (or colocated) instances
    d_head: np.ndarray
    d_tail: np.ndarray
    d_queued: np.ndarray
    d_running: np.ndarray
    d_context: np.ndarray
    d_kv_used: np.ndarray
    d_steps: np.ndarray
    d_state: np.ndarray
    d_is_prefill: np.ndarray
    """Colocated only: 1 while the step in flight is a prefill step."""
    d_step_start: np.ndarray
    # per-instance statistics, prefill instances first
    stats: np.ndarray
    # scalars
    i: np.ndarray
    f: np.ndarray


def new_state(n: int, n_prefill: int, n_decode: int, n_stats: int) -> State:
    """Fresh state for ``n`` requests (NaN timestamps mean "did not happen").

    Colocated runs use the prefill columns for each instance's batch in flight and the decode
    columns for its queue and running batch.
    """

    def nan() -> np.ndarray:
        return np.full(n, np.nan)

    def ints(k: int, fill: int = 0) -> np.ndarray:
        return np.full(k, fill, dtype=np.int64)

    scal = ints(10)
    scal[I_LQ_HEAD] = scal[I_LQ_TAIL] = -1
    return State(
        prefill_start=nan(), first_token=nan(), kv_start=nan(), kv_ready=nan(),
        decode_start=nan(), finish=nan(), status=np.zeros(n, dtype=np.int8),
        prefill_inst=ints(n, -1), decode_inst=ints(n, -1), first_step=ints(n, -1),
        qnext=ints(n, -1),
        p_head=ints(n_prefill, -1), p_tail=ints(n_prefill, -1), p_tokens=ints(n_prefill),
        p_state=ints(n_prefill), p_batch=ints(n_prefill, -1), p_batch_n=ints(n_prefill),
        d_head=ints(n_decode, -1), d_tail=ints(n_decode, -1), d_queued=ints(n_decode),
        d_running=ints(n_decode), d_context=ints(n_decode), d_kv_used=ints(n_decode),
        d_steps=ints(n_decode), d_state=ints(n_decode), d_is_prefill=ints(n_decode),
        d_step_start=np.zeros(n_decode), stats=np.zeros((n_stats, 6)),
        i=scal, f=np.zeros(5),
    )
