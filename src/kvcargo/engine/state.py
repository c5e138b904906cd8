"""The simulation state: a handful of plain arrays, one row per request or per instance.

No Python object per request or per token: the event handlers read and write these arrays, so
the same code runs as plain Python or compiled by numba. Columns are named by the constants
below (``st.t[r, FIRST_TOKEN]``); keeping the arrays few keeps compiled calls cheap (every
array passed is reference-counted). Queues are intrusive FIFO lists threaded through the
``QNEXT`` column (a request sits in at most one queue at a time).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kvcargo import _jit

# Event kinds (the heap holds (time, seq, kind, index) tuples).
ARRIVAL, PREFILL_WAKE, PREFILL_DONE, GRANT, XFER_DONE, RELEASE, DECODE_WAKE, DECODE_DONE = range(8)

# Instance states.
IDLE, WAKING, BUSY = 0, 1, 2
# Request outcome.
PENDING, DONE, REJECTED = 0, 1, 2

# ``State.t``: per-request timestamps (NaN: did not happen).
PREFILL_START, FIRST_TOKEN, KV_START, KV_READY, DECODE_START, FINISH = range(6)
# ``State.r``: per-request integers.
STATUS, PREFILL_INST, DECODE_INST, FIRST_STEP, QNEXT = range(5)
# ``State.p``: per prefill instance (colocated: the batch in flight of each instance).
P_HEAD, P_TAIL, P_TOKENS, P_STATE, P_BATCH, P_BATCH_N = range(6)
# ``State.d``: per decode (or colocated) instance.
D_HEAD, D_TAIL, D_QUEUED, D_RUNNING, D_CONTEXT, D_KV_USED, D_STEPS, D_STATE, D_IS_PREFILL, D_FIN_N = range(10)
# ``State.stats``: per instance (prefill instances first), totals and the step in flight's start.
S_BUSY, S_FLOPS, S_BYTES, S_EC, S_EM, S_STEPS, S_STEP_START = range(7)
# ``State.i``: integer scalars.
I_SEQ, I_DONE, I_REJ, I_STOP, I_LINK_FREE, I_LQ_HEAD, I_LQ_TAIL, I_XFERS, I_NSTEPS, I_NEV = range(10)
# ``State.evi``: pending events (with ``State.evt`` their times), a binary heap of size I_NEV.
EV_SEQ, EV_KIND, EV_IDX = range(3)
# ``State.f``: float scalars (the clock, link totals).
F_NOW, F_LINK_BUSY, F_LINK_J, F_TRANSIT_J = range(4)

# ``Params.rf``: per-request floats.
ARRIVAL_T, XFER_TIME, XFER_J, TRANSIT_J, EP_OPS, EP_BYTES = range(6)
# ``Params.ri``: per-request integers (QUAD = prompt·(prompt + 1), the causal-attention term).
PROMPT, OUTPUT, QUAD = range(3)
# ``Params.ints``: limits and switches.
P_NPREFILL, P_NDECODE, P_COLOCATED, P_BUDGET, P_MAXBATCH, P_KVCAP, P_ENDPOINT, P_CHANNELS = range(8)


class Params(NamedTuple):
    """Everything the engine reads but never writes: the workload, costs, limits."""

    rf: np.ndarray
    """Per request: arrival, link hold time, link J, in-transit J, endpoint ops and bytes."""
    ri: np.ndarray
    """Per request: prompt, output, prompt·(prompt + 1)."""
    mi: np.ndarray
    mf: np.ndarray
    """Model coefficients (see :func:`kvcargo.cost.model_coefficients`)."""
    hf: np.ndarray
    """Pool coefficients: row 0 prefill (or colocated), row 1 decode."""
    ints: np.ndarray


class State(NamedTuple):
    """Everything the engine writes."""

    t: np.ndarray
    r: np.ndarray
    p: np.ndarray
    d: np.ndarray
    fin: np.ndarray
    """Per decode instance: a heap of (finish-step ordinal, request) pairs (see finheap.py)."""
    stats: np.ndarray
    i: np.ndarray
    f: np.ndarray
    evt: np.ndarray
    evi: np.ndarray
    """Pending events: a heap ordered by (time, sequence) — see events.py."""
    logf: np.ndarray
    """Decode steps in the order they ended: start, end (the first I_NSTEPS rows are used)."""
    logi: np.ndarray
    """Per logged step: instance, batch size."""


def new_state(n: int, n_prefill: int, n_decode: int, n_stats: int, max_batch: int, channels: int,
              log_capacity: int) -> State:
    """Fresh state for ``n`` requests.

    Colocated runs use the prefill rows for each instance's batch in flight and the decode rows
    for its queue and running batch.
    """
    r = np.zeros((n, 5), dtype=np.int64)
    r[:, PREFILL_INST:] = -1
    p = np.zeros((n_prefill, 6), dtype=np.int64)
    p[:, [P_HEAD, P_TAIL, P_BATCH]] = -1
    d = np.zeros((n_decode, 10), dtype=np.int64)
    d[:, [D_HEAD, D_TAIL]] = -1
    i = np.zeros(10, dtype=np.int64)
    i[[I_LQ_HEAD, I_LQ_TAIL]] = -1
    i[I_LINK_FREE] = channels
    # At most one pending event per instance, one arrival, and per link channel a grant, a
    # transfer end and a release.
    events = n_prefill + n_decode + 3 * channels + 8
    return State(
        t=np.full((n, 6), np.nan), r=r, p=p, d=d,
        fin=np.zeros((n_decode, max(1, min(max_batch, n)), 2), dtype=np.int64),
        stats=np.zeros((n_stats, 7)), i=i, f=np.zeros(4),
        evt=np.zeros(events), evi=np.zeros((events, 3), dtype=np.int64),
        logf=np.zeros((log_capacity, 2)), logi=np.zeros((log_capacity, 2), dtype=np.int64),
    )


def by_reference(obj: State | Params) -> object:
    """What the engine is handed: the namedtuple itself in plain Python, a numba StructRef over
    the same arrays when compiled (see _structs.py)."""
    if not _jit.ENABLED:
        return obj
    from kvcargo.engine._structs import by_reference as compiled

    return compiled(obj)


def with_log_capacity(st: State, capacity: int) -> State:
    """The same state with a larger step log (the engine pauses when its log is full)."""
    k = int(st.i[I_NSTEPS])
    logf = np.zeros((capacity, 2))
    logi = np.zeros((capacity, 2), dtype=np.int64)
    logf[:k] = st.logf[:k]
    logi[:k] = st.logi[:k]
    return st._replace(logf=logf, logi=logi)
