"""Primitives every handler uses: scheduling events, settling requests, logging steps.

The heap holds (time, sequence, kind, index) tuples. Ties at the same time are broken by the
order events were scheduled, exactly as SimPy does for the reference simulator, so zero-delay
chains (a submit waking an idle instance, a released link channel granted to the next transfer)
resolve in the same order.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from kvcargo.engine._jit import kernel
from kvcargo.engine.state import DONE, F_NOW, I_DONE, I_NSTEPS, I_REJ, I_SEQ, I_STOP, REJECTED


@kernel
def schedule(heap, st, t, kind, idx):
    """Put an event on the heap; later-scheduled events at the same time run later."""
    seq = st.i[I_SEQ]
    st.i[I_SEQ] = seq + 1
    heapq.heappush(heap, (t, seq, kind, idx))


@kernel
def next_event_time(heap):
    """Time of the earliest pending event (infinity when none)."""
    if len(heap) == 0:
        return math.inf
    return heap[0][0]


@kernel
def finish_request(st, pr, r):
    """A request has produced its last token; the run ends when every request is settled."""
    st.finish[r] = st.f[F_NOW]
    st.status[r] = DONE
    st.i[I_DONE] += 1
    _check_settled(st, pr)


@kernel
def reject_request(st, pr, r):
    """A request whose KV can never fit a decode instance is turned away on arrival."""
    st.status[r] = REJECTED
    st.i[I_REJ] += 1
    _check_settled(st, pr)


@kernel
def _check_settled(st, pr):
    if st.i[I_DONE] + st.i[I_REJ] == pr.arrival.shape[0]:
        st.i[I_STOP] = 1


@kernel
def log_step(st, logf, logi, inst, start, end, batch):
    """Append a decode step to the step log (grown by doubling)."""
    k = st.i[I_NSTEPS]
    cap = logf[0].shape[0]
    if k == cap:
        bigger_f = np.empty((2 * cap, 2))
        bigger_f[:cap] = logf[0]
        logf[0] = bigger_f
        bigger_i = np.empty((2 * cap, 2), dtype=np.int64)
        bigger_i[:cap] = logi[0]
        logi[0] = bigger_i
    logf[0][k, 0] = start
    logf[0][k, 1] = end
    logi[0][k, 0] = inst
    logi[0][k, 1] = batch
    st.i[I_NSTEPS] = k + 1
