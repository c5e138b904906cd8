"""Primitives every handler uses: the event heap, settling requests, logging steps.

Pending events live in a binary heap of plain arrays ordered by (time, sequence). Ties at the
same time are broken by the order events were scheduled, exactly as SimPy does for the
reference simulator, so zero-delay chains (a submit waking an idle instance, a released link
channel granted to the next transfer) resolve in the same order.
"""

from __future__ import annotations

import math

from kvcargo._jit import kernel
from kvcargo.engine.state import (
    DONE,
    EV_IDX,
    EV_KIND,
    EV_SEQ,
    F_NOW,
    FINISH,
    I_DONE,
    I_NEV,
    I_NSTEPS,
    I_REJ,
    I_SEQ,
    I_STOP,
    IDLE,
    QNEXT,
    REJECTED,
    S_BUSY,
    S_BYTES,
    S_EC,
    S_EM,
    S_EO,
    S_FLOPS,
    S_OPT_BUSY,
    S_OPT_FLOPS,
    S_STEPS,
    STATUS,
    WAKING,
)


@kernel(inline=True)
def _earlier(st, a, t, seq):
    """Whether event slot ``a`` orders before an event (t, seq)."""
    return st.evt[a] < t or (st.evt[a] == t and st.evi[a, EV_SEQ] < seq)


@kernel(inline=True)
def _put(st, slot, t, seq, kind, idx):
    st.evt[slot] = t
    st.evi[slot, EV_SEQ] = seq
    st.evi[slot, EV_KIND] = kind
    st.evi[slot, EV_IDX] = idx


@kernel(inline=True)
def schedule(st, t, kind, idx):
    """Put an event on the heap; later-scheduled events at the same time run later."""
    seq = st.i[I_SEQ]
    st.i[I_SEQ] = seq + 1
    i = st.i[I_NEV]
    st.i[I_NEV] = i + 1
    while i > 0:
        parent = (i - 1) >> 1
        if _earlier(st, parent, t, seq):
            break
        _put(st, i, st.evt[parent], st.evi[parent, EV_SEQ], st.evi[parent, EV_KIND], st.evi[parent, EV_IDX])
        i = parent
    _put(st, i, t, seq, kind, idx)


@kernel(inline=True)
def pop_event(st):
    """Remove the earliest event; returns its (time, kind, index)."""
    t, kind, idx = st.evt[0], st.evi[0, EV_KIND], st.evi[0, EV_IDX]
    n = st.i[I_NEV] - 1
    st.i[I_NEV] = n
    lt, lseq, lkind, lidx = st.evt[n], st.evi[n, EV_SEQ], st.evi[n, EV_KIND], st.evi[n, EV_IDX]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        if child + 1 < n and _earlier(st, child + 1, st.evt[child], st.evi[child, EV_SEQ]):
            child += 1
        if not _earlier(st, child, lt, lseq):
            break
        _put(st, i, st.evt[child], st.evi[child, EV_SEQ], st.evi[child, EV_KIND], st.evi[child, EV_IDX])
        i = child
    _put(st, i, lt, lseq, lkind, lidx)
    return t, kind, idx


@kernel(inline=True)
def wake(st, table, row, col, kind):
    """Wake instance ``row`` (state ``table[row, col]``) if it sleeps: a zero-delay ``kind``
    event."""
    if table[row, col] == IDLE:
        table[row, col] = WAKING
        schedule(st, st.f[F_NOW], kind, row)


@kernel(inline=True)
def next_event_time(st):
    """Time of the earliest pending event (infinity when none)."""
    if st.i[I_NEV] == 0:
        return math.inf
    return st.evt[0]


@kernel(inline=True)
def log_full(st):
    """Whether the step log has no room for another step (the engine then pauses)."""
    return st.i[I_NSTEPS] >= st.logf.shape[0]


@kernel(inline=True)
def _settled(st):
    """The run ends when every request is settled (finished or rejected)."""
    if st.i[I_DONE] + st.i[I_REJ] == st.r.shape[0]:
        st.i[I_STOP] = 1


@kernel(inline=True)
def finish_request(st, r):
    """A request has produced its last token; the run ends when every request is settled."""
    st.t[r, FINISH] = st.f[F_NOW]
    st.r[r, STATUS] = DONE
    st.i[I_DONE] += 1
    _settled(st)


@kernel(inline=True)
def reject_request(st, r):
    """A request whose KV can never fit a decode instance is turned away on arrival."""
    st.r[r, STATUS] = REJECTED
    st.i[I_REJ] += 1
    _settled(st)


@kernel(inline=True)
def log_step(st, inst, start, end, batch):
    """Append a decode step to the step log (the caller made sure there is room)."""
    k = st.i[I_NSTEPS]
    st.logf[k, 0] = start
    st.logf[k, 1] = end
    st.logi[k, 0] = inst
    st.logi[k, 1] = batch
    st.i[I_NSTEPS] = k + 1


@kernel(inline=True)
def charge_step(st, row, dt, flops, nbytes, e_c, e_m):
    """Add one step to instance ``row``'s totals (in step order: the sums are the reference's)."""
    st.stats[row, S_BUSY] += dt
    st.stats[row, S_FLOPS] += flops
    st.stats[row, S_BYTES] += nbytes
    st.stats[row, S_EC] += e_c
    st.stats[row, S_EM] += e_m
    st.stats[row, S_STEPS] += 1


@kernel(inline=True)
def charge_engine(st, row, dt, e_o, optical_flops, engine_bound):
    """Add an optical transform engine's share of a step to instance ``row``'s totals."""
    st.stats[row, S_EO] += e_o
    st.stats[row, S_OPT_FLOPS] += optical_flops
    if engine_bound:
        st.stats[row, S_OPT_BUSY] += dt


@kernel(inline=True)
def fifo_push(st, table, row, head, tail, r):
    """Append request ``r`` to the FIFO whose ends are ``table[row, head]``, ``table[row, tail]``
    (queues thread through the requests' QNEXT column)."""
    st.r[r, QNEXT] = -1
    last = table[row, tail]
    if last < 0:
        table[row, head] = r
    else:
        st.r[last, QNEXT] = r
    table[row, tail] = r


@kernel(inline=True)
def fifo_cut(table, row, head, tail, r):
    """Make request ``r`` (or -1: none) the head of that FIFO, the requests before it having
    left."""
    table[row, head] = r
    if r < 0:
        table[row, tail] = -1
